"""Event time on live input: partition idleness (``Job.idle_timeout_ms``, Flink's
``withIdleness``), watermark alignment (``Job.max_watermark_drift_ms``, Flink's
``withWatermarkAlignment``), partitions that appear while the job runs, and
``Source.start_offset``. Wall clock: a fake one given to ``JobRunner(clock=...)``."""
from __future__ import annotations

import json

import crc32c
import pandas as pd
import pyarrow as pa

from examples.keyed_count import keyed_count_job, keyed_count_oracle
from examples.synthetic import SyntheticSource
from operators.api.operator import WATERMARK_MAX, WATERMARK_MIN
from operators.io.sources import TIMESTAMP_COLUMN
from operators.runtime.checkpoints import JobCheckpoint, read_checkpoint
from operators.runtime.driver import JobRunner
from operators.runtime.live import idle_partitions, paused_partitions, plan_epoch
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
    assert first.watermark == _ts("p0", 299) - BOUND_MS
    # p1 gets nothing new: caught up for 5 s, not idle yet, it holds the watermark.
    second = epoch(after_s=5, p0=600, p1=300)
    assert second.watermark == _ts("p1", 299) - BOUND_MS
    # 15 s without events on p1: idle; the watermark follows p0 alone.
    third = epoch(after_s=10, p0=700, p1=300)
    assert third.watermark == _ts("p0", 699) - BOUND_MS
    # p1 receives events (older than the watermark: late, as in Flink) and is active
    # again: the watermark waits for it although p0 reads on.
    fourth = epoch(after_s=1, p0=800, p1=400)
    fifth = epoch(after_s=1, p0=900, p1=400)
    assert fourth.watermark == fifth.watermark == third.watermark
    ckpt = read_checkpoint(JobRunner(live_sources.job(visible), None, str(tmp_path / "s")).store,
                           "jobs/growing_count", 5)
    assert ckpt.partition_active_at_ms == {"p0": int(clock.now * 1000), "p1": int((clock.now - 1) * 1000)}


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
    assert results[1].watermark == _ts("p1", 299) - BOUND_MS
    assert results[2].watermark == _ts("p0", 1_299) - BOUND_MS
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
    plus one epoch's step of p1 (100 events x 10 min), and the output is the oracle's."""
    drift = 2 * 3_600_000
    step = 100 * 600_000  # one epoch's share of p1, in event time
    _, unaligned, _ = _skewed_run(tmp_path, None)
    runner, aligned, got = _skewed_run(tmp_path, drift)
    assert max(unaligned) > drift + step  # the case needs alignment
    assert aligned and max(aligned) <= drift + step
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
    assert plan.offsets == {"a": (0, 30), "b": (0, 30), "c": (0, 0)}  # c's share is not given away


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
    assert third.watermark == _ts("p0", 1_299) - BOUND_MS
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
