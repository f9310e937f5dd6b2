"""Processing time: processing-time timers (``Subject.set_processing_timer``,
``BatchContext.set_processing_timers``) checked against a model, across restarts, a
crash, a rescale and Spark; and the watermark of a quiet source (``Job.quiet_timeout_ms``).
Wall clock: a fake one given to ``JobRunner(clock=...)``; nothing sleeps."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.examples.keyed_count import KeyedWindowCount, KeyedWindowCountBatch
from dkvstream.operators.api.keygroups import KeyGroupRange
from dkvstream.operators.api.operator import TimeDomain
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.event_time import EpochPlan, quiet_since, quiet_watermark
from dkvstream.operators.runtime.task import TaskSpec, run_task
from dkvstream.operators.tools.state_reader import list_timers
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at
from tests.operators import live_sources
from tests.operators import processing_time as pt
from tests.operators.live_sources import STEP_MS, reveal

START_S = 1_700_000_000.0


class FakeClock:
    """Wall clock in seconds, moved by the test only."""

    def __init__(self, now: float = START_S) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# (seconds the clock moves, events visible per partition after it). Timers are set
# DELAY_MS = 10 s after an epoch's processing time: some fire at the next step, some
# steps later, some only in an epoch without input (the last steps reveal nothing).
SCRIPT = [(0, 100), (4, 180), (7, 260), (3, 300), (12, 380), (1, 380), (6, 460), (30, 460), (9, 460), (2, 520)]


def _run_script(tmp_path, operator, spark=None, *, restart_every: int | None = None,
                parallelism=(2,), crash_step: int | None = None, script=SCRIPT):
    visible, clock = tmp_path / "visible.json", FakeClock()
    root = str(tmp_path / "store")
    runner, looks = None, []
    for step, (advance_s, n) in enumerate(script):
        clock.now += advance_s
        reveal(visible, {"p0": n, "p1": n})
        if runner is None or (restart_every and step % restart_every == 0):
            if runner is not None:
                runner.close()
            p = parallelism[step % len(parallelism)]
            runner = JobRunner(pt.job(visible, operator, parallelism=p), spark, root, clock=clock,
                               retain_checkpoints=None)
        if step == crash_step:
            # The driver dies after the tasks, before the commit: the epoch is replayed.
            with crash_at("after_tasks", (runner.latest().epoch if runner.latest() else 0) + 1), \
                    pytest.raises(Crash):
                runner.run()
            runner.close()
            runner = JobRunner(pt.job(visible, operator), spark, root, clock=clock, retain_checkpoints=None)
        results = runner.run()
        planned = int(clock.now * 1000)
        if not results:
            latest = runner.latest()
            looks.append((planned, latest.epoch if latest else 0))
        for r in results:  # every epoch of this step was planned at this clock reading
            assert read_checkpoint(runner.store, runner.job.prefix, r.epoch).processing_time_ms == planned
    runner.close()
    return runner, looks


def _check_against_model(runner, looks, exercised: bool = True) -> None:
    want, seen = pt.model(runner, looks)
    # The script exercises every case: timers set, moved (deleted), fired, left pending;
    # and a run without input ran an epoch whenever a timer was due.
    if exercised:
        assert seen["set"] and seen["deleted"] and seen["fired"] and seen["pending"], seen
    assert seen["missed"] == 0, (seen, looks)
    got = pt.output(runner)
    assert len(got) == len(set(got)), "a timer fired twice"
    pd.testing.assert_frame_equal(pt.frame(got), pt.frame(want))
    stamps = [read_checkpoint(runner.store, runner.job.prefix, e).processing_time_ms
              for e in range(1, runner.latest().epoch + 1)]
    assert stamps == sorted(stamps)


@pytest.mark.parametrize("operator", [pt.Timeout(), pt.TimeoutBatch()], ids=["on_event", "batch"])
def test_processing_time_timers_fire_once_in_order_and_deleted_ones_never(tmp_path, operator) -> None:
    runner, looks = _run_script(tmp_path, operator)
    assert looks  # some steps found nothing to do
    _check_against_model(runner, looks)
    latest = runner.latest()
    assert latest.next_processing_timer_ms is not None and latest.next_event_timer_ms is None
    # The state reader lists the pending ones, with their domain.
    pending = list_timers(runner.store, runner.job).to_pydict()
    assert set(pending["domain"]) == {"processing_time"} and len(pending["domain"]) == pt.model(runner)[1]["pending"]
    assert min(t.timestamp() * 1000 for t in pending["timestamp"]) == latest.next_processing_timer_ms


@pytest.mark.parametrize("operator", [pt.Timeout(), pt.TimeoutBatch()], ids=["on_event", "batch"])
def test_processing_time_timers_across_restarts_a_rescale_and_a_crash(tmp_path, operator) -> None:
    """A new runner every other step, alternating 2 and 3 ranges (timers move with their
    key groups), and a driver crash before a commit: the same output as the model."""
    runner, looks = _run_script(tmp_path, operator, restart_every=2, parallelism=(2, 3), crash_step=4)
    _check_against_model(runner, looks)


@pytest.mark.parametrize("operator", [pt.Timeout(), pt.TimeoutBatch()], ids=["on_event", "batch"])
def test_processing_time_timers_on_a_bounded_source(tmp_path, operator) -> None:
    """A bounded source read in 8 epochs while the wall clock moves 2 s per reading:
    timers fire as processing time passes them, and those not due when the input ends
    never fire (processing time does not jump at the end)."""
    from dkvstream.examples.synthetic import SyntheticSource

    job = pt.job(tmp_path / "unused.json", operator, events_per_epoch=100)
    job.source = SyntheticSource(400, 60, partitions=2, step_ms=STEP_MS)  # 400 events per partition
    runner = JobRunner(job, None, str(tmp_path / "s"), clock=SteppingClock(2), retain_checkpoints=None)
    results = runner.run()
    assert len(results) == 8 and results[-1].finished
    _check_against_model(runner, [])
    runner.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 25), st.integers(0, 60)), min_size=1, max_size=8),
       batch=st.booleans(), restart_every=st.sampled_from([None, 2, 3]))
def test_processing_time_timers_match_the_model_on_any_script(tmp_path_factory, steps, batch, restart_every) -> None:
    """Any clock moves and arrivals, either form, restarts with 2 or 3 ranges."""
    script, n = [], 0
    for advance_s, more in steps:
        n += more
        script.append((advance_s, n))
    runner, looks = _run_script(tmp_path_factory.mktemp("script"), pt.TimeoutBatch() if batch else pt.Timeout(),
                                restart_every=restart_every, parallelism=(2, 3), script=script)
    if runner.latest() is not None:
        _check_against_model(runner, looks, exercised=False)


def test_timers_fire_by_processing_time_in_timestamp_order_within_an_epoch(tmp_path) -> None:
    """Within an epoch, ``on_timer_expired`` sees processing-time timers in timestamp
    order, after the event-time ones, with ``subject.time_domain`` set."""
    class Recorder(pt.Timeout):
        fired: list = []

        def on_event(self, subject, event):
            subject.set_processing_timer(event.value["amount"])
            subject.set_timer(event.timestamp)
            if event.value["amount"] == 30:
                subject.delete_processing_timer(30)

        def on_timer_expired(self, subject, timestamp):
            Recorder.fired.append((subject.time_domain, timestamp, subject.key))

    events = pa.table({"amount": pa.array([50, 20, 30, 10, 70], pa.int64()),
                       "key": pa.array([b"a", b"b", b"c", b"d", b"e"]),
                       "timestamp": pa.array([5, 4, 3, 2, 1], pa.int64()),
                       "_part": pa.array([0] * 5, pa.int32()), "_offset": pa.array(range(5), pa.int64()),
                       "_kg": pa.array([0] * 5, pa.int32()), "_range": pa.array([0] * 5, pa.int32())})
    spec = TaskSpec(job_prefix="jobs/t", epoch=1, op_index=0, range_index=0, key_group_range=KeyGroupRange(0, 4),
                    manifest_key=None, watermark_before=0, watermark_after=3, processing_time=60)
    run_task(Recorder(), spec, events, open_object_store(str(tmp_path)), {"main": None})
    assert Recorder.fired == [
        (TimeDomain.EVENT_TIME, 1, b"e"), (TimeDomain.EVENT_TIME, 2, b"d"), (TimeDomain.EVENT_TIME, 3, b"c"),
        (TimeDomain.PROCESSING_TIME, 10, b"d"), (TimeDomain.PROCESSING_TIME, 20, b"b"),
        (TimeDomain.PROCESSING_TIME, 50, b"a")]


def test_processing_time_timers_on_spark_with_task_retries_and_a_rescale(spark, tmp_path, monkeypatch) -> None:
    """Long-lived tasks on local[2]; with 4 attempts per task, every task fails once and
    its epoch is rerun (the same processing time, the same timers); a restart with 3
    ranges."""
    from dkvstream.operators.spark import long_lived

    monkeypatch.setattr(long_lived, "task_attempts", lambda sc: 4)
    log_dir = tmp_path / "marks"
    log_dir.mkdir()
    runner, looks = _run_script(tmp_path, pt.TimeoutFailsOnce(str(log_dir)), spark, restart_every=4,
                                parallelism=(2, 3))
    assert len(list(log_dir.iterdir())) >= len(SCRIPT) - len(looks)  # a failed attempt per epoch with input
    _check_against_model(runner, looks)


# ------------------------------------------------------------------ quiet source
QUIET_MS = 60_000


def test_quiet_source_emits_its_last_window_after_the_gap(tmp_path) -> None:
    for form, operator in (("on_event", KeyedWindowCount()), ("batch", KeyedWindowCountBatch())):
        visible, clock = tmp_path / f"{form}.json", FakeClock()
        reveal(visible, {"p0": 700, "p1": 700})
        job = live_sources.job(visible, name=f"quiet_{form}", quiet_timeout_ms=QUIET_MS)
        job.operators = [operator]
        runner = JobRunner(job, None, str(tmp_path / "s"), clock=clock)
        first = runner.run()
        newest = 699 * STEP_MS + 1  # p1's last event (p0's is 1 ms older and holds the watermark back)
        assert first[-1].watermark == newest - 1 - 2 * STEP_MS - 1
        assert len(live_sources.output(runner)) < len(live_sources.oracle(job.source, 1 << 62))
        clock.now += 30  # quiet for less than the timeout: nothing runs
        assert runner.run() == []
        # Quiet for 4000 s: the watermark is the newest event time plus 4000 s, minus the
        # bound and 1 ms; every window of the events read closes.
        clock.now += 3_970
        [quiet] = runner.run()
        assert quiet.events == 0 and quiet.watermark == newest + 4_000_000 - 2 * STEP_MS - 1
        pd.testing.assert_frame_equal(live_sources.output(runner),
                                      live_sources.oracle(job.source, 1 << 62), check_dtype=False)
        # Events that arrive after it, older than that watermark, are late.
        reveal(visible, {"p0": 710, "p1": 710})
        runner.run()
        assert job.sinks["late"].read(runner.store, job.prefix).num_rows == 20
        runner.close()


class SteppingClock(FakeClock):
    """A wall clock that moves ``step_s`` each time it is read."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.mark.parametrize("on_spark", [False, True], ids=["in_process", "spark"])
