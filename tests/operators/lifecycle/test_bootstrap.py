"""Bootstrap (dkvstream.operators.runtime.bootstrap): a job's first epoch starts from the
state written from tables (against a pandas oracle), after a restart and a rescale too;
the state reader reads back exactly what was written (Hypothesis round trips over every
spec kind); bad tables are refused naming the column and the row or key."""
from __future__ import annotations

import dataclasses
import json
import tempfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.operators.errors import BootstrapError
from dkvstream.operators.runtime.bootstrap import bootstrap
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import list_timers, read_state, verify
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.dkv.manifest import load_manifest
from tests.operators.lifecycle.bootstrap_jobs import (
    EveryKind,
    RunningCount,
    count_job,
    count_oracle,
    every_kind_job,
    sort_output,
)

INITIAL = {"k0": 100, "k3": 5, "k4": 0, "absent": 9}  # "absent" never occurs in the input
TIMERS = {"k1": [50, 60], "k5": [70], "absent": [10_000]}


def _initial_tables() -> tuple[pa.Table, pa.Table]:
    counts = pa.table({"key": list(INITIAL), "value": pa.array(list(INITIAL.values()), pa.int32())})
    timers = pa.table({"key": [k for k, v in TIMERS.items() for _ in v],
                       "timestamp": [t for v in TIMERS.values() for t in v]})
    return counts, timers


def _output(runner: JobRunner) -> pd.DataFrame:
    return sort_output(runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas())


def _final_counts(runner: JobRunner) -> dict[str, int]:
    state = read_state(runner.store, runner.job, "count")
    return dict(zip([k.decode() for k in state.column("subject_key").to_pylist()], state.column("value").to_pylist()))


def _expected_final(job) -> dict[str, int]:
    out = dict(INITIAL)
    for t in job.source.tables.values():
        for k in t.column("key").to_pylist():
            out[k.decode()] = out.get(k.decode(), 0) + 1
    return out


def test_first_epoch_starts_from_bootstrapped_state(tmp_path) -> None:
    job = count_job()
    counts, timers = _initial_tables()
    result = bootstrap(str(tmp_path), job, {"running_count": {"count": counts}}, timers={"running_count": timers})
    assert result.epoch == 1 and result.entries == len(INITIAL) + sum(map(len, TIMERS.values()))
    assert [w.range_label for w in result.ranges] == ["kg-0000-0007", "kg-0008-0015"]
    ckpt = latest_checkpoint(JobRunner(job, None, str(tmp_path)).store, job.prefix)
    assert ckpt.epoch == 1 and ckpt.source_offsets == {} and ckpt.next_event_timer_ms == 50
    assert ckpt.state_schemas["running_count"]["count"]["value_codec"] == "int64"
    runner = JobRunner(job, None, str(tmp_path))
    epochs = runner.run()
    assert epochs[0].epoch == 2  # the bootstrap was epoch 1
    pd.testing.assert_frame_equal(_output(runner), count_oracle(job.source, INITIAL, TIMERS))
    assert _final_counts(runner) == _expected_final(job)


def test_restart_and_rescale_after_bootstrap(tmp_path) -> None:
    job = count_job(parallelism=2)
    counts, timers = _initial_tables()
    pq.write_table(counts, tmp_path / "counts.parquet")
    bootstrap(str(tmp_path / "store"), job, {"running_count": {"count": str(tmp_path / "counts.parquet")}},
              timers={"running_count": timers})
    JobRunner(job, None, str(tmp_path / "store")).run(max_epochs=2)
    rescaled = count_job(parallelism=3)  # a restart at another parallelism
    runner = JobRunner(rescaled, None, str(tmp_path / "store"))
    runner.run()
    assert len(latest_checkpoint(runner.store, job.prefix).operators["running_count"]) == 3
    pd.testing.assert_frame_equal(_output(runner), count_oracle(job.source, INITIAL, TIMERS))
    assert _final_counts(runner) == _expected_final(job)


def test_hashed_layout_and_a_later_epoch(tmp_path) -> None:
    job = dataclasses.replace(count_job(), key_layout="hashed")
    counts, timers = _initial_tables()
    result = bootstrap(str(tmp_path), job, {"running_count": {"count": counts}}, timers={"running_count": timers},
                       epoch=5)
    assert all(w.manifest_key.startswith("jobs/boot_count/r/") for w in result.ranges)
    runner = JobRunner(job, None, str(tmp_path))
    assert runner.run()[0].epoch == 6
    pd.testing.assert_frame_equal(_output(runner), count_oracle(job.source, INITIAL, TIMERS))


