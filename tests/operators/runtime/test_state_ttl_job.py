"""State TTL in running jobs: both operator forms, in process across a restart and a
rescale, and on Spark, against a replay model with the TTL rules (tests/operators/ttl_probe.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.dkv.manifest import load_manifest
from tests.operators.ttl_probe import (
    EVENTS_PER_EPOCH,
    SCHEMA,
    TtlProbe,
    TtlProbeBatch,
    probe_model,
    probe_source,
)

EPOCHS = 12


def _job(op, source, parallelism: int = 2) -> Job:
    return Job(name=f"ttl_{type(op).__name__}", source=source, operators=[op],
               sinks={"main": ParquetSink("probe", SCHEMA)}, key_groups=16, parallelism=parallelism,
               events_per_epoch=EVENTS_PER_EPOCH)


def _run(job: Job, root: str, spark=None, restart_at: int | None = None, rescale_to: int = 3):
    """Runs ``job`` to its end, one epoch per processing-time second; with
    ``restart_at``, stops after that many epochs and continues in a new runner with
    ``rescale_to`` tasks. Returns the output and ``(offset, watermark, processing ms)``
    per epoch."""
    now = [0.0]
    epochs = []
    runner = JobRunner(job, spark, root, clock=lambda: now[0])
    while True:
        if restart_at is not None and len(epochs) == restart_at:
            runner.close()
            job = _job(job.operators[0], job.source, rescale_to)
            runner = JobRunner(job, spark, root, clock=lambda: now[0])
            restart_at = None
        now[0] += 1.0
        done = runner.run(max_epochs=1)
        if not done:
            break
        r = done[0]
        epochs.append((r.source_offsets["p0"], r.watermark, int(now[0] * 1000)))
        if r.finished:
            break
    out = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
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


def test_ttl_state_across_a_restart_and_a_rescale(tmp_path) -> None:
    source = probe_source(EPOCHS, seed=1)
    out, epochs = _run(_job(TtlProbeBatch(), source), str(tmp_path / "store"), restart_at=5)
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
    source = probe_source(6)
    out, epochs = _run(_job(TtlProbeBatch(), source), str(tmp_path / "store"), spark=spark)
    _check(out, _expected(source, epochs))
