"""The driver: plans micro-batch epochs, runs each operator as a Spark stage, commits.

The design is in docs/design.md, "Epochs and checkpoints". Per epoch
(``JobRunner._run_epoch``, one method per step):

1. Plan (``dkvstream.operators.runtime.event_time.plan_epoch``): for each source partition, new ones
   from ``Source.start_offset``, the offset range ``[committed, end)`` (an equal share
   of ``events_per_epoch`` per unfinished partition; none for a partition more than
   ``max_watermark_drift_ms`` ahead in event time: watermark alignment). A live source
   with nothing new ends the run, or, in a continuous run
   (``JobRunner.epochs(continuous=True)``), the driver waits for the next firing of the
   processing-time trigger and plans again; it runs an epoch without input only when
   the watermark advances (a partition became idle), a processing-time timer is due, or
   the watermark of a quiet source (``Job.quiet_timeout_ms``) reaches an event-time
   timer (``_due_without_input``). A runner that follows another job (``follow``: a
   branch's shadow run, ``dkvstream.operators.runtime.branches``) plans instead exactly
   the offsets of that job's checkpoint of the same epoch, at its processing time, and
   runs every epoch that job committed, with input or without. ``JobRunner.stop()`` ends the run
   between epochs; ``stop(drain=True)`` first commits a drain epoch: nothing read,
   watermark +infinity (every timer fires), the job finished (Flink's ``stop --drain``).
2. Read (``dkvstream.operators.runtime.splits``, ``dkvstream.operators.runtime.exchange``): one read task per
   planned slice reads it, screens bad rows out to the dead-letter rows and sends its
   events, by key-group range of the first operator, through the epoch's exchange
   (Spark's shuffle, ``dkvstream.operators.spark.stage``); the driver never receives an event. The
   epoch's event time (``event_time.epoch_event_time``) comes from the read tasks' split
   summaries: the watermark it reaches (bounded out-of-orderness: min over the
   partitions of the max event time seen, minus the bound; a bounded source's fully read
   partitions do not count, and once all are read it is +infinity; a live source's
   caught-up partitions do count, as they may still receive older events, unless idle
   for ``idle_timeout_ms``), and with watermark alignment where each slice ends, before
   its first event too far ahead of the slowest partition (``event_time.alignment_cuts``: the
   offsets committed end there). With alignment the driver computes it before any
   operator runs; without, the first operator's tasks do, and its range 0 reports it.
3. Run stages: one Spark stage per operator, one task per key-group range over the
   events routed to it (``dkvstream.operators.runtime.task.run_task``; a range without events
   still runs, so it fires its timers); each operator has its own ranges
   (``Job.operator_parallelism``). An operator's ``main`` output is re-keyed and routed
   through the exchange to the next operator's ranges.
4. Dead letters: the first operator's range 0 stages the epoch's bad input rows (before
   the alignment cut) as one file; tasks stage the events their operator raised on.
5. Prepare sinks: each sink checks the staged files of the epoch (``Sink.prepare``).
6. Metrics: events, timers, dead letters, DKV shape, requests, live metrics (rates,
   lag, latency; ``live.epoch_metrics``), recorded in the checkpoint. An epoch whose
   dead letters are more than ``DeadLetter.max_ratio`` of its records fails here.
7. Commit: one job checkpoint manifest, written with put-if-absent, names the source
   offsets, the watermark, every DKV range manifest and every staged output file; it
   counts only if its epoch is newer than every epoch committed before (the fence,
   ``dkvstream.operators.runtime.checkpoints``), else this driver stops with ``JobFencedError``.
8. Publish: staged sink files of the committed epoch get their final names
   (server-side copies; a sink that produces records does it in Spark tasks,
   ``Sink.publish_in_tasks``; idempotent, redone on restart for the newest checkpoint).
9. Retention: older checkpoints and the files only they named are deleted
   (``dkvstream.operators.runtime.cleanup``: incremental, from what each checkpoint recorded it
   dropped, with a full sweep every ``full_sweep_every`` epochs).

Restart = read the newest checkpoint and continue from its offsets; files of failed
attempts are never named and never published (``dkvstream.operators.runtime.recovery``: an
unusable or missing newest checkpoint is fallen back from only where that is correct).
A restart with another parallelism rescales: each new key-group range opens DKV from
the old ranges it overlaps, reading only its own key interval (key groups themselves
are fixed for a job's lifetime).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from dkvstream.operators.api.job import Job
from dkvstream.operators.api.keygroups import KeyGroupRange, key_group_ranges
from dkvstream.operators.api.operator import MAIN_OUTPUT, WATERMARK_MIN
from dkvstream.operators.api.state_schema import StateSchemas, evolve_job
from dkvstream.operators.errors import BadInputError, JobFailedError, JobFencedError, OperatorError
from dkvstream.operators.io import dead_letter
from dkvstream.operators.paths import LAYOUTS, checkpoint_key, job_prefix
from dkvstream.operators.runtime import live
from dkvstream.operators.runtime.branches import check_promoted_code
from dkvstream.operators.runtime.checkpoints import (
    JobCheckpoint,
    commit_checkpoint,
    encode_objects,
    latest_checkpoint,
    read_checkpoint,
    read_commit_log,
    record_commit,
)
from dkvstream.operators.runtime.cleanup import CleanupReport, IncrementalRetention
from dkvstream.operators.runtime.control import (
    acquire_lease,
    consume_flush_requests,
    pending_flush_requests,
    release_lease,
)
from dkvstream.operators.runtime.erasure import (
    erasure_targets,
    finish_applied,
    held_before,
    read_erasure_requests,
    subjects_of,
)
from dkvstream.operators.runtime.event_time import (
    EpochEventTime,
    EpochPlan,
    EventTimeInputs,
    epoch_event_time,
    partition_activity,
    plan_epoch,
)
from dkvstream.operators.runtime.exchange import (
    DeadLetterResult,
    DeadLetterSpec,
    Exchange,
    FirstStage,
    LocalExchange,
)
from dkvstream.operators.runtime.forks import refuse_if_dropped
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.recovery import VERIFY_MODES, restart_checkpoint, restore_source
from dkvstream.operators.runtime.splits import ReadContext, Split, SplitSummary, stage_input_schema
from dkvstream.operators.runtime.task import TaskResult, TaskSpec, forwarded_schema
from dkvstream.operators.runtime.task_errors import task_error
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import ObjectStore, open_object_store, subtract_requests, sum_requests

log = logging.getLogger(__name__)



@dataclass
class EpochResult:
    """A committed epoch, as reported to the caller (and to Dagster as metadata).

    Attributes:
        epoch: epoch number (1-based).
        watermark: watermark reached, ms (``WATERMARK_MAX`` at end of input).
        source_offsets: next offset per source partition.
        checkpoint_uri: URI of the job checkpoint manifest.
        events: events read this epoch.
        seconds: wall time of the epoch, s.
        finished: True when a bounded source is fully processed, or the job was drained
            (``drained``); a finished job runs no more epochs.
        tables / table_bytes / keys: DKV tables, bytes and entries over all ranges.
        output_rows: rows published per output.
        published: object keys published this epoch.
        dead_letter: bad input rows, and events and timers an operator raised on,
            sent to the dead-letter table this epoch, per reason and ``total``
            (``dkvstream.operators.io.dead_letter``).
        recovery: set on the first epoch after a restart that fell back from an
            unusable checkpoint (``dkvstream.operators.runtime.recovery.Fallback.as_metrics``).
        live: arrival (``input_rate``), read and processing rates (events/s), lag
            (offsets and ms), end-to-end latency or event-time lag (ms) and watermark
            delay (ms), measured after the publish
            (``dkvstream.operators.runtime.live.epoch_metrics``; the checkpoint's ``metrics["live"]``
            holds the same measured at the commit).
        drained: True for the drain epoch of ``JobRunner.stop(drain=True)`` (no events
            read, watermark +infinity, ``finished``).
    """

    epoch: int
    watermark: int
    source_offsets: dict[str, int]
    checkpoint_uri: str
    events: int
    seconds: float
    finished: bool
    tables: int
    table_bytes: int
    keys: int
    output_rows: dict[str, int]
    published: list[str]
    dead_letter: dict[str, int] = field(default_factory=dict)
    recovery: dict | None = None
    live: dict = field(default_factory=dict)
    drained: bool = False

    @property
    def events_per_second(self) -> float:
        """Events per second of wall time."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


