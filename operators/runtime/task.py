"""One operator over one key-group range for one epoch: the body of a Spark task.

Steps (docs/design.md, "Epochs and checkpoints", step 2): open DKV at the range's previous
manifest, run ``on_event`` for the range's events in event-time order (ties broken by
source partition and offset, so a replay is deterministic), advance the watermark and
fire due event-time timers in timestamp order, then the processing-time timers due at the
epoch's processing time, stage output files and DKV files under names unique
to (epoch, range, attempt), checkpoint DKV, and return a small result the driver commits.

Runs in Spark's Python workers and, unchanged, in unit tests without Spark.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators import paths
from dkvstream.operators.api import batch as batch_api
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.columns import (
    DOMAIN_COLUMN,
    INGEST_TIME_COLUMN,
    INTERNAL_COLUMNS,
    KEY_COLUMN,
    KEY_GROUP_COLUMN,
    KG_COLUMN,
    OFFSET_COLUMN,
    PART_COLUMN,
    RANGE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.api.keygroups import KeyGroupRange, key_groups_of, range_indexes_of
from dkvstream.operators.api.operator import (
    MAIN_OUTPUT,
    WATERMARK_MIN,
    KeyedEvent,
    Operator,
    Subject,
    TimeDomain,
)
from dkvstream.operators.api.state import StateClock, state_specs, subject_prefix
from dkvstream.operators.api.state_schema import bind_operator
from dkvstream.operators.errors import OperatorError
from dkvstream.operators.io import dead_letter
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.paths import staging_prefix
from dkvstream.operators.runtime import operator_errors
from dkvstream.operators.runtime.erasure import erase_subjects
from dkvstream.operators.runtime.live import ingest_sketches
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.splits import apply_cuts
from dkvstream.operators.runtime.timers import Timers
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc_pause import gc_paused
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import ObjectStore


@dataclass(frozen=True)
class TaskSpec:
    """What one task needs besides its events (pickled to Spark workers).

    Attributes:
        job_prefix: object-store prefix of the job.
        epoch: the epoch being computed.
        op_index: position of the operator in the job.
        range_index: which key-group range (0..P-1).
        key_group_range: the key groups this task owns.
        manifest_key: DKV manifest of this range at the previous checkpoint (None: empty).
        parent_manifests: after a rescale, the manifests of the previous checkpoint's
            ranges that overlap this one; the task opens DKV from them, restricted to
            its own key interval (``manifest_key`` is then None).
        watermark_before: watermark reached by the previous epoch (ms); events at or
            below it are late.
        watermark_after: watermark this epoch reaches (ms); timers up to it fire.
        processing_time: the epoch's processing time (ms since the Unix epoch), decided
            once by the driver (``JobRunner``): processing-time timers up to it fire (a
            retry of the task fires the same ones), and it is the clock of
            processing-time state TTL; None: the task's wall clock at its start.
        next_key_groups / next_parallelism: routing of ``main`` output to the next
            operator (None for the last operator).
        flush: write the memtable to level-0 SSTables before the DKV checkpoint (a
            flush request, ``dkvstream.operators.runtime.control``).
        erase: ``(key group, key)`` of the subjects whose every entry the task purges
            after the epoch's events and timers (erasure requests,
            ``dkvstream.operators.runtime.erasure``); only the range's own.
        on_operator_error: the job's policy, ``"fail"`` or ``"dead_letter"``
            (``dkvstream.operators.runtime.operator_errors``).
        input_name: the ``source`` column of this task's dead-letter rows: the job
            source's name for the first operator, ``operator:<name>`` of the operator
            feeding a later one.
        input_partitions: source partition names by the events' ``_part`` index (the
            first operator), or None: the events have no source position.
        offset_limits: watermark alignment's cuts for the first operator,
            ``{_part index: first offset not read}`` (``event_time.alignment_cuts``): events at
            or past it are dropped (the next epoch reads them again); None: no cut.
        layout: the job's key layout (``dkvstream.operators.paths``): where the range's DKV files
            and staged output go.
        state_schemas: the operator's part of the checkpoint's ``state_schemas``
            (``{state id: record}``, ``dkvstream.operators.api.state_schema``): the
            schema versions its record codecs read; None: the declared ones only.
    """

    job_prefix: str
    epoch: int
    op_index: int
    range_index: int
    key_group_range: KeyGroupRange
    manifest_key: str | None
    watermark_before: int
    watermark_after: int
    next_key_groups: int | None = None
    next_parallelism: int | None = None
    parent_manifests: tuple[str, ...] = ()
    flush: bool = False
    on_operator_error: str = "fail"
    input_name: str = ""
    input_partitions: tuple[str, ...] | None = None
    offset_limits: dict[int, int] | None = None
    layout: int = paths.LAYOUT_FLAT
    processing_time: int | None = None
    state_schemas: dict[str, dict] | None = None
    erase: tuple[tuple[int, bytes], ...] = ()


@dataclass
class TaskResult:
    """What a task returns to the driver.

    ``metrics``: ``events``, ``timers_fired``, ``emitted`` (rows per output), ``seconds``
    (the task's wall time, s), ``open_seconds`` (of which opening or catching up DKV and
    installing remote compactions, s), ``dkv`` (``DKV.stats()``), ``remote_compactions``,
    ``dkv_reused`` (the worker's open instance was taken, ``dkvstream.operators.runtime.open_state``),
    ``dead_letter`` (events and timers dead-lettered, ``dkvstream.operators.runtime.operator_errors``),
    ``ingest`` and ``ingest_at_event_time`` (the ``live.IngestSketch``es of its events'
    ingest times that are not and that are their event time, ``live.ingest_sketches``;
    None: none) and
    ``requests`` (object-store requests of the task), and ``next_timers``
    (``{"event_time": ms or None, "processing_time": ms or None}``: a lower bound of the
    earliest timer of each domain left, None: none, ``Timers.next_timestamps``; the driver
    runs an epoch without input when one is due).

    ``dead_letter_key``: the staged file of the task's dead-letter rows, or None.

    ``staged_checksums``: ``{staged key: [bytes, crc32c]}`` of the staged outputs whose
    sink took a checksum (``Sink.stage``; ``ObjectChecksum.to_json``).

    ``event_time``: the first operator's range 0, when it computed the epoch's event time
    itself (``dkvstream.operators.runtime.exchange``): the ``event_time.EpochEventTime``; else None.

    ``dropped`` / ``unkept``: what the range's new DKV manifest stopped naming and what
    the task wrote that it does not name (``{object key: bytes}``,
    ``DKV.dropped_at_checkpoint`` / ``unkept_at_checkpoint``; None: unknown), for
    incremental retention (``dkvstream.operators.runtime.cleanup``).
    """

    range_index: int
    range_label: str
    manifest_key: str
    staged_outputs: dict[str, str]
    metrics: dict = field(default_factory=dict)
    forwarded: pa.Table | None = None  # main output events for the next operator
    dead_letter_key: str | None = None
    event_time: object | None = None  # event_time.EpochEventTime, computed by range 0 (exchange.run_range)
    dropped: dict[str, int] | None = None  # retention hook (dkvstream.operators.runtime.cleanup)
    unkept: dict[str, int] | None = None  # retention hook
    staged_checksums: dict[str, list[int]] = field(default_factory=dict)


class _TaskSubject(Subject):
    """The mutable subject a task hands to its operator, re-pointed per event."""

    __slots__ = (
        "_db",
        "_emitted",
        "_outputs",
        "_state_prefix",
        "_timers",
        "key",
        "key_group",
        "state_clock",
        "processing_time",
        "time_domain",
        "timestamp",
        "watermark",
    )

    def __init__(self, db: DKV, timers: Timers, outputs: dict[str, pa.Schema]) -> None:
        self._db = db
        self._timers = timers
        self._outputs = outputs
        self._emitted: dict[str, list] = {name: [] for name in outputs}
        self.key = b""
        self.key_group = -1
        self.timestamp = 0
        self.watermark = 0
        self.state_clock: StateClock | None = None  # of TTL'd state (state.StateClock)
        self.processing_time = 0
        self.time_domain: TimeDomain | None = None
        self._state_prefix = b""

    def _point_at(self, key: bytes, key_group: int) -> None:
        if key != self.key or key_group != self.key_group:
            self.key, self.key_group = key, key_group
            self._state_prefix = subject_prefix(key_group, key)

    def set_timer(self, timestamp: int) -> None:
        self._timers.event.set(self.key_group, timestamp, self.key)

    def delete_timer(self, timestamp: int) -> None:
        self._timers.event.delete(self.key_group, timestamp, self.key)

    def set_processing_timer(self, timestamp: int) -> None:
        self._timers.processing.set(self.key_group, timestamp, self.key)

    def delete_processing_timer(self, timestamp: int) -> None:
        self._timers.processing.delete(self.key_group, timestamp, self.key)

    def emit(self, value: dict, *, output: str = MAIN_OUTPUT, key: bytes | None = None,
             timestamp: int | None = None) -> None:
        try:
            sink = self._emitted[output]
        except KeyError:
            raise KeyError(f"operator declares no output {output!r} (outputs: {sorted(self._outputs)})") from None
        sink.append((self.key if key is None else key,
                     self.timestamp if timestamp is None else timestamp, value))


def _sorted_events(events: pa.Table) -> pa.Table:
    events = events.filter(pc.is_valid(events.column(KEY_COLUMN)))  # drop heartbeat rows
    return events.sort_by([(TIMESTAMP_COLUMN, "ascending"), (PART_COLUMN, "ascending"),
                           (OFFSET_COLUMN, "ascending")])


def run_task(operator: Operator, spec: TaskSpec, events: pa.Table, store: ObjectStore,
             sinks: dict[str, Sink] | None = None, dkv_options: DKVOptions | None = None,
             open_state: OpenState | None = None) -> TaskResult:
    """Run ``operator`` for one range and epoch.

    Args:
        operator: the job's operator ``spec.op_index``.
        spec: see ``TaskSpec``.
        events: this range's events (key, timestamp, value columns and the runtime's
            ``_part``/``_offset``/``_kg``/``_range`` columns); rows with a null key are
            heartbeats that only make the range's task run.
        store: the job's object store.
        sinks: output name -> sink, for the last operator (staged files are written).
        dkv_options: DKV tuning.
        open_state: where a Spark worker keeps the range's DKV open between epochs
            (``dkvstream.operators.runtime.open_state``); None opens it from the manifest and closes it.

    Returns:
        A ``TaskResult`` naming the DKV manifest and staged files written.

    Raises:
        OperatorError: under ``spec.on_operator_error == "fail"``, a handler raised on
            an event or timer (named; the operator's exception is its ``__cause__``). The
            epoch then fails and the previous checkpoint stays the newest.
        Exception: what is not the event's (a storage error, ``MemoryError``, a runtime
            check), as raised; under ``"dead_letter"`` only such errors
            (``dkvstream.operators.runtime.operator_errors``).
    """
    started = time.perf_counter()
    attempt = uuid.uuid4().hex[:12]
    # Before any state access: record codecs read the versions the checkpoint recorded.
    bind_operator(operator, spec.state_schemas)
    events = apply_cuts(events, spec.offset_limits)
    ingest = ingest_at_event_time = None
    if INGEST_TIME_COLUMN in events.column_names:  # for the latency metric only
        keyed = events.filter(pc.is_valid(events.column(KEY_COLUMN)))
        ingest, ingest_at_event_time = ingest_sketches(keyed.column(INGEST_TIME_COLUMN),
                                                       keyed.column(TIMESTAMP_COLUMN))
    krange = spec.key_group_range
    state_prefix = paths.state_prefix(spec.job_prefix, operator.name, krange.label, spec.layout)
    db = timers = None
    if open_state is not None and not spec.parent_manifests:
        taken = open_state.take(store.root_uri, state_prefix, spec.manifest_key, dkv_options)
        if taken is not None:
            db, timers = taken
    reused = db is not None
    if db is None:
        db = _open_range(spec, store, state_prefix, dkv_options)
    # Results of compactions run outside the job (e.g. a Dagster op) are installed here,
    # at the start of an epoch, if all their inputs are still live.
    compactions = db.install_pending_compactions()
    open_seconds = time.perf_counter() - started
    if timers is None:
        timers = Timers.over(db, krange)
    else:
        timers.begin_epoch()
    if spec.processing_time is None:
        spec = dataclasses.replace(spec, processing_time=time.time_ns() // 1_000_000)
    newest = None
    if spec.watermark_after == WATERMARK_MIN and events.num_rows and TIMESTAMP_COLUMN in events.column_names:
        newest = pc.max(events.column(TIMESTAMP_COLUMN)).as_py()
    state_clock = StateClock(spec.watermark_before, spec.watermark_after, spec.processing_time, newest)
    subject = _TaskSubject(db, timers, operator.outputs)
    subject.state_clock = state_clock

    dead = None
    try:
        # The cyclic collector is paused for the run (gc_pause.py): an epoch allocates a
        # container or more per event (value dicts, decoded records) while the memtable
        # holds millions of entries, and each full collection those allocations trigger
        # walks the memtable; state accesses make no cycles. Cycles an operator makes
        # are collected after the run, so they cost memory for one epoch at most. The
        # "dead_letter" rerun below is not paused: each caught exception is a cycle.
        with gc_paused():
            if isinstance(operator, BatchOperator):
                n_events, timers_fired, emitted = _run_batch(operator, spec, events, db, timers,
                                                             state_clock=state_clock)
            else:
                n_events, timers_fired, emitted = _run_events(operator, spec, events, subject, timers)
        next_timers = timers.next_timestamps()
    except Exception as e:
        if not operator_errors.attributable(e) or isinstance(e, OperatorError):
            raise
        if spec.on_operator_error != "dead_letter":
            if isinstance(operator, BatchOperator):  # the row is not known: found as "dead_letter" finds it
                db.close()
                raise _batch_error(operator, spec, events, store, state_prefix, dkv_options, e, state_clock) from e
            raise
        # Every write of the failed run is in this instance's memory, never checkpointed:
        # drop it and run the epoch again from the previous checkpoint, guarded.
        db.close()
        db = _open_range(spec, store, state_prefix, dkv_options)
        compactions = db.install_pending_compactions()
        dead = operator_errors.DeadLetterRows(operator, spec.epoch, spec.input_name,
                                              spec.input_partitions)
        buffer = operator_errors.WriteBuffer(db)
        timers = Timers.over(buffer, krange)  # not kept: it writes through the buffer
        if isinstance(operator, BatchOperator):
            n_events, timers_fired, emitted = _run_batch(operator, spec, events, buffer, timers, dead, state_clock)
        else:
            subject = _TaskSubject(buffer, timers, operator.outputs)
            subject.state_clock = state_clock
            n_events, timers_fired, emitted = _run_events(operator, spec, events, subject, timers, dead)
        buffer.commit()
        next_timers = timers.next_timestamps()
        timers = None

    staging = staging_prefix(spec.job_prefix, spec.epoch, operator.name, krange.label, attempt, spec.layout)
    tables = {name: e[0] for name, e in emitted.items()}
    forwarded = None
    staged: dict[str, str] = {}
    checksums: dict[str, list[int]] = {}
    if spec.next_parallelism is not None:
        forwarded = _forward_table(*emitted[MAIN_OUTPUT], spec)
    else:
        for name, table in tables.items():
            if table.num_rows:
                staged[name], checksum = sinks[name].stage(store, staging, table)
                if checksum is not None:
                    checksums[staged[name]] = checksum.to_json()
    dead_letter_key = None
    if dead is not None and dead.count:
        dead_letter_key, checksum = dead_letter.stage(store, spec.job_prefix, spec.epoch, dead.table(), attempt,
                                                      label=f"{operator.name}-{krange.label}", layout=spec.layout)
        checksums[dead_letter_key] = checksum.to_json()
    erased = None
    if spec.erase:  # after the epoch's own writes, so they are erased too
        erased = erase_subjects(db, spec.erase)
        if timers is not None:  # a kept instance's timer heap may hold erased timers
            timers = Timers.over(db, krange)
    if spec.flush:
        db.flush()
    # Expired TTL'd state leaves storage as compaction rewrites it, at this checkpoint's
    # clocks (state.py); the filter in the manifest makes remote compaction agree.
    if any(s.ttl is not None for s in state_specs(operator).values()):
        db.set_compaction_filter(state_clock.compaction_filter())
    fault_point("task_before_checkpoint")
    manifest_key = db.checkpoint(f"e{spec.epoch:010d}-{attempt}")
    dropped, unkept = db.dropped_at_checkpoint(), db.unkept_at_checkpoint()  # retention hook
    fault_point("task_after_checkpoint")
    dkv_stats = db.stats()
    if open_state is not None:
        open_state.keep(store.root_uri, state_prefix, manifest_key, dkv_options, db, timers)
    else:
        db.close()
    return TaskResult(
        range_index=spec.range_index,
        range_label=krange.label,
        manifest_key=manifest_key,
        staged_outputs=staged,
        staged_checksums=checksums,
        metrics={
            "events": n_events,
            "timers_fired": timers_fired,
            "emitted": {name: t.num_rows for name, t in tables.items()},
            "seconds": time.perf_counter() - started,
            "dkv": dkv_stats,
            "remote_compactions": compactions,
            "dkv_reused": reused,
            "open_seconds": open_seconds,
            "dead_letter": 0 if dead is None else dead.count,
            "ingest": ingest,
            "ingest_at_event_time": ingest_at_event_time,
            "next_timers": next_timers,
            **({"erased": erased} if erased is not None else {}),
        },
        forwarded=forwarded,
        dead_letter_key=dead_letter_key,
        dropped=dropped, unkept=unkept,  # retention hook
    )


def _open_range(spec: TaskSpec, store: ObjectStore, state_prefix: str, dkv_options: DKVOptions | None) -> DKV:
    """The range's DKV at the previous checkpoint (after a rescale: from the old ranges
    it overlaps, restricted to its key interval)."""
    if spec.parent_manifests:
        return DKV.open_from_parents(store, state_prefix, list(spec.parent_manifests),
                                     spec.key_group_range.key_interval, dkv_options)
    return DKV.open(store, state_prefix, spec.manifest_key, dkv_options)


# Per output: (values table, keys, timestamps), row-aligned.
Emitted = dict[str, tuple[pa.Table, list, list]]


def _run_events(operator: Operator, spec: TaskSpec, events: pa.Table, subject: _TaskSubject,
                timers: Timers, dead: operator_errors.DeadLetterRows | None = None
                ) -> tuple[int, int, Emitted]:
    """The ``on_event`` form: one call per event in event-time order, then per due timer:
    event time first, then processing time (a processing-time handler's event-time timer
    that is already due fires in the next epoch, as Flink fires it at the next watermark).

    What happens when a handler raises is the policy's: without ``dead``, ``_RaiseEventErrors``
    (the plain path, which calls the handlers themselves); with ``dead``, ``_DeadLetterEvents``
    (``subject`` and ``timers`` then act on a ``WriteBuffer``).
    """
    krange = spec.key_group_range
    events = _sorted_events(events)
    value_columns = [c for c in events.column_names if c not in INTERNAL_COLUMNS]
    keys = events.column(KEY_COLUMN).to_pylist()
    stamps = events.column(TIMESTAMP_COLUMN).to_pylist()
    groups = events.column(KG_COLUMN).to_pylist()
    values = events.select(value_columns).to_pylist()
    policy = (_RaiseEventErrors(operator, spec, events, values) if dead is None
              else _DeadLetterEvents(operator, subject, timers, dead))

    on_event = policy.handler(operator.on_event)
    point_at = subject._point_at
    subject.watermark = spec.watermark_before
    subject.processing_time = spec.processing_time
    for key, ts, kg, value in zip(keys, stamps, groups, values):
        if kg not in krange:
            raise ValueError(f"key {key!r} (key group {kg}) routed to task of {krange.label}")
        point_at(key, kg)
        subject.timestamp = ts
        try:  # free until it raises (Python 3.11's zero-cost exceptions)
            on_event(subject, KeyedEvent(key, ts, value))
        except Exception as e:
            policy.event_raised(e, value)
    policy.events_done(events, value_columns, values)

    on_timer = policy.handler(operator.on_timer_expired)
    timers_fired = 0
    subject.watermark = spec.watermark_after
    for domain, service, until in _domains(spec, timers):
        subject.time_domain = domain
        for ts, kg, key in service.due(until):
            point_at(key, kg)
            subject.timestamp = ts
            try:
                on_timer(subject, ts)
            except Exception as e:
                policy.timer_raised(e, key, ts)
            timers_fired += 1
    subject.time_domain = None
    policy.timers_done()
    emitted = {
        name: (_emitted_table(operator, name, [r[2] for r in rows]),
               [r[0] for r in rows], [r[1] for r in rows])
        for name, rows in subject._emitted.items()
    }
    return len(keys), timers_fired, emitted


class _RaiseEventErrors:
    """The ``on_event`` form's plain policy: a handler's exception ends the run. Under
    ``on_operator_error="fail"`` it is named (an ``OperatorError`` whose ``__cause__`` it
    is); under ``"dead_letter"`` it propagates as is, and ``run_task`` reruns the epoch
    with ``_DeadLetterEvents``. The handlers are called unwrapped: no cost per event."""

    def __init__(self, operator: Operator, spec: TaskSpec, events: pa.Table, values: list[dict]) -> None:
        self._operator, self._spec, self._events, self._values = operator, spec, events, values
        self._name = spec.on_operator_error == "fail"

    @staticmethod
    def handler(fn):
        return fn

    def event_raised(self, e: Exception, value: dict) -> None:
        if not self._name or not operator_errors.attributable(e):
            raise e
        # The row it raised on: its value dict is that very object (found only on failure).
        row = next(i for i, v in enumerate(self._values) if v is value)
        raise _event_error(self._operator, self._spec, "on_event", e, self._events, row) from e

    def timer_raised(self, e: Exception, key: bytes, timestamp: int) -> None:
        if not self._name or not operator_errors.attributable(e):
            raise e
        raise operator_errors.timer_error(self._operator, "on_timer_expired", e, key=key, timestamp=timestamp) from e

    def events_done(self, events: pa.Table, value_columns: list[str], values: list[dict]) -> None:
        pass

    def timers_done(self) -> None:
        pass


class _DeadLetterEvents:
    """The ``on_event`` form's ``"dead_letter"`` policy: each call's writes, timers and
    emitted rows are kept only if it returns; the events and timers it raises on go to
    ``dead``. The subject and timers act on a ``WriteBuffer``
    (``dkvstream.operators.runtime.operator_errors``); an error that is not the event's
    (``operator_errors.attributable``) still ends the run."""

    def __init__(self, operator: Operator, subject: _TaskSubject, timers: Timers,
                 dead: operator_errors.DeadLetterRows) -> None:
        self._operator, self._subject, self._timers, self._dead = operator, subject, timers, dead
        self._buffer: operator_errors.WriteBuffer = subject._db  # type: ignore[assignment]
        self._failed: list[tuple[dict, BaseException]] = []
        self._bad_timers: list[tuple[bytes, int, BaseException]] = []

    def handler(self, fn):
        """``fn`` guarded: what a call did is undone if it raises."""
        operator, buffer, timers, emitted_rows = self._operator, self._buffer, self._timers, self._subject._emitted

        def guarded(subject: _TaskSubject, arg) -> None:
            buffer.commit()  # a due timer's own deletion: it is consumed whatever its handler does
            marks = {name: len(rows) for name, rows in emitted_rows.items()}
            try:
                fn(subject, arg)
                # Rows of the wrong type fail this call, not the whole output at the end.
                for name, rows in emitted_rows.items():
                    if len(rows) > marks[name]:
                        _emitted_table(operator, name, [r[2] for r in rows[marks[name]:]])
            except Exception as e:
                if operator_errors.attributable(e, buffer):
                    for name, rows in emitted_rows.items():
                        del rows[marks[name]:]
                    timers.undo(buffer.discard(), buffer.stored)
                raise
            buffer.commit()

        return guarded

    def event_raised(self, e: Exception, value: dict) -> None:
        if not operator_errors.attributable(e, self._buffer):
            raise e
        self._failed.append((value, e))

    def timer_raised(self, e: Exception, key: bytes, timestamp: int) -> None:
        if not operator_errors.attributable(e, self._buffer):
            raise e
        self._bad_timers.append((key, timestamp, e))

    def events_done(self, events: pa.Table, value_columns: list[str], values: list[dict]) -> None:
        # Rows by the identity of their value dicts (all alive in ``values``): one pass.
        row_of = {id(v): i for i, v in enumerate(values)} if self._failed else {}
        failed = {row_of[id(value)]: e for value, e in self._failed}
        self._dead.events(events, value_columns, failed, "on_event", PART_COLUMN)

    def timers_done(self) -> None:
        self._buffer.commit()
        bad = self._bad_timers
        self._dead.timers([t[0] for t in bad], [t[1] for t in bad], [t[2] for t in bad], "on_timer_expired")


def _event_error(operator: Operator, spec: TaskSpec, handler: str, e: BaseException, events: pa.Table,
                 row: int) -> OperatorError:
    """``operator_errors.event_error`` for row ``row`` of ``events`` (sorted, with
    ``_part`` and ``_offset``)."""
    event = events.slice(row, 1).to_pylist()[0]
    first = spec.input_partitions is not None
    return operator_errors.event_error(
        operator, handler, e, key=event[KEY_COLUMN], timestamp=event[TIMESTAMP_COLUMN], source=spec.input_name,
        partition=spec.input_partitions[event[PART_COLUMN]] if first else None,
        offset=event[OFFSET_COLUMN] if first else None)


def _batch_error(operator: BatchOperator, spec: TaskSpec, events: pa.Table, store: ObjectStore, state_prefix: str,
                 dkv_options: DKVOptions | None, error: BaseException,
                 state_clock: StateClock | None = None) -> OperatorError:
    """The ``OperatorError`` of a vectorised handler that raised ``error`` under
    ``on_operator_error="fail"``: the range is reopened at the previous checkpoint and run
    as under ``"dead_letter"`` (``_IsolatingBatchCalls``), and the first event or timer set
    aside is named, at the same clocks of TTL'd state (``state_clock``) as the run that
    raised. Nothing of that run is kept."""
    db = _open_range(spec, store, state_prefix, dkv_options)
    dead = operator_errors.DeadLetterRows(operator, spec.epoch, spec.input_name, spec.input_partitions)
    buffer = operator_errors.WriteBuffer(db)
    try:
        _run_batch(operator, spec, events, buffer, Timers.over(buffer, spec.key_group_range), dead, state_clock)
        found, why = dead.first(), "a rerun raised on none"
    except Exception as e:  # noqa: BLE001 - the search's own failure is reported with the original error
        found, why = None, f"{type(e).__name__}: {' '.join(str(e).split())}"
    finally:
        db.close()
    if found is None:
        cause = operator_errors.cause_of(error, operator_errors.code_file_of(operator))
        return OperatorError(f"operator {operator.name} raised over the range's events or timers, and the "
                             f"one it raised on could not be found ({why}): {cause}. {operator_errors.WHAT_TO_DO}")
    row, handler, e = found
    if row["source"].startswith(operator_errors.TIMER_SOURCE):
        return operator_errors.timer_error(operator, handler, e, key=row["key"], timestamp=row["timestamp"])
    return operator_errors.event_error(operator, handler, e, key=row["key"], timestamp=row["timestamp"],
                                       source=spec.input_name, partition=row["partition"], offset=row["offset"])


def _emitted_table(operator: Operator, output: str, rows: list[dict]) -> pa.Table:
    """The rows ``Subject.emit`` collected for one output, as a table of its schema.

    ``Table.from_pylist`` ignores a key the schema lacks and makes a missing one null, so a
    misspelled field would silently become a column of nulls: the field names are checked
    first, as the union of the rows' keys (one pass in C, no per-value work), and the
    non-nullable fields by their null counts after the conversion.

    Raises:
        TypeError: an unknown field, a non-nullable field missing or null, or a value
            that does not convert to its field's type; names operator, output and field.
    """
    schema = operator.outputs[output]
    batch_api.check_emitted_names(operator.name, output, schema, set().union(*rows) if rows else ())
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise TypeError(f"operator {operator.name} output {output!r}: {_bad_field(schema, rows)}"
                        f"{' '.join(str(e).split())}") from e
    batch_api.check_not_null(operator.name, output, schema, table)
    return table


def _bad_field(schema: pa.Schema, rows: list[dict]) -> str:
    """``"field 'x' (type): "`` for the first field whose values do not convert (the slow
    path of an error), or "" if none is found alone."""
    for f in schema:
        try:
            pa.array([r.get(f.name) for r in rows], f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            return f"field {f.name!r} ({f.type}): "
    return ""


def _batch_input(spec: TaskSpec, events: pa.Table) -> tuple[pa.Table, list[str], pa.Table]:
    """``(events, value columns, batch)``: the range's events without heartbeat rows,
    sorted by (key, time, partition, offset), and the ``on_batch`` table of them (row i
    of one is row i of the other).

    Raises:
        ValueError: an event of a key group outside the task's range.
    """
    krange = spec.key_group_range
    events = events.filter(pc.is_valid(events.column(KEY_COLUMN)))  # drop heartbeat rows
    kgs = events.column(KG_COLUMN)
    if events.num_rows and (pc.min(kgs).as_py() < krange.start or pc.max(kgs).as_py() >= krange.end):
        bad = events.filter(pc.invert(pc.and_(pc.greater_equal(kgs, krange.start), pc.less(kgs, krange.end))))
        raise ValueError(f"key {bad.column(KEY_COLUMN)[0].as_py()!r} (key group {bad.column(KG_COLUMN)[0]})"
                         f" routed to task of {krange.label}")
    events = events.sort_by([(KEY_COLUMN, "ascending"), (TIMESTAMP_COLUMN, "ascending"),
                             (PART_COLUMN, "ascending"), (OFFSET_COLUMN, "ascending")])
    value_columns = [c for c in events.column_names if c not in INTERNAL_COLUMNS]
    batch = pa.table({KEY_COLUMN: events.column(KEY_COLUMN), TIMESTAMP_COLUMN: events.column(TIMESTAMP_COLUMN),
                      KEY_GROUP_COLUMN: events.column(KG_COLUMN),
                      **{c: events.column(c) for c in value_columns}})
    return events, value_columns, batch


def _domains(spec: TaskSpec, timers: Timers):
    """``(domain, its timer service, time up to which its timers fire)`` in firing order."""
    return ((TimeDomain.EVENT_TIME, timers.event, spec.watermark_after),
            (TimeDomain.PROCESSING_TIME, timers.processing, spec.processing_time))


def _timer_table(stamps: list, kgs: list, keys: list, domain: TimeDomain) -> pa.Table:
    return pa.table({
        KEY_COLUMN: pa.array(keys, pa.binary()),
        KEY_GROUP_COLUMN: pa.array(kgs, pa.int32()),
        TIMESTAMP_COLUMN: pa.array(stamps, pa.int64()),
        DOMAIN_COLUMN: pa.array([domain.value] * len(stamps), pa.string()),
    })


def _batch_emitted(operator: BatchOperator, ctx: BatchContext) -> Emitted:
    emitted: Emitted = {}
    for name, parts in ctx.emitted.items():
        schema = operator.outputs[name]
        emitted[name] = (pa.concat_tables([p[0] for p in parts]) if parts else schema.empty_table(),
                         [k for p in parts for k in p[1]], [t for p in parts for t in p[2]])
    return emitted


def _run_batch(operator: BatchOperator, spec: TaskSpec, events: pa.Table, db: DKV,
               timers: Timers, dead: operator_errors.DeadLetterRows | None = None,
               state_clock: StateClock | None = None) -> tuple[int, int, Emitted]:
    """The vectorised form: ``on_batch`` once with the range's events sorted by (key,
    time), then ``on_timers`` with due timers until none is due, event time first, then
    processing time.

    How the handlers are called is the policy's: without ``dead``, ``_DirectBatchCalls``
    (an exception propagates; ``run_task`` names its row); with ``dead``,
    ``_IsolatingBatchCalls`` (``db`` is then a ``WriteBuffer`` over the range's DKV at the
    previous checkpoint, and ``timers`` writes through it).
    """
    events, value_columns, batch = _batch_input(spec, events)
    ctx = BatchContext(db, timers.event, operator.outputs, operator.name, timers.processing)
    ctx.state_clock = state_clock
    calls = _DirectBatchCalls(operator, ctx) if dead is None else _IsolatingBatchCalls(operator, ctx, db, timers, dead)
    ctx.watermark = spec.watermark_before
    ctx.processing_time = spec.processing_time
    if batch.num_rows:
        calls.on_batch(batch, events, value_columns)
    ctx.watermark = spec.watermark_after
    timers_fired = 0
    for domain, service, until in _domains(spec, timers):
        while True:
            # Timers the handler sets show up next round.
            stamps, due_kgs, due_keys = service.pop_due_columns(until)
            calls.timers_consumed()
            if not stamps:
                break
            timers_fired += len(stamps)
            calls.on_timers(stamps, due_kgs, due_keys, domain)
    return batch.num_rows, timers_fired, _batch_emitted(operator, ctx)


class _DirectBatchCalls:
    """The vectorised form's plain policy: each handler is called once, on all its rows."""

    def __init__(self, operator: BatchOperator, ctx: BatchContext) -> None:
        self._operator, self._ctx = operator, ctx

    def on_batch(self, batch: pa.Table, events: pa.Table, value_columns: list[str]) -> None:
        self._operator.on_batch(self._ctx, batch)

    def timers_consumed(self) -> None:
        pass

    def on_timers(self, stamps: list, due_kgs: list, due_keys: list, domain: TimeDomain) -> None:
        self._operator.on_timers(self._ctx, _timer_table(stamps, due_kgs, due_keys, domain))