def test_retention_collects_the_bootstrap_checkpoint_as_any_other(tmp_path) -> None:
    job = count_job()
    counts, timers = _initial_tables()
    result = bootstrap(str(tmp_path), job, {"running_count": {"count": counts}}, timers={"running_count": timers})
    runner = JobRunner(job, None, str(tmp_path), retain_checkpoints=1)
    runner.run()
    report = cleanup_job(runner.store, job.prefix, 1)
    assert report.retained_epochs == [latest_checkpoint(runner.store, job.prefix).epoch]
    assert not any(runner.store.exists(w.manifest_key) for w in result.ranges)  # garbage once expired
    assert verify(runner.store, job)[1] == []
    assert _final_counts(runner) == _expected_final(job)


def test_a_large_range_is_merged_once_into_one_sorted_run(tmp_path) -> None:
    job = dataclasses.replace(count_job(), parallelism=1)
    n = 3_000
    counts = pa.table({"key": [f"key{i:05d}" for i in range(n)], "value": list(range(n))})
    result = bootstrap(str(tmp_path), job, {"running_count": {"count": counts}},
                       dkv_options=DKVOptions(memtable_bytes=4 << 10, target_file_bytes=16 << 10))
    store = JobRunner(job, None, str(tmp_path)).store
    levels = load_manifest(store, result.ranges[0].manifest_key).levels
    assert levels.l0 == () and result.tables == len(list(levels.all_tables())) > 1
    assert _rows(read_state(store, job, "count")) == sorted(
        ((f"key{i:05d}".encode(), i) for i in range(n)), key=repr)


def test_read_state_output_bootstraps_another_job(tmp_path) -> None:
    """The state reader's table (with key_group and state_id) is a bootstrap table as is."""
    job = count_job()
    counts, _ = _initial_tables()
    bootstrap(str(tmp_path), job, {"running_count": {"count": counts}})
    runner = JobRunner(job, None, str(tmp_path))
    read = read_state(runner.store, job, "count")
    copy = count_job(name="boot_copy")
    bootstrap(runner.store, copy, {"running_count": {"count": read}})
    assert read_state(runner.store, copy, "count").equals(read)


# -- round trips -----------------------------------------------------------------------

_keys = st.lists(st.binary(min_size=1, max_size=6), min_size=0, max_size=25, unique=True)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)
_json = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=4), st.lists(st.booleans(), max_size=3))


@st.composite
def _tables(draw) -> dict[str, pa.Table]:
    """A random table of each state of ``EveryKind``, as the state reader shows them."""
    def keys():
        return draw(_keys)

    def map_rows(map_keys):
        rows = []
        for k in keys():
            for mk in draw(st.lists(map_keys, min_size=1, max_size=3, unique=True)):
                rows.append((k, mk))
        return rows

    k = keys()
    total = pa.table({"subject_key": pa.array(k, pa.binary()),
                      "value": pa.array(draw(st.lists(_i64, min_size=len(k), max_size=len(k))), pa.int64())})
    k = keys()
    records = [{"n": draw(st.one_of(st.none(), _i64)), "name": draw(st.one_of(st.none(), st.text(max_size=5)))}
               for _ in k]
    record = pa.table({"subject_key": pa.array(k, pa.binary()),
                       "value": pa.array(records, pa.struct([("n", pa.int64()), ("name", pa.string())]))})
    k = keys()
    doc = pa.table({"subject_key": pa.array(k, pa.binary()),
                    "value": pa.array([json.dumps(draw(_json), separators=(",", ":")) for _ in k], pa.string())})
    k = keys()
    names = pa.table({"subject_key": pa.array(k, pa.binary()),
                      "value": pa.array([draw(st.lists(st.text(max_size=4), max_size=4)) for _ in k],
                                        pa.list_(pa.string()))})
    rows = map_rows(st.integers(-(1 << 40), 1 << 40))
    scores = pa.table({"subject_key": pa.array([r[0] for r in rows], pa.binary()),
                       "map_key": pa.array([r[1] for r in rows], pa.int64()),
                       "value": pa.array([draw(st.floats(allow_nan=False)) for _ in rows], pa.float64())})
    k = keys()
    recent = pa.table({"subject_key": pa.array(k, pa.binary()),
                       "value": pa.array(draw(st.lists(_i64, min_size=len(k), max_size=len(k))), pa.int64()),
                       "expiry": pa.array(draw(st.lists(_i64, min_size=len(k), max_size=len(k))), pa.int64())})
    rows = map_rows(st.text(max_size=3))
    seen = pa.table({"subject_key": pa.array([r[0] for r in rows], pa.binary()),
                     "map_key": pa.array([r[1] for r in rows], pa.string()),
                     "value": pa.array(draw(st.lists(_i64, min_size=len(rows), max_size=len(rows))), pa.int64())})
    return {"total": total, "record": record, "doc": doc, "names": names, "scores": scores, "recent": recent,
            "seen": seen}


