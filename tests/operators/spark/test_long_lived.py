"""Long-lived tasks (``dkvstream.operators.spark.long_lived``): a run's epochs on one
barrier Spark job, each compared with a pandas oracle; a task killed at a point of an
epoch restarts the stage and the epoch, exactly once."""
from __future__ import annotations

import os
import signal
import threading

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.spark import long_lived
from dkvstream.operators.spark.long_lived import owner
from dkvstream.storage import faults
from tests.operators import live_sources
from tests.operators.live_sources import EVENTS, reveal
from tests.operators.runtime import test_chain as chain


def _all_visible(n: int = EVENTS) -> dict[str, int]:
    return {"p0": n, "p1": n}


def _assert_output_is_oracle(runner: JobRunner) -> None:
    got = live_sources.output(runner)
    want = live_sources.oracle(runner.job.source, runner.latest().watermark)
    assert len(want) > 0
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


@given(st.integers(1, 256).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, p))))
def test_owner_gives_each_task_a_contiguous_share(pw) -> None:
    """Every range has one owner; owners never decrease along the ranges (contiguous
    shares); every task owns a share, and shares differ by at most one range."""
    p, w = pw
    owners = [owner(r, p, w) for r in range(p)]
    assert owners == sorted(owners) and set(owners) == set(range(w))
    sizes = [owners.count(i) for i in range(w)]
    assert max(sizes) - min(sizes) <= 1


def test_continuous_run_on_long_lived_tasks_equals_oracle(spark, tmp_path) -> None:
    """A continuous run on long-lived tasks (the default on Spark): events revealed while
    it waits are read as they arrive, each once: output = oracle."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible(500))
    runner = JobRunner(live_sources.job(visible), spark, str(tmp_path))
    caught_up = threading.Event()

    def produce() -> None:
        for n in range(1_000, EVENTS + 1, 500):
            caught_up.wait(120)
            caught_up.clear()
            reveal(visible, _all_visible(n))

    producer = threading.Thread(target=produce)
    producer.start()
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.source_offsets == _all_visible(EVENTS):
            runner.stop()
        elif result.source_offsets == live_sources.json.loads(visible.read_text()):
            caught_up.set()
    producer.join(60)
    assert sum(r.events for r in results) == 2 * EVENTS
    ckpt = runner.latest()
    assert {k: ckpt.metrics["long_lived_tasks"][k] for k in ("tasks", "restarts")} == {"tasks": 2, "restarts": 0}
    _assert_output_is_oracle(runner)


@pytest.mark.parametrize("point", ["epoch_planned", "after_tasks"])
def test_a_killed_task_restarts_the_stage_and_the_epoch(spark, tmp_path, point) -> None:
    """A long-lived task's process killed with SIGKILL at ``point`` of epoch 3 (before it
    read, or after its operators ran and before the commit): Spark restarts the barrier
    stage, the epoch runs again from the last checkpoint, and every event counts once."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible())
    runner = JobRunner(live_sources.job(visible), spark, str(tmp_path))
    killed: list[int] = []

    def kill(point, epoch) -> None:
        pid = runner._tasks.pids[1]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    faults.arm(point, action=kill, epoch=3)
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.source_offsets == _all_visible():
            runner.stop()
    assert len(killed) == 1, "the kill did not land"
    assert sum(r.events for r in results) == 2 * EVENTS
    assert [r.epoch for r in results] == list(range(1, len(results) + 1))
    assert runner.latest().metrics["long_lived_tasks"]["restarts"] == 1
    _assert_output_is_oracle(runner)


def _read_ahead(runner: JobRunner) -> list[bool]:
    """Per committed epoch: was it read while the epoch before ran (pipelining)?"""
    from dkvstream.operators.runtime.checkpoints import read_checkpoint

    return [read_checkpoint(runner.store, runner.job.prefix, e).metrics["long_lived_tasks"]["read_ahead"]
            for e in range(1, runner.latest().epoch + 1)]


def test_two_operators_with_uneven_shares_on_long_lived_tasks(spark, tmp_path) -> None:
    """Three ranges on two tasks, an intermediate operator whose output is exchanged
    between the tasks over Flight, and every epoch after the first read while the one
    before ran (a bounded run: its trigger is always due): output = pandas oracle."""
    job = chain._job(parallelism=3)
    runner = JobRunner(job, spark, str(tmp_path / "store"), retain_checkpoints=None)
    assert len(runner.run()) >= 5
    chain._check(job, runner)
    assert runner.latest().metrics["long_lived_tasks"]["tasks"] == 2
    assert _read_ahead(runner) == [False] + [True] * (runner.latest().epoch - 1)


@pytest.mark.parametrize("drain", [False, True], ids=["stop", "drain"])
def test_a_stop_discards_the_epoch_read_ahead(spark, tmp_path, drain) -> None:
    """``stop()`` after epoch 2 while epoch 3 is being read ahead: epoch 3 is not run (a
    drain epoch, which reads nothing, runs in its place when asked for); a restart reads
    epoch 3's events again, each once: output = oracle."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible())
    job = live_sources.job(visible, trigger_interval_ms=0)
    runner = JobRunner(job, spark, str(tmp_path), retain_checkpoints=None)
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.epoch == 2:
            assert runner._ahead is not None and runner._ahead.epoch == 3
            runner.stop(drain=drain)
    assert [r.epoch for r in results] == [1, 2, 3] if drain else [1, 2]
    assert results[-1].drained == drain
    if drain:
        assert results[-1].events == 0
        return
    rest = JobRunner(live_sources.job(visible), spark, str(tmp_path)).run()
    assert rest[0].epoch == 3 and sum(r.events for r in results + rest) == 2 * EVENTS
    _assert_output_is_oracle(runner)


def test_a_failed_task_runs_the_epoch_again(spark, tmp_path, monkeypatch) -> None:
    """With 4 attempts per task (``spark.task.maxFailures``' part), every epoch's first
    attempt fails in a task and the epoch runs again from the last checkpoint: each
    event counts once, output = oracle."""
    monkeypatch.setattr(long_lived, "task_attempts", lambda sc: 4)
    marks = tmp_path / "marks"
    marks.mkdir()
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible())
    job = live_sources.job(visible)
    job.operators = [live_sources.FailsOnceInEachTask(str(marks))]
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    results = runner.run()
    assert sum(r.events for r in results) == 2 * EVENTS
    assert len(list(marks.iterdir())) >= len(results)  # at least one failure per epoch
    assert runner.latest().metrics["long_lived_tasks"]["restarts"] == 0
    _assert_output_is_oracle(runner)


def test_task_attempts_follow_spark() -> None:
    class Conf:
        def __init__(self, conf: dict) -> None:
            self.conf = conf

        def get(self, key: str, default: str) -> str:
            return self.conf.get(key, default)

    class Context:
        def __init__(self, master: str, conf: dict | None = None) -> None:
            self.master, self._conf = master, Conf(conf or {})

        def getConf(self) -> Conf:
            return self._conf

    assert long_lived.task_attempts(Context("local[2]")) == 1
    assert long_lived.task_attempts(Context("local")) == 1
    assert long_lived.task_attempts(Context("local[2,4]")) == 4
    assert long_lived.task_attempts(Context("spark://h:7077")) == 4
    assert long_lived.task_attempts(Context("spark://h:7077", {"spark.task.maxFailures": "2"})) == 2
