"""Bad input goes to the dead-letter table with its reason; the job keeps running.

A source injects every kind of bad row among good ones. Oracle: the good rows through
a pandas computation of the operator's output, and the injected list of bad rows."""
from __future__ import annotations

import json
import re
import sys

import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

from dkvstream.examples.synthetic import (
    WINDOW_COUNT_SCHEMA,
    KeyWindowCount,
    SyntheticSource,
    group_of,
    window_count_oracle,
)
from dkvstream.operators.api.columns import ERROR_COLUMN, RAW_VALUE_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.errors import TooManyDeadLettersError
from dkvstream.operators.io.dead_letter import REASONS, BadInputError, DeadLetter
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from tests.crashes import Crash, crash_at

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark workers cannot import tests

BASE_MS = 1_700_000_000_000  # 2023-11-14: good events are in the past of any test run
YEAR_2200_MS = 7_258_118_400_000
# (partition, offset) -> (reason, how the row is broken)
BAD = {
    ("p0", 3): "unparseable_value",
    ("p0", 50): "missing_key",          # null key
    ("p0", 51): "missing_key",          # empty key
    ("p0", 120): "timestamp_before_epoch",
    ("p0", 199): "timestamp_in_future",
    ("p1", 0): "timestamp_in_future",   # first row of the job: no watermark to compare with
    ("p1", 77): "missing_timestamp",
    ("p1", 78): "unparseable_value",
    ("p1", 150): "timestamp_before_epoch",
}


class BadInputSource(Source):
    """``SyntheticSource`` events (shifted to ``BASE_MS``) with the rows of ``BAD`` broken."""

    name = "bad_input"

    def __init__(self, events: int = 200) -> None:
        self.inner = SyntheticSource(events, keys=12, partitions=2, step_ms=700)

    def partitions(self) -> list[str]:
        return self.inner.partitions()

    def end_offsets(self) -> dict[str, int]:
        return self.inner.end_offsets()

    @property
    def value_schema(self) -> pa.Schema:
        return self.inner.value_schema

    def good_rows(self, partition: str) -> list[dict]:
        rows = self.inner.full_partition(partition).to_pylist()
        for r in rows:
            r["timestamp"] += BASE_MS
        return rows

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        rows = self.good_rows(partition)[start:end]
        errors, raws = [None] * len(rows), [None] * len(rows)
        for i, row in enumerate(rows):
            reason = BAD.get((partition, start + i))
            if reason == "unparseable_value":
                row["amount"] = None
                errors[i], raws[i] = "JSONDecodeError: Expecting value", b"{amount: oops"
            elif reason == "missing_key":
                row["key"] = None if (start + i) % 2 == 0 else b""
            elif reason == "timestamp_before_epoch":
                row["timestamp"] = -86_400_000
            elif reason == "timestamp_in_future":
                row["timestamp"] = YEAR_2200_MS
            elif reason == "missing_timestamp":
                row["timestamp"] = None
        t = pa.Table.from_pylist(rows, schema=pa.schema([("key", pa.binary()), ("timestamp", pa.int64()),
                                                         *self.value_schema]))
        return t.append_column(ERROR_COLUMN, pa.array(errors, pa.string())).append_column(
            RAW_VALUE_COLUMN, pa.array(raws, pa.binary()))


def _job(tolerance: str = "all", events_per_epoch: int = 200) -> Job:
    return Job(name="dl", source=BadInputSource(), operators=[KeyWindowCount()],
               sinks={"main": ParquetSink("counts", WINDOW_COUNT_SCHEMA)}, parallelism=2,
               events_per_epoch=events_per_epoch, max_out_of_orderness_ms=5_000,
               dead_letter=DeadLetter(tolerance=tolerance))


def _oracle(source: BadInputSource) -> pd.DataFrame:
    rows = [r for p in source.partitions() for off, r in enumerate(source.good_rows(p)) if (p, off) not in BAD]
    return window_count_oracle(pd.DataFrame(rows))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True).astype("int64", errors="ignore")