def _rows(table: pa.Table) -> list[tuple]:
    cols = [c for c in ("subject_key", "map_key", "value", "expiry") if c in table.column_names]
    return sorted(zip(*(table.column(c).to_pylist() for c in cols)), key=repr)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=_tables(), ttl_from=st.integers(0, 1 << 40))
def test_state_reader_reads_back_what_bootstrap_wrote(tables, ttl_from) -> None:
    job = every_kind_job()
    with tempfile.TemporaryDirectory() as root:
        bootstrap(root, job, {"every_kind": tables}, ttl_from_ms=ttl_from)
        store = JobRunner(job, None, root).store
        for state_id, table in tables.items():
            got = read_state(store, job, state_id)
            want = table
            if state_id == "seen":  # no expiry column given: the TTL counted from ttl_from
                want = table.append_column("expiry", pa.array([ttl_from + 5_000] * table.num_rows, pa.int64()))
            assert _rows(got) == _rows(want), state_id
            assert got.column("state_id").to_pylist() == [state_id] * got.num_rows


@settings(max_examples=15, deadline=None)
@given(stamps=st.lists(st.tuples(st.binary(min_size=1, max_size=4), st.integers(-(1 << 50), 1 << 50),
                                 st.sampled_from(["event_time", "processing_time"])), max_size=20))
def test_list_timers_reads_back_the_timers_written(stamps) -> None:
    job = count_job()
    table = pa.table({"key": pa.array([s[0] for s in stamps], pa.binary()),
                      "timestamp": pa.array([s[1] for s in stamps], pa.int64()),
                      "domain": pa.array([s[2] for s in stamps], pa.string())})
    with tempfile.TemporaryDirectory() as root:
        bootstrap(root, job, {}, timers={"running_count": table})
        got = list_timers(JobRunner(job, None, root).store, job)
        read = set(zip(got.column("subject_key").to_pylist(),
                       pc_ms(got.column("timestamp")), got.column("domain").to_pylist()))
        assert read == set(stamps)  # a timer given twice is written once
        ckpt = latest_checkpoint(JobRunner(job, None, root).store, job.prefix)
        events = [s[1] for s in stamps if s[2] == "event_time"]
        assert ckpt.next_event_timer_ms == (min(events) if events else None)
        copy = count_job(name="boot_copy")  # the state reader's timer table, written back as it is
        bootstrap(root, copy, {}, timers={"running_count": got})
        assert list_timers(JobRunner(copy, None, root).store, copy).equals(got)


def pc_ms(column) -> list[int]:
    return column.cast(pa.int64()).to_pylist()


# -- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("states, match", [
    ({"nope": {}}, "has no operator 'nope'"),
    ({"every_kind": {"nope": pa.table({"key": [b"a"], "value": [1]})}}, "declares no state 'nope'"),
    ({"every_kind": {"total": pa.table({"key": [b"a"]})}}, "column 'value' is missing"),
    ({"every_kind": {"total": pa.table({"key": [1], "value": [1]})}}, "column 'key' is int64; a subject key is binary"),
    ({"every_kind": {"total": pa.table({"key": [b"a"], "value": ["x"]})}}, "column 'value' is string, the state "
                                                                          "stores int64"),
    ({"every_kind": {"total": pa.table({"key": [b"a", b"b", b"a"], "value": [1, 2, 3]})}},
     "state 'total': key b'a' appears twice"),
    ({"every_kind": {"total": pa.table({"key": [b"a", None], "value": [1, 2]})}}, "column 'key' is null in row 1"),
    ({"every_kind": {"total": pa.table({"key": [b"a", b""], "value": [1, 2]})}}, "row 1: the key is empty"),
    ({"every_kind": {"total": pa.table({"key": [b"a", b"b"], "value": [1, None]})}},
     r"column 'value' is null in row 1 \(key b'b'\)"),
    ({"every_kind": {"total": pa.table({"key": [b"a"], "value": [1], "extra": [1]})}},
     r"unknown column\(s\) \['extra'\]"),
    ({"every_kind": {"recent": pa.table({"key": [b"a"], "value": [1]})}}, "column 'expiry' is missing"),
    ({"every_kind": {"doc": pa.table({"key": [b"a", b"b"], "value": ["1", "{bad"]})}},
     r"row 1 \(key b'b'\): column 'value' holds '\{bad'"),
    ({"every_kind": {"scores": pa.table({"key": [b"a", b"a"], "map_key": [1, 1], "value": [1.0, 2.0]})}},
     "with map key bytes .* appears twice"),
    ({"every_kind": {"record": pa.table({"key": [b"a"], "n": [1]})}}, "column 'name' is missing"),
])
def test_bad_tables_are_refused_naming_column_and_row(tmp_path, states, match) -> None:
    with pytest.raises(BootstrapError, match=match):
        bootstrap(str(tmp_path), every_kind_job(), states)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # refused before anything was written
    assert latest_checkpoint(JobRunner(every_kind_job(), None, str(tmp_path)).store, "jobs/boot_kinds") is None


