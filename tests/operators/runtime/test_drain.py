"""Stopping with a drain (``JobRunner.stop(drain=True)``, ``run_job --drain-on-stop``),
end offsets that go backwards, and ``Source.close``.

The live source is ``tests.operators.live_sources.GrowingSource``; the oracle is the
pandas keyed count over the events read. Without a drain a live job emits only the
windows its watermark closed; with one, every window of the events read."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dkvstream.examples.keyed_count import WINDOW_MS, keyed_count_oracle
from dkvstream.operators.api.operator import WATERMARK_MAX
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage import faults
from tests.operators import live_sources
from tests.operators.live_sources import EVENTS, reveal

REPO = Path(__file__).resolve().parents[3]
ALL = {"p0": EVENTS, "p1": EVENTS}


def _oracle_of_read(source: live_sources.GrowingSource, offsets: dict[str, int],
                    watermark: int = WATERMARK_MAX) -> pd.DataFrame:
    """The keyed count over the first ``offsets[p]`` events of each partition, the
    windows closed by ``watermark``."""
    want = keyed_count_oracle(live_sources._Prefix(source.data, offsets))
    want = want[want.window_start + WINDOW_MS <= watermark]
    return want.sort_values(["key", "window_start"]).reset_index(drop=True)


def _assert_output(runner: JobRunner, want: pd.DataFrame) -> None:
    assert len(want) > 0
    pd.testing.assert_frame_equal(live_sources.output(runner), want, check_dtype=False)


def test_drain_emits_every_window_of_the_events_read(tmp_path) -> None:
    """A continuous run catches up; stop(drain=True) commits one more epoch that reads
    nothing, at watermark +infinity: the output then equals the oracle over all events,
    the last windows included (before the drain they were missing)."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)
    runner = JobRunner(live_sources.job(visible), None, str(tmp_path))
    results = []
    before_drain = None
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.source_offsets == ALL and not result.drained:
            before_drain = live_sources.output(runner)
            runner.stop(drain=True)
    last = results[-1]
    assert [r.drained for r in results] == [False] * (len(results) - 1) + [True]
    assert last.finished and last.events == 0 and last.watermark == WATERMARK_MAX
    assert last.source_offsets == ALL and last.live["lag_events"] == {"p0": 0, "p1": 0}
    ckpt = runner.latest()
    assert ckpt.finished and ckpt.metrics["drained"] is True and ckpt.watermark == WATERMARK_MAX
    want = _oracle_of_read(runner.job.source, ALL)
    assert len(before_drain) < len(want)  # the drain emitted the windows still open
    _assert_output(runner, want)


def test_restart_of_a_drained_job_runs_no_epoch_and_says_so(tmp_path, caplog) -> None:
    """A drained job is finished: a new driver, with new events in the source, runs no
    epoch, reads nothing, warns naming the job, and the output stays the drained one."""
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 1_000, "p1": 1_000})
    first = JobRunner(live_sources.job(visible), None, str(tmp_path))
    first.stop(drain=True)  # asked before the run: it drains at once, reading nothing
    assert [(r.epoch, r.events, r.drained) for r in first.run()] == [(1, 0, True)]
    assert first.latest().source_offsets == {"p0": 0, "p1": 0}

    reveal(visible, ALL)
    again = JobRunner(live_sources.job(visible), None, str(tmp_path))
    with caplog.at_level(logging.WARNING, "dkvstream.operators.runtime.driver"):
        assert again.run() == []
        assert list(again.epochs(continuous=True)) == []
    assert "growing_count was drained at epoch 1" in caplog.text
    assert again.latest().epoch == 1
    assert live_sources.output(again).empty