def test_quiet_source_in_a_continuous_run_commits_one_epoch_without_input(tmp_path, request, on_spark) -> None:
    """A continuous run over a source that went quiet: its watermark moves at every look
    (the wall clock moves 60 s per reading), but the run commits one epoch without input,
    when it reaches the open window's timer, and that epoch emits the last window."""
    spark = request.getfixturevalue("spark") if on_spark else None
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 700, "p1": 700})
    job = live_sources.job(visible, quiet_timeout_ms=QUIET_MS, trigger_interval_ms=0)
    runner = JobRunner(job, spark, str(tmp_path / "s"), clock=SteppingClock(60))
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.events == 0:
            runner.stop()
    assert [r.events for r in results] == [750, 650, 0]
    assert results[-1].watermark >= 2 * 3_600_000
    pd.testing.assert_frame_equal(live_sources.output(runner), live_sources.oracle(job.source, 1 << 62),
                                  check_dtype=False)
    runner.close()


def test_quiet_watermark_waits_for_a_timer_in_a_continuous_run(tmp_path) -> None:
    """A quiet source's watermark moves with every look, but an epoch without input runs
    only once it reaches an event-time timer (the checkpoint's lower bound)."""
    visible, clock = tmp_path / "visible.json", FakeClock()
    reveal(visible, {"p0": 700, "p1": 700})
    job = live_sources.job(visible, quiet_timeout_ms=QUIET_MS)
    runner = JobRunner(job, None, str(tmp_path / "s"), clock=clock)
    runner.run()
    ckpt = runner.latest()
    assert ckpt.next_event_timer_ms == 2 * 3_600_000  # the open window's end
    plan = runner._plan(ckpt)
    assert not runner._due_without_input(ckpt, plan, continuous=True)  # not quiet yet
    clock.now += QUIET_MS / 1000  # quiet, but its watermark is below the window's end
    assert not runner._due_without_input(ckpt, runner._plan(ckpt), continuous=True)
    clock.now += 3_000
    assert runner._due_without_input(ckpt, runner._plan(ckpt), continuous=True)
    runner.close()


