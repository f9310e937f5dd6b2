"""Event time: the partitions an epoch reads and the watermark it reaches, for bounded and
live jobs alike (``dkvstream.operators.runtime.driver`` plans every epoch with these).

* ``plan_epoch``: the offsets an epoch reads, with idle partitions
  (``idle_partitions``, Flink's ``withIdleness``; ``partition_activity``: where a
  partition's quiet time counts from) and watermark alignment at planning
  (``paused_partitions``, Flink's ``withWatermarkAlignment``).
* ``quiet_since``, ``quiet_watermark``: a live source none of whose partitions received
  an event for ``Job.quiet_timeout_ms`` is quiet, and its watermark advances with
  processing time (the whole job going quiet, where idleness is per partition).
* ``epoch_event_time``: from the read tasks' split summaries, alignment's cuts within the
  epoch (``alignment_cuts``, over each split's ``EventTimeSteps``) and the watermark
  (``watermark``: bounded out-of-orderness, the min over the partitions that hold it back,
  ``watermark_holders``). One pure function, so the driver and the first operator's tasks
  agree on it to the bit.

A bounded source's partitions hold back the watermark until read to the end, and when all
are the watermark is +infinity and the job finishes; a live source's hold it back unless
idle.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN


@dataclass(frozen=True)
class EpochPlan:
    """What an epoch reads, decided before it reads anything (``plan_epoch``).

    Attributes:
        offsets: ``{partition: (start, end)}`` offsets to read, ``[start, end)``, for every
            partition of the source in its order (``start == end``: nothing).
        ends: end offset of each partition when planned.
        idle: partitions idle when planned (``idle_partitions``); they do not hold back
            the watermark.
        paused: partitions with input that read nothing this epoch because their event
            time is too far ahead (watermark alignment, ``paused_partitions``).
        planned_at_ms: wall clock when planned, before the end offsets were asked
            for, ms since the Unix epoch: each partition read up to its end was quiet
            from its ``partition_activity`` time until at least then.
        ends_at_ms: wall clock when ``ends`` were known (the source's answer came
            back), ms since the Unix epoch: every event the plan reads had entered the
            source by then. None: at ``planned_at_ms``.
        quiet_since_ms: the source is quiet (``quiet_since``): wall clock, ms, since
            which no partition has received an event; None: not quiet.
    """

    offsets: dict[str, tuple[int, int]]
    ends: dict[str, int]
    idle: frozenset[str]
    paused: frozenset[str]
    planned_at_ms: int
    ends_at_ms: int | None = None
    quiet_since_ms: int | None = None

    @property
    def has_input(self) -> bool:
        """True if some partition has offsets to read."""
        return any(end > start for start, end in self.offsets.values())


def idle_partitions(committed: dict[str, int], ends: dict[str, int], active_at_ms: dict[str, int],
                    now_ms: int, idle_timeout_ms: int | None) -> frozenset[str]:
    """Partitions that stopped holding back the watermark (Flink's
    ``WatermarkStrategy.withIdleness``): read up to their end offset, and quiet for
    ``idle_timeout_ms`` (wall clock) since ``active_at_ms`` (``partition_activity``).

    A partition with events it has not read is never idle (it is behind, not quiet);
    one that receives events is read and active again at the next epoch. A partition
    missing from ``active_at_ms`` is not idle: no epoch has read events since it
    appeared, so its quiet time has not started (a source silent everywhere, such as a
    topic whose producers have not started yet, makes no partition idle).

    Args:
        committed: next offset to read per partition.
        ends: end offset per partition.
        active_at_ms: wall clock (ms) from which each partition's quiet time counts
            (``partition_activity``; the checkpoint's ``partition_active_at_ms``).
        now_ms: wall clock, ms, no later than the moment ``ends`` were asked for (a
            partition read to its end got nothing from ``active_at_ms`` until then).
        idle_timeout_ms: ``Job.idle_timeout_ms``; None: no partition is ever idle.

    Returns:
        The idle partitions.
    """
    if idle_timeout_ms is None:
        return frozenset()
    return frozenset(p for p in committed if committed[p] >= ends[p] and p in active_at_ms
                     and now_ms - active_at_ms[p] >= idle_timeout_ms)


def quiet_since(committed: dict[str, int], ends: dict[str, int], active_at_ms: dict[str, int],
                now_ms: int, quiet_timeout_ms: int | None) -> int | None:
    """When the whole source went quiet, if it has been for ``quiet_timeout_ms``: every
    partition read to its end, and the latest ``active_at_ms`` (``partition_activity``:
    after it no partition received an event) at least ``quiet_timeout_ms`` before
    ``now_ms``.

    Args:
        committed, ends, active_at_ms, now_ms: as ``idle_partitions``.
        quiet_timeout_ms: ``Job.quiet_timeout_ms``; None: never quiet.

    Returns:
        The latest ``active_at_ms`` (ms), or None: not quiet (a partition has events to
        read, the timeout has not passed, or no partition has received an event yet).
    """
    if quiet_timeout_ms is None or any(committed[p] < ends[p] for p in committed):
        return None
    latest = max((active_at_ms[p] for p in committed if p in active_at_ms), default=None)
    if latest is None or now_ms - latest < quiet_timeout_ms:
        return None
    return latest


def quiet_watermark(plan: EpochPlan, partition_max_ts: dict[str, int], bound_ms: int) -> int | None:
    """The watermark of a quiet source (``EpochPlan.quiet_since_ms``): event time is taken
    to go on at the pace of processing time while nothing arrives, so the watermark is
    the largest event time read plus the time quiet (``planned_at_ms -
    quiet_since_ms``), minus ``bound_ms`` and 1 ms as ``watermark``. A window whose end
    is ``d`` ms past the last event is emitted once the source has been quiet for
    ``max(quiet_timeout_ms, d + bound_ms)``.

    Returns:
        That watermark (ms), or None: the source is not quiet, or no event time is known.
    """
    if plan.quiet_since_ms is None:
        return None
    newest = max((t for t in partition_max_ts.values() if t != WATERMARK_MIN), default=None)
    if newest is None:
        return None
    return newest + (plan.planned_at_ms - plan.quiet_since_ms) - bound_ms - 1


def partition_activity(active_at_ms: dict[str, int], plan: EpochPlan) -> dict[str, int]:
    """Where each partition's quiet time counts from after an epoch (the checkpoint's
    ``partition_active_at_ms``, read by ``idle_partitions``).

    * A partition the epoch read from: when the plan's end offsets were known
      (``EpochPlan.ends_at_ms``). Its last record read entered the source by then;
      the driver cannot tell when exactly, so quiet time counts from the latest moment
      it may have (the plan's clock, read before the end offsets were asked for,
      could be seconds earlier on a slow broker, and a partition would then go idle
      before it was quiet for the timeout).
    * Otherwise, a partition with a time keeps it.
    * A partition without one (it never had a record read) gets the same time if the
      epoch read events from any partition, else stays without: its quiet time starts
      at its assignment (the first plan that lists it) or at the source's first
      delivered events, whichever is later. A partition whose first event comes
      later than ``idle_timeout_ms`` after that is idle by then, as one that pauses
      that long, and those of its events older than the watermark the others drove
      meanwhile are late.

    Why not from its assignment alone (as Flink's ``withIdleness``): a job started
    before its source's producers would then find every partition idle once they
    start, and the events of a producer starting a moment after the first one would be
    older than the watermark the first one drove: late, on a topic in event-time order.
    Why not never (a partition idle only after a first record): a partition that never
    receives one (a key-partitioned topic whose keys miss it) would hold back the
    watermark for ever, and no window would close.

    Args:
        active_at_ms: the previous checkpoint's times, ms (partitions without one are
            missing).
        plan: the epoch's plan as committed (alignment's cuts applied).

    Returns:
        ``{partition: wall clock ms}`` for the plan's partitions that have one.
    """
    read = {p for p, (start, end) in plan.offsets.items() if end > start}
    at = plan.planned_at_ms if plan.ends_at_ms is None else plan.ends_at_ms
    out = {}
    for p in plan.offsets:
        if p in read or (p not in active_at_ms and read):
            out[p] = at
        elif p in active_at_ms:
            out[p] = active_at_ms[p]
    return out


def paused_partitions(open_partitions: list[str], candidates: list[str], partition_max_ts: dict[str, int],
                      max_drift_ms: int | None) -> frozenset[str]:
    """Watermark alignment (Flink's ``WatermarkStrategy.withWatermarkAlignment``): the
    partitions whose max event time is more than ``max_drift_ms`` ahead of the slowest
    candidate; they read nothing this epoch, so the slower ones catch up and the events
    of the fast ones do not wait in state for the watermark.

    Args:
        open_partitions: partitions with offsets to read.
        candidates: partitions that hold back the watermark (not idle; of a bounded
            source, not read to the end). One without an event time yet does not count:
            it has told nothing of where it is.
        partition_max_ts: max event time read per partition, ms (``WATERMARK_MIN``: none).
        max_drift_ms: ``Job.max_watermark_drift_ms``; None: no alignment.

    Returns:
        The paused partitions (never the slowest one, so an epoch with input reads
        something unless only paused partitions have input).
    """
    timed = [partition_max_ts[p] for p in candidates if partition_max_ts[p] != WATERMARK_MIN]
    if max_drift_ms is None or not timed:
        return frozenset()
    slowest = min(timed)
    return frozenset(p for p in open_partitions if partition_max_ts[p] > slowest + max_drift_ms)


def plan_epoch(committed: dict[str, int], ends: dict[str, int], partition_max_ts: dict[str, int],
               active_at_ms: dict[str, int], *, now_ms: int, events_per_epoch: int, bounded: bool,
               idle_timeout_ms: int | None = None, max_drift_ms: int | None = None,
               ends_at_ms: int | None = None, quiet_timeout_ms: int | None = None) -> EpochPlan:
    """The offsets the next epoch reads: ``events_per_epoch`` split equally over the
    partitions that have input and are not paused by watermark alignment (one with less
    than its share reads what it has). A paused partition's share goes to the others;
    that they do not then run ahead within the epoch is ``alignment_cuts``' job, after
    reading.

    Args:
        committed: next offset per partition, in the source's partition order (new
            partitions at their ``Source.start_offset``).
        ends: end offset per partition (``Source.end_offsets``; a partition missing
            there has none yet).
        partition_max_ts, active_at_ms: per partition, as in the checkpoint
            (``partition_max_ts``: ``WATERMARK_MIN`` for a new one; ``active_at_ms``:
            missing for one whose quiet time has not started, ``partition_activity``).
        now_ms: wall clock before ``ends`` were asked for, ms (idleness is judged at it).
        events_per_epoch, idle_timeout_ms, max_drift_ms: the ``Job`` fields.
        bounded: ``Source.bounded`` (a bounded source's partitions read to the end
            hold back nothing).
        ends_at_ms: wall clock when ``ends`` were known, ms (``EpochPlan.ends_at_ms``;
            None: ``now_ms``).
        quiet_timeout_ms: ``Job.quiet_timeout_ms`` (``quiet_since``; a bounded source is
            never quiet).

    Returns:
        The ``EpochPlan``.
    """
    ends = {p: max(ends.get(p, committed[p]), committed[p]) for p in committed}
    open_parts = [p for p in committed if committed[p] < ends[p]]
    idle = idle_partitions(committed, ends, active_at_ms, now_ms, idle_timeout_ms)
    candidates = watermark_holders(committed, ends, idle, bounded)
    paused = paused_partitions(open_parts, candidates, partition_max_ts, max_drift_ms)
    reading = [p for p in open_parts if p not in paused]
    share = -(-events_per_epoch // max(1, len(reading)))
    offsets = {p: (committed[p], min(ends[p], committed[p] + share) if p in reading else committed[p])
               for p in committed}
    quiet = None if bounded else quiet_since(committed, ends, active_at_ms, now_ms, quiet_timeout_ms)
    return EpochPlan(offsets=offsets, ends=ends, idle=idle, paused=paused, planned_at_ms=now_ms,
                     ends_at_ms=ends_at_ms, quiet_since_ms=quiet)


def watermark_holders(committed: dict[str, int], ends: dict[str, int], idle: frozenset[str],
                      bounded: bool) -> list[str]:
    """The partitions that hold back the watermark when an epoch is planned: not idle,
    and of a bounded source not read to the end."""
    return [p for p in committed if p not in idle and (not bounded or committed[p] < ends[p])]


# Watermark alignment: a read task summarises its split's event times in at most this
# many steps (``EventTimeSteps``), so what the driver receives does not grow with events.
MAX_ALIGNMENT_STEPS = 1024


@dataclass(frozen=True)
class EventTimeSteps:
    """Where a split's running maximum of event time rises, thinned to at most
    ``MAX_ALIGNMENT_STEPS`` steps: what watermark alignment needs to know of a split
    read in a task (``alignment_cuts``), in bytes independent of its events.

    A step is kept where the running maximum enters a new bucket of ``quantum`` ms
    (buckets counted from ``base``, the split's smallest event time); ``quantum`` is 1 ms
    when the split spans at most ``MAX_ALIGNMENT_STEPS`` ms of event time, so the steps
    are then every rise of the running maximum and the cut is exact; otherwise a cut may
    come up to one quantum of event time earlier than the first event past the limit
    (never later).

    Attributes:
        base, quantum: bucket of a time t is ``(t - base) // quantum``, ms.
        values: event time of each step's row, ms (its running maximum there).
        offsets: source offset of each step's row.
        rows_before: good rows of the split before each step's row.
        max_before: running maximum of event time before each step's row, ms
            (``WATERMARK_MIN`` for the first row).
    """

    base: int
    quantum: int
    values: np.ndarray
    offsets: np.ndarray
    rows_before: np.ndarray
    max_before: np.ndarray

    @classmethod
    def of(cls, offsets: np.ndarray, ts: np.ndarray) -> EventTimeSteps:
        """The steps of a split's good rows (``offsets`` and event times ``ts``, ms, in
        offset order, at least one row)."""
        ts = np.asarray(ts, np.int64)
        base = int(ts.min())
        quantum = max(1, -(-(int(ts.max()) - base + 1) // MAX_ALIGNMENT_STEPS))
        running = np.maximum.accumulate(ts)
        bucket = (running - base) // quantum
        idx = np.flatnonzero(np.diff(bucket, prepend=-1) > 0)
        before = np.empty(len(idx), np.int64)
        before[0] = WATERMARK_MIN
        before[1:] = running[idx[1:] - 1]
        return cls(base, quantum, ts[idx], np.asarray(offsets, np.int64)[idx], idx.astype(np.int64), before)

    def first_past(self, limit: int) -> int | None:
        """Index of the step the split is cut at so that no row kept is past ``limit``
        (ms), or None if no row is past it."""
        i = int(np.searchsorted(self.values, limit, side="right"))  # first step value > limit
        if i == len(self.values):
            # Rows after the last step stay in its bucket: past the limit only if the bucket is.
            last = len(self.values) - 1
            top = self.base + ((int(self.values[last]) - self.base) // self.quantum + 1) * self.quantum - 1
            return None if top <= limit else last
        if i > 0 and self.quantum > 1:
            # Rows between steps i-1 and i stay in step i-1's bucket: if it reaches past the
            # limit, one of them may be past it: cut at i-1 (earlier, never later).
            top = self.base + ((int(self.values[i - 1]) - self.base) // self.quantum + 1) * self.quantum - 1
            if top > limit:
                return i - 1
        return i


def alignment_cuts(summaries: list, partition_max_ts: dict[str, int], holders: list[str],
                   max_drift_ms: int | None) -> dict[str, tuple[int, int]]:
    """Watermark alignment within an epoch: where to end each partition's slice so that
    no partition reads events more than ``max_drift_ms`` ahead of the slowest holder.

    Pausing at planning (``paused_partitions``) cannot stop a partition from running
    ahead within one epoch, by up to its whole share; so after reading, the slowest
    holder's max event time (with this epoch's events) plus the drift is a limit, and a
    partition's slice ends before its first event past the limit (to within a quantum of
    its ``EventTimeSteps``). The events cut off are read again by the next epoch (Flink
    pauses a split's reader at that point).

    Args:
        summaries: the epoch's ``splits.SplitSummary``s (each partition's in offset order).
        partition_max_ts: max event time per partition before the epoch, ms.
        holders: partitions holding back the watermark (``watermark_holders``).
        max_drift_ms: ``Job.max_watermark_drift_ms``; None: no cut.

    Returns:
        ``{partition: (offset, max event time of the rows kept)}``: the first offset a cut
        partition did not read and the largest event time it did read this epoch
        (``WATERMARK_MIN``: none). Empty when nothing is cut, and also when the cut would
        leave the epoch without events (a slowest holder that read nothing and a gap in
        the others' event times): the epoch then keeps its planned slices, so a run
        always makes progress.
    """
    read = [s for s in summaries if s.rows]
    if max_drift_ms is None or not read:
        return {}
    new_max = dict(partition_max_ts)
    for s in read:
        p = s.split.partition
        new_max[p] = max(new_max.get(p, WATERMARK_MIN), s.max_ts)
    timed = [new_max[p] for p in holders if new_max.get(p, WATERMARK_MIN) != WATERMARK_MIN]
    if not timed:
        return {}
    limit = min(timed) + max_drift_ms
    cuts: dict[str, tuple[int, int]] = {}
    kept = 0
    by_partition: dict[str, list] = {}
    for s in read:
        by_partition.setdefault(s.split.partition, []).append(s)
    for p, splits in by_partition.items():
        seen_max, rows = WATERMARK_MIN, 0
        for s in sorted(splits, key=lambda s: s.split.start):
            i = s.steps.first_past(limit)
            if i is not None:
                cuts[p] = (int(s.steps.offsets[i]), max(seen_max, int(s.steps.max_before[i])))
                rows += int(s.steps.rows_before[i])
                break
            seen_max, rows = max(seen_max, s.max_ts), rows + s.rows
        kept += rows
    return cuts if kept else {}


def watermark(previous: int, partition_max_ts: dict[str, int], inputs: list[str], bound_ms: int) -> int:
    """Bounded out-of-orderness: min over ``inputs`` of their max event time, minus
    ``bound_ms``, minus 1 ms, never below ``previous`` (Flink's
    ``forBoundedOutOfOrderness`` with the min over input partitions). No inputs (all
    idle), or one without an event time yet: ``previous``.

    Why the 1 ms: an event with ``timestamp <= watermark`` is late (timers up to the
    watermark have fired), and an event ``bound_ms`` behind its partition's max is within
    the bound: with ``bound_ms`` 0, the next event of a partition in event-time order
    with the same timestamp as its max (a tie) would otherwise be late.
    """
    low = min((partition_max_ts[p] for p in inputs), default=WATERMARK_MIN)
    if low == WATERMARK_MIN:
        return previous
    return max(previous, low - bound_ms - 1)


@dataclass(frozen=True)
class EventTimeInputs:
    """What, besides the read tasks' split summaries, decides an epoch's event time
    (``epoch_event_time``): the previous checkpoint's and the plan's (pickled to the
    first operator's tasks when they compute it themselves).

    Attributes:
        previous_watermark: the watermark before the epoch, ms.
        partition_max_ts: max event time per planned partition before the epoch, ms.
        plan: the epoch's ``EpochPlan``.
        bounded: ``Source.bounded``.
        out_of_orderness_ms, max_drift_ms: the ``Job`` fields.
        drain: the drain epoch (``JobRunner.stop(drain=True)``): watermark +infinity.
    """

    previous_watermark: int
    partition_max_ts: dict[str, int]
    plan: EpochPlan
    bounded: bool
    out_of_orderness_ms: int
    max_drift_ms: int | None
    drain: bool = False


@dataclass(frozen=True)
class EpochEventTime:
    """An epoch's event time, from its split summaries (``epoch_event_time``).

    Attributes:
        watermark: the watermark the epoch reaches, ms.
        partition_max_ts: max event time per partition after the epoch, ms.
        finished: a bounded source read to the end, or the drain epoch.
        cuts: watermark alignment's cuts, ``{partition: first offset not read}``.
        plan: the plan with each cut partition's offsets ending at its cut.
    """

    watermark: int
    partition_max_ts: dict[str, int]
    finished: bool
    cuts: dict[str, int]
    plan: EpochPlan


def epoch_event_time(inputs: EventTimeInputs, summaries: list) -> EpochEventTime:
    """The watermark an epoch reaches and where alignment cuts its slices, from the
    read tasks' ``splits.SplitSummary``s: one pure function, so the driver and the
    first operator's tasks (which compute it themselves when the job does not align,
    saving the driver a Spark job per epoch) agree to the bit.

    Steps: max event time read per partition; alignment's cuts (``alignment_cuts``, with
    ``max_drift_ms``), which lower a cut partition's max to what it kept and end its
    offsets at the cut; then the watermark: min over the input partitions of their max
    event time, minus the bound and 1 ms, never below the previous one (``watermark``), and
    on a quiet source at least its quiet watermark (``quiet_watermark``). Input
    partitions: a bounded source's partitions not read to the end (none left: finished,
    +infinity); a live source's partitions, caught up or not (they may still receive
    older events), except idle ones (Flink's ``withIdleness``: all idle, the watermark
    stays). The drain epoch: +infinity, finished.
    """
    plan = inputs.plan
    max_ts: dict[str, int] = {}
    for s in summaries:
        if s.rows:
            p = s.split.partition
            max_ts[p] = max(max_ts.get(p, WATERMARK_MIN), s.max_ts)
    cuts: dict[str, int] = {}
    if inputs.max_drift_ms is not None and summaries:
        holders = watermark_holders({p: start for p, (start, _) in plan.offsets.items()}, plan.ends, plan.idle,
                                    inputs.bounded)
        found = alignment_cuts(summaries, inputs.partition_max_ts, holders, inputs.max_drift_ms)
        for p, (cut, kept_max) in found.items():
            cuts[p] = cut
            if kept_max == WATERMARK_MIN:
                max_ts.pop(p, None)
            else:
                max_ts[p] = kept_max
        if cuts:
            plan = dataclasses.replace(
                plan, offsets={p: (start, cuts.get(p, end)) for p, (start, end) in plan.offsets.items()})
    part_max = {p: max(inputs.partition_max_ts.get(p, WATERMARK_MIN), max_ts.get(p, WATERMARK_MIN))
                for p in plan.offsets}
    if inputs.drain:
        return EpochEventTime(WATERMARK_MAX, part_max, True, cuts, plan)
    if inputs.bounded:
        holding = [p for p, (_, end) in plan.offsets.items() if end < plan.ends[p]]
        if not holding:
            return EpochEventTime(WATERMARK_MAX, part_max, True, cuts, plan)
    else:
        holding = [p for p in plan.offsets if p not in plan.idle]
    mark = watermark(inputs.previous_watermark, part_max, holding, inputs.out_of_orderness_ms)
    quiet = quiet_watermark(plan, part_max, inputs.out_of_orderness_ms)
    if quiet is not None and not max_ts:  # quiet: planned with nothing to read, and read nothing
        mark = max(mark, quiet)
    return EpochEventTime(mark, part_max, False, cuts, plan)