class _IsolatingBatchCalls:
    """The vectorised form's ``"dead_letter"`` policy: finds the rows ``on_batch`` and
    ``on_timers`` raise on (the search: ``operator_errors.isolate``), sends them to
    ``dead`` and runs the handler on the other rows. What a call did is kept only if it
    returned on the rows kept; an error that is not the rows' (``operator_errors.attributable``)
    ends the run."""

    def __init__(self, operator: BatchOperator, ctx: BatchContext, buffer: operator_errors.WriteBuffer,
                 timers: Timers, dead: operator_errors.DeadLetterRows) -> None:
        self._operator, self._ctx, self._buffer, self._timers, self._dead = operator, ctx, buffer, timers, dead

    def _call(self, handler, table: pa.Table, keep: bool) -> BaseException | None:
        """``handler(ctx, table)``; what it did is kept only if ``keep`` and it returned."""
        ctx, buffer = self._ctx, self._buffer
        marks = {name: len(parts) for name, parts in ctx.emitted.items()}
        try:
            handler(ctx, table)
        except Exception as e:
            if not operator_errors.attributable(e, buffer):
                raise
            keep = False
            err = e
        else:
            err = None
        if keep:
            buffer.commit()
        else:
            for name, parts in ctx.emitted.items():
                del parts[marks[name]:]
            self._timers.undo(buffer.discard(), buffer.stored)
        return err

    def _run_isolating(self, handler, table: pa.Table, groups_of, what: str) -> dict[int, BaseException]:
        """Runs ``handler`` on the rows of ``table`` it does not raise on (kept); returns
        the others, ``{row: exception}``."""
        bad: dict[int, BaseException] = {}
        rows = np.arange(table.num_rows)
        err = self._call(handler, table, keep=True)
        while err is not None:
            found = operator_errors.isolate(
                groups_of(rows), lambda idx: self._call(handler, table.take(pa.array(idx)), keep=False), err,
                f"operator {self._operator.name} {what}")
            bad.update(found)
            rows = np.setdiff1d(rows, np.fromiter(found, np.int64, len(found)))
            err = self._call(handler, table.take(pa.array(rows)), keep=True) if len(rows) else None
        return bad

    def on_batch(self, batch: pa.Table, events: pa.Table, value_columns: list[str]) -> None:
        keys = batch.column(KEY_COLUMN)
        # The batch is sorted by key: a key's rows are one run. Run number of every row.
        starts = np.concatenate([[True], pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
                                 .to_numpy(zero_copy_only=False)]) if len(keys) > 1 else np.array([True])
        run_of = np.cumsum(starts)

        def key_runs(rows: np.ndarray) -> list[np.ndarray]:
            cuts = np.flatnonzero(np.diff(run_of[rows])) + 1
            return np.split(rows, cuts)

        bad = self._run_isolating(self._operator.on_batch, batch, key_runs, "on_batch")
        self._dead.events(events, value_columns, bad, "on_batch", PART_COLUMN)

    def timers_consumed(self) -> None:
        self._buffer.commit()  # the due timers are consumed whatever their handler does

    def on_timers(self, stamps: list, due_kgs: list, due_keys: list, domain: TimeDomain) -> None:
        def timer_keys(rows: np.ndarray) -> list[np.ndarray]:
            by_key: dict[tuple[int, bytes], list[int]] = {}
            for r in rows.tolist():
                by_key.setdefault((due_kgs[r], due_keys[r]), []).append(r)
            return [np.asarray(v) for v in by_key.values()]

        bad = self._run_isolating(self._operator.on_timers, _timer_table(stamps, due_kgs, due_keys, domain), timer_keys,
                                  "on_timers")
        order = sorted(bad)
        self._dead.timers([due_keys[i] for i in order], [stamps[i] for i in order], [bad[i] for i in order],
                          "on_timers")


