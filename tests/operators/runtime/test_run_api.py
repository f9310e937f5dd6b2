"""``JobRunner.run()`` runs the job (as the README shows it) and returns the committed
epochs; ``epochs()`` yields each as it commits.
Oracle: the checkpoints in the store and the pandas answer of the keyed counting job."""

from __future__ import annotations

from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.driver import EpochResult
from tests.operators import small_keyed_count as small


def test_run_runs_the_job_and_returns_every_epoch(tmp_path) -> None:
    runner = small.runner(str(tmp_path))
    results = runner.run()
    assert isinstance(results, list) and all(isinstance(r, EpochResult) for r in results)
    assert [r.epoch for r in results] == list(range(1, 9))
    assert results[-1].finished and runner.latest().epoch == 8
    small.assert_output_exact(runner, "run()")
    assert runner.run() == []  # finished: nothing more to do


def test_run_stops_after_max_epochs(tmp_path) -> None:
    runner = small.runner(str(tmp_path))
    assert [r.epoch for r in runner.run(max_epochs=3)] == [1, 2, 3]
    assert runner.latest().epoch == 3
    assert [r.epoch for r in runner.run(max_epochs=2)] == [4, 5]


def test_epochs_yields_each_epoch_as_it_commits(tmp_path) -> None:
    runner = small.runner(str(tmp_path))
    it = runner.epochs()
    assert list_epochs(runner.store, runner.job.prefix) == []  # lazy: nothing ran yet
    first = next(it)
    assert first.epoch == 1 and list_epochs(runner.store, runner.job.prefix) == [1]
    assert [r.epoch for r in it] == list(range(2, 9))
