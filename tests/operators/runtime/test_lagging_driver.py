"""A driver that falls behind another by more than ``retain_checkpoints`` epochs: the
other's retention deleted the files of the checkpoint it started from, so its tasks fail
reading them. It must stop with ``JobFencedError`` (what happened), not a not-found
``JobFailedError``, and publish nothing. In process: the interleaving is exact."""
from __future__ import annotations

import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.driver import JobFailedError, JobFencedError, JobRunner
from dkvstream.storage.errors import ObjectNotFoundError


def _runner(root: str) -> JobRunner:
    return JobRunner(flights_job(events_per_epoch=20_000, parallelism=2), None, root, retain_checkpoints=1)


def _fall_behind(lagging: JobRunner, ahead: JobRunner, epochs: int) -> None:
    """Make ``ahead`` commit ``epochs`` epochs after ``lagging`` planned its next one."""
    read = lagging._read_events

    def read_after_the_other_ran(plan, epoch):
        ahead.run(max_epochs=epochs)
        return read(plan, epoch)

    lagging._read_events = read_after_the_other_ran


def test_driver_lagging_past_retention_is_fenced(tmp_path) -> None:
    root = str(tmp_path / "store")
    _runner(root).run(max_epochs=1)
    lagging, ahead = _runner(root), _runner(root)
    _fall_behind(lagging, ahead, epochs=3)  # epochs 2-4; retention keeps only epoch 4
    with pytest.raises(JobFencedError) as err:
        next(lagging.epochs())
    message = str(err.value)
    assert "epoch 2 was committed by another driver" in message, message
    assert "the newest checkpoint is" in message and "checkpoints/epoch-0000000004.json" in message, message
    assert "from epoch 1" in message, message
    assert "not found" in message, message  # the tasks' own error, for the operator
    latest = latest_checkpoint(ahead.store, ahead.job.prefix)
    assert latest.epoch == 4  # the lagging driver committed nothing
    # ... and the job goes on from the other driver's checkpoint.
    assert next(_runner(root).epochs()).epoch == 5


def test_failed_epoch_nobody_committed_stays_a_job_failure(tmp_path) -> None:
    """The same task error with no other driver: the state is lost, not overtaken."""
    root = str(tmp_path / "store")
    _runner(root).run(max_epochs=1)
    runner = _runner(root)
    read = runner._read_events

    def read_after_losing_a_manifest(plan, epoch):
        ckpt = latest_checkpoint(runner.store, runner.job.prefix)
        runner.store.delete(next(iter(ckpt.operators["route_daily_delays"].values())))
        return read(plan, epoch)

    runner._read_events = read_after_losing_a_manifest
    with pytest.raises(JobFailedError) as err:
        next(runner.epochs())
    assert not isinstance(err.value, JobFencedError)
    assert ("epoch 2 failed in operator route_daily_delays: ObjectNotFoundError: object not found"
            in str(err.value))
    # The task's error is the cause, and says whether running the epoch again may help.
    assert isinstance(err.value.__cause__, ObjectNotFoundError) and not err.value.retryable
