"""Failed, retried and duplicated task attempts leave no trace in committed output.

Every task writes its DKV files and staged output under names unique to its attempt,
and only the files named by the driver's commit count (docs/design.md, step 3). Checked by:

* a driver on Spark ``local[2,4]`` (4 attempts per task) whose operator fails every
  task's first attempt, half of them after the attempt wrote its staged files and DKV
  manifest (slow: the subprocess starts its own Spark session, since the shared
  ``local[2]`` session allows one attempt);
* duplicate attempts in-process: every task runs twice, as a speculative copy would,
  and a random one of the two results is committed.

Spark's own speculation never launches a copy on the host of the running attempt, so
it cannot be exercised in local mode; the duplicate-attempt test stands in for it.
"""
from __future__ import annotations

import pytest

from dkvstream.operators.runtime import exchange as runtime
from dkvstream.operators.runtime.cleanup import cleanup_job
from tests.reliability import harness


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> harness.Reference:
    return harness.reference_run(tmp_path_factory.mktemp("reference"))


def test_duplicate_attempts_leave_no_trace(reference, tmp_path, monkeypatch) -> None:
    rnd, seed = harness.rng("duplicates")
    print(f"seed {seed}")
    real = runtime.run_task
    chosen = []

    def twice(*args, **kwargs):
        first, second = real(*args, **kwargs), real(*args, **kwargs)
        assert first.manifest_key != second.manifest_key  # attempts never share a file name
        chosen.append(rnd.random() < 0.5)
        return first if chosen[-1] else second

    monkeypatch.setattr(runtime, "run_task", twice)
    store = str(tmp_path / "store")
    r = harness.runner(store)
    for res in r.epochs():
        assert harness.state(r.store, r.job.prefix, res.epoch) == reference.states[res.epoch]
        harness.assert_named_files_exist(r.store, r.job.prefix)
    assert len(chosen) == 2 * reference.epochs and 0 < sum(chosen) < len(chosen)
    monkeypatch.setattr(runtime, "run_task", real)
    harness.check_recovery(store, reference)  # output equals the oracle, state the reference
    # The full sweep (the Dagster cleanup op; the driver's every ``full_sweep_every`` epochs)
    # collects the unnamed attempts' files, which no checkpoint records: only retained
    # checkpoints' staged files stay.
    report = cleanup_job(r.store, r.job.prefix, harness.RETAIN, concurrent=True)
    assert report.files_deleted >= len(chosen) // 2 and not report.deferred
    staged = r.store.list(f"{r.job.prefix}/staging/")
    named = {k for e in r.latest().outputs.values() for k in e}
    assert len(staged) <= harness.RETAIN * len(named), staged


@pytest.mark.slow
def test_failed_first_attempts_on_spark_are_retried(reference, tmp_path) -> None:
    failures = tmp_path / "failed-attempts"
    failures.mkdir()
    store = str(tmp_path / "store")
    run = harness.run_driver({"store": store, "spark": "local[2,4]", "fail_first_attempt": str(failures)},
                             tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = sorted(p.name for p in failures.iterdir())
    # Every epoch's stage had 2 tasks and both first attempts failed.
    assert len(failed) == 2 * reference.epochs, failed
    assert "injected failure of attempt 0" in run.stderr  # Spark logged the lost attempts
    harness.check_recovery(store, reference)
    harness.assert_named_files_exist(harness.runner(store).store, harness.job().prefix)