def forwarded_schema(main_output: pa.Schema) -> pa.Schema:
    """Schema of a later operator's input: the previous operator's ``main`` output
    columns, then key, timestamp, ``_part`` (the emitting range), ``_offset`` (emit
    order), ``_kg`` and ``_range``."""
    return pa.schema([*main_output, pa.field(KEY_COLUMN, pa.binary()), pa.field(TIMESTAMP_COLUMN, pa.int64()),
                      pa.field(PART_COLUMN, pa.int32()), pa.field(OFFSET_COLUMN, pa.int64()),
                      pa.field(KG_COLUMN, pa.int32()), pa.field(RANGE_COLUMN, pa.int32())])


def _forward_table(values: pa.Table, keys: list, stamps: list, spec: TaskSpec) -> pa.Table:
    """Main output as events of the next operator, with its key group and range."""
    kgs = key_groups_of(keys, spec.next_key_groups)
    table = values
    table = table.append_column(KEY_COLUMN, pa.array(keys, pa.binary()))
    table = table.append_column(TIMESTAMP_COLUMN, pa.array(stamps, pa.int64()))
    table = table.append_column(PART_COLUMN, pa.array([spec.range_index] * len(keys), pa.int32()))
    table = table.append_column(OFFSET_COLUMN, pa.array(range(len(keys)), pa.int64()))
    table = table.append_column(KG_COLUMN, pa.array(kgs, pa.int32()))
    return table.append_column(
        RANGE_COLUMN, pa.array(range_indexes_of(kgs, spec.next_key_groups, spec.next_parallelism), pa.int32())
    )