@pytest.mark.parametrize("use_spark", [False, True], ids=["in-process", "spark"])
def test_bad_rows_go_to_dead_letter_with_reason(use_spark, request, tmp_path) -> None:
    spark = request.getfixturevalue("spark") if use_spark else None
    job = _job()
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    results = runner.run()
    assert results[-1].finished and len(results) >= 2  # several epochs, job kept running

    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    pd.testing.assert_frame_equal(_sorted(got), _oracle(job.source), check_dtype=False)

    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    assert sorted(zip(dead["partition"], dead["offset"], dead["reason"])) == sorted(
        (p, o, r) for (p, o), r in BAD.items())
    row = dead[(dead["partition"] == "p0") & (dead["offset"] == 3)].iloc[0]
    assert row["value"] == b"{amount: oops" and row["error"].startswith("JSONDecodeError")
    row = dead[(dead["partition"] == "p0") & (dead["offset"] == 120)].iloc[0]
    assert row["timestamp"] == -86_400_000 and set(json.loads(row["value"])) == {"amount"}
    assert set(dead["source"]) == {"bad_input"}

    # Counts per reason: per epoch in the checkpoint metrics and the EpochResult (the
    # Dagster metadata), summing to the injected rows.
    want = {r: sum(1 for v in BAD.values() if v == r) for r in REASONS}
    summed = {r: sum(res.dead_letter[r] for res in results) for r in REASONS}
    assert summed == want and sum(res.dead_letter["total"] for res in results) == len(BAD)
    ckpt = latest_checkpoint(runner.store, job.prefix)
    assert ckpt.metrics["dead_letter"] == results[-1].dead_letter
    from dkvstream.assets.checkpoints import checkpoint_metadata, level_stats

    for res in results:  # the Dagster materialization metadata of each checkpoint
        md = checkpoint_metadata(res, level_stats(runner.store, ckpt))
        assert {r: md[f"dead_letter_{r}"].value for r in (*REASONS, "total")} == res.dead_letter
    # Exactly once: each bad row is in one epoch's file, named by that epoch's checkpoint.
    assert dead.groupby(["partition", "offset"]).size().max() == 1


def test_dead_letter_rows_are_exactly_once_across_a_crash(tmp_path) -> None:
    """A crash after the commit, before publishing: the restart publishes the dead
    letters of that epoch once (idempotent), and a crash before the commit leaves none."""
    root = str(tmp_path / "store")

    for point, epoch in (("after_commit", 2), ("after_tasks", 3)):
        with crash_at(point, epoch), pytest.raises(Crash):
            JobRunner(_job(events_per_epoch=120), None, root).run()
    job = _job(events_per_epoch=120)
    runner = JobRunner(job, None, root)
    runner.run()
    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    assert sorted(zip(dead["partition"], dead["offset"])) == sorted(BAD)
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    pd.testing.assert_frame_equal(_sorted(got), _oracle(job.source), check_dtype=False)


def test_tolerance_none_fails_before_any_stage(tmp_path) -> None:
    job = _job(tolerance="none")
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(BadInputError, match="partition p0 offset 3: unparseable_value"):
        runner.run()
    assert runner.latest() is None
    assert not runner.store.list(f"{job.prefix}/state/")  # nothing ran


def test_tolerance_none_on_spark_fails_with_the_read_tasks_bad_input_error(spark, tmp_path) -> None:
    """A read task's ``BadInputError`` reaches the driver as that type, with its message
    (which bad row comes first depends on which read task fails first)."""
    runner = JobRunner(_job(tolerance="none"), spark, str(tmp_path / "store"))
    with pytest.raises(BadInputError) as failed:
        runner.run()
    where = re.fullmatch(r"source bad_input partition (p\d) offset (\d+): (\w+) \(dead_letter.tolerance='none'\)",
                         str(failed.value))
    assert where and BAD[(where[1], int(where[2]))] == where[3], str(failed.value)
    assert runner.latest() is None


