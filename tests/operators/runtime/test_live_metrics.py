"""Per-epoch live metrics (``dkvstream.operators.runtime.live.epoch_metrics``): in the checkpoint
(measured at the commit) and in ``EpochResult.live`` (after the publish), against a hand
computation with a fake wall clock that only the test moves."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage import faults
from tests.operators import live_sources
from tests.operators.live_sources import STEP_MS, reveal

T0_MS = 1_700_000_000_000
INGEST_BASE_MS = T0_MS - 60_000
COMMIT_AFTER_MS, PUBLISH_AFTER_MS, NEXT_PLAN_AFTER_MS = 500, 250, 2_000


def _ingest(partition: str, offsets) -> list[int]:
    """Ingest time of each offset: 10 ms apart, partition p1 5 ms after p0."""
    return [INGEST_BASE_MS + 10 * o + 5 * int(partition[1:]) for o in offsets]


def _ts(partition: str, offset: int) -> int:
    return offset * STEP_MS + int(partition[1:])


def _nearest_rank(values: list[int], q: float) -> int:
    return sorted(values)[math.ceil(q * len(values)) - 1]


def _expected(read: dict[str, range], ends: dict[str, int], now_ms: int, plan_ms: int,
              previous_plan_ms: int | None, watermark: int, previous_ends: dict[str, int] | None = None) -> dict:
    events = sum(len(r) for r in read.values())
    ages = [now_ms - t for p, r in read.items() for t in _ingest(p, r)]
    seconds = None if previous_plan_ms is None else (plan_ms - previous_plan_ms) / 1000
    return {
        "at_ms": now_ms,
        # Arriving: how far the end offsets moved between the two plans.
        "input_rate": None if seconds is None else sum(ends[p] - previous_ends[p] for p in ends) / seconds,
        "read_rate": None if seconds is None else events / seconds,
        "processing_rate": events / ((now_ms - plan_ms) / 1000),
        "lag_events": {p: ends[p] - r.stop for p, r in read.items()},
        "lag_ms": {p: now_ms - _ts(p, r.stop - 1) for p, r in read.items()},
        "latency_ms": {"p50": _nearest_rank(ages, 0.5), "p99": _nearest_rank(ages, 0.99), "max": max(ages)},
        "event_time_lag_ms": None,  # every ingest time differs from its event time
        "watermark_delay_ms": now_ms - watermark,
    }


def test_live_metrics_against_a_hand_computation(tmp_path) -> None:
    now = [T0_MS / 1000]

    def advance(point: str, epoch: int) -> None:
        now[0] += {"after_tasks": COMMIT_AFTER_MS, "after_commit": PUBLISH_AFTER_MS}.get(point, 0) / 1000

    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 300, "p1": 350})
    job = live_sources.job(visible, events_per_epoch=400, source_args={"ingest_time": _ingest})
    runner = JobRunner(job, None, str(tmp_path / "s"), clock=lambda: now[0])
    with faults.callback(advance):
        epochs = runner.epochs()
        ends = {"p0": 300, "p1": 350}

        first = next(epochs)  # planned at T0: p0 and p1 [0, 200)
        plan1 = T0_MS
        read1 = {"p0": range(200), "p1": range(200)}
        ckpt1 = read_checkpoint(runner.store, job.prefix, 1)
        assert ckpt1.metrics["live"] == _expected(read1, ends, plan1 + COMMIT_AFTER_MS, plan1, None,
                                                  first.watermark)
        assert first.live == _expected(read1, ends, plan1 + COMMIT_AFTER_MS + PUBLISH_AFTER_MS, plan1, None,
                                       first.watermark)

        now[0] += NEXT_PLAN_AFTER_MS / 1000
        new_ends = {"p0": 330, "p1": 400}  # 30 + 50 events arrive before the next plan
        reveal(visible, new_ends)
        second = next(epochs)  # p0 [200, 330), p1 [200, 400)
        plan2 = plan1 + COMMIT_AFTER_MS + PUBLISH_AFTER_MS + NEXT_PLAN_AFTER_MS
        read2 = {"p0": range(200, 330), "p1": range(200, 400)}
        ckpt2 = read_checkpoint(runner.store, job.prefix, 2)
        assert ckpt2.metrics["live"] == _expected(read2, new_ends, plan2 + COMMIT_AFTER_MS, plan2, plan1,
                                                  second.watermark, previous_ends=ends)
        assert second.live["input_rate"] == 80 / 2.75 and second.live["read_rate"] == 330 / 2.75
        assert second.live["lag_events"] == {"p0": 0, "p1": 0}


def _ingest_is_event_time(partition: str, offsets) -> list[int]:
    """As a Kafka record whose timestamp is both its event time and its ingest time; but
    offset 0 of p1, whose ingest time is its event time + 7 ms."""
    return [_ts(partition, o) + (7 if (partition, o) == ("p1", 0) else 0) for o in offsets]


def test_event_time_lag_is_not_called_latency(tmp_path) -> None:
    """Events whose ingest time is their event time: now minus it is event-time lag, in
    ``event_time_lag_ms``; ``latency_ms`` covers only the one event whose ingest time
    differs. Oracle: the same computed from the source's offsets."""
    now_ms = T0_MS + 100_000
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 40, "p1": 40})
    job = live_sources.job(visible, events_per_epoch=400, source_args={"ingest_time": _ingest_is_event_time})
    [result] = JobRunner(job, None, str(tmp_path / "s"), clock=lambda: now_ms / 1000).run()
    lags = [now_ms - _ts(p, o) for p in ("p0", "p1") for o in range(40) if (p, o) != ("p1", 0)]
    assert result.live["event_time_lag_ms"] == {"p50": _nearest_rank(lags, 0.5), "p99": _nearest_rank(lags, 0.99),
                                                "max": max(lags)}
    own = now_ms - (_ts("p1", 0) + 7)
    assert result.live["latency_ms"] == {"p50": own, "p99": own, "max": own}


