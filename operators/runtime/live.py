"""Running a job on a live source: the trigger, and stopping a continuous run.

``JobRunner.epochs(continuous=True)`` (``dkvstream.operators.runtime.driver``) keeps planning
epochs on a live source instead of ending when it has nothing new. This module holds
the pieces of that loop that are not the epoch protocol itself:

* ``ProcessingTimeTrigger``: when the next epoch may start (Spark Structured
  Streaming's ``Trigger.ProcessingTime``).
* ``StopRequest``: a request to stop the loop, safe to make from any thread and from
  a signal handler.
* ``epoch_metrics``: arrival, read and processing rates, lag, end-to-end latency (or
  event-time lag) and watermark delay of an epoch.

What an epoch reads and the watermark, which bounded jobs share, are in
``dkvstream.operators.runtime.event_time``.
"""
from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN
from dkvstream.operators.runtime.event_time import EpochPlan

# With no new input, the driver asks the source again after the trigger interval, but
# never more often than this (ms): a trigger interval of 0 must not poll the source's
# end offsets in a tight loop (Spark's ``spark.sql.streaming.pollingDelay`` plays this role).
NO_INPUT_POLL_MS = 100


class ProcessingTimeTrigger:
    """When a continuous run plans its next epoch (Spark's ``Trigger.ProcessingTime``).

    The trigger fires at most once per ``interval_ms``: an epoch that took less than the
    interval is followed by a wait for the rest of it; one that took longer is followed
    by the next at once. When the trigger fired and the source had nothing new, the next
    look is ``max(interval_ms, NO_INPUT_POLL_MS)`` after that one.

    Args:
        interval_ms: the trigger interval, ms (``Job.trigger_interval_ms``, >= 0).
        clock: seconds of a monotonic clock (tests pass a fake one).
    """

    def __init__(self, interval_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_ms < 0:
            raise ValueError(f"trigger interval must be >= 0 ms, got {interval_ms}")
        self.interval_ms = interval_ms
        self._clock = clock
        self._fired: float | None = None
        self._had_input = True

    def fire(self) -> None:
        """Records that the trigger fired now (the driver plans an epoch)."""
        self._fired = self._clock()
        self._had_input = True

    def nothing_new(self) -> None:
        """Records that the last firing found no input: the next look waits at least
        ``NO_INPUT_POLL_MS``."""
        self._had_input = False

    def seconds_to_next(self) -> float:
        """Seconds until the trigger may fire again (0.0: now; also before the first firing)."""
        if self._fired is None:
            return 0.0
        interval = self.interval_ms if self._had_input else max(self.interval_ms, NO_INPUT_POLL_MS)
        return max(0.0, self._fired + interval / 1000 - self._clock())


class StopRequest:
    """A request to stop a continuous run, and the wait it interrupts.

    ``request`` may be called from any thread and from a signal handler. A
    ``threading.Event`` is not safe there: a handler runs on the main thread between
    two bytecodes, possibly while that thread holds the event's internal lock inside
    ``wait``, and ``set`` would then wait for that lock forever. ``queue.SimpleQueue.put``
    is reentrant (documented for exactly such callers), so the waiter blocks in
    ``SimpleQueue.get(timeout=...)`` instead: no spinning, and woken at once.
    """

    def __init__(self) -> None:
        self._requested = False
        self._drain = False
        self._wakeups: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def request(self, drain: bool = False) -> None:
        """Asks the run to stop (idempotent; a stopped run stays stopped); ``drain``:
        with a final epoch at watermark +infinity (``JobRunner.stop``). A drain asked for
        once stays asked for, whatever later requests say."""
        if drain:
            self._drain = True  # before _requested: a run that sees the stop sees the drain
        self._requested = True  # plain stores: atomic, safe in a signal handler
        self._wakeups.put(True)

    @property
    def requested(self) -> bool:
        """True once ``request`` was called."""
        return self._requested

    @property
    def drain(self) -> bool:
        """True once ``request(drain=True)`` was called."""
        return self._drain

    def wait(self, seconds: float) -> bool:
        """Blocks up to ``seconds`` or until a stop is requested.

        Returns:
            True if a stop was requested (before or during the wait).
        """
        if self._requested or seconds <= 0:
            return self._requested
        try:
            self._wakeups.get(timeout=seconds)
        except queue.Empty:
            pass
        return self._requested



# An ``IngestSketch`` keeps at most this many ingest times of a task's events.
INGEST_SAMPLE = 1024


@dataclass(frozen=True)
class IngestSketch:
    """The ``_ingest_time`` distribution of one task's events, in bytes independent of
    their number: ``count`` times, the smallest ``min_ms``, and ``sample``: all of them
    sorted when ``count <= INGEST_SAMPLE``, else ``INGEST_SAMPLE`` of them at evenly spaced
    ranks (each standing for ``count / len(sample)`` events)."""

    count: int
    min_ms: int
    sample: np.ndarray

    @classmethod
    def of(cls, ingest_ms: pa.Array | pa.ChunkedArray) -> IngestSketch | None:
        """The sketch of ``ingest_ms`` (ms; nulls skipped), or None if all are null."""
        values = ingest_ms.drop_null()
        if not len(values):
            return None
        ordered = np.sort(values.to_numpy().astype(np.int64, copy=False))
        n = len(ordered)
        if n > INGEST_SAMPLE:
            ordered = ordered[((np.arange(INGEST_SAMPLE) + 0.5) * n / INGEST_SAMPLE).astype(np.int64)]
        return cls(n, int(values.to_numpy().min()), ordered)


def ingest_sketches(ingest_ms: pa.ChunkedArray, event_ms: pa.ChunkedArray
                    ) -> tuple[IngestSketch | None, IngestSketch | None]:
    """The ``IngestSketch`` of the ingest times that are not the event's time and of
    those that are (a Kafka record's timestamp is both, unless the event time comes from
    a value column): now minus the first is latency, minus the second event-time lag."""
    same = pc.fill_null(pc.equal(ingest_ms, event_ms), False)
    return IngestSketch.of(ingest_ms.filter(pc.invert(same))), IngestSketch.of(ingest_ms.filter(same))


def latency_ms(sketches: list[IngestSketch], now_ms: int) -> dict | None:
    """``{"p50", "p99", "max"}``: now - ingest time over the sketches' events, ms
    (nearest rank over the weighted samples; exact when every task had at most
    ``INGEST_SAMPLE`` events; max exact), or None without ingest times."""
    sketches = [s for s in sketches if s is not None and s.count]
    if not sketches:
        return None
    ages = np.concatenate([now_ms - s.sample for s in sketches])
    weights = np.concatenate([np.full(len(s.sample), s.count / len(s.sample)) for s in sketches])
    order = np.argsort(ages, kind="stable")
    ages, cumulative = ages[order], np.cumsum(weights[order])
    total = cumulative[-1]

    def rank(q: float) -> int:
        return int(ages[min(len(ages) - 1, int(np.searchsorted(cumulative, q * total - 1e-9)))])

    return {"p50": rank(0.5), "p99": rank(0.99), "max": int(now_ms - min(s.min_ms for s in sketches))}


def arrived(plan: EpochPlan, previous_ends: dict[str, int]) -> int:
    """Offsets the source's partitions grew by from the previous plan (``previous_ends``)
    to ``plan``: a partition new since then counts from where the plan starts it, one
    whose end went backwards (a recreated topic) counts 0."""
    return sum(max(0, end - previous_ends.get(p, plan.offsets[p][0])) for p, end in plan.ends.items())


def epoch_metrics(*, events: int, ingest: list[IngestSketch], plan: EpochPlan,
                  committed: dict[str, int], partition_max_ts: dict[str, int], watermark_ms: int,
                  now_ms: int, previous_plan_ms: int | None, previous_ends: dict[str, int] | None = None,
                  ingest_at_event_time: list[IngestSketch] = ()) -> dict:
    """An epoch's live metrics (Spark's ``StreamingQueryProgress`` and Kafka's consumer
    lag, per epoch).

    Args:
        events: events the epoch read.
        ingest: the ``IngestSketch``es of the ingest times (``_ingest_time``) of the
            epoch's events whose ingest time is not their event time (one per
            first-operator task that had any; empty: none).
        plan: the epoch's plan.
        committed: next offset per partition after the epoch.
        partition_max_ts: max event time read per partition after the epoch, ms.
        watermark_ms: the epoch's watermark.
        now_ms: wall clock the measurement is taken at (the commit, or after the publish).
        previous_plan_ms: when the previous epoch of this driver was planned (None: this
            is its first).
        previous_ends: the end offsets of the previous epoch's plan (None: this is the
            driver's first).
        ingest_at_event_time: the ``IngestSketch``es of the events whose ingest time is
            their event time (a Kafka record timestamp used as both).

    Returns:
        ``{"at_ms": now_ms,
        "input_rate": events/s arriving: the growth of the partitions' end offsets from the
            previous plan to this one, per second between the two (``arrived``; null on a
            driver's first epoch),
        "read_rate": events/s read: events read / time since the previous plan (Spark's
            ``inputRowsPerSecond``; null on a driver's first epoch),
        "processing_rate": events/s from the plan to now_ms (null if no time passed),
        "lag_events": {partition: end offset at planning - committed offset (offsets)},
        "lag_ms": {partition: now - max event time read, ms, null if none read},
        "latency_ms": {"p50", "p99", "max"}: now - ingest time over the epoch's events
            whose ingest time is not their event time (nearest rank), null if none,
        "event_time_lag_ms": the same over the events whose ingest time is their event
            time: now - event time, which is latency only if the event time is when the
            event was produced (Flink's ``currentEmitEventTimeLag``), null if none,
        "watermark_delay_ms": now - watermark (null before any event time and at the end of
            a bounded source)}``.
    """
    since_previous = None if previous_plan_ms is None else plan.planned_at_ms - previous_plan_ms
    elapsed = now_ms - plan.planned_at_ms
    unknown = (WATERMARK_MIN, WATERMARK_MAX)
    seconds = since_previous / 1000 if since_previous else None
    return {
        "at_ms": now_ms,
        "input_rate": arrived(plan, previous_ends) / seconds if seconds and previous_ends is not None else None,
        "read_rate": events / seconds if seconds else None,
        "processing_rate": events / (elapsed / 1000) if elapsed > 0 else None,
        "lag_events": {p: plan.ends[p] - committed[p] for p in committed},
        "lag_ms": {p: None if partition_max_ts[p] == WATERMARK_MIN else now_ms - partition_max_ts[p]
                   for p in committed},
        "latency_ms": latency_ms(ingest, now_ms),
        "event_time_lag_ms": latency_ms(list(ingest_at_event_time), now_ms),
        "watermark_delay_ms": None if watermark_ms in unknown else now_ms - watermark_ms,
    }