class JobRunner:
    """Runs a ``Job`` on a Spark session against an object store.

    Args:
        job: the job definition.
        spark: a ``SparkSession`` (see ``dkvstream.operators.spark.session.get_spark``), or None to run
            every stage in this process, range after range (tests, debugging).
        store: the object store, or its root URI or path (``.dkvstream`` by default;
            ``dkvstream.storage.objectstore.open_object_store``). Spark tasks receive the store
            pickled (its configuration, e.g. an S3 endpoint and credentials), so they use
            the same store as the driver whatever their environment.
        dkv_options: DKV tuning passed to every task.
        retain_checkpoints: keep this many newest checkpoints and, after each epoch,
            delete older ones and the files only they named (``dkvstream.operators.runtime.cleanup``);
            None keeps everything. Incremental: a few requests per epoch whatever the
            number of ranges (``dkvstream.operators.runtime.cleanup.IncrementalRetention``).
        full_sweep_every: every this many epochs, retention runs the full sweep
            instead, which also deletes what failed task attempts left
            (``dkvstream.operators.runtime.cleanup.cleanup_job``; its requests grow with
            retained checkpoints x ranges); None: never inline (schedule the Dagster
            ``cleanup`` op instead).
        verify_restart: how a restart checks the newest checkpoint before continuing
            from it, ``"names"`` (files exist at their recorded size) or ``"full"``
            (every block and record); an unusable one is fallen back from where that
            is correct (``dkvstream.operators.runtime.recovery``).
        clock: wall clock, seconds since the Unix epoch (``time.time``): partition
            idleness, live metrics, the dead-letter table's times. Tests pass a fake one.
        long_lived_tasks: on Spark, run a run's epochs on long-lived tasks: one barrier
            Spark job for the whole run, state kept open in its tasks, epochs pipelined
            (``dkvstream.operators.spark.long_lived``). False: one or two Spark jobs per
            epoch (``dkvstream.operators.spark.stage``), whose tasks Spark retries one
            by one and which need no free task slot beyond one per task. Ignored in
            process.
        follow: the name of another job reading the same source (the main job of a
            branch, ``dkvstream.operators.runtime.branches``): each epoch of this job reads
            exactly the offsets the other's checkpoint of the same epoch number ended at,
            so epoch k of both covers the same input, and the run ends (a continuous run
            waits) when this job has caught up with the other's newest checkpoint.
            Watermark alignment is left to the other job (its cuts are the plan); the
            epoch's processing time is the other's (its processing-time timers fire in
            the same epochs), and an epoch the other ran without input is run too. Each
            checkpoint records the other's watermark in ``metrics["follow"]``.

    An in-process runner (``spark=None``) keeps each range's DKV open between epochs;
    ``close()`` (or leaving a ``with JobRunner(...) as runner:`` block) closes them.

    Raises:
        InvalidJobError: the job definition is invalid (``dkvstream.operators.api.validation``);
            nothing has been written.
    """

    def __init__(self, job: Job, spark, store: ObjectStore | str = ".dkvstream",
                 dkv_options: DKVOptions | None = None,
                 retain_checkpoints: int | None = 10, full_sweep_every: int | None = 100,
                 verify_restart: str = "names",
                 clock: Callable[[], float] = time.time,
                 long_lived_tasks: bool = True, follow: str | None = None) -> None:
        job.validate()  # again: fields may have changed since construction; fail before any write
        self.job = job
        self.spark = spark
        self.store: ObjectStore = store if isinstance(store, ObjectStore) else open_object_store(store)
        # Driver requests are counted from here to each commit (checkpoint metric "requests").
        self._requests_mark = self.store.stats.snapshot()
        self.dkv_options = dkv_options
        # In-process tasks keep their ranges' DKV open between epochs, as Spark workers do:
        # one per range and operator of this job at most (``close`` closes them).
        self._open_state = OpenState(capacity=sum(job.parallelism_of(op.name) for op in job.operators))
        if retain_checkpoints is not None and retain_checkpoints < 1:
            raise ValueError(f"retain_checkpoints must be >= 1 or None, got {retain_checkpoints}")
        self.retain_checkpoints = retain_checkpoints
        self._retention = None if retain_checkpoints is None else IncrementalRetention(
            self.store, job.prefix, retain_checkpoints, full_sweep_every)
        if verify_restart not in VERIFY_MODES:
            raise ValueError(f"verify_restart must be one of {VERIFY_MODES}, got {verify_restart!r}")
        self.verify_restart = verify_restart
        job.source.attach(self.store, job.prefix)
        job.source.use_tasks(self._map_in_tasks)
        self._recovery: dict | None = None  # a fallback, recorded in the next checkpoint
        self._retention_damage: list[str] = []  # found by retention, for the next checkpoint
        self._task_dead_letters: list[str] = []  # staged by the epoch's tasks (_run_stages)
        self._erasing: list = []  # erasure requests the epoch in flight serves (_run_leased)
        self._erasure_skipped: dict[str, str] = {}  # malformed request objects: {key: why}
        self._exchange: Exchange | None = None  # the epoch's data plane (_read_events)
        self._screened: DeadLetterResult | None = None  # the dead-letter task's (_run_stages)
        self.last_cleanup: CleanupReport | None = None
        self._stop = live.StopRequest()
        self._clock = clock
        self._previous_plan_ms: int | None = None  # for the rates (live.epoch_metrics)
        self._previous_plan_ends: dict[str, int] | None = None  # for the input (arrival) rate
        self._ends_behind: set[str] = set()  # partitions warned of an end below the committed offset
        self.long_lived_tasks = long_lived_tasks
        self._tasks = None  # the run's long-lived tasks (a long_lived.Coordinator), while it runs
        self._ahead: _ReadAhead | None = None  # the next epoch, planned and being read (pipelining)
        self._may_read_ahead: Callable[[], bool] = lambda: False
        self._epoch_read_ahead = False  # the epoch in flight was read ahead
        # Each state's schema history (dkvstream.operators.api.state_schema), set by _restart.
        self._state_schemas: StateSchemas = {}
        if follow == job.name:
            raise ValueError(f"job {job.name}: a job cannot follow itself")
        self.follow = follow
        self._followed: dict[int, JobCheckpoint] = {}  # epoch -> the followed job's checkpoint

    def close(self) -> None:
        """Closes the DKV instances in-process tasks kept open (a later epoch reopens
        them from the object store) and the source (``Source.close``). Idempotent."""
        self._open_state.close_all()
        self._close_source()

    def _close_source(self) -> None:
        """``Source.close``; a failure is logged, not raised: nothing read or committed
        depends on it, and an error of the run it ends must stay the one reported."""
        try:
            self.job.source.close()
        except Exception:  # any source's close: logged, not raised
            log.warning("job %s: closing source %s failed", self.job.name, self.job.source.name,
                        exc_info=True)

    def __enter__(self) -> JobRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- planning
    def latest(self) -> JobCheckpoint | None:
        """The newest committed checkpoint of this job, or None."""
        return latest_checkpoint(self.store, self.job.prefix)

    def _initial(self) -> JobCheckpoint:
        parts = self.job.source.partitions()
        return JobCheckpoint(
            job=self.job.name, epoch=0, watermark=WATERMARK_MIN,
            source_offsets={p: self.job.source.start_offset(p) for p in parts},
            partition_max_ts={p: WATERMARK_MIN for p in parts},
            finished=False, key_groups=self.job.key_groups, parallelism=self.job.parallelism,
            operators={op.name: {} for op in self.job.operators}, outputs={},
            layout=LAYOUTS[self.job.key_layout], next_event_timer_ms=None, next_processing_timer_ms=None,
        )

    def _check_compatible(self, ckpt: JobCheckpoint) -> None:
        if ckpt.key_groups != self.job.key_groups:
            raise JobFailedError(
                f"job {self.job.name}: checkpoint epoch {ckpt.epoch} has key_groups={ckpt.key_groups}, "
                f"job has {self.job.key_groups}; key groups are fixed for a job's lifetime")
        if ckpt.layout != LAYOUTS[self.job.key_layout]:
            recorded = next(name for name, n in LAYOUTS.items() if n == ckpt.layout)
            log.warning("job %s: key_layout=%r, but the job's files are in the %r layout since its first "
                        "epoch; it keeps that one (a layout is fixed for a job's lifetime)",
                        self.job.name, self.job.key_layout, recorded)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _plan(self, ckpt: JobCheckpoint) -> EpochPlan | None:
        """Step 1 (``event_time.plan_epoch``): the partitions of the source now, new ones
        from their ``start_offset``, with idleness and watermark alignment; following
        another job, its next checkpoint's offsets (``_follow_plan``; None: caught up)."""
        source, now_ms = self.job.source, self._now_ms()
        parts = list(ckpt.source_offsets)
        parts += [p for p in source.partitions() if p not in ckpt.source_offsets]
        committed = {p: ckpt.source_offsets[p] if p in ckpt.source_offsets else source.start_offset(p)
                     for p in parts}
        ends = source.end_offsets()
        # Idleness is judged at now_ms (every caught-up partition was quiet until at least
        # then); activity counts from ends_at_ms (every event read was in by then).
        ends_at_ms = self._now_ms()
        self._warn_ends_behind(committed, ends)
        plan = plan_epoch(
            committed, ends, self._partition_max_ts(ckpt, parts), ckpt.partition_active_at_ms, now_ms=now_ms,
            events_per_epoch=self.job.events_per_epoch, bounded=source.bounded,
            idle_timeout_ms=self.job.idle_timeout_ms, max_drift_ms=self._max_drift_ms,
            ends_at_ms=ends_at_ms, quiet_timeout_ms=self.job.quiet_timeout_ms)
        return plan if self.follow is None else self._follow_plan(ckpt, plan)

    @property
    def _max_drift_ms(self) -> int | None:
        """Watermark alignment's drift: none when following (the followed job's cuts are the plan)."""
        return self.job.max_watermark_drift_ms if self.follow is None else None

    def _follow_plan(self, ckpt: JobCheckpoint, plan: EpochPlan) -> EpochPlan | None:
        """``plan`` with each partition's range ending where the followed job's checkpoint
        of epoch ``ckpt.epoch + 1`` ends it; None when the followed job has not committed
        that epoch yet.

        Raises:
            JobFailedError: that checkpoint was deleted by the followed job's retention
                (this job fell too far behind to follow it), or it starts before this
                job's offsets (the two did not start from the same checkpoint).
        """
        prefix = job_prefix(self.follow)
        epoch = ckpt.epoch + 1
        if read_commit_log(self.store, prefix).newest_committed < epoch:
            return None
        try:
            target = read_checkpoint(self.store, prefix, epoch)
        except ObjectNotFoundError:
            raise JobFailedError(
                f"job {self.job.name} follows job {self.follow}, whose checkpoint of epoch {epoch} is gone "
                f"({self.store.uri(checkpoint_key(prefix, epoch))}; its retention deleted it): this job fell "
                f"too far behind to read the same input as epoch {epoch}. Branch again from the newest "
                f"checkpoint, or keep more of {self.follow}'s checkpoints (retain_checkpoints)") from None
        starts = {p: start for p, (start, _) in plan.offsets.items()}
        behind = {p: (starts.get(p), end) for p, end in target.source_offsets.items()
                  if end < starts.get(p, end)}
        if behind:
            raise JobFailedError(
                f"job {self.job.name} follows job {self.follow}, but {self.follow}'s epoch {epoch} ends "
                f"before this job's offsets ({{partition: (this job's, {self.follow}'s)}}: {behind}): the "
                f"two did not start from the same checkpoint; branch {self.job.name} again")
        self._followed[epoch] = target
        offsets = {p: (starts.get(p, end), end) for p, end in target.source_offsets.items()}
        ends = {p: max(plan.ends.get(p, end), end) for p, end in target.source_offsets.items()}
        return dataclasses.replace(plan, offsets=offsets, ends=ends, paused=frozenset())

    def _processing_time(self, ckpt: JobCheckpoint, plan: EpochPlan) -> int:
        """The epoch's processing time, ms: the wall clock when it was planned, never below
        the previous epoch's (a restarted driver's clock may be behind). Decided once per
        epoch: every task and every retry of the epoch fires the same processing-time
        timers, and the checkpoint records it. Following another job: that job's
        processing time of the same epoch, so the follower fires the same timers in the
        same epoch (it runs later by the wall clock) and can be promoted at any epoch."""
        now = plan.planned_at_ms
        followed = self._followed.get(ckpt.epoch + 1)
        if followed is not None and followed.processing_time_ms is not None:
            now = followed.processing_time_ms
        previous = ckpt.processing_time_ms
        return now if previous is None else max(previous, now)

    def _due_without_input(self, ckpt: JobCheckpoint, plan: EpochPlan, continuous: bool) -> bool:
        """Whether an epoch that reads nothing is worth running: a processing-time timer
        is due at its processing time, or the source is quiet and its watermark
        (``event_time.quiet_watermark``) reaches an event-time timer (the checkpoint's
        lower bounds of the timers left); in a continuous run also when the watermark
        advances otherwise (a partition became idle)."""
        due = ckpt.next_processing_timer_ms
        if due is not None and self._processing_time(ckpt, plan) >= due:
            return True
        inputs = self._event_time_inputs(ckpt, plan)
        if plan.quiet_since_ms is not None:
            mark = epoch_event_time(inputs, []).watermark
            if ckpt.next_event_timer_ms is not None and mark > ckpt.watermark and mark >= ckpt.next_event_timer_ms:
                return True
        if not continuous:
            return False
        if self._pending_erasures():  # served by an epoch without input
            return True
        # The quiet watermark moves with every look: only the reasons above run an epoch for it.
        unquiet = dataclasses.replace(inputs, plan=dataclasses.replace(plan, quiet_since_ms=None))
        return epoch_event_time(unquiet, []).watermark > ckpt.watermark

    def _warn_ends_behind(self, committed: dict[str, int], ends: dict[str, int]) -> None:
        """Logs a warning, once per partition until it recovers, when the source reports
        an end offset below the committed one. Offsets never go backwards: such a
        partition reads nothing until its end passes the committed offset again
        (``event_time.plan_epoch`` clamps the end). Causes: a topic deleted and created again
        under the same name starts over at 0 (the job must then be reset); a broker may
        answer an end below what was read while a transaction is open (Tansu's
        ListOffsets under ``read_committed``, docs/kafka.md)."""
        behind = {p: ends[p] for p in committed if p in ends and ends[p] < committed[p]}
        for p in sorted(behind.keys() - self._ends_behind):
            log.warning("job %s: source %s reports end offset %d for partition %s, below the "
                        "committed offset %d; reading nothing from it until its end passes %d "
                        "again (a topic deleted and recreated under the same name needs a new job)",
                        self.job.name, self.job.source.name, behind[p], p, committed[p], committed[p])
        self._ends_behind = set(behind)

    @staticmethod
    def _partition_max_ts(ckpt: JobCheckpoint, parts: list[str]) -> dict[str, int]:
        return {p: ckpt.partition_max_ts.get(p, WATERMARK_MIN) for p in parts}

    # ------------------------------------------------------------------ running
    def run(self, max_epochs: int | None = None) -> list[EpochResult]:
        """Runs the job until a bounded source is drained or a live one has nothing new.

        Args:
            max_epochs: stop after this many committed epochs (None: no limit).

        Returns:
            The committed epochs' ``EpochResult``s, in order (empty if there was nothing
            to do). ``epochs`` yields each as it commits instead.

        Raises:
            JobFailedError: an epoch failed (the previous checkpoint stays newest); its
                ``TooManyDeadLettersError``: more than ``DeadLetter.max_ratio`` of an
                epoch's records were dead letters; its ``OperatorError``: an operator
                raised under ``on_operator_error="fail"`` (names the event or timer).
            JobFencedError: another driver committed an epoch this one ran (found at the
                commit, or when this driver's tasks failed because the other's
                retention deleted the files of the checkpoint it started from).
            RecoveryRefusedError: the newest checkpoint is unusable or missing and
                falling back is not safe (``dkvstream.operators.runtime.recovery``).
        """
        return list(self.epochs(max_epochs))

    def epochs(self, max_epochs: int | None = None, *, continuous: bool = False) -> Iterator[EpochResult]:
        """``run`` as an iterator: yields an ``EpochResult`` after each committed epoch
        (after its publish and retention).

        Args:
            max_epochs: stop after this many committed epochs (None: no limit; a drain
                epoch, below, is not counted).
            continuous: on a live source, do not end when it has nothing new: plan an
                epoch each time the job's processing-time trigger fires
                (``Job.trigger_interval_ms``, ``dkvstream.operators.runtime.live``) and there is
                new input, blocking in between (no polling loop faster than
                ``live.NO_INPUT_POLL_MS``). The run then ends only at ``max_epochs``,
                on ``stop()``, or on an error. A bounded source ends as without it,
                once fully read. False: a live source with nothing new ends the run.

        The run also ends after the epoch in flight once ``stop()`` was called; after
        ``stop(drain=True)`` it first commits the drain epoch (``stop``) and yields it.
        A finished job (a bounded source fully read, or drained) runs no epoch; a
        drained one logs a warning saying so. When the run ends, however it ends, the
        source is closed (``Source.close``). Errors as ``run``.
        """
        try:
            ckpt = self._restart()
            if not ckpt.finished:
                self._start_long_lived_tasks()
            if ckpt.finished and ckpt.metrics.get("drained"):
                log.warning(
                    "job %s was drained at epoch %d (watermark +infinity, every window emitted) and "
                    "is finished: it runs no more epochs and does not read what its source received "
                    "after offsets %s. Were it to go on, every event would be late. Run the job under "
                    "a new name to process them.", self.job.name, ckpt.epoch, ckpt.source_offsets)
            trigger = live.ProcessingTimeTrigger(self.job.trigger_interval_ms if continuous else 0)
            done = 0
            ran_without_input = False  # a run that is not continuous runs at most one such epoch
            # Pipelining (long-lived tasks): epoch e+1 may be read while epoch e's operators
            # run when the trigger is due by then and the run goes on (_read_ahead).
            self._may_read_ahead = lambda: (not self._stop.requested and trigger.seconds_to_next() <= 0
                                            and (max_epochs is None or done + 2 <= max_epochs))
            while not ckpt.finished and (max_epochs is None or done < max_epochs):
                if self._stop.wait(trigger.seconds_to_next()):
                    break
                trigger.fire()
                ahead, self._ahead = self._ahead, None
                if ahead is not None and ahead.epoch == ckpt.epoch + 1:
                    plan = ahead.plan  # planned and being read since the previous epoch's event time
                    self._ahead = ahead
                else:
                    plan = self._plan(ckpt)
                if plan is None:  # following another job, and caught up with it
                    if not continuous:
                        break
                    trigger.nothing_new()
                    continue
                # Following, every epoch the followed job committed is run, input or not.
                if self.follow is None and not self.job.source.bounded and not plan.has_input:
                    due = self._due_without_input(ckpt, plan, continuous)
                    if not continuous and (not due or ran_without_input):
                        break
                    if not due:
                        trigger.nothing_new()
                        continue
                    # No input, but timers are due (processing time, or a watermark that
                    # advances): an epoch without events fires them.
                    ran_without_input = True
                result, ckpt = self._run_leased(ckpt, plan)
                done += 1
                yield result
            if self._stop.requested and self._stop.drain and not ckpt.finished:
                self._discard_read_ahead()  # the drain epoch reads nothing
                result, ckpt = self._run_leased(ckpt, self._drain_plan(ckpt), drain=True)
                yield result
        finally:
            self._discard_read_ahead()
            self._stop_long_lived_tasks()
            self._close_source()

    def _start_long_lived_tasks(self) -> None:
        """Starts the run's long-lived tasks when this run uses them (``long_lived_tasks``)."""
        if self.spark is None or not self.long_lived_tasks or self._tasks is not None:
            return
        from dkvstream.operators.spark.long_lived import Coordinator, TaskConfig, task_slots

        job = self.job
        # A barrier stage needs every task running at once: no more tasks than slots.
        workers = min(task_slots(self.spark.sparkContext), max(job.parallelism_of(op.name) for op in job.operators))
        def config(location: str, run_id: str, w: int, loopback: bool) -> TaskConfig:
            # A task owns at most ceil(P / w) ranges of each operator (``long_lived.owner``).
            owned = sum(-(-job.parallelism_of(op.name) // w) for op in job.operators)
            return TaskConfig(location, run_id, w, tuple(job.operators), job.sinks, self.store, self.dkv_options,
                              loopback, owned)

        self._tasks = Coordinator(self.spark, config, workers)

    def _stop_long_lived_tasks(self) -> None:
        if self._tasks is not None:
            tasks, self._tasks = self._tasks, None
            tasks.close()

    def _run_leased(self, ckpt: JobCheckpoint, plan: EpochPlan,
                    drain: bool = False) -> tuple[EpochResult, JobCheckpoint]:
        """``_run_epoch`` under the epoch's lease, serving the pending flush and erasure
        requests."""
        # Requests seen now are served by this epoch; the lease keeps a concurrent
        # cleanup off the files the tasks write before the commit (dkvstream.operators.runtime.control).
        flushes = pending_flush_requests(self.store, self.job.prefix)
        erasures = self._pending_erasures()
        self._erasing = erasures
        lease = acquire_lease(self.store, self.job.prefix, ckpt.epoch + 1)
        try:
            # What holds an erased key now, for its record: the epoch's retention may delete some.
            held = held_before(self.store, self.job.prefix, erasures, self.job.key_groups) if erasures else None
            fault_point("epoch_planned", epoch=ckpt.epoch + 1)
            result, ckpt = self._run_epoch(ckpt, plan, flush=bool(flushes), drain=drain)
        except BaseException:
            # The epoch's own error is the one to report: with the store down,
            # releasing the lease fails too, and the lease goes stale on its own.
            with contextlib.suppress(Exception):
                release_lease(self.store, self.job.prefix, lease)
            raise
        fault_point("after_cleanup", epoch=result.epoch)
        release_lease(self.store, self.job.prefix, lease)
        consume_flush_requests(self.store, flushes)
        if erasures:  # retained checkpoints before this one expire (dkvstream.operators.runtime.erasure)
            # Incremental: a LIST of the job's files is complete_erasure's to pay, if needed.
            finish_applied(self.store, self.job.prefix, erasures, ckpt, held, full_sweep=False)
        return result, ckpt

    def _pending_erasures(self) -> list:
        """The pending erasure requests (``erasure.read_erasure_requests``). A malformed
        request object is skipped, never fatal: warned about once per object, and named
        in each epoch's ``metrics["erasure_skipped"]`` while it stays."""
        requests, skipped = read_erasure_requests(self.store, self.job.prefix)
        for key in sorted(skipped.keys() - self._erasure_skipped.keys()):
            log.warning("job %s: %s", self.job.name, skipped[key])
        self._erasure_skipped = skipped
        return requests

    def _drain_plan(self, ckpt: JobCheckpoint) -> EpochPlan:
        """The drain epoch's plan: nothing read (each partition's range is empty at its
        committed offset); the ends are asked for, so its lag metric tells what the
        drained job leaves unread."""
        plan = self._plan(ckpt)
        if plan is None:
            raise JobFailedError(f"job {self.job.name} follows job {self.follow}: it drains when "
                                 f"{self.follow} does (run it further), not on its own")
        unread = {p: plan.ends[p] - start for p, (start, _) in plan.offsets.items() if plan.ends[p] > start}
        if unread:
            log.warning("job %s: draining leaves unread the events after the committed offsets "
                        "(per partition: %s); a restart of the drained job does not read them",
                        self.job.name, unread)
        return dataclasses.replace(plan, offsets={p: (start, start) for p, (start, _) in plan.offsets.items()})

    def stop(self, drain: bool = False) -> None:
        """Asks a run (``epochs``/``run``, continuous or not) to stop: an epoch in
        flight finishes (commit, publish, retention) and is yielded, then the run
        returns normally; a run waiting for its trigger returns at once without
        starting an epoch. Nothing is ever half-committed: an epoch either commits
        whole or was not started. Safe to call from any thread and from a signal
        handler (``dkvstream.operators.tools.run_job --continuous`` calls it on SIGTERM/SIGINT);
        idempotent. A stopped runner stays stopped: later ``epochs`` calls return
        without running an epoch (but for a drain asked for and not yet done).

        Args:
            drain: Flink's ``stop --drain``: before returning, the run commits one more
                epoch that reads nothing and whose watermark is +infinity
                (``WATERMARK_MAX``), so every event-time timer fires and every window
                still open is emitted; its checkpoint has ``finished=True`` and
                ``metrics["drained"]=True`` and its ``EpochResult.drained`` is True.
                A drained job is finished for good, as one whose bounded source was
                fully read: a restart runs no epoch (and logs a warning), and events the
                source received after the last offsets read are never read by it (had
                it gone on, its watermark of +infinity would make every one of them
                late; Flink's documentation likewise says to drain only to terminate a
                job permanently, as a drained job resumed later may give incorrect
                results). Drain to end a job for good and have its last windows; stop
                without draining to restart it later.
        """
        self._stop.request(drain)

    def _restart(self) -> JobCheckpoint:
        """The checkpoint to continue from (``dkvstream.operators.runtime.recovery``), its commit
        record written if a crash lost it, its publish finished; or the initial one."""
        refuse_if_dropped(self.store, self.job)  # its checkpoints may name files collected since
        ckpt, fallback = restart_checkpoint(self.store, self.job, self.verify_restart)
        if fallback is not None:
            self._recovery = fallback.as_metrics()
        if ckpt is None:
            self._state_schemas = evolve_job(self.job.operators, {})
            return self._initial()
        self._check_compatible(ckpt)
        check_promoted_code(self.store, self.job, ckpt)  # a promoted job runs its branch's code
        # Before any epoch: new operator code must read the state the checkpoint holds.
        self._state_schemas = evolve_job(self.job.operators, ckpt.state_schemas, ckpt.epoch)
        # Before any discovery: a source whose own metadata lost what the offsets refer
        # to must refuse, not read other events under them.
        restore_source(self.job, ckpt)
        if read_commit_log(self.store, self.job.prefix).last_recorded < ckpt.epoch:
            record_commit(self.store, self.job.prefix, ckpt.epoch)  # a crash came between
        self._republish(ckpt)  # finishes a publish a crash interrupted
        return ckpt

    def _new_exchange(self, epoch: int) -> Exchange:
        if self.spark is None:
            return LocalExchange(self.store, self.dkv_options, self._open_state)
        if self._tasks is not None:
            from dkvstream.operators.spark.long_lived import LongLivedExchange

            return LongLivedExchange(self._tasks, epoch, self._first_parallelism)
        from dkvstream.operators.spark.stage import SparkExchange

        return SparkExchange(self.spark, self.store, self.dkv_options, self._first_parallelism)

    @property
    def _first_parallelism(self) -> int:
        return self.job.parallelism_of(self.job.operators[0].name)

    def _read_context(self, epoch: int) -> ReadContext:
        return ReadContext(epoch=epoch, now_ms=self._now_ms(), key_groups=self.job.key_groups,
                           parallelism=self._first_parallelism, dead_letter=self.job.dead_letter,
                           alignment=self._max_drift_ms is not None)

    def _read_ahead(self, ckpt: JobCheckpoint, epoch: int, event_time: EpochEventTime) -> None:
        """Pipelining on long-lived tasks: once epoch ``epoch``'s event time is known (its
        read is done), plans epoch ``epoch + 1`` from where ``epoch`` ends and starts its
        read, which the tasks run while ``epoch``'s operators run and the driver commits
        it. Only when the run will want that epoch at once (``_may_read_ahead``: the
        trigger is due, no stop, ``max_epochs`` not reached) and it has input. Nothing
        read ahead is written anywhere: a run that stops or fails first discards it, and
        a crash loses nothing a restart would not read again."""
        if self._tasks is None or event_time.finished or not self._may_read_ahead():
            return
        ends = {p: end for p, (_, end) in event_time.plan.offsets.items()}
        provisional = dataclasses.replace(
            ckpt, epoch=epoch, watermark=event_time.watermark, source_offsets=ends,
            partition_max_ts=event_time.partition_max_ts,
            partition_active_at_ms=partition_activity(ckpt.partition_active_at_ms, event_time.plan))
        plan = self._plan(provisional)
        if plan is None or not plan.has_input:
            return
        exchange = self._new_exchange(epoch + 1)
        exchange.start_read(self.job.source, _splits(plan.offsets), self._read_context(epoch + 1))
        self._ahead = _ReadAhead(epoch + 1, plan, exchange)

    def _discard_read_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.exchange.discard()

    def _read_events(self, plan: dict[str, tuple[int, int]], epoch: int) -> list[SplitSummary] | None:
        """Step 2: the read tasks read the planned slices (``dkvstream.operators.runtime.splits``);
        their events and dead letters stay in the epoch's exchange. With watermark
        alignment the driver gets one ``SplitSummary`` per slice; otherwise None: on
        Spark the read tasks then run in the first operator's job, and a read error is
        raised from there (``_stage_error``), as here.

        Raises:
            BadInputError: a bad row under ``DeadLetter(tolerance="none")``.
            JobFailedError: a read task failed (a bad slice, a source error).
        """
        splits, ctx = _splits(plan), self._read_context(epoch)
        ahead, self._ahead = self._ahead, None
        self._epoch_read_ahead = ahead is not None and (ahead.epoch, ahead.plan.offsets) == (epoch, plan)
        if self._epoch_read_ahead:
            self._exchange = ahead.exchange
        else:
            if ahead is not None:
                ahead.exchange.discard()
            self._exchange = self._new_exchange(epoch)
        try:
            return self._exchange.read(self.job.source, splits, ctx)
        except Exception as e:
            if self.spark is None:  # in process: the source's own error, as raised
                raise
            cause = task_error(e)
            if cause is not None:  # a task's DkvstreamError: the same as in process
                raise cause from e
            raise JobFailedError(f"job {self.job.name}: epoch {epoch} failed reading source "
                                 f"{self.job.source.name}: {_root_message(e)}") from e

    def _event_time_inputs(self, ckpt: JobCheckpoint, plan: EpochPlan,
                           drain: bool = False) -> EventTimeInputs:
        """What decides the epoch's event time besides its split summaries
        (``event_time.epoch_event_time``: the watermark, alignment's cuts, finished)."""
        return EventTimeInputs(
            previous_watermark=ckpt.watermark,
            partition_max_ts=self._partition_max_ts(ckpt, list(plan.offsets)), plan=plan,
            bounded=self.job.source.bounded, out_of_orderness_ms=self.job.max_out_of_orderness_ms,
            max_drift_ms=self._max_drift_ms, drain=drain)

    def _run_epoch(self, ckpt: JobCheckpoint, plan: EpochPlan, flush: bool = False,
                   drain: bool = False) -> tuple[EpochResult, JobCheckpoint]:
        """Runs, commits, publishes and retains epoch ``ckpt.epoch + 1`` (module docstring);
        ``drain``: the drain epoch (``stop``), whose ``plan`` reads nothing, at watermark
        +infinity, finished."""
        started = time.perf_counter()
        epoch = ckpt.epoch + 1
        inputs = self._event_time_inputs(ckpt, plan, drain)
        attempt = 1
        while True:
            try:
                event_time, results = self._read_and_run(ckpt, plan, epoch, flush, inputs)
                break
            except Exception as e:
                if self._tasks is None:
                    raise
                # Nothing of this attempt is committed: the epoch may run again from ``ckpt``.
                if self._tasks.lost:
                    # A long-lived task was lost: once Spark restarted the stage (what was
                    # read ahead went with the tasks).
                    self._ahead = None
                    self._tasks.restart()
                    continue
                from dkvstream.operators.spark.long_lived import retryable

                if attempt >= self._tasks.max_attempts or not retryable(e):
                    raise
                attempt += 1
                log.warning("job %s: epoch %d failed in a task (%s); attempt %d of %d from epoch %d's checkpoint",
                            self.job.name, epoch, _task_message(e), attempt, self._tasks.max_attempts, ckpt.epoch)
                self._discard_read_ahead()
                if self._exchange is not None:
                    self._exchange.discard()
        if event_time is None:
            event_time = results[self.job.operators[0].name][0].event_time
        watermark, part_max, finished = event_time.watermark, event_time.partition_max_ts, event_time.finished
        plan = event_time.plan
        received = self._exchange.bytes_received
        self._exchange = None  # the epoch's events are no longer needed
        fault_point("after_tasks", epoch=epoch)
        outputs, checksums = _staged_outputs(results[self.job.operators[-1].name])
        outputs.update(self._stage_dead_letters())
        checksums.update(self._dead_letter_checksums(results))
        self._prepare_sinks(epoch, outputs)
        offsets = {p: end for p, (_, end) in plan.offsets.items()}
        first = results[self.job.operators[0].name]
        events = sum(res.metrics["events"] for res in first)
        live_metrics = functools.partial(
            live.epoch_metrics, events=events, ingest=[res.metrics.get("ingest") for res in first],
            ingest_at_event_time=[res.metrics.get("ingest_at_event_time") for res in first],
            plan=plan, committed=offsets, partition_max_ts=part_max, watermark_ms=watermark,
            previous_plan_ms=self._previous_plan_ms, previous_ends=self._previous_plan_ends)
        metrics = self._metrics(events, results, flush)
        if self._erasing:
            metrics["erasure"] = {"requests": [r.id for r in self._erasing], "ranges": {
                op: {res.range_label: res.metrics["erased"] for res in rs if "erased" in res.metrics}
                for op, rs in results.items()}}
        if self._erasure_skipped:
            metrics["erasure_skipped"] = dict(self._erasure_skipped)
        self._check_dead_letters(epoch, metrics["dead_letter"], results, outputs)
        metrics["driver_bytes_received"] = received
        metrics["live"] = live_metrics(now_ms=self._now_ms())  # at the commit
        if drain:
            metrics["drained"] = True
        followed = self._followed.get(epoch)
        if followed is not None:
            metrics["follow"] = {"job": self.follow, "watermark": followed.watermark,
                                 "same_watermark": followed.watermark == watermark}
            if followed.watermark != watermark:  # same input, other event time: say why it may differ
                log.warning("job %s: epoch %d reached watermark %d, job %s's %d (the same input: their "
                            "event-time settings or partition idleness differ)", self.job.name, epoch,
                            watermark, self.follow, followed.watermark)
        new = JobCheckpoint(
            job=self.job.name, epoch=epoch, watermark=watermark,
            source_offsets=offsets, partition_max_ts=part_max,
            finished=finished, key_groups=self.job.key_groups, parallelism=self.job.parallelism,
            operators={op: {res.range_label: res.manifest_key for res in rs}
                       for op, rs in results.items()},
            outputs=outputs, output_checksums=checksums, metrics=metrics, layout=ckpt.layout,
            dropped=encode_objects(self.job.prefix, {  # retention hook (dkvstream.operators.runtime.cleanup)
                op: {res.range_label: res.dropped for res in rs} for op, rs in results.items()}, ckpt.layout),
            unkept=encode_objects(self.job.prefix, {  # retention hook
                op: {res.range_label: res.unkept for res in rs} for op, rs in results.items()}, ckpt.layout),
            partition_active_at_ms=partition_activity(ckpt.partition_active_at_ms, plan),
            source_state=self.job.source.snapshot_state(offsets),
            state_schemas=self._state_schemas,
            processing_time_ms=self._processing_time(ckpt, plan),
            next_event_timer_ms=_next_timer(results, "event_time"),
            next_processing_timer_ms=_next_timer(results, "processing_time"),
        )
        key = self._commit(new)
        self._followed.pop(epoch, None)
        if self._retention is not None:  # retention hook
            self._retention.committed(new)
        self._previous_plan_ms, self._previous_plan_ends = plan.planned_at_ms, plan.ends
        fault_point("after_commit", epoch=epoch)
        published = self._publish(new)
        published_live = live_metrics(now_ms=self._now_ms())  # after the publish
        fault_point("before_cleanup", epoch=epoch)
        self._apply_retention()
        seconds = time.perf_counter() - started
        log.info("job %s: committed epoch %d (%d events, %d dead letters, watermark %d, %.1f s)",
                 self.job.name, epoch, events, metrics["dead_letter"]["total"], watermark, seconds)
        return EpochResult(
            epoch=epoch, watermark=watermark, source_offsets=new.source_offsets,
            checkpoint_uri=self.store.uri(key), events=events, seconds=seconds,
            finished=finished, tables=metrics["tables"], table_bytes=metrics["table_bytes"],
            keys=metrics["keys"], output_rows=metrics["output_rows"], published=published,
            dead_letter=metrics["dead_letter"], recovery=metrics.get("recovery"),
            live=published_live, drained=drain,
        ), new

    def _read_and_run(self, ckpt: JobCheckpoint, plan: EpochPlan, epoch: int, flush: bool,
                      inputs: EventTimeInputs) -> tuple[EpochEventTime | None, dict[str, list[TaskResult]]]:
        """Steps 2 and 3: ``(event time if the driver computed it, results by operator)``."""
        summaries = self._read_events(plan.offsets, epoch)
        # With watermark alignment the driver needs the summaries before any operator
        # runs (the cuts); otherwise the first operator's tasks compute the same event
        # time from them and range 0 reports it (``dkvstream.operators.runtime.exchange``).
        event_time = None if summaries is None else epoch_event_time(inputs, summaries)
        if event_time is not None:
            self._read_ahead(ckpt, epoch, event_time)
        return event_time, self._run_stages(ckpt, epoch, flush, event_time, inputs)

    def _run_stages(self, ckpt: JobCheckpoint, epoch: int, flush: bool, event_time: EpochEventTime | None,
                    inputs: EventTimeInputs) -> dict[str, list[TaskResult]]:
        """Step 3: one stage per operator over the epoch's exchange (``_read_events``),
        each fed the previous one's ``main`` output; the first one's range 0 stages the
        dead letters too. ``event_time``: the epoch's, with the watermark and alignment's
        cuts, or None: the first operator's tasks compute it from ``inputs`` and the
        split summaries, and the later operators take it from its range 0.

        Returns:
            ``{operator name: [TaskResult per range]}``.

        Raises:
            JobFencedError: a stage failed and another driver has committed this epoch.
            JobFailedError: a stage failed.
        """
        results_by_op: dict[str, list[TaskResult]] = {}
        # Partition names by the events' ``_part`` index: a source's partitions keep their
        # order, so the list now extends the one the events were read with. Tasks name an
        # event's partition in its dead-letter row or operator error.
        partitions = tuple(self.job.source.partitions())
        part_index = {p: i for i, p in enumerate(ckpt.source_offsets)}
        part_index.update({p: i for i, p in enumerate(partitions) if p not in part_index})
        cuts = event_time.cuts if event_time is not None else {}
        offset_limits = {part_index[p]: cut for p, cut in cuts.items()} or None
        input_schema = stage_input_schema(self.job.source.value_schema)
        # One per epoch: every task's processing-time timers and TTL clock agree.
        processing_time = self._processing_time(ckpt, inputs.plan)
        self._task_dead_letters = []
        self._screened = None
        for i, op in enumerate(self.job.operators):
            last = i == len(self.job.operators) - 1
            previous = ckpt.operators.get(op.name, {})
            ranges = key_group_ranges(self.job.key_groups, self.job.parallelism_of(op.name))
            # Rescaled: the previous checkpoint's ranges of this operator are others. A
            # range whose previous manifest is another job's (a fork's first epoch) opens
            # from it the same way: its new files go under this job's prefix.
            old_ranges = sorted(KeyGroupRange.from_label(label) for label in previous)
            rescaled = bool(previous) and (old_ranges != ranges or any(
                not m.startswith(f"{self.job.prefix}/") for m in previous.values()))
            next_parallelism = None if last else self.job.parallelism_of(self.job.operators[i + 1].name)
            erase = erasure_targets(self.store, previous, ranges, subjects_of(self._erasing, self.job.key_groups))
            specs = [
                TaskSpec(
                    job_prefix=self.job.prefix, epoch=epoch, op_index=i, range_index=r,
                    key_group_range=kr,
                    manifest_key=None if rescaled else previous.get(kr.label),
                    parent_manifests=parent_manifests(previous, old_ranges, kr) if rescaled else (),
                    watermark_before=ckpt.watermark,
                    # Unknown yet (WATERMARK_MIN) only in the first stage, whose tasks compute it.
                    watermark_after=event_time.watermark if event_time is not None else WATERMARK_MIN,
                    next_key_groups=None if last else self.job.key_groups,
                    next_parallelism=next_parallelism,
                    flush=flush,
                    on_operator_error=self.job.on_operator_error,
                    input_name=self.job.source.name if i == 0 else f"operator:{self.job.operators[i - 1].name}",
                    input_partitions=partitions if i == 0 else None,
                    offset_limits=offset_limits if i == 0 else None,
                    layout=ckpt.layout,
                    processing_time=processing_time,
                    state_schemas=self._state_schemas.get(op.name),
                    erase=erase[r],
                )
                for r, kr in enumerate(ranges)
            ]
            first = None
            if i == 0:
                first = FirstStage(DeadLetterSpec(self.job.prefix, epoch, dict(cuts), ckpt.layout),
                                   event_time=inputs if event_time is None else None)
            try:
                results, screened = self._exchange.run_operator(
                    op, specs, input_schema, self.job.sinks if last else None, first)
            except Exception as e:
                raise self._stage_error(op.name, ckpt.epoch, epoch, e) from (task_error(e) or e)
            if i == 0:
                self._screened = screened
                if event_time is None:
                    event_time = results[0].event_time
            results_by_op[op.name] = results
            self._task_dead_letters += [res.dead_letter_key for res in results if res.dead_letter_key]
            input_schema = forwarded_schema(op.outputs[MAIN_OUTPUT]) if not last else input_schema
        return results_by_op

    def _stage_error(self, operator: str, start_epoch: int, epoch: int,
                     e: Exception) -> JobFailedError | BadInputError:
        """The error to raise for a failed stage: fenced if another driver committed
        ``epoch`` meanwhile, a read task's ``BadInputError`` (the read stage runs with the
        first operator's when the job does not align), an ``OperatorError``, else a job
        failure whose ``retryable`` is the task error's. A task's ``DkvstreamError``
        keeps its type across Spark (``dkvstream.operators.runtime.task_errors``); the caller raises
        the result from it."""
        newest = self._newest_epoch_elsewhere()
        if newest is not None and newest >= epoch:
            # A driver this far behind finds the files of its start checkpoint
            # deleted by the other's retention; fencing is what happened.
            return JobFencedError(
                f"job {self.job.name}: epoch {epoch} was committed by another driver (the newest "
                f"checkpoint is {self.store.uri(checkpoint_key(self.job.prefix, newest))}) while "
                f"this driver ran it from epoch {start_epoch}, and its tasks failed "
                f"({_task_message(e)}); this driver stops without publishing. Run one driver per job.")
        cause = task_error(e)
        if isinstance(cause, BadInputError):
            return cause
        failed = f"job {self.job.name}: epoch {epoch} failed in operator {operator}: "
        if isinstance(cause, OperatorError):
            return OperatorError(failed + str(cause))
        error = JobFailedError(failed + _task_message(e))
        error.retryable = cause is not None and cause.retryable
        return error

    def _stage_dead_letters(self) -> dict[str, list[str]]:
        """Step 4: the epoch's bad input rows, staged by the dead-letter task, with the
        files tasks staged for events their operator raised on
        (``dkvstream.operators.runtime.operator_errors``); ``{}`` when there were none."""
        keys = list(self._task_dead_letters)
        if self._screened is not None and self._screened.staged_key:
            keys.insert(0, self._screened.staged_key)
        return {dead_letter.DEAD_LETTER_OUTPUT: keys} if keys else {}

    def _dead_letter_checksums(self, results_by_op: dict[str, list[TaskResult]]) -> dict[str, list[int]]:
        """Checksums of the epoch's staged dead-letter files (the screen's and the tasks'
        of every operator; the last operator's are in ``_staged_outputs`` already)."""
        staged = set(self._task_dead_letters)
        out = {k: v for rs in results_by_op.values() for res in rs
               for k, v in res.staged_checksums.items() if k in staged}
        if self._screened is not None and self._screened.checksum is not None:
            out[self._screened.staged_key] = self._screened.checksum
        return out

    def _check_dead_letters(self, epoch: int, counts: dict[str, int], results_by_op: dict[str, list[TaskResult]],
                            outputs: dict[str, list[str]]) -> None:
        """Before the commit: an epoch whose dead letters are more than
        ``DeadLetter.max_ratio`` of its records fails (``dead_letter.check_ratio``). Its
        records: the rows read from the source (events of the first operator and the
        screen's dead letters), the events of later operators, and the timers fired.

        Raises:
            TooManyDeadLettersError: the share is over the limit; nothing is committed.
        """
        screened = sum(self._screened.counts.values()) if self._screened is not None else 0
        records = screened + sum(res.metrics["events"] + res.metrics["timers_fired"]
                                 for rs in results_by_op.values() for res in rs)
        dead_letter.check_ratio(self.job.dead_letter, counts, records,
                                outputs.get(dead_letter.DEAD_LETTER_OUTPUT, []), self.store,
                                f"job {self.job.name}: epoch {epoch}")

    def _prepare_sinks(self, epoch: int, outputs: dict[str, list[str]]) -> None:
        """Step 5: every sink checks its staged files; a refusal fails the epoch."""
        for name, staged in outputs.items():
            try:
                self.job.output_sink(name).prepare_in_tasks(self.store, self.job.prefix, epoch, staged,
                                                            self._map_in_tasks)
            except Exception as e:
                raise JobFailedError(f"job {self.job.name}: epoch {epoch} refused by sink {name}: {e}") from e

    def _metrics(self, events: int, results_by_op: dict[str, list[TaskResult]],
                 flush: bool) -> dict:
        """Step 6: the checkpoint's ``metrics`` (``dkvstream.operators.runtime.checkpoints``)."""
        every = [res for rs in results_by_op.values() for res in rs]
        last_results = results_by_op[self.job.operators[-1].name]
        dkv = [res.metrics["dkv"] for res in every]
        metrics = {
            "events": events,
            "timers_fired": sum(res.metrics["timers_fired"] for res in every),
            "output_rows": {name: sum(res.metrics["emitted"].get(name, 0) for res in last_results)
                            for name in self.job.sinks},
            "tables": sum(sum(s["tables_per_level"]) for s in dkv),
            "table_bytes": sum(sum(s["bytes_per_level"]) for s in dkv),
            "keys": sum(int(s.get("approx_live_keys", 0)) for s in dkv),
            "remote_compactions": {
                kind: sum(res.metrics["remote_compactions"].get(kind, 0) for res in every)
                for kind in ("installed", "discarded")},
            "flushed": flush,
            "dead_letter": dead_letter.counts(
                self._screened.counts if self._screened is not None else {},
                operator_errors=sum(res.metrics.get("dead_letter", 0) for res in every)),
            **({"recovery": self._recovery} if self._recovery else {}),
            **({"retention_damage": self._retention_damage} if self._retention_damage else {}),
            "task_seconds_max": max((res.metrics["seconds"] for res in every), default=0.0),
        }
        metrics["requests"] = self._epoch_requests(results_by_op)
        if self._tasks is not None:
            metrics["long_lived_tasks"] = {"tasks": self._tasks.workers, "restarts": self._tasks.restarts,
                                           "read_ahead": self._epoch_read_ahead}
        return metrics

    def _commit(self, new: JobCheckpoint) -> str:
        """Step 7: commits ``new`` behind the fence (``dkvstream.operators.runtime.checkpoints``);
        returns the checkpoint's key.

        Raises:
            JobFencedError: the epoch was committed by another driver, now or before.
        """
        try:
            key = commit_checkpoint(self.store, self.job.prefix, new)
        except ObjectExistsError:
            raise JobFencedError(
                f"job {self.job.name}: epoch {new.epoch} was committed by another driver "
                f"({self.store.uri(checkpoint_key(self.job.prefix, new.epoch))} already exists); "
                f"this driver stops without publishing. Run one driver per job.") from None
        self._recovery = None
        self._retention_damage = []
        return key

    def _publish(self, ckpt: JobCheckpoint) -> list[str]:
        """Step 8: the committed epoch's staged files get their final names (idempotent);
        a sink that moves rows does it in tasks (``Sink.publish_in_tasks``)."""
        published = []
        for name, staged in ckpt.outputs.items():
            published += self.job.output_sink(name).publish_in_tasks(self.store, self.job.prefix, ckpt.epoch,
                                                                     staged, self._map_in_tasks)
            fault_point("publish_file", epoch=ckpt.epoch)
        return published

    def _republish(self, ckpt: JobCheckpoint) -> list[str]:
        """Step 8 again for the checkpoint a restart continues from: files published
        correctly are left alone, and a staged file damaged since it was written is
        never published (``Sink.republish``)."""
        checksums = ckpt.staged_checksums()
        published = []
        for name, staged in ckpt.outputs.items():
            published += self.job.output_sink(name).republish(
                self.store, self.job.prefix, ckpt.epoch, staged, checksums,
                self.verify_restart == "full", self._map_in_tasks)
        return published

    def _map_in_tasks(self, fn: Callable, items: list) -> list:
        """``[fn(item) for item in items]``, on Spark one task per item (at most one per
        core), so what ``fn`` reads and writes never passes through the driver."""
        if self.spark is None or not items:
            return [fn(item) for item in items]
        if self._tasks is not None:  # they hold every task slot: no other Spark job would run
            return self._tasks.map(fn, items)
        from dkvstream.operators.spark.stage import map_in_tasks

        return map_in_tasks(self.spark, fn, items)

    def _apply_retention(self) -> None:
        """Step 9: keeps the newest ``retain_checkpoints`` checkpoints, frees the rest.

        In the concurrent mode: another driver of the job may have an epoch in flight
        (``dkvstream.operators.runtime.cleanup``). Damage found is recorded in the next checkpoint.
        """
        if self._retention is None:
            return
        self.last_cleanup = self._retention.apply()
        self._retention_damage = list(self.last_cleanup.damaged)

    def _epoch_requests(self, results_by_op: dict[str, list[TaskResult]]) -> dict[str, dict[str, int]]:
        """Object-store requests by kind and bytes since the previous commit (or start):
        ``{"driver": {...}, "tasks": {...}}``, each shaped like ``RequestStats.snapshot()``.
        The driver part includes the previous epoch's commit, publish and cleanup."""
        now = self.store.stats.snapshot()
        tasks = sum_requests(res.metrics.get("requests", {}) for rs in results_by_op.values() for res in rs)
        driver = subtract_requests(now, self._requests_mark)
        if self.spark is None:  # in-process tasks used the driver's store
            driver = subtract_requests(driver, tasks)
        self._requests_mark = now
        return {"driver": driver, "tasks": tasks}

    # -------------------------------------------------------------------- Spark
    def _newest_epoch_elsewhere(self) -> int | None:
        """The newest committed epoch (a driver that sees one at or past the epoch it
        runs was overtaken), or None when none is known or the store cannot say (the
        stage's own error is then the one to report)."""
        try:
            return read_commit_log(self.store, self.job.prefix).newest_committed or None
        except Exception:  # noqa: BLE001 - a failing store is reported through the stage's error
            return None


@dataclass
class _ReadAhead:
    """The next epoch, planned, its read started (``JobRunner._read_ahead``)."""

    epoch: int
    plan: EpochPlan
    exchange: Exchange


def _splits(offsets: dict[str, tuple[int, int]]) -> list[Split]:
    """The read slices of an epoch's planned offset ranges (empty ones left out)."""
    return [Split(p, i, start, end) for i, (p, (start, end)) in enumerate(offsets.items()) if end > start]


def parent_manifests(manifests: dict[str, str], old_ranges, new_range) -> tuple[str, ...]:
    """Manifests of the old ranges whose key groups overlap ``new_range`` (rescaling)."""
    return tuple(manifests[o.label] for o in old_ranges
                 if o.label in manifests and o.start < new_range.end and new_range.start < o.end)


def _staged_outputs(last_results: list[TaskResult]) -> tuple[dict[str, list[str]], dict[str, list[int]]]:
    """``({output name: [staged key per range, in range order]}, {staged key: checksum})``
    of the last operator (the checkpoint's ``outputs`` and ``output_checksums``)."""
    outputs: dict[str, list[str]] = {}
    checksums: dict[str, list[int]] = {}
    for res in sorted(last_results, key=lambda r: r.range_index):
        for name, key in res.staged_outputs.items():
            outputs.setdefault(name, []).append(key)
        checksums.update(res.staged_checksums)
    return outputs, checksums


def _next_timer(results_by_op: dict[str, list[TaskResult]], domain: str) -> int | None:
    """The earliest timer of ``domain`` left over every range (a lower bound, ms), None:
    none (``TaskResult.metrics["next_timers"]``)."""
    stamps = [res.metrics["next_timers"][domain] for rs in results_by_op.values() for res in rs]
    return min((t for t in stamps if t is not None), default=None)


def _task_message(e: BaseException) -> str:
    """``Type: message`` of the ``DkvstreamError`` a task raised (the same in process
    and across Spark), else the last Python error line of the failure's text."""
    cause = task_error(e)
    return f"{type(cause).__name__}: {cause}" if cause is not None else _root_message(e)


def _root_message(e: BaseException) -> str:
    """The last Python error line of a (possibly JVM-wrapped) task failure."""
    text = str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln and not ln.startswith(("\tat ", "  File"))]
    return errors[-1].strip() if errors else (lines[-1].strip() if lines else type(e).__name__)