def test_drain_asked_during_an_epoch_leaves_the_rest_unread(tmp_path, caplog) -> None:
    """stop(drain=True) while epoch 2 runs: epoch 2 commits, then the drain epoch 3; the
    events after epoch 2's offsets stay unread (lag metric, warning), and the output is
    every window of the events read."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)

    runner = JobRunner(live_sources.job(visible), None, str(tmp_path))
    faults.arm("after_tasks", action=lambda point, epoch: runner.stop(drain=True), epoch=2)
    with caplog.at_level(logging.WARNING, "dkvstream.operators.runtime.driver"):
        results = list(runner.epochs(continuous=True))
    assert [(r.epoch, r.drained) for r in results] == [(1, False), (2, False), (3, True)]
    read = results[1].source_offsets
    assert results[2].source_offsets == read and results[2].events == 0
    assert results[2].live["lag_events"] == {p: EVENTS - read[p] for p in read}
    assert "draining leaves unread" in caplog.text
    _assert_output(runner, _oracle_of_read(runner.job.source, read))


def test_drain_while_waiting_for_the_trigger(tmp_path) -> None:
    """A caught-up continuous run waits for input; stop(drain=True) from another thread
    wakes it, it drains and returns."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)
    runner = JobRunner(live_sources.job(visible), None, str(tmp_path))
    caught_up = threading.Event()
    results = []

    def run() -> None:
        for r in runner.epochs(continuous=True):
            results.append(r)
            if r.source_offsets == ALL:
                caught_up.set()

    loop = threading.Thread(target=run)
    loop.start()
    assert caught_up.wait(60)
    runner.stop(drain=True)
    loop.join(60)
    assert not loop.is_alive() and results[-1].drained and results[-1].events == 0
    _assert_output(runner, _oracle_of_read(runner.job.source, ALL))


def test_run_job_drain_on_stop(tmp_path) -> None:
    """``run_job --continuous --drain-on-stop``: SIGTERM once caught up ends the run with
    a drain epoch and exit 0; the output is the oracle over every event."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)
    root = str(tmp_path / "store")
    env = {**os.environ, live_sources.VISIBLE_FILE_ENV: str(visible),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dkvstream.operators.tools.run_job", "--job", "tests.operators.live_sources:live_job",
         "--store", root, "--create-store", "--in-process", "--continuous", "--drain-on-stop",
         "--events-per-epoch", "3000", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == "committed" and lines[-1]["source_offsets"] == ALL:
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines += [json.loads(line) for line in out.splitlines()]
    committed = [r for r in lines if r["event"] == "committed"]
    assert committed[-1]["drained"] and committed[-1]["finished"] and committed[-1]["events"] == 0
    assert not any(r["drained"] for r in committed[:-1])
    assert lines[-1] == {"event": "stopped", "epoch": committed[-1]["epoch"], "drained": True}
    assert "draining" in err
    runner = JobRunner(live_sources.job(visible), None, root)
    _assert_output(runner, _oracle_of_read(runner.job.source, ALL))
    # Started again, the drained job runs nothing, says so, and exits 0 at once.
    again = subprocess.run(proc.args, capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert [json.loads(line) for line in again.stdout.splitlines()] == [
        {"event": "stopped", "epoch": committed[-1]["epoch"], "drained": True}]
    assert "was drained at epoch" in again.stderr


def test_drain_on_stop_needs_continuous(capsys) -> None:
    from dkvstream.operators.tools import run_job

    with pytest.raises(SystemExit) as exited:
        run_job.main(["--job", "dkvstream.examples.keyed_count:keyed_count_job", "--in-process", "--drain-on-stop"])
    assert exited.value.code == 2
    assert "--drain-on-stop needs --continuous" in capsys.readouterr().err


class _ShrinkingSource(live_sources.GrowingSource):
    """Reports end offset 0 for p1 while ``shrunk`` is set (Tansu under
    ``read_committed`` with a transaction open; a fresh source object after a restart);
    counts ``close`` calls and records every read."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.shrunk = False
        self.closed = 0
        self.reads: list[tuple[str, int, int]] = []

    def end_offsets(self) -> dict[str, int]:
        ends = super().end_offsets()
        return {**ends, "p1": 0} if self.shrunk else ends

    def read(self, partition, start, end):
        self.reads.append((partition, start, end))
        return super().read(partition, start, end)

    def close(self) -> None:
        self.closed += 1