def test_quiet_since_and_quiet_watermark() -> None:
    committed, ends = {"p0": 5, "p1": 7}, {"p0": 5, "p1": 7}
    active = {"p0": 1_000, "p1": 4_000}
    assert quiet_since(committed, ends, active, 9_000, 5_000) == 4_000
    assert quiet_since(committed, ends, active, 8_999, 5_000) is None          # not long enough
    assert quiet_since(committed, {"p0": 6, "p1": 7}, active, 9_000, 5_000) is None  # p0 has input
    assert quiet_since(committed, ends, {}, 9_000, 5_000) is None              # nothing ever arrived
    assert quiet_since(committed, ends, active, 9_000, None) is None           # option off
    plan = EpochPlan(offsets={"p0": (5, 5), "p1": (7, 7)}, ends=ends, idle=frozenset(), paused=frozenset(),
                     planned_at_ms=9_000, quiet_since_ms=4_000)
    assert quiet_watermark(plan, {"p0": 100, "p1": 300}, 50) == 300 + 5_000 - 50 - 1


class _RaisesOnB(pt.Timeout):
    """Sets a processing-time timer at 10 for every event, then raises on key ``b``."""

    fired: list = []

    def on_event(self, subject, event):
        subject.set_processing_timer(10)
        if subject.key == b"b":
            raise ValueError("bad b")

    def on_timer_expired(self, subject, timestamp):
        _RaisesOnB.fired.append((subject.time_domain, timestamp, subject.key))


