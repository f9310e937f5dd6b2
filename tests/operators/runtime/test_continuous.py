"""Continuous runs on a live source: ``JobRunner.epochs(continuous=True)``, the
processing-time trigger, ``JobRunner.stop()`` and ``run_job --continuous``.

The live source is ``tests.operators.live_sources.GrowingSource`` (events revealed by
the test); outputs are compared with the pandas oracle of the revealed events,
restricted to the windows the final watermark closed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.live import NO_INPUT_POLL_MS, ProcessingTimeTrigger, StopRequest
from dkvstream.storage import faults
from tests.operators import live_sources
from tests.operators import small_keyed_count as small
from tests.operators.live_sources import EVENTS, reveal

REPO = Path(__file__).resolve().parents[3]


def _all_visible(n: int = EVENTS) -> dict[str, int]:
    return {"p0": n, "p1": n}


def _assert_output_is_oracle(runner: JobRunner) -> None:
    ckpt = runner.latest()
    got = live_sources.output(runner)
    want = live_sources.oracle(runner.job.source, ckpt.watermark)
    assert len(want) > 0
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_trigger_fires_at_most_once_per_interval() -> None:
    """Spark's processing-time trigger: an epoch shorter than the interval waits for
    the rest of it, a longer one is followed at once; with no input the next look is
    an interval later, and never sooner than NO_INPUT_POLL_MS (interval 0)."""
    clock = FakeClock()
    trigger = ProcessingTimeTrigger(1_000, clock)
    assert trigger.seconds_to_next() == 0.0  # the first epoch starts at once
    trigger.fire()
    clock.now += 0.25  # a 250 ms epoch (binary fractions: exact)
    assert trigger.seconds_to_next() == 0.75
    clock.now += 0.75
    trigger.fire()
    clock.now += 3.0  # a 3 s epoch: the next starts right away
    assert trigger.seconds_to_next() == 0.0
    trigger.fire()
    trigger.nothing_new()
    assert trigger.seconds_to_next() == 1.0

    eager = ProcessingTimeTrigger(0, clock)
    eager.fire()
    assert eager.seconds_to_next() == 0.0
    eager.fire()
    eager.nothing_new()
    assert eager.seconds_to_next() == pytest.approx(NO_INPUT_POLL_MS / 1000)
    eager.fire()  # found input again: no wait
    assert eager.seconds_to_next() == 0.0


def test_stop_request_wakes_a_waiter_from_another_thread() -> None:
    stop = StopRequest()
    assert stop.wait(0) is False
    waiter = threading.Thread(target=lambda: results.append(stop.wait(600)))
    results: list[bool] = []
    waiter.start()
    stop.request()
    waiter.join(60)
    assert results == [True]
    assert stop.wait(600) is True  # stays stopped, returns at once


def test_continuous_run_reads_events_as_they_arrive(tmp_path) -> None:
    """A producer thread reveals 500 events per partition at a time while the run is
    caught up and waiting; the run picks each batch up, and once everything is read
    the consumer stops it: output = oracle, every event read exactly once."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible(500))
    runner = JobRunner(live_sources.job(visible), None, str(tmp_path))
    caught_up = threading.Event()

    def produce() -> None:
        for n in range(1_000, EVENTS + 1, 500):
            caught_up.wait(60)
            caught_up.clear()
            reveal(visible, _all_visible(n))

    producer = threading.Thread(target=produce)
    producer.start()
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.source_offsets == _all_visible(EVENTS):
            runner.stop()
        elif result.source_offsets == json.loads(visible.read_text()):
            caught_up.set()  # read all visible: reveal more
    producer.join(60)
    assert sum(r.events for r in results) == 2 * EVENTS
    assert [r.epoch for r in results] == list(range(1, len(results) + 1))
    assert not any(r.finished for r in results)
    _assert_output_is_oracle(runner)


class _CountingSource(live_sources.GrowingSource):
    """Sets ``looked_twice`` on its second ``end_offsets`` call (the run planned, found
    nothing new, and planned again: it is in its trigger loop)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls = 0
        self.looked_twice = threading.Event()

    def end_offsets(self) -> dict[str, int]:
        self.calls += 1
        if self.calls >= 2:
            self.looked_twice.set()
        return super().end_offsets()


def test_stop_while_waiting_for_input_returns_without_an_epoch(tmp_path) -> None:
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible(300))
    job = live_sources.job(visible)
    assert len(JobRunner(job, None, str(tmp_path)).run()) == 1  # caught up at epoch 1
    job.source = _CountingSource(visible)
    runner = JobRunner(job, None, str(tmp_path))
    results: list = []
    loop = threading.Thread(target=lambda: results.extend(runner.epochs(continuous=True)))
    loop.start()
    assert job.source.looked_twice.wait(60)
    runner.stop()
    loop.join(60)
    assert not loop.is_alive() and results == []
    assert runner.latest().epoch == 1


def test_stop_during_an_epoch_lets_it_commit_and_ends_the_run(tmp_path) -> None:
    """stop() arriving while epoch 2's tasks are done (before its commit): epoch 2
    commits, publishes and is yielded, no epoch 3 starts; a restart continues from it."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible())
    root = str(tmp_path)

    runner = JobRunner(live_sources.job(visible), None, root)
    faults.arm("after_tasks", action=lambda point, epoch: runner.stop(), epoch=2)
    results = list(runner.epochs(continuous=True))
    assert [r.epoch for r in results] == [1, 2]
    assert latest_checkpoint(runner.store, runner.job.prefix).source_offsets == results[-1].source_offsets
    assert runner.run() == []  # a stopped runner stays stopped

    again = JobRunner(live_sources.job(visible), None, root)
    rest = again.run()
    assert rest[0].epoch == 3
    assert sum(r.events for r in results + rest) == 2 * EVENTS
    _assert_output_is_oracle(again)


def test_continuous_run_of_a_bounded_source_ends_when_finished(tmp_path) -> None:
    results = list(small.runner(str(tmp_path)).epochs(continuous=True))
    assert len(results) == small.EPOCHS and results[-1].finished
    small.assert_output_exact(small.runner(str(tmp_path)), "continuous run of a bounded source")


def test_run_job_continuous_stops_cleanly_on_sigterm(tmp_path) -> None:
    """``run_job --continuous --in-process`` on a live source: SIGTERM after the first
    committed epoch ends the run after the epoch in flight with exit 0; the last epoch
    printed is the newest checkpoint, and a restart continues from it to the oracle."""
    visible = tmp_path / "visible.json"
    reveal(visible, _all_visible())
    root = str(tmp_path / "store")
    env = {**os.environ, live_sources.VISIBLE_FILE_ENV: str(visible),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dkvstream.operators.tools.run_job", "--job", "tests.operators.live_sources:live_job",
         "--store", root, "--create-store", "--in-process", "--continuous", "--events-per-epoch", "300", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == "committed":
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines += [json.loads(line) for line in out.splitlines()]
    committed = [r["epoch"] for r in lines if r["event"] == "committed"]
    assert all(set(r["live"]["lag_events"]) == {"p0", "p1"} for r in lines if r["event"] == "committed")
    assert committed == list(range(1, len(committed) + 1))
    assert lines[-1] == {"event": "stopped", "epoch": committed[-1], "drained": False}
    assert "SIGTERM" in err
    runner = JobRunner(live_sources.job(visible), None, root)
    assert runner.latest().epoch == committed[-1]
    rest = runner.run()
    assert rest and rest[0].epoch == committed[-1] + 1  # a whole run has 20 epochs of 300
    _assert_output_is_oracle(runner)