def test_a_job_with_a_checkpoint_is_refused(tmp_path) -> None:
    job = count_job()
    counts, _ = _initial_tables()
    bootstrap(str(tmp_path), job, {"running_count": {"count": counts}})
    with pytest.raises(BootstrapError, match="has checkpoints already .* new name"):
        bootstrap(str(tmp_path), job, {"running_count": {"count": counts}})
    with pytest.raises(BootstrapError, match="epoch must be an int >= 1"):
        bootstrap(str(tmp_path / "other"), job, {}, epoch=0)


def test_a_delta_table_and_a_pandas_frame_as_tables(tmp_path) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "names"), pa.table({"key": ["a", "b"], "value": [["x", "y"], []]}))
    job = every_kind_job()
    bootstrap(str(tmp_path / "store"), job, {"every_kind": {
        "names": str(tmp_path / "names"),
        "scores": pd.DataFrame({"key": ["a", "a"], "map_key": [2, 1], "value": [0.5, 1.5]})}})
    store = JobRunner(job, None, str(tmp_path / "store")).store
    assert _rows(read_state(store, job, "names")) == [(b"a", ["x", "y"]), (b"b", [])]
    assert _rows(read_state(store, job, "scores")) == [(b"a", 1, 1.5), (b"a", 2, 0.5)]


def test_two_operators_one_named_without_tables(tmp_path) -> None:
    """Range indexes stay aligned when an operator is named with no table and another
    operator of the job follows it."""
    chain = dataclasses.replace(every_kind_job(), operators=[RunningCount(), EveryKind()])
    bootstrap(str(tmp_path), chain, {"running_count": {}, "every_kind": {"total": pa.table({
        "key": ["a", "b"], "value": [1, 2]})}})
    ckpt = latest_checkpoint(JobRunner(chain, None, str(tmp_path)).store, chain.prefix)
    assert ckpt.operators["running_count"] == {} and len(ckpt.operators["every_kind"]) == 3
    got = read_state(JobRunner(chain, None, str(tmp_path)).store, chain, "total", operator="every_kind")
    assert _rows(got) == [(b"a", 1), (b"b", 2)]


def test_record_fields_as_columns(tmp_path) -> None:
    job = every_kind_job()
    bootstrap(str(tmp_path), job, {"every_kind": {"record": pa.table({
        "key": ["a", "b"], "name": ["x", None], "n": pa.array([1, 2], pa.int32())})}})
    got = read_state(JobRunner(job, None, str(tmp_path)).store, job, "record")
    assert _rows(got) == [(b"a", {"n": 1, "name": "x"}), (b"b", {"n": 2, "name": None})]


def test_bootstrap_and_first_epochs_on_spark(spark, tmp_path) -> None:
    """On local[2]: the tables encoded and each range written in Spark tasks (one per
    range), the job run on Spark from the checkpoint; a bad table's error crosses Spark
    with its type."""
    job = count_job()
    counts, timers = _initial_tables()
    pq.write_table(timers, tmp_path / "timers.parquet")
    frame = spark.createDataFrame(counts.to_pandas())
    with pytest.raises(BootstrapError, match=r"state 'count': key b'\w+' appears twice"):
        bootstrap(str(tmp_path / "bad"), job, {"running_count": {"count": frame.union(frame)}}, spark=spark)
    result = bootstrap(str(tmp_path / "store"), job, {"running_count": {"count": frame}},
                       timers={"running_count": str(tmp_path / "timers.parquet")}, spark=spark)
    assert [w.range_label for w in result.ranges] == ["kg-0000-0007", "kg-0008-0015"]
    assert result.entries == len(INITIAL) + sum(map(len, TIMERS.values()))
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    try:
        runner.run()
    finally:
        runner.close()
    pd.testing.assert_frame_equal(_output(runner), count_oracle(job.source, INITIAL, TIMERS))
    assert _final_counts(runner) == _expected_final(job)