class _RaisesOnBBatch(pt.TimeoutBatch):
    """``_RaisesOnB`` in vectorised form."""

    def on_batch(self, ctx, events):
        keys, kgs = events.column("key").to_pylist(), events.column("key_group").to_pylist()
        ctx.set_processing_timers(keys, kgs, [10] * len(keys))
        if b"b" in keys:
            raise ValueError("bad b")

    def on_timers(self, ctx, timers):
        _RaisesOnB.fired += [(d, t, k) for d, t, k in zip(timers.column("domain").to_pylist(),
                                                         timers.column("timestamp").to_pylist(),
                                                         timers.column("key").to_pylist())]


@pytest.mark.parametrize("operator", [_RaisesOnB(), _RaisesOnBBatch()], ids=["on_event", "batch"])
def test_a_dead_lettered_call_sets_no_processing_time_timer(tmp_path, operator) -> None:
    """Under ``on_operator_error="dead_letter"`` the processing-time timer set by a call
    that raised is discarded with the rest of what it did."""
    _RaisesOnB.fired = []
    events = pa.table({"amount": pa.array([1, 2, 3], pa.int64()), "key": pa.array([b"a", b"b", b"c"]),
                       "timestamp": pa.array([1, 2, 3], pa.int64()), "_part": pa.array([0] * 3, pa.int32()),
                       "_offset": pa.array(range(3), pa.int64()), "_kg": pa.array([0] * 3, pa.int32()),
                       "_range": pa.array([0] * 3, pa.int32())})
    spec = TaskSpec(job_prefix="jobs/t", epoch=1, op_index=0, range_index=0, key_group_range=KeyGroupRange(0, 4),
                    manifest_key=None, watermark_before=0, watermark_after=0, processing_time=60,
                    on_operator_error="dead_letter", input_name="test", input_partitions=("p0",))
    result = run_task(operator, spec, events, open_object_store(str(tmp_path)), {"main": None})
    assert result.metrics["dead_letter"] == 1
    assert sorted(_RaisesOnB.fired) == [("processing_time", 10, b"a"), ("processing_time", 10, b"c")]