def test_future_bound_is_relative_to_the_wall_clock() -> None:
    import time

    import numpy as np

    from dkvstream.operators.io.dead_letter import screen

    now = int(time.time() * 1000)
    t = pa.table({"key": [b"a", b"b", b"c"], "timestamp": [now, now + 3_600_000, now + 3 * 86_400_000],
                  "amount": [1, 2, 3]})
    good, dead, offs = screen(t, np.arange(10, 13), DeadLetter(), source="s", partition="p", epoch=1, now_ms=now)
    assert good.column("key").to_pylist() == [b"a", b"b"] and offs.tolist() == [10, 11]
    assert dead.column("reason").to_pylist() == ["timestamp_in_future"] and dead["offset"].to_pylist() == [12]
    good, dead, _ = screen(t, np.arange(3), DeadLetter(max_future_ms=None), source="s", partition="p", epoch=1)
    assert good.num_rows == 3 and dead.num_rows == 0


def test_topic_values_that_do_not_decode_go_to_dead_letter(tmp_path) -> None:
    """TopicSource: a value that is not JSON, not an object, or has a field of the wrong
    type, and a record without key, are dead letters; the rest is processed."""
    from dkvstream.operators.io.topics import TopicSource
    from dkvstream.storage.log import Log, TopicConfig
    from dkvstream.storage.objectstore import open_object_store

    root = str(tmp_path / "store")
    log = Log(open_object_store(root))
    log.create_topic("in", TopicConfig(partitions=1))
    prod = log.producer()
    broken = {5: (b"k1", b"{amount: 1"), 9: (b"k2", b"[1, 2]"), 14: (b"k3", b'{"amount": "ten"}'),
              20: (None, b'{"amount": 4}'), 21: (b"k1", b"\xff\xfe")}
    reasons = {5: "unparseable_value", 9: "unparseable_value", 14: "unparseable_value", 20: "missing_key",
               21: "unparseable_value"}
    good = []
    for i in range(40):
        key, value = broken.get(i, (f"k{i % 4}".encode(), json.dumps({"amount": i}).encode()))
        prod.send("in", key, value, timestamp=BASE_MS + 1_000 * i)
        if i not in broken:
            good.append({"key": key, "timestamp": BASE_MS + 1_000 * i, "amount": i})
    prod.flush()
    job = Job(name="topic_dl", source=TopicSource(root, "in", value_schema=pa.schema([("amount", pa.int64())]),
                                                  bounded=True),
              operators=[KeyWindowCount()], sinks={"main": ParquetSink("counts", WINDOW_COUNT_SCHEMA)},
              key_groups=8, parallelism=2, events_per_epoch=15)
    runner = JobRunner(job, None, root)
    runner.run()
    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    assert sorted(zip(dead["offset"], dead["reason"])) == sorted(reasons.items())
    assert dict(zip(dead["offset"], dead["value"])) == {i: v for i, (_, v) in broken.items()}
    assert "field 'amount'" in dead.set_index("offset").loc[14, "error"]
    df = pd.DataFrame(good)
    df["window_start"] = df["timestamp"] - df["timestamp"] % KeyWindowCount.window_ms
    want = df.groupby(["key", "window_start"], as_index=False).agg(count=("amount", "size"),
                                                                   amount=("amount", "sum"))
    want["group"] = [group_of(k) for k in want["key"]]
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    pd.testing.assert_frame_equal(_sorted(got), _sorted(want[["group", "window_start", "count", "amount"]]),
                                  check_dtype=False)


TALLY_SCHEMA = pa.schema([pa.field("key", pa.binary()), pa.field("amount", pa.int64())])


