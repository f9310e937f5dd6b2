"""One operator over one key-group range for one epoch: the body of a Spark task.

Steps (DESIGN.md, "Epochs and checkpoints", step 2): open DKV at the range's previous
manifest, run ``on_event`` for the range's events in event-time order (ties broken by
source partition and offset, so a replay is deterministic), advance the watermark and
fire due timers in timestamp order, stage output files and DKV files under names unique
to (epoch, range, attempt), checkpoint DKV, and return a small result the driver commits.

Runs in Spark's Python workers and, unchanged, in unit tests without Spark.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from operators.api import MAIN_OUTPUT, KeyedEvent, Operator, Subject
from operators.keygroups import KeyGroupRange, key_groups_of, range_indexes_of
from operators.sinks import Sink
from operators.sources import KEY_COLUMN, TIMESTAMP_COLUMN
from operators.staging import staging_prefix
from operators.state import subject_prefix
from operators.timers import TimerService
from storage.dkv import DKV, DKVOptions
from storage.objectstore import ObjectStore

# Columns the runtime adds to events; everything else besides key/timestamp is value.
PART_COLUMN = "_part"
OFFSET_COLUMN = "_offset"
KEY_GROUP_COLUMN = "_kg"
RANGE_COLUMN = "_range"
INTERNAL_COLUMNS = (KEY_COLUMN, TIMESTAMP_COLUMN, PART_COLUMN, OFFSET_COLUMN, KEY_GROUP_COLUMN, RANGE_COLUMN)


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
        next_key_groups / next_parallelism: routing of ``main`` output to the next
            operator (None for the last operator).
        flush: write the memtable to level-0 SSTables before the DKV checkpoint (a
            flush request, ``operators.control``).
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


@dataclass
class TaskResult:
    """What a task returns to the driver."""

    range_index: int
    range_label: str
    manifest_key: str
    staged_outputs: dict[str, str]
    metrics: dict = field(default_factory=dict)
    forwarded: pa.Table | None = None  # main output events for the next operator


class _TaskSubject(Subject):
    """The mutable subject a task hands to its operator, re-pointed per event."""

    __slots__ = ("key", "key_group", "timestamp", "watermark", "_db", "_state_prefix",
                 "_timers", "_emitted", "_outputs")

    def __init__(self, db: DKV, timers: TimerService, outputs: dict[str, pa.Schema]) -> None:
        self._db = db
        self._timers = timers
        self._outputs = outputs
        self._emitted: dict[str, list] = {name: [] for name in outputs}
        self.key = b""
        self.key_group = -1
        self.timestamp = 0
        self.watermark = 0
        self._state_prefix = b""

    def _point_at(self, key: bytes, key_group: int) -> None:
        if key != self.key or key_group != self.key_group:
            self.key, self.key_group = key, key_group
            self._state_prefix = subject_prefix(key_group, key)

    def set_timer(self, timestamp: int) -> None:
        self._timers.set(self.key_group, timestamp, self.key)

    def delete_timer(self, timestamp: int) -> None:
        self._timers.delete(self.key_group, timestamp, self.key)

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
             sinks: dict[str, Sink] | None = None, dkv_options: DKVOptions | None = None) -> TaskResult:
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

    Returns:
        A ``TaskResult`` naming the DKV manifest and staged files written.

    Raises:
        Whatever the operator raises; the epoch then fails and the previous checkpoint
        stays the newest.
    """
    started = time.perf_counter()
    attempt = uuid.uuid4().hex[:12]
    krange = spec.key_group_range
    state_prefix = f"{spec.job_prefix}/state/{operator.name}/{krange.label}"
    if spec.parent_manifests:
        db = DKV.open_from_parents(store, state_prefix, list(spec.parent_manifests), krange.key_interval,
                                   dkv_options)
    else:
        db = DKV.open(store, state_prefix, spec.manifest_key, dkv_options)
    # Results of compactions run outside the job (e.g. a Dagster op) are installed here,
    # at the start of an epoch, if all their inputs are still live.
    compactions = db.install_pending_compactions()
    timers = TimerService(db, krange)
    subject = _TaskSubject(db, timers, operator.outputs)

    events = _sorted_events(events)
    value_columns = [c for c in events.column_names if c not in INTERNAL_COLUMNS]
    keys = events.column(KEY_COLUMN).to_pylist()
    stamps = events.column(TIMESTAMP_COLUMN).to_pylist()
    groups = events.column(KEY_GROUP_COLUMN).to_pylist()
    values = events.select(value_columns).to_pylist()

    on_event = operator.on_event
    point_at = subject._point_at
    subject.watermark = spec.watermark_before
    for key, ts, kg, value in zip(keys, stamps, groups, values):
        if kg not in krange:
            raise ValueError(f"key {key!r} (key group {kg}) routed to task of {krange.label}")
        point_at(key, kg)
        subject.timestamp = ts
        on_event(subject, KeyedEvent(key, ts, value))

    timers_fired = 0
    subject.watermark = spec.watermark_after
    for ts, kg, key in timers.due(spec.watermark_after):
        point_at(key, kg)
        subject.timestamp = ts
        operator.on_timer_expired(subject, ts)
        timers_fired += 1

    staging = staging_prefix(spec.job_prefix, spec.epoch, operator.name, krange.label, attempt)
    tables = {name: _emitted_table(rows, operator.outputs[name]) for name, rows in subject._emitted.items()}
    forwarded = None
    staged: dict[str, str] = {}
    if spec.next_parallelism is not None:
        forwarded = _forward_table(subject._emitted[MAIN_OUTPUT], tables[MAIN_OUTPUT], spec)
    else:
        for name, table in tables.items():
            if table.num_rows:
                staged[name] = sinks[name].write_staged(store, staging, table)
    if spec.flush:
        db.flush()
    manifest_key = db.checkpoint(f"e{spec.epoch:010d}-{attempt}")
    dkv_stats = db.stats()
    db.close()
    return TaskResult(
        range_index=spec.range_index,
        range_label=krange.label,
        manifest_key=manifest_key,
        staged_outputs=staged,
        metrics={
            "events": len(keys),
            "timers_fired": timers_fired,
            "emitted": {name: t.num_rows for name, t in tables.items()},
            "seconds": time.perf_counter() - started,
            "dkv": dkv_stats,
            "remote_compactions": compactions,
        },
        forwarded=forwarded,
    )


def _emitted_table(rows: list, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([r[2] for r in rows], schema=schema)


def _forward_table(rows: list, values: pa.Table, spec: TaskSpec) -> pa.Table:
    """Main output as events of the next operator, with its key group and range."""
    keys = [r[0] for r in rows]
    kgs = key_groups_of(keys, spec.next_key_groups)
    table = values
    table = table.append_column(KEY_COLUMN, pa.array(keys, pa.binary()))
    table = table.append_column(TIMESTAMP_COLUMN, pa.array([r[1] for r in rows], pa.int64()))
    table = table.append_column(PART_COLUMN, pa.array([spec.range_index] * len(rows), pa.int32()))
    table = table.append_column(OFFSET_COLUMN, pa.array(range(len(rows)), pa.int64()))
    table = table.append_column(KEY_GROUP_COLUMN, pa.array(kgs, pa.int32()))
    return table.append_column(
        RANGE_COLUMN, pa.array(range_indexes_of(kgs, spec.next_key_groups, spec.next_parallelism), pa.int32())
    )
