"""Crash and restart: exactly-once output and state equal to a run that never crashed.

A driver crash is simulated at each step of the commit protocol: after epoch k
committed (stop), after the tasks of epoch k finished but before its commit, and after
the commit but before the sink files were published.
"""
from __future__ import annotations

import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import checkpoint_entries
from tests.crashes import Crash, crash_at

EPOCH_EVENTS = 50_000  # 8 epochs over the full data set


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """One uninterrupted in-process run: its store and the state at each epoch."""
    job = flights_job(events_per_epoch=EPOCH_EVENTS)
    root = str(tmp_path_factory.mktemp("clean"))
    runner = JobRunner(job, None, root)
    results = runner.run()
    state = {r.epoch: _state(runner, r.epoch) for r in results}
    return job, runner, state


def _state(runner: JobRunner, epoch: int) -> list:
    return [(op, label, k, v) for op, label, k, v in checkpoint_entries(runner.store, runner.job.prefix, epoch)]


@pytest.mark.parametrize("point,epoch", [
    ("stop", 1), ("stop", 4), ("after_tasks", 3), ("after_tasks", 8), ("after_commit", 2), ("after_commit", 8),
])
def test_crash_then_restart_is_exactly_once(point, epoch, tmp_path, clean_run, check_flights_output) -> None:
    job, clean, clean_state = clean_run
    root = str(tmp_path / "store")
    if point == "stop":
        JobRunner(job, None, root).run(max_epochs=epoch)
        committed = epoch
    else:
        with crash_at(point, epoch), pytest.raises(Crash):
            JobRunner(job, None, root).run()
        committed = epoch if point == "after_commit" else epoch - 1
    restarted = JobRunner(job, None, root)
    latest = restarted.latest()
    assert (latest.epoch if latest else 0) == committed
    if committed:
        assert _state(restarted, committed) == clean_state[committed], "restored state differs"

    rest = restarted.run()
    assert [r.epoch for r in rest] == list(range(committed + 1, max(clean_state) + 1))
    check_flights_output(job.sinks["main"].read(restarted.store, job.prefix))
    assert _state(restarted, max(clean_state)) == clean_state[max(clean_state)]


def test_restart_on_spark_after_tasks_before_commit(spark, tmp_path, clean_run, check_flights_output) -> None:
    job, _, clean_state = clean_run
    root = str(tmp_path / "store")
    with crash_at("after_tasks", 4), pytest.raises(Crash):
        JobRunner(job, spark, root).run()
    runner = JobRunner(job, spark, root)
    assert runner.latest().epoch == 3
    assert _state(runner, 3) == clean_state[3], "state written by Spark tasks differs from in-process state"
    runner.run()
    check_flights_output(job.sinks["main"].read(runner.store, job.prefix))


def test_incompatible_restart_is_refused(tmp_path) -> None:
    root = str(tmp_path / "store")
    JobRunner(flights_job(events_per_epoch=EPOCH_EVENTS), None, root).run(max_epochs=1)
    with pytest.raises(Exception, match="key_groups"):
        JobRunner(flights_job(events_per_epoch=EPOCH_EVENTS, key_groups=128), None, root).run()