class Tally(Operator):
    """Emits each event's amount: no timers, so an epoch's records are its rows read."""

    name = "tally"
    outputs = {"main": TALLY_SCHEMA}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        subject.emit({"key": event.key, "amount": event.value["amount"]})


def _ratio_job(max_ratio: float | None) -> Job:
    return Job(name="ratio", source=BadInputSource(), operators=[Tally()],
               sinks={"main": ParquetSink("tally", TALLY_SCHEMA)}, parallelism=2, events_per_epoch=200,
               dead_letter=DeadLetter(max_ratio=max_ratio, min_records=1))


def test_epoch_over_max_ratio_fails_before_its_commit(tmp_path) -> None:
    """Oracle: ``BAD``. Epoch 1 reads offsets [0, 100) of both partitions: 200 records,
    the bad ones among them dead letters. Over ``max_ratio`` the epoch fails naming the
    counts, the share, the reasons and the first rows, and nothing is committed or
    published; at exactly the share it commits."""
    bad = {k: r for k, r in BAD.items() if k[1] < 100}
    share = len(bad) / 200
    root = str(tmp_path / "store")
    runner = JobRunner(_ratio_job(share - 0.001), None, root)
    with pytest.raises(TooManyDeadLettersError) as raised:
        runner.run()
    message = str(raised.value)
    assert f"job ratio: epoch 1 sent {len(bad)} of its 200 records ({share:.1%}) to the dead-letter table" in message
    per_reason = ", ".join(f"{r} {sum(v == r for v in bad.values())}" for r in REASONS
                           if any(v == r for v in bad.values()))
    assert f"(per reason: {per_reason})" in message
    assert ("First: source bad_input partition p0 offset 3: unparseable_value (JSONDecodeError: Expecting value); "
            "source bad_input partition p0 offset 50: missing_key; "
            "source bad_input partition p0 offset 51: missing_key.") in message
    assert "DeadLetter(max_ratio=...)" in message
    assert runner.latest() is None
    assert runner.job.dead_letter.sink.read(runner.store, runner.job.prefix).num_rows == 0

    job = _ratio_job(share)  # not more than the limit: the job runs to the end
    results = JobRunner(job, None, root).run()
    assert results[-1].finished and results[0].dead_letter["total"] == len(bad)
    assert job.sinks["main"].read(runner.store, job.prefix).num_rows == 400 - len(BAD)


def test_values_of_the_wrong_type_stop_the_job_by_default(tmp_path) -> None:
    """Float values for a column declared int64 (a producer and a job that disagree):
    every record but a few is a dead letter; with the default ``DeadLetter`` the first
    epoch fails, naming the field, instead of the job running on what is left."""
    from dkvstream.operators.io.topics import TopicSource
    from dkvstream.storage.log import Log, TopicConfig
    from dkvstream.storage.objectstore import open_object_store

    root = str(tmp_path / "store")
    log = Log(open_object_store(root))
    log.create_topic("in", TopicConfig(partitions=1))
    prod = log.producer()
    for i in range(300):  # every 50th amount is whole and decodes
        prod.send("in", f"k{i % 4}".encode(), json.dumps({"amount": i + (0 if i % 50 == 0 else 0.5)}).encode(),
                  timestamp=BASE_MS + 1_000 * i)
    prod.flush()
    job = Job(name="floats", source=TopicSource(root, "in", value_schema=pa.schema([("amount", pa.int64())]),
                                                bounded=True),
              operators=[Tally()], sinks={"main": ParquetSink("tally", TALLY_SCHEMA)}, key_groups=8,
              parallelism=2, events_per_epoch=150)
    runner = JobRunner(job, None, root)
    with pytest.raises(TooManyDeadLettersError, match=r"epoch 1 sent 147 of its 150 records \(98.0%\).*"
                                                      r"per reason: unparseable_value 147\). First: source "
                                                      r"topic:in partition in-0 offset 1: unparseable_value "
                                                      r"\(field 'amount'"):
        runner.run()
    assert runner.latest() is None
