"""Event time on live input: partition idleness (``Job.idle_timeout_ms``, Flink's
``withIdleness``), watermark alignment (``Job.max_watermark_drift_ms``, Flink's
``withWatermarkAlignment``), partitions that appear while the job runs, and
``Source.start_offset``. Wall clock: a fake one given to ``JobRunner(clock=...)``."""
from __future__ import annotations

import json

import crc32c
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.columns import TIMESTAMP_COLUMN
from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.event_time import (
    EventTimeInputs,
    EventTimeSteps,
    alignment_cuts,
    epoch_event_time,
    idle_partitions,
    partition_activity,
    paused_partitions,
    plan_epoch,
)
from dkvstream.operators.runtime.splits import Split, SplitSummary
from tests.operators import live_sources
from tests.operators.live_sources import STEP_MS, reveal

BOUND_MS = 2 * STEP_MS  # live_sources.job's max_out_of_orderness_ms
IDLE_MS = 10_000


class FakeClock:
    """Wall clock in seconds, moved by the test only."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _ts(partition: str, offset: int) -> int:
    """Event time of ``offset`` of a GrowingSource partition (SyntheticSource's rule)."""
    return offset * STEP_MS + int(partition[1:])


def test_idle_partition_stops_holding_back_the_watermark_until_it_receives_events(tmp_path) -> None:
    visible, clock = tmp_path / "visible.json", FakeClock()
    reveal(visible, {"p0": 300, "p1": 300})

    def epoch(**advance_and_reveal):
        clock.now += advance_and_reveal.pop("after_s")
        reveal(visible, advance_and_reveal)
        runner = JobRunner(live_sources.job(visible, idle_timeout_ms=IDLE_MS), None, str(tmp_path / "s"),
                           clock=clock)
        [result] = runner.run(max_epochs=1)
        return result

    first = epoch(after_s=0, p0=300, p1=300)
    assert first.watermark == _ts("p0", 299) - BOUND_MS - 1
    # p1 gets nothing new: caught up for 5 s, not idle yet, it holds the watermark.
    second = epoch(after_s=5, p0=600, p1=300)
    assert second.watermark == _ts("p1", 299) - BOUND_MS - 1
    # 15 s without events on p1: idle; the watermark follows p0 alone.
    third = epoch(after_s=10, p0=700, p1=300)
    assert third.watermark == _ts("p0", 699) - BOUND_MS - 1
    # p1 receives events (older than the watermark: late, as in Flink) and is active
    # again: the watermark waits for it although p0 reads on.
    fourth = epoch(after_s=1, p0=800, p1=400)
    fifth = epoch(after_s=1, p0=900, p1=400)
    assert fourth.watermark == fifth.watermark == third.watermark
    ckpt = read_checkpoint(JobRunner(live_sources.job(visible), None, str(tmp_path / "s")).store,
                           "jobs/growing_count", 5)
    assert ckpt.partition_active_at_ms == {"p0": int(clock.now * 1000), "p1": int((clock.now - 1) * 1000)}


class _SlowEnds(live_sources.GrowingSource):
    """A ``GrowingSource`` whose end-offset query, while ``slow`` holds
    ``(seconds, visible)``, takes that long on the test's clock and sees ``visible``
    (records that entered the log while the broker answered)."""

    def __init__(self, visible_file, clock: FakeClock) -> None:
        super().__init__(visible_file)
        self.clock, self.slow = clock, None

    def end_offsets(self) -> dict[str, int]:
        if self.slow is not None:
            seconds, visible = self.slow
            self.slow = None
            self.clock.now += seconds
            reveal(self.visible_file, visible)
        return super().end_offsets()


def test_quiet_time_counts_from_when_the_end_offsets_came_back(tmp_path) -> None:
    """The driver asks for the end offsets after reading its clock; a record that enters
    the log while the broker answers (2 s here) is read by that epoch. p1 then pauses
    9 s, less than the idle timeout: it never becomes idle, so the watermark waits for it
    and none of its events is late (counting from the plan's clock, p1 would be idle
    at 10 s and its next events late)."""
    visible, clock = tmp_path / "visible.json", FakeClock()
    reveal(visible, {"p0": 300, "p1": 300})
    job = live_sources.job(visible, idle_timeout_ms=IDLE_MS, events_per_epoch=4_000)
    job.source = _SlowEnds(visible, clock)
    runner = JobRunner(job, None, str(tmp_path / "s"), clock=clock)
    job.source.slow = (2, {"p0": 300, "p1": 301})
    [first] = runner.run(max_epochs=1)  # planned at 0 s, p1's record 301 in at 2 s
    clock.now += 8
    reveal(visible, {"p0": 700, "p1": 301})
    [second] = runner.run(max_epochs=1)  # 10 s after the plan, 8 s after p1's last record
    assert first.watermark == _ts("p0", 299) - BOUND_MS - 1
    assert second.watermark == _ts("p1", 300) - BOUND_MS - 1  # p1 holds it back
    clock.now += 1
    reveal(visible, {"p0": 800, "p1": 400})  # p1 resumes 9 s after its last record
    [third] = runner.run(max_epochs=1)
    assert third.events == 199
    assert runner.job.sinks["late"].read(runner.store, runner.job.prefix).num_rows == 0
    pd.testing.assert_frame_equal(live_sources.output(runner),
                                  live_sources.oracle(runner.job.source, third.watermark), check_dtype=False)


def _late_start_run(tmp_path, second_producer_after_s: float):
    """The job starts before its producers (as a live benchmark's job does): 15 s with no
    event on any partition, then p0's producer starts (2.5 h of event time), then p1's,
    ``second_producer_after_s`` later. Both partitions are in event-time order.

    Returns:
        ``(runner, watermark before p1's first epoch, p1's first epoch)``.
    """
    visible, clock = tmp_path / "visible.json", FakeClock()
    reveal(visible, {"p0": 0, "p1": 0})
    runner = JobRunner(live_sources.job(visible, idle_timeout_ms=IDLE_MS, events_per_epoch=3_000), None,
                       str(tmp_path / "s"), clock=clock)
    assert runner.run(max_epochs=1) == []  # no producer yet
    clock.now += 15
    reveal(visible, {"p0": 1_200, "p1": 0})
    [first] = runner.run(max_epochs=1)
    clock.now += second_producer_after_s
    reveal(visible, {"p0": 1_500, "p1": 0})
    [second] = runner.run(max_epochs=1)
    clock.now += 1
    reveal(visible, {"p0": 1_500, "p1": 1_500})
    [third] = runner.run(max_epochs=1)
    assert first.events + second.events + third.events == 3_000
    return runner, second.watermark, third


def test_a_partition_is_not_idle_before_its_first_event_while_no_partition_had_one(tmp_path) -> None:
    """The time before the first event on any partition does not count towards a
    partition's idleness: p1's producer starting 5 s after p0's (20 s after the job) holds
    the watermark until its first event, and none of its events is late."""
    runner, before, third = _late_start_run(tmp_path, second_producer_after_s=5)
    assert before == WATERMARK_MIN  # p1 has no event yet and is not idle: it holds it
    assert third.watermark == _ts("p0", 1_499) - BOUND_MS - 1
    assert runner.job.sinks["late"].read(runner.store, runner.job.prefix).num_rows == 0
    pd.testing.assert_frame_equal(live_sources.output(runner),
                                  live_sources.oracle(runner.job.source, third.watermark), check_dtype=False)


def test_a_partition_without_events_is_idle_a_timeout_after_the_first_epoch_that_read_any(tmp_path) -> None:
    """p1's producer starts 11 s after the first epoch read p0's events: p1 was quiet for
    longer than the idle timeout while the job read, so it is idle (as a partition pausing
    that long), the watermark follows p0, and exactly the events of p1 in windows that
    closed by then are late."""
    from dkvstream.examples.keyed_count import WINDOW_MS

    runner, before, third = _late_start_run(tmp_path, second_producer_after_s=11)
    assert before == _ts("p0", 1_499) - BOUND_MS - 1
    ts = np.array([_ts("p1", o) for o in range(1_500)])
    want = ts[ts // WINDOW_MS * WINDOW_MS + WINDOW_MS <= before]
    late = runner.job.sinks["late"].read(runner.store, runner.job.prefix)
    assert 0 < len(want) < len(ts)
    assert sorted(late.column("timestamp").to_pylist()) == want.tolist()


@st.composite
def _in_order_feeds(draw):
    """Partitions in event-time order (ties allowed) whose producers start within the
    idle timeout of the first one and then never pause that long: ``(arrivals, event
    times)`` per partition (wall clock ms from the job's start, when each record enters
    the log; event time ms), and the driver's plans ``(now, ends_seen)``: the wall clock
    it plans at and the later moment its end-offset query saw the log (a broker slow to
    answer). Epochs may last far longer than the idle timeout (an overloaded job)."""
    n = draw(st.integers(2, 3))
    feed_start = draw(st.integers(0, 4 * IDLE_MS))  # the job may start long before any producer
    arrivals, times = [], []
    for i in range(n):
        start = feed_start + (0 if i == 0 else draw(st.integers(0, IDLE_MS - 1)))
        gaps = draw(st.lists(st.integers(0, IDLE_MS - 1), min_size=1, max_size=10))
        arrivals.append(np.cumsum([start, *gaps[1:]]))
        times.append(np.cumsum(draw(st.lists(st.integers(0, 50_000), min_size=len(gaps), max_size=len(gaps)))))
    end = max(int(a[-1]) for a in arrivals) + 2 * IDLE_MS
    plans, now = [], 0
    while now < end:
        now += draw(st.integers(500, 3 * IDLE_MS))  # the trigger, or an epoch that took this long
        seen = now + draw(st.sampled_from([0, 0, 1, 100, 2_000]))  # the end-offset query's answer
        plans.append((now, seen))
        now = seen
    return arrivals, times, plans


# p1's first record enters the log while the driver's end-offset query is under way
# (planned at 1 s, answered at 2 s), its next one 9.999 s later: never quiet for the
# timeout, but quiet time counted from the plan's clock would make it idle at 11 s and
# the record at 11.499 s late.
_SLOW_ENDS = ([np.arange(0, 30_000, 1_000), np.array([1_500, 11_499])],
              [np.arange(1, 31) * 60_000, np.array([1, 2])],
              [(1_000, 2_000), *((t, t) for t in range(3_000, 30_001, 1_000))])


@settings(max_examples=300, deadline=None)
@given(feeds=_in_order_feeds(), events_per_epoch=st.integers(1, 8), bound_ms=st.integers(0, 5_000),
       drift_ms=st.one_of(st.none(), st.integers(0, 100_000)))
@example(feeds=_SLOW_ENDS, events_per_epoch=8, bound_ms=0, drift_ms=None)
def test_no_event_of_an_in_order_partition_is_late_unless_it_went_quiet_for_the_idle_timeout(
        feeds, events_per_epoch, bound_ms, drift_ms) -> None:
    """The driver's event-time steps (``plan_epoch``, ``epoch_event_time``,
    ``partition_activity``) on a live source whose partitions are each in event-time
    order and none is quiet for the idle timeout once the source delivers events
    (producers starting at different moments, long after the job; a backlog read in
    small epochs; epochs longer than the timeout; end offsets seen after the plan's
    clock; with or without watermark alignment): no event read is at or below the
    watermark it meets (the operator API's lateness)."""
    arrivals, times, plans = feeds
    parts = [f"p{i}" for i in range(len(arrivals))]
    committed = dict.fromkeys(parts, 0)
    part_max = dict.fromkeys(parts, WATERMARK_MIN)
    active_at: dict[str, int] = {}
    wm = WATERMARK_MIN
    for now, seen in plans:
        ends = {p: int(np.searchsorted(arrivals[i], seen, side="right")) for i, p in enumerate(parts)}
        plan = plan_epoch(committed, ends, part_max, active_at, now_ms=now, events_per_epoch=events_per_epoch,
                          bounded=False, idle_timeout_ms=IDLE_MS, max_drift_ms=drift_ms, ends_at_ms=seen)
        summaries = []
        for i, p in enumerate(parts):
            start, stop = plan.offsets[p]
            if stop > start:
                offsets, ts = np.arange(start, stop), times[i][start:stop]
                summaries.append(SplitSummary(Split(p, i, start, stop), stop - start, 0, int(ts.max()),
                                              EventTimeSteps.of(offsets, ts)))
        result = epoch_event_time(EventTimeInputs(wm, part_max, plan, False, bound_ms, drift_ms), summaries)
        if not plan.has_input and result.watermark <= wm:
            continue  # the driver commits no epoch
        for i, p in enumerate(parts):
            start, stop = result.plan.offsets[p]
            assert (times[i][start:stop] > wm).all(), (p, now, wm)
        committed = {p: stop for p, (_, stop) in result.plan.offsets.items()}
        part_max, wm = result.partition_max_ts, result.watermark
        active_at = partition_activity(active_at, result.plan)


@pytest.mark.parametrize("bound_ms", [0, 1_000])
def test_an_event_within_the_bound_of_its_partitions_newest_is_not_late(bound_ms) -> None:
    """A partition in event-time order may repeat its newest timestamp (a tie), and an
    event exactly ``bound_ms`` behind it is within the bound: epochs reading them one
    at a time find neither at or below the watermark (``timestamp <= watermark`` is
    late), as Flink's bounded out-of-orderness (max - bound - 1 ms)."""
    ts = np.array([5_000, 5_000 + bound_ms, 5_000 + bound_ms, 5_000])
    committed, part_max, wm = {"p": 0}, {"p": WATERMARK_MIN}, WATERMARK_MIN
    for offset, t in enumerate(ts):
        assert t > wm
        plan = plan_epoch(committed, {"p": len(ts)}, part_max, {}, now_ms=0, events_per_epoch=1, bounded=False)
        assert plan.offsets == {"p": (offset, offset + 1)}
        summary = SplitSummary(Split("p", 0, offset, offset + 1), 1, 0, int(t),
                               EventTimeSteps.of(np.array([offset]), ts[offset:offset + 1]))
        result = epoch_event_time(EventTimeInputs(wm, part_max, plan, False, bound_ms, None), [summary])
        committed, part_max, wm = {"p": offset + 1}, result.partition_max_ts, result.watermark
    assert wm == 5_000 - 1


def test_continuous_run_advances_the_watermark_of_idle_partitions_without_input(tmp_path) -> None:
    """No input at all, but p1 went idle: the run commits an epoch without events whose
    watermark follows p0, and the windows it closes are published."""
    visible, clock = tmp_path / "visible.json", FakeClock()
    reveal(visible, {"p0": 1_300, "p1": 300})
    runner = JobRunner(live_sources.job(visible, idle_timeout_ms=IDLE_MS, events_per_epoch=1_400), None,
                       str(tmp_path / "s"), clock=clock)
    results = []
    for result in runner.epochs(continuous=True):
        results.append(result)
        if result.epoch == 1:  # read p0 [0, 700), all of p1
            clock.now += 8
        elif result.epoch == 2:  # read the rest of p0: p0 active at +8 s, p1 at 0 s
            clock.now += 3  # p1: 11 s without events, idle; p0: 3 s, not
        else:
            runner.stop()
    assert [(r.epoch, r.events) for r in results] == [(1, 1_000), (2, 600), (3, 0)]
    assert results[1].watermark == _ts("p1", 299) - BOUND_MS - 1
    assert results[2].watermark == _ts("p0", 1_299) - BOUND_MS - 1
    got = live_sources.output(runner)
    pd.testing.assert_frame_equal(got, live_sources.oracle(runner.job.source, results[2].watermark),
                                  check_dtype=False)
    assert len(got) > len(live_sources.oracle(runner.job.source, results[1].watermark))


def test_idleness_needs_the_partition_read_to_its_end() -> None:
    committed, ends = {"a": 5, "b": 5, "c": 5}, {"a": 5, "b": 9, "c": 5}
    active = {"a": 0, "b": 0, "c": 5_000}
    assert idle_partitions(committed, ends, active, 10_000, 10_000) == {"a"}  # b has unread events
    assert idle_partitions(committed, ends, active, 10_000, None) == set()


class SkewedSource(SyntheticSource):
    """Two partitions; p1's event time advances 10x faster than p0's (bounded)."""

    name = "skewed"

    def full_partition(self, partition: str) -> pa.Table:
        table = super().full_partition(partition)
        if partition == "p1":
            ts = table.column(TIMESTAMP_COLUMN).to_numpy() * 10
            table = table.set_column(table.schema.get_field_index(TIMESTAMP_COLUMN), TIMESTAMP_COLUMN,
                                     pa.array(ts))
        return table


def _skewed_run(tmp_path, drift_ms: int | None):
    job = keyed_count_job(2_000, 50, partitions=2, step_ms=60_000, events_per_epoch=200,
                          parallelism=1, name="skewed")
    job.source = SkewedSource(2_000, 50, partitions=2, step_ms=60_000)
    job.max_out_of_orderness_ms = 0
    job.max_watermark_drift_ms = drift_ms
    runner = JobRunner(job, None, str(tmp_path / f"drift-{drift_ms}"), retain_checkpoints=None)
    spreads, before = [], None
    for result in runner.epochs():
        ckpt = read_checkpoint(runner.store, job.prefix, result.epoch)
        unfinished = [p for p, o in (before or {"p0": 0, "p1": 0}).items() if o < 2_000]
        if len(unfinished) == 2 and min(ckpt.partition_max_ts.values()) > WATERMARK_MIN:
            spreads.append(max(ckpt.partition_max_ts.values()) - min(ckpt.partition_max_ts.values()))
        before = result.source_offsets
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    return runner, spreads, got.sort_values(["key", "window_start"]).reset_index(drop=True)


def test_watermark_alignment_bounds_the_event_time_spread_and_keeps_the_output(tmp_path) -> None:
    """p1 runs 10x faster in event time: without alignment its max event time runs
    ever further ahead of p0's; with a drift of 2 h the spread stays within the drift
    (pausing at planning alone would allow one epoch's step of p1 more: 100 events x
    10 min; the cut after reading removes that), every event is read exactly once, and
    the output is the oracle's."""
    drift = 2 * 3_600_000
    step = 100 * 600_000  # one epoch's share of p1, in event time
    _, unaligned, _ = _skewed_run(tmp_path, None)
    runner, aligned, got = _skewed_run(tmp_path, drift)
    assert max(unaligned) > drift + step  # the case needs alignment
    assert len(aligned) >= 10 and max(aligned) <= drift
    want = keyed_count_oracle(runner.job.source).sort_values(["key", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert runner.latest().finished and runner.latest().watermark == WATERMARK_MAX


def test_alignment_pauses_only_partitions_ahead_of_the_slowest_active_one() -> None:
    part_max = {"a": 1_000, "b": 5_000, "c": 9_000, "idle": 0, "new": WATERMARK_MIN}
    everyone = list(part_max)
    # Idle and new partitions do not count as the slowest; c is 8 s ahead of a.
    assert paused_partitions(everyone, ["a", "b", "c", "new"], part_max, 4_000) == {"c"}
    assert paused_partitions(everyone, ["b", "c"], part_max, 4_000) == set()
    assert paused_partitions(everyone, everyone, part_max, None) == set()
    plan = plan_epoch({"a": 0, "b": 0, "c": 0}, {"a": 100, "b": 100, "c": 100}, part_max,
                      {"a": 0, "b": 0, "c": 0}, now_ms=0, events_per_epoch=90, bounded=True,
                      max_drift_ms=4_000)
    assert plan.paused == {"c"}
    assert plan.offsets == {"a": (0, 45), "b": (0, 45), "c": (0, 0)}  # c's share goes to a and b


def _cuts(parts, part, offset, ts, part_max, holders, drift) -> dict[str, int]:
    """``alignment_cuts`` over the summaries read tasks would return for these rows
    (one split per partition): ``{partition: cut offset}``."""
    summaries = []
    for i, p in enumerate(parts):
        mine = part == i
        if mine.any():
            o, t = offset[mine], ts[mine]
            summaries.append(SplitSummary(Split(p, i, int(o[0]), int(o[-1]) + 1), int(mine.sum()), 0,
                                          int(t.max()), EventTimeSteps.of(o, t)))
    return {p: cut for p, (cut, _) in alignment_cuts(summaries, part_max, holders, drift).items()}


def test_alignment_cuts_each_slice_before_its_first_event_past_the_limit() -> None:
    parts = ["a", "b", "c"]
    part = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    offset = np.array([10, 11, 12, 20, 21, 22, 30, 31])
    ts = np.array([100, 200, 300, 150, 900, 250, 5_000, 6_000])
    before = {"a": 50, "b": 50, "c": 4_000}
    # The slowest holder after reading is a (300): limit 300 + 500; b's 900 is past it
    # (its later 250 waits with it, offsets stay contiguous), c's whole slice is.
    assert _cuts(parts, part, offset, ts, before, parts, 500) == {"b": 21, "c": 30}
    assert _cuts(parts, part, offset, ts, before, parts, None) == {}
    # c does not hold back the watermark (idle): a is still the slowest.
    assert _cuts(parts, part, offset, ts, before, ["a", "b"], 500) == {"b": 21, "c": 30}
    # The slowest holder d read nothing and everything read is past its limit: no cut,
    # so the epoch makes progress.
    assert _cuts(parts + ["d"], part, offset, ts, {**before, "d": -1_000}, parts + ["d"], 500) == {}


@settings(max_examples=300)
@given(ts=st.lists(st.integers(0, 5_000), min_size=1, max_size=300), limit=st.integers(-10, 5_100))
def test_event_time_steps_cut_before_the_first_event_past_the_limit(ts, limit) -> None:
    """A split's ``EventTimeSteps`` cut it at or before its first event past the limit
    (never after), and exactly there when it spans at most ``MAX_ALIGNMENT_STEPS`` ms."""
    from dkvstream.operators.runtime.event_time import MAX_ALIGNMENT_STEPS

    ts = np.array(ts, np.int64)
    offsets = np.arange(100, 100 + len(ts), dtype=np.int64)
    steps = EventTimeSteps.of(offsets, ts)
    assert len(steps.values) <= MAX_ALIGNMENT_STEPS + 1
    past = np.flatnonzero(ts > limit)
    i = steps.first_past(limit)
    cut = None if i is None else int(steps.offsets[i])
    if not len(past):
        assert cut is None or (ts.max() - ts.min() + 1 > MAX_ALIGNMENT_STEPS)
    else:
        assert cut is not None and cut <= offsets[past[0]]
    if cut is not None:
        kept = ts[offsets < cut]
        assert (kept <= limit).all()
        assert steps.rows_before[i] == len(kept)
        assert steps.max_before[i] == (kept.max() if len(kept) else WATERMARK_MIN)
    if ts.max() - ts.min() + 1 <= MAX_ALIGNMENT_STEPS:
        assert cut == (None if not len(past) else int(offsets[past[0]]))


class _StartsAt100(live_sources.GrowingSource):
    """Its log starts at offset 100 (older events deleted by retention, as in Kafka)."""

    def start_offset(self, partition: str) -> int:
        return 100


def test_new_partitions_are_read_from_their_start_offset(tmp_path) -> None:
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 300})
    job = live_sources.job(visible, events_per_epoch=4_000)
    job.source = _StartsAt100(visible)
    runner = JobRunner(job, None, str(tmp_path / "s"))
    [first] = runner.run()
    assert first.source_offsets == {"p0": 300} and first.events == 200
    reveal(visible, {"p0": 300, "p1": 250})  # the topic got a partition
    [second] = runner.run()
    assert second.source_offsets == {"p0": 300, "p1": 250} and second.events == 150
    assert runner.latest().partition_max_ts == {"p0": _ts("p0", 299), "p1": _ts("p1", 249)}
    # Once read, the new partition holds back the watermark as the others do.
    assert second.watermark == first.watermark
    reveal(visible, {"p0": 1_300, "p1": 1_300})
    [third] = runner.run()
    assert third.watermark == _ts("p0", 1_299) - BOUND_MS - 1
    got = live_sources.output(runner)
    events = pa.concat_tables([job.source.data.full_partition(p).slice(100, 1_200) for p in ("p0", "p1")])
    want = keyed_count_oracle(_Table(events))
    want = want[want.window_start + 3_600_000 <= third.watermark]
    assert len(want) > 0
    pd.testing.assert_frame_equal(got, want.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  check_dtype=False)


class _Table:
    """One table as a one-partition source, for ``keyed_count_oracle``."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def partitions(self) -> list[str]:
        return ["all"]

    def full_partition(self, partition: str) -> pa.Table:
        return self.table


def test_checkpoints_without_the_activity_record_still_decode() -> None:
    new = JobCheckpoint(job="j", epoch=1, watermark=0, source_offsets={"p": 1}, partition_max_ts={"p": 0},
                        finished=False, key_groups=8, parallelism=1, operators={}, outputs={},
                        partition_active_at_ms={"p": 5})
    doc = json.loads(new.encode())
    del doc["body"]["partition_active_at_ms"]
    body = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
    doc["crc32c"] = crc32c.crc32c(body.encode())
    old = JobCheckpoint.decode(json.dumps(doc).encode(), "mem://old")
    assert old.partition_active_at_ms == {} and old.source_offsets == {"p": 1}


class _SkewedWithBadRows(SkewedSource):
    """``SkewedSource`` whose p1 rows at offsets divisible by 7 have no key (dead letters)."""

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        table = super().read(partition, start, end)
        if partition != "p1":
            return table
        keys = table.column("key").to_pylist()
        keys = [None if (start + i) % 7 == 0 else k for i, k in enumerate(keys)]
        return table.set_column(0, "key", pa.array(keys, pa.binary()))


def test_alignment_cut_sends_each_bad_row_to_the_dead_letter_table_once(tmp_path) -> None:
    """Rows cut off are read again by the next epoch: a dead letter among them must not
    be recorded by both epochs."""
    job = keyed_count_job(2_000, 50, partitions=2, step_ms=60_000, events_per_epoch=200,
                          parallelism=1, name="skewed_bad")
    job.source = _SkewedWithBadRows(2_000, 50, partitions=2, step_ms=60_000)
    job.max_out_of_orderness_ms = 0
    job.max_watermark_drift_ms = 2 * 3_600_000
    runner = JobRunner(job, None, str(tmp_path))
    results = runner.run()
    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    assert sorted(dead.offset) == list(range(0, 2_000, 7))
    assert set(dead.partition) == {"p1"}
    assert sum(r.events for r in results) == 4_000 - len(dead)
    assert sum(r.dead_letter["total"] for r in results) == len(dead)


@settings(max_examples=200)
@given(speeds=st.lists(st.integers(1, 50), min_size=2, max_size=4),
       sizes=st.lists(st.integers(0, 400), min_size=4, max_size=4),
       drift_ms=st.integers(0, 500), events_per_epoch=st.integers(1, 300))
def test_aligned_planning_reads_every_event_once_within_the_drift(speeds, sizes, drift_ms,
                                                                  events_per_epoch) -> None:
    """Planning and cuts as the driver applies them, on bounded partitions whose event
    time advances ``speeds[i]`` ms per offset: every run ends, reads each offset exactly
    once, and an epoch that was cut read no event past the limit: the slowest unfinished
    partition's largest event time (with what it read this epoch) plus the drift."""
    parts = [f"p{i}" for i in range(len(speeds))]
    ends = {p: sizes[i] for i, p in enumerate(parts)}
    committed = {p: 0 for p in parts}
    part_max = {p: WATERMARK_MIN for p in parts}
    read = {p: [] for p in parts}
    for _ in range(10_000):
        plan = plan_epoch(committed, ends, part_max, {p: 0 for p in parts}, now_ms=0,
                          events_per_epoch=events_per_epoch, bounded=True, max_drift_ms=drift_ms)
        if not plan.has_input:
            break
        rows = [(i, o, o * speeds[i]) for i, p in enumerate(parts) for o in range(*plan.offsets[p])]
        part, offset, ts = (np.array(c, dtype=np.int64) for c in zip(*rows))
        holders = [p for p in parts if committed[p] < ends[p]]
        cuts = _cuts(parts, part, offset, ts, part_max, holders, drift_ms)
        if cuts:
            latest = [max([part_max[p], *ts[part == parts.index(p)]]) for p in holders]
            limit = min(t for t in latest if t != WATERMARK_MIN) + drift_ms
            kept = offset < np.array([cuts.get(p, 1 << 62) for p in parts])[part]
            assert (ts[kept] <= limit).all() and kept.any()
        for i, p in enumerate(parts):
            start, end = plan.offsets[p]
            end = cuts.get(p, end)
            read[p] += range(start, end)
            if end > start:
                part_max[p] = max(part_max[p], (end - 1) * speeds[i])
            committed[p] = end
    else:
        raise AssertionError("planning never finished")
    assert read == {p: list(range(ends[p])) for p in parts}
