"""State TTL in running jobs: both operator forms, in process across a restart and a
rescale, and on Spark, against a replay model with the TTL rules (tests/operators/ttl_probe.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from dkvstream.operators import paths
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import Operator
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import read_state
from dkvstream.storage import faults
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint
from tests.operators.ttl_probe import (
    EVENTS_PER_EPOCH,
    PROC_TTL_MS,
    SCHEMA,
    TTL_MS,
    TtlProbe,
    TtlProbeBatch,
    probe_model,
    probe_source,
)

EPOCHS = 12


def _job(op, source, parallelism: int = 2) -> Job:
    return Job(name=f"ttl_{op.name}", source=source, operators=[op],
               sinks={"main": ParquetSink("probe", SCHEMA)}, key_groups=16, parallelism=parallelism,
               events_per_epoch=EVENTS_PER_EPOCH)


class Crash(Exception):
    """A simulated driver crash at a fault point."""


def _crash(point: str, epoch: int | None) -> None:
    raise Crash(point)


def _crashed(e: BaseException | None) -> bool:
    """Whether ``e`` is, or was raised from, a ``Crash``."""
    while e is not None:
        if isinstance(e, Crash):
            return True
        e = e.__cause__ or e.__context__
    return False


# Small tables and an early L0 trigger: flushes and compactions (with the TTL's
# compaction filter) run within the few epochs of these jobs.
SMALL = DKVOptions(memtable_bytes=2_048, block_bytes=256, l0_compaction_trigger=2, target_file_bytes=2_048,
                   level_base_bytes=8_192, level_multiplier=2, zstd_level=1)


def _run(job: Job, root: str, spark=None, restart_at: int | None = None, rescale_to: int = 3,
         then: Operator | None = None):
    """Runs ``job`` until its input is read, one epoch per processing-time second; with
    ``restart_at``, stops after that many epochs and continues in a new runner with
    ``rescale_to`` tasks (running ``then`` instead of the job's operator if given: the
    other form of it); a ``Crash`` (from an armed fault point) restarts a runner at
    the same parallelism. Returns the output and ``(offset, watermark, processing
    ms)`` per committed epoch."""
    now = [0.0]
    epochs: list[tuple[int, int, int]] = []
    total = job.source.end_offsets()["p0"]
    runner = JobRunner(job, spark, root, dkv_options=SMALL, clock=lambda: now[0])
    while True:
        if restart_at is not None and len(epochs) == restart_at:
            runner.close()
            job = _job(then or job.operators[0], job.source, rescale_to)
            runner = JobRunner(job, spark, root, dkv_options=SMALL, clock=lambda: now[0])
            restart_at = None
        now[0] += 1.0
        try:
            done = runner.run(max_epochs=1)
        except Exception as e:  # a crash in a task's DKV code surfaces as the task's error
            if not _crashed(e):
                raise
            runner.close()
            runner = JobRunner(job, spark, root, dkv_options=SMALL, clock=lambda: now[0])
            continue
        if not done:
            break
        r = done[0]
        epochs.append((r.source_offsets["p0"], r.watermark, int(now[0] * 1000)))
        if r.finished or (not job.source.bounded and r.source_offsets["p0"] == total):
            break
    out = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    assert any(k.endswith(".sst") for k in runner.store.list(job.prefix + "/state/"))  # compactions ran
    runner.close()
    return out.sort_values("v").reset_index(drop=True), epochs


def _expected(source, epochs) -> pd.DataFrame:
    return pd.DataFrame(probe_model(source, epochs), columns=SCHEMA.names)


def _check(out: pd.DataFrame, exp: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(out[SCHEMA.names], exp, check_dtype=False)
    # The model's TTLs bite: some reads found their state expired, some did not.
    assert exp["last"].notna().any() and (exp["last"].isna() & (exp.index >= len(exp) // 2)).any()
    assert exp["proc"].notna().any() and exp["proc"].isna().sum() > len(set(exp["k"]))


@pytest.mark.parametrize("op", [TtlProbe(), TtlProbeBatch()], ids=["on_event", "batch"])
def test_ttl_state_in_both_forms_equals_model(tmp_path, op) -> None:
    source = probe_source(EPOCHS)
    out, epochs = _run(_job(op, source), str(tmp_path / "store"))
    _check(out, _expected(source, epochs))


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "live"])
def test_ttl_state_across_a_restart_and_a_rescale(tmp_path, bounded) -> None:
    source = probe_source(EPOCHS, seed=1, bounded=bounded)
    out, epochs = _run(_job(TtlProbeBatch(), source), str(tmp_path / "store"), restart_at=5)
    _check(out, _expected(source, epochs))


@pytest.mark.parametrize("point, hit", [("after_tasks", 4), ("dkv_compaction_written", 1),
                                        ("task_after_checkpoint", 7)])
def test_ttl_state_after_a_crash_equals_model(tmp_path, point, hit) -> None:
    # A crash after DKV checkpoints (their compaction filters recorded, expired entries
    # perhaps compacted away) but before the commit: the epoch runs again from the
    # previous checkpoint and reads what the model says.
    source = probe_source(EPOCHS, seed=2)
    faults.arm(point, hit, _crash)
    try:
        out, epochs = _run(_job(TtlProbe(), source), str(tmp_path / "store"))
    finally:
        assert point not in faults._armed  # the crash happened
        faults.disarm_all()
    _check(out, _expected(source, epochs))


def test_checkpoints_record_the_ttl_clocks(tmp_path) -> None:
    source = probe_source(3)
    job = _job(TtlProbe(), source, parallelism=1)
    runner = JobRunner(job, None, str(tmp_path / "store"), clock=lambda: 7.0)
    r = runner.run(max_epochs=1)[0]
    (manifest_key,) = runner.latest().operators[TtlProbe.name].values()
    f = load_manifest(runner.store, manifest_key).compaction_filter
    assert f is not None and dict(f.clocks) == {0x02: r.watermark, 0x03: 7_000}
    runner.close()


def test_ttl_state_on_spark_equals_model(spark, tmp_path) -> None:
    # Both forms on Spark in one run: the per-event form, then after a restart with 3
    # tasks instead of 2 (a rescale) the vectorised one, over the same state.
    source = probe_source(8)
    out, epochs = _run(_job(TtlProbe(), source), str(tmp_path / "store"), spark=spark, restart_at=4,
                       then=TtlProbeBatch())
    _check(out, _expected(source, epochs))


def test_remote_compaction_drops_a_jobs_expired_state_physically(tmp_path) -> None:
    # A live job (its watermark stays finite) with no inline compaction: its last
    # checkpoint's tables hold expired entries; a remote full compaction of each range
    # (what the Dagster op runs) drops exactly those, at the clocks the task recorded.
    source = probe_source(EPOCHS, seed=3, bounded=False)
    job = _job(TtlProbe(), source)
    lazy = DKVOptions(**{**SMALL.__dict__, "max_inline_compaction_bytes": 0})
    now = [1.0]
    runner = JobRunner(job, None, str(tmp_path / "store"), dkv_options=lazy, clock=lambda: now[0])
    for _ in range(EPOCHS):
        now[0] += 1.0
        runner.run(max_epochs=1)
    ckpt = runner.latest()
    dropped = kept = 0
    for label, manifest_key in ckpt.operators[TtlProbe.name].items():
        prefix = paths.state_prefix(job.prefix, TtlProbe.name, label, ckpt.layout)
        f = load_manifest(runner.store, manifest_key).compaction_filter
        db = DKV.open(runner.store, prefix, manifest_key, lazy)
        db.flush_memtable()  # every entry in a table, for the count
        before = dict(db.scan_range(b"", None))
        expired = {k for k, v in before.items() if f.expired(k, v)}
        base = db.checkpoint("flushed")
        assert compact_checkpoint(runner.store, prefix, base, lazy, full=True) is not None
        assert db.install_pending_compactions()["installed"] == 1
        assert sum(t.entries for t in db.levels.all_tables()) == len(before) - len(expired)
        assert dict(db.scan_range(b"", None)) == {k: v for k, v in before.items() if k not in expired}
        dropped, kept = dropped + len(expired), kept + len(before) - len(expired)
        db.close()
    assert dropped > 0 and kept > 0
    runner.close()


def test_state_reader_shows_ttl_state_with_its_expiry(tmp_path) -> None:
    source = probe_source(3)
    job = _job(TtlProbe(), source)
    with JobRunner(job, None, str(tmp_path / "store"), clock=lambda: 5.0) as runner:
        results = runner.run(max_epochs=2)
        table = read_state(runner.store, job, "last").to_pylist()
        procs = read_state(runner.store, job, "proc").to_pylist()
    events = source.tables["p0"].slice(0, 2 * EVENTS_PER_EPOCH).to_pylist()
    newest = {e["key"]: e["v"] for e in events}  # keys of epoch 2 written last
    assert {r["subject_key"]: r["value"] for r in table} == newest
    first = {e["key"] for e in events[:EVENTS_PER_EPOCH]} - {e["key"] for e in events[EVENTS_PER_EPOCH:]}
    for r in table:  # written in epoch 1 or 2: the watermark that epoch reached, plus the TTL
        assert r["expiry"] == results[0 if r["subject_key"] in first else 1].watermark + TTL_MS
    assert {r["expiry"] for r in procs} == {5_000 + PROC_TTL_MS}