def test_an_end_offset_below_the_committed_one_reads_nothing_and_warns(tmp_path, caplog) -> None:
    """Offsets never go backwards: while the source says p1 ends at 0, below its
    committed offset, the job reads nothing of p1 (no error, no re-read), warns once
    naming the partition; once the end is back, it reads on from its committed offset."""
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 1_500, "p1": 1_500})
    job = live_sources.job(visible, events_per_epoch=3_000)
    job.source = _ShrinkingSource(visible)
    runner = JobRunner(job, None, str(tmp_path))
    assert runner.run()[-1].source_offsets == {"p0": 1_500, "p1": 1_500}
    job.source.shrunk = True
    reveal(visible, ALL)
    with caplog.at_level(logging.WARNING, "dkvstream.operators.runtime.driver"):
        first = runner.run()
        assert runner.run() == []  # nothing new in p0 now: no epoch, no second warning
    assert [r.source_offsets for r in first] == [{"p0": EVENTS, "p1": 1_500}]
    assert first[0].live["lag_events"] == {"p0": 0, "p1": 0}
    warned = [r.getMessage() for r in caplog.records if "below the committed offset" in r.getMessage()]
    assert len(warned) == 1 and "partition p1" in warned[0] and "end offset 0" in warned[0]
    assert not [r for r in job.source.reads if r[0] == "p1" and r[1] < 1_500 and r[2] > 1_500]

    job.source.shrunk = False
    rest = runner.run()
    assert rest[-1].source_offsets == ALL
    p1_reads = [(s, e) for p, s, e in job.source.reads if p == "p1"]
    assert [s for s, _ in p1_reads[1:]] == [e for _, e in p1_reads[:-1]]  # each offset once
    _assert_output(runner, live_sources.oracle(job.source, rest[-1].watermark))


def test_source_is_closed_when_a_run_ends_and_by_close(tmp_path) -> None:
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 300, "p1": 300})
    job = live_sources.job(visible)
    job.source = _ShrinkingSource(visible)
    runner = JobRunner(job, None, str(tmp_path))
    assert job.source.closed == 0
    runner.run()
    assert job.source.closed == 1  # the run ended: caught up
    runner.run()
    assert job.source.closed == 2  # a run without an epoch closes it too
    reveal(visible, ALL)
    epochs = runner.epochs(continuous=True)
    next(epochs)
    epochs.close()  # the caller left the loop early
    assert job.source.closed == 3
    with runner:
        pass
    assert job.source.closed == 4


@settings(max_examples=10)
@example(visible=(0, 0), events_per_epoch=100, drain_at=2)
@given(visible=st.tuples(st.integers(0, EVENTS), st.integers(0, EVENTS)),
       events_per_epoch=st.integers(100, 4_000), drain_at=st.integers(0, 4))
def test_drain_anywhere_emits_every_window_of_what_was_read(visible, events_per_epoch, drain_at) -> None:
    """Whatever the input and wherever the drain is asked for (before the first epoch,
    or during epoch ``drain_at``): the run ends with one drain epoch that reads nothing,
    and the output is exactly the oracle over the events read (each window once)."""
    offsets = {"p0": visible[0], "p1": visible[1]}
    with tempfile.TemporaryDirectory() as root:
        reveal(Path(root, "visible.json"), offsets)

        job = live_sources.job(Path(root, "visible.json"), events_per_epoch=events_per_epoch,
                               trigger_interval_ms=0)
        runner = JobRunner(job, None, root)
        faults.arm("after_tasks", action=lambda point, epoch: runner.stop(drain=True), epoch=drain_at)
        if drain_at == 0 or not any(visible):
            runner.stop(drain=True)  # (no input: the run would wait for some)
        results = []
        for result in runner.epochs(continuous=True):
            results.append(result)
            if result.source_offsets == offsets and not result.drained:
                runner.stop(drain=True)  # caught up before epoch drain_at
        runner.close()
        faults.disarm("after_tasks")  # not reached if the run caught up first
        assert [r.drained for r in results] == [False] * (len(results) - 1) + [True]
        read = results[-1].source_offsets
        assert results[-1].events == 0 and all(read[p] <= offsets[p] for p in read)
        assert sum(r.events for r in results) == sum(read.values())
        want = _oracle_of_read(job.source, read)
        pd.testing.assert_frame_equal(live_sources.output(runner), want, check_dtype=False)