def test_latency_is_null_without_ingest_times(tmp_path) -> None:
    visible = tmp_path / "visible.json"
    reveal(visible, {"p0": 10, "p1": 10})
    [result] = JobRunner(live_sources.job(visible), None, str(tmp_path / "s")).run()
    assert result.live["latency_ms"] is None and result.live["input_rate"] is None
    assert result.live["event_time_lag_ms"] is None and result.live["read_rate"] is None
    assert result.live["lag_events"] == {"p0": 0, "p1": 0}


@settings(max_examples=200, deadline=None)
@given(tasks=st.lists(st.lists(st.integers(0, 10_000), min_size=1, max_size=300), min_size=1, max_size=4),
       big=st.integers(0, 3))
def test_latency_from_ingest_sketches_matches_the_events(tasks, big) -> None:
    """Latency percentiles from the tasks' ``IngestSketch``es: exact (nearest rank over
    all events) when every task had at most ``INGEST_SAMPLE`` events; with more, within
    the spread of one sample step of the exact value; max always exact."""
    from dkvstream.operators.runtime.live import INGEST_SAMPLE, IngestSketch, latency_ms

    rng = np.random.default_rng(len(tasks) * 7 + big)
    tasks = [np.array(t, np.int64) for t in tasks]
    if big:  # one task with more events than a sketch keeps
        tasks.append(rng.integers(0, 10_000, INGEST_SAMPLE * big + 17))
    now = 20_000
    got = latency_ms([IngestSketch.of(pa.array(t)) for t in tasks], now)
    ages = now - np.concatenate(tasks)
    p50, p99 = np.percentile(ages, [50, 99], method="inverted_cdf")
    assert got["max"] == ages.max()
    if not big:
        assert (got["p50"], got["p99"]) == (int(p50), int(p99))
    else:
        slack = 10_000 * 4 / INGEST_SAMPLE + 1  # a few sample steps of the value range
        assert abs(got["p50"] - p50) <= slack and abs(got["p99"] - p99) <= slack


@settings(max_examples=200, deadline=None)
@given(growth=st.lists(st.lists(st.integers(0, 1_000), min_size=3, max_size=3), min_size=1, max_size=8),
       start=st.lists(st.integers(0, 10_000), min_size=3, max_size=3), joins=st.integers(0, 2))
def test_arrivals_over_plans_add_up_to_what_the_source_grew(growth, start, joins) -> None:
    """``live.arrived`` between consecutive plans sums to the growth of the end offsets
    from the first plan to the last, a partition that appears later counting from where
    it is first read (oracle: the final ends minus the starts)."""
    from dkvstream.operators.runtime.event_time import EpochPlan
    from dkvstream.operators.runtime.live import arrived

    parts = ["p0", "p1", "p2"][:3 - joins]
    late = ["p0", "p1", "p2"][3 - joins:]  # appear at the second plan
    ends = {p: s for p, s in zip(parts, start)}
    previous, total = dict(ends), 0
    for i, step in enumerate(growth):
        if i == 1:
            ends.update({p: start[int(p[1])] for p in late})
        ends = {p: e + step[int(p[1])] for p, e in ends.items()}
        plan = EpochPlan(offsets={p: (previous.get(p, start[int(p[1])]),) * 2 for p in ends}, ends=dict(ends),
                         idle=frozenset(), paused=frozenset(), planned_at_ms=i)
        total += arrived(plan, previous)
        previous = dict(ends)
    first = {p: start[int(p[1])] for p in ends}
    assert total == sum(ends[p] - first[p] for p in ends)
