"""Unit tests of one operator without Spark, a source or an object store:
``OperatorTestHarness`` (Flink's ``KeyedOneInputStreamOperatorTestHarness``, Spark's
``TwsTester``).

The harness runs the operator the way a job's tasks run it, through the runtime's own
task body (``dkvstream.operators.runtime.task.run_task``): events in event-time order
(``on_event``) or as one table per key-group range (``on_batch``), the watermark, late
events (``timestamp <= watermark``), timers fired in (timestamp, key group, key) order,
output checked against the operator's schemas, operator errors named or dead-lettered, and
state and timers in a real DKV per key-group range, checkpointed after every step into an
in-memory object store (``dkvstream.storage.objectstore.memory``). Each step is one epoch
of a job:

* ``process_events(events, watermark=None)``: the events, with the watermark reached so
  far (events at or below it are late), then every timer up to ``watermark``;
* ``advance_watermark(ms)``: an epoch without events that moves the watermark and fires
  the timers it passes; ``finish()`` moves it to +infinity, as the end of a bounded input;
* ``advance_processing_time(ms)``: an epoch without events whose processing time is
  ``ms``: the processing-time timers up to it fire (and processing-time state TTL reads
  that clock); processing time starts at 0 and, as in a job, is one value per epoch;
* ``restart(parallelism=None)``: what a job restart does: every range's DKV is reopened
  from its checkpoint and the operator is a fresh copy of the one given (so attributes it
  set on ``self`` are gone, as on a new Spark worker); with ``parallelism``, the ranges are
  rescaled as a job's are.

Then read what it did: ``output(name)`` (rows as dicts), ``output_table(name)`` (Arrow),
``output_events()`` (the ``main`` rows with their emitted key and time, as a next operator
gets them), ``timers(key, domain)`` (pending timers of either time domain), ``state(key, state_id)``, ``state_keys()``
and ``dead_letters()``. Keys are ``bytes``; a ``str`` key is taken as its UTF-8 bytes.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dkvstream.operators import paths
from dkvstream.operators.api.columns import (
    INTERNAL_COLUMNS,
    KEY_COLUMN,
    RANGE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.api.keygroups import (
    DEFAULT_KEY_GROUPS,
    MAX_KEY_GROUPS,
    KeyGroupRange,
    key_group_of,
    key_group_ranges,
    range_index_of,
)
from dkvstream.operators.api.operator import (
    MAIN_OUTPUT,
    WATERMARK_MAX,
    WATERMARK_MIN,
    KeyedEvent,
    Operator,
    TimeDomain,
)
from dkvstream.operators.api.state import (
    SCHEMA_STATE,
    SCHEMA_STATE_TTL_EVENT,
    SCHEMA_STATE_TTL_PROCESSING,
    STATE_SCHEMAS,
    ListSpec,
    MapSpec,
    StateClock,
    decode_state_key,
    state_specs,
    subject_prefix,
)
from dkvstream.operators.api.validation import check_operator
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.dead_letter import DEAD_LETTER_FILE_SCHEMA
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import parent_manifests
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.splits import stage_input_schema, tag_events
from dkvstream.operators.runtime.task import TaskResult, TaskSpec, run_task
from dkvstream.operators.runtime.timers import SCHEMAS, decode_timer_key
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.objectstore.memory import MemoryObjectStore

# The harness's input as the runtime names it: the ``source`` of dead-letter rows and the
# partition of an event in an operator error; an event's offset is its position in the
# harness's input (0 for the first event fed).
HARNESS_INPUT = "harness"
_JOB = "harness"


class _ReadOnly:
    """A ``StateStore`` over a DKV that drops writes: reading state in the harness (a TTL
    that refreshes on read writes a new expiry) must not change what the next step sees."""

    def __init__(self, db: DKV) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def put(self, key: bytes, value: bytes) -> None:
        pass

    def delete(self, key: bytes) -> None:
        pass

    def write_batch(self, keys: Any, values: Any) -> None:
        pass


class _StateReader:
    """What a state spec's ``state_for`` needs of a subject: the DKV (read only), the
    key's prefix and the clocks TTL'd state is read at (those the next step reads at)."""

    def __init__(self, db: DKV, key: bytes, key_group: int, clock: StateClock) -> None:
        self._db, self.key, self.key_group = _ReadOnly(db), key, key_group
        self._state_prefix = subject_prefix(key_group, key)
        self.state_clock = clock
        self.watermark = clock.watermark


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes):
        return key
    raise TypeError(f"a key is bytes (or str, taken as UTF-8), got {type(key).__name__} {key!r}")


class OperatorTestHarness:
    """Runs one operator (either form) over events you give it, one epoch per step.

    Args:
        operator: an ``Operator`` or ``BatchOperator`` instance. It must pickle, as Spark
            ships it to its tasks (``restart`` runs a copy of it as given, made as
            pickling makes one).
        key_groups: K, as ``Job.key_groups`` (decides each key's key group).
        parallelism: key-group ranges the operator runs over, as ``Job.parallelism``: a
            ``BatchOperator`` gets one ``on_batch`` call per range that has events.
        on_operator_error: as ``Job.on_operator_error``: ``"fail"`` (a handler that
            raises fails the step with ``OperatorError`` naming the key, the event's
            position in the input and its time; nothing of the step is kept) or
            ``"dead_letter"`` (the event or timer goes to ``dead_letters()``, the rest of
            the step is kept).
        value_schema: the events' value columns and types, as ``Source.value_schema``;
            None: taken from each step's events (pass it when a column may be all null in a
            step, or to give ``on_batch`` the same types in every step).
        dkv_options: DKV tuning (``dkvstream.storage.dkv.DKVOptions``), e.g. a small
            memtable to run state through SSTables.

    Raises:
        InvalidJobError: the operator is not one, or declares a bad output schema or codec.
        ValueError: ``key_groups``, ``parallelism`` or ``on_operator_error`` out of range.
        TypeError: the operator does not pickle.
    """

    def __init__(self, operator: Operator, *, key_groups: int = DEFAULT_KEY_GROUPS, parallelism: int = 1,
                 on_operator_error: str = "fail", value_schema: pa.Schema | None = None,
                 dkv_options: DKVOptions | None = None) -> None:
        check_operator(SimpleNamespace(name=f"{_JOB} of {getattr(operator, 'name', operator)!r}"), operator)
        if isinstance(key_groups, bool) or not isinstance(key_groups, int) or not 1 <= key_groups <= MAX_KEY_GROUPS:
            raise ValueError(f"key_groups must be an int in [1, {MAX_KEY_GROUPS}], got {key_groups!r}")
        if on_operator_error not in ("fail", "dead_letter"):
            raise ValueError(f"on_operator_error must be 'fail' or 'dead_letter', got {on_operator_error!r}")
        try:
            # Copied as pickling copies it (``__reduce_ex__``), as Spark's cloudpickle ships
            # it; classes by reference, so one defined in a test function copies too.
            self._pristine = copy.deepcopy(operator)
        except Exception as e:  # noqa: BLE001 - whatever copying raises is the user's to see, named
            raise TypeError(f"operator {operator.name} does not pickle ({type(e).__name__}: {e}); Spark ships "
                            f"operators to its tasks: keep configuration in plain attributes, and open files "
                            f"or clients inside the handlers") from e
        self.operator = operator
        self.key_groups = key_groups
        self.on_operator_error = on_operator_error
        self.value_schema = value_schema
        self.dkv_options = dkv_options
        self._ranges = key_group_ranges(key_groups, parallelism)
        self._store = MemoryObjectStore()
        self._open = OpenState(capacity=max(parallelism, 1))
        self._prefix = paths.job_prefix(_JOB)
        self._sinks = {name: ParquetSink(name, schema) for name, schema in operator.outputs.items()}
        # An operator with only a main output runs as a chain's intermediate operator does:
        # its rows come back as the next operator's events, with the key and time emitted.
        self._forward = set(operator.outputs) == {MAIN_OUTPUT}
        self._manifests: dict[str, str] = {}  # range label -> DKV manifest of the last step
        self._parents: dict[str, tuple[str, ...]] = {}  # after a rescale, until the next step
        self._epoch = 0
        self._watermark = WATERMARK_MIN
        self._processing_time = 0  # ms: the epochs' processing time (a job's driver sets it per epoch)
        self._fed = 0  # events fed so far: the next event's offset
        self._outputs: dict[str, list[pa.Table]] = {name: [] for name in operator.outputs}
        self._emitted_at: list[tuple[pa.ChunkedArray, pa.ChunkedArray]] = []  # main's (keys, times)
        self._dead: list[pa.Table] = []

    # ----------------------------------------------------------------- steps

    @property
    def watermark(self) -> int:
        """The watermark reached (ms); ``WATERMARK_MIN`` before the first advance."""
        return self._watermark

    @property
    def processing_time(self) -> int:
        """The processing time of the last step (ms since the Unix epoch; 0 at first)."""
        return self._processing_time

    @property
    def parallelism(self) -> int:
        """The number of key-group ranges the operator runs over."""
        return len(self._ranges)

    @property
    def epoch(self) -> int:
        """Steps run so far (each is one epoch)."""
        return self._epoch

    def process_events(self, events: pa.Table | Iterable[KeyedEvent | dict], watermark: int | None = None) -> None:
        """One epoch: ``events`` with the watermark reached so far, then the timers up to
        ``watermark``.

        Args:
            events: a table with a ``key`` (binary or string) and a ``timestamp`` (int64,
                ms) column and value columns; or ``KeyedEvent``s (``value`` a dict of
                value columns, or None); or dicts with ``key``, ``timestamp`` and value
                columns. Events of one step reach ``on_event`` in timestamp order, ties
                in the order given (``on_batch``: sorted by key, then the same).
            watermark: where the watermark goes after the events (ms); None: it stays.

        Raises:
            ValueError: ``watermark`` is below the watermark reached (it never goes
                back), or an event has no key or timestamp (named by its position).
            OperatorError: under ``on_operator_error="fail"``, a handler raised; the
                step is not kept (state, timers, output and watermark are as before it).
            TypeError: an emitted row does not match its output's schema (named).
        """
        after = self._watermark if watermark is None else self._check_watermark(watermark)
        table = self._event_table(events)
        self._run_epoch(table if table.num_rows else None, after)

    def process_event(self, key: bytes | str, timestamp: int, value: dict | None = None,
                      watermark: int | None = None) -> None:
        """``process_events`` of one event (its own epoch)."""
        self.process_events([KeyedEvent(_key_bytes(key), timestamp, value or {})], watermark)

    def advance_watermark(self, watermark: int) -> None:
        """An epoch without events that moves the watermark to ``watermark`` (ms) and
        fires every timer at or below it, as a job's epoch does.

        Raises:
            ValueError: ``watermark`` is below the watermark reached.
        """
        self._run_epoch(None, self._check_watermark(watermark))

    def advance_processing_time(self, processing_time: int) -> None:
        """An epoch without events whose processing time is ``processing_time`` (ms since
        the Unix epoch; the harness's processing time starts at 0): every processing-time
        timer at or below it fires (``subject.time_domain`` / the ``domain`` column is
        ``"processing_time"``), after any event-time timers at the watermark reached.
        Later steps keep this processing time until it is advanced again.

        Raises:
            ValueError: ``processing_time`` is below the processing time reached (it never
                goes back, as a job's driver never lets it).
        """
        if isinstance(processing_time, bool) or not isinstance(processing_time, (int, np.integer)):
            raise TypeError(f"a processing time is an int (ms), got {type(processing_time).__name__} "
                            f"{processing_time!r}")
        if processing_time < self._processing_time:
            raise ValueError(f"processing time only advances: it is at {self._processing_time}, asked for "
                             f"{processing_time}")
        before, self._processing_time = self._processing_time, int(processing_time)
        try:
            self._run_epoch(None, self._watermark)
        except BaseException:
            self._processing_time = before  # the step is not kept
            raise

    def finish(self) -> None:
        """The end of a bounded input: the watermark goes to +infinity
        (``WATERMARK_MAX``) and every pending timer fires."""
        self.advance_watermark(WATERMARK_MAX)

    def restart(self, parallelism: int | None = None) -> None:
        """Restarts as a job does from its last checkpoint: each range's DKV is reopened
        from the manifest of the last step, timers are read back from it, and the
        operator (``self.operator``) becomes a fresh copy of the one given, as a new
        Spark worker unpickles it: attributes it set on ``self`` since are gone.

        Args:
            parallelism: run the following steps over this many ranges instead (a
                rescale: each new range opens the old ranges it overlaps); None: as before.

        Raises:
            ValueError: ``parallelism`` is not in [1, key_groups], or the ranges were
                rescaled already with no step since.
        """
        self._open.close_all()
        self.operator = copy.deepcopy(self._pristine)
        if parallelism is None or parallelism == len(self._ranges):
            return
        new = key_group_ranges(self.key_groups, parallelism)
        manifests = self._manifests_now()
        old = sorted(KeyGroupRange.from_label(label) for label in manifests)
        self._parents = {kr.label: parent_manifests(manifests, old, kr) for kr in new}
        self._manifests = {}
        self._ranges = new
        self._open = OpenState(capacity=parallelism)

    def close(self) -> None:
        """Closes the ranges' DKV instances (the harness is not used after)."""
        self._open.close_all()

    def __enter__(self) -> OperatorTestHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- reading

    def output(self, name: str = MAIN_OUTPUT) -> list[dict]:
        """Rows emitted to output ``name`` so far, as dicts, in step order (within a
        step: range by range, each in emit order).

        Raises:
            KeyError: the operator declares no such output.
        """
        return self.output_table(name).to_pylist()

    def output_table(self, name: str = MAIN_OUTPUT) -> pa.Table:
        """``output`` as one Arrow table of the output's schema: what the job's sink
        for it would receive.

        Raises:
            KeyError: the operator declares no such output.
        """
        if name not in self._outputs:
            raise KeyError(f"operator {self.operator.name} declares no output {name!r} "
                           f"(outputs: {sorted(self._outputs)})")
        schema = self.operator.outputs[name]
        tables = [t.cast(schema) for t in self._outputs[name]]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def output_events(self) -> list[KeyedEvent]:
        """The ``main`` rows emitted so far as the events a next operator in a chain
        receives: the ``key`` and ``timestamp`` passed to ``emit`` (default: the
        subject's), the row as ``value``; in ``output`` order.

        Raises:
            ValueError: the operator declares other outputs than ``main`` (only such an
                operator can feed another one).
        """
        if not self._forward:
            raise ValueError(f"operator {self.operator.name} declares outputs {sorted(self._outputs)}: only "
                             f"an operator whose one output is {MAIN_OUTPUT!r} feeds a next operator; read "
                             f"its rows with output()")
        return [KeyedEvent(key, ts, value)
                for table, (keys, stamps) in zip(self._outputs[MAIN_OUTPUT], self._emitted_at)
                for key, ts, value in zip(keys.to_pylist(), stamps.to_pylist(), table.to_pylist())]

    def clear_output(self) -> None:
        """Forgets the rows emitted so far (every output and the dead letters)."""
        self._outputs = {name: [] for name in self._outputs}
        self._emitted_at = []
        self._dead = []

    def dead_letters(self) -> pa.Table:
        """Under ``on_operator_error="dead_letter"``: the events and timers a handler
        raised on, as the job's dead-letter table holds them (``source`` is
        ``"harness"``, ``offset`` the event's position in the input)."""
        if not self._dead:
            return DEAD_LETTER_FILE_SCHEMA.empty_table()
        return pa.concat_tables(self._dead, promote_options="default")

    def timers(self, key: bytes | str | None = None, domain: TimeDomain | str = TimeDomain.EVENT_TIME
               ) -> list[int] | list[tuple[int, bytes]]:
        """Pending timers of one time domain.

        Args:
            key: one subject key; None: every key's.
            domain: ``TimeDomain.EVENT_TIME`` (default) or ``TimeDomain.PROCESSING_TIME``
                (or their string values).

        Returns:
            For ``key``: its timers' timestamps (ms), ascending. Without: ``(timestamp,
            key)`` of every timer, in the order they fire in a range (timestamp, key
            group, key).
        """
        schema = SCHEMAS[TimeDomain(domain)]
        found = []
        for r in range(len(self._ranges)):
            with self._reading(r) as db:
                if db is not None:
                    found += [decode_timer_key(k, schema) for k, _ in db.scan_range(b"", None) if k[2] == schema]
        found.sort(key=lambda t: (t[1], t[0], t[2]))
        if key is None:
            return [(ts, k) for _, ts, k in found]
        key = _key_bytes(key)
        return [ts for _, ts, k in found if k == key]

    def state(self, key: bytes | str, state_id: str) -> Any:
        """The state ``state_id`` of ``key``, decoded by its spec's codecs.

        Returns:
            A ``ValueSpec``'s value (None if unset); a ``ListSpec``'s list (empty if
            none); a ``MapSpec``'s ``{map key: value}`` in the map's order (empty if none).

        Raises:
            KeyError: the operator declares no state ``state_id`` (names those it does).
        """
        specs = state_specs(self.operator)
        if state_id not in specs:
            raise KeyError(f"operator {self.operator.name} declares no state {state_id!r} "
                           f"(its state ids: {sorted(specs)})")
        spec = specs[state_id]
        key = _key_bytes(key)
        kg = key_group_of(key, self.key_groups)
        with self._reading(range_index_of(kg, self.key_groups, len(self._ranges))) as db:
            if db is None:
                return {} if isinstance(spec, MapSpec) else [] if isinstance(spec, ListSpec) else None
            state = spec.state_for(_StateReader(db, key, kg, self._state_clock()))
            return dict(state.items()) if isinstance(spec, MapSpec) else state.get()

    def state_keys(self, state_id: str | None = None) -> list[bytes]:
        """The subject keys that hold state (of ``state_id``, or of any state), sorted:
        a key missing here has none left, e.g. after its window was emitted and cleared."""
        keys: set[bytes] = set()
        clock = self._state_clock()
        now = {SCHEMA_STATE_TTL_EVENT: clock.watermark, SCHEMA_STATE_TTL_PROCESSING: clock.processing_time}
        for r in range(len(self._ranges)):
            with self._reading(r) as db:
                if db is None:
                    continue
                for k, v in db.scan_range(b"", None):
                    if k[2] not in STATE_SCHEMAS:
                        continue
                    if k[2] != SCHEMA_STATE and int.from_bytes(v[:8], "big", signed=True) <= now[k[2]]:
                        continue  # expired: invisible to the operator
                    _, subject, sid, _ = decode_state_key(k)
                    if state_id is None or sid == state_id:
                        keys.add(subject)
        return sorted(keys)

    def _state_clock(self) -> StateClock:
        """The clocks the next step reads TTL'd state at."""
        return StateClock(self._watermark, self._watermark, self._processing_time)

    # ----------------------------------------------------------------- internals

    def _check_watermark(self, watermark: int) -> int:
        if isinstance(watermark, bool) or not isinstance(watermark, (int, np.integer)):
            raise TypeError(f"a watermark is an int (ms), got {type(watermark).__name__} {watermark!r}")
        if not WATERMARK_MIN <= watermark <= WATERMARK_MAX:
            raise ValueError(f"watermark {watermark} is outside the signed 64-bit range of event time (ms)")
        if watermark < self._watermark:
            raise ValueError(f"the watermark only advances: it is at {self._watermark}, asked for {watermark}")
        return int(watermark)

    def _event_table(self, events: pa.Table | Iterable[KeyedEvent | dict]) -> pa.Table:
        """The step's events as a read task hands them to the first operator: key,
        timestamp, value columns, ``_part`` 0, ``_offset`` (position in the input),
        ``_ingest_time`` null, ``_kg`` and ``_range``."""
        if not isinstance(events, pa.Table):
            rows = []
            for i, e in enumerate(events):
                if isinstance(e, KeyedEvent):
                    rows.append({**(e.value or {}), KEY_COLUMN: e.key, TIMESTAMP_COLUMN: e.timestamp})
                elif isinstance(e, dict):
                    rows.append(dict(e))  # the caller's dict stays as given
                else:
                    raise TypeError(f"event {i}: a KeyedEvent or a dict with key and timestamp, "
                                    f"got {type(e).__name__}")
            for i, row in enumerate(rows):
                if row.get(KEY_COLUMN) is None or row.get(TIMESTAMP_COLUMN) is None:
                    raise ValueError(f"event {i} ({self._fed + i} in the harness's input) has no "
                                     f"{KEY_COLUMN if row.get(KEY_COLUMN) is None else TIMESTAMP_COLUMN}: {row}")
                row[KEY_COLUMN] = _key_bytes(row[KEY_COLUMN])
            if not rows:
                return _EMPTY_INPUT
            events = pa.Table.from_pylist(rows, schema=self._schema_of(rows))
        if not events.num_rows:
            return _EMPTY_INPUT
        for name in (KEY_COLUMN, TIMESTAMP_COLUMN):
            if name not in events.column_names:
                raise ValueError(f"events need a {name!r} column; they have {events.column_names}")
            column = events.column(name)
            if column.null_count:
                first = pc.index(pc.is_null(column), True).as_py()
                raise ValueError(f"event {first} ({self._fed + first} in the harness's input) has no {name}")
        keys = events.column(KEY_COLUMN)
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
            keys = keys.cast(pa.binary())
        values = [c for c in events.column_names if c not in INTERNAL_COLUMNS]
        value_columns = {c: events.column(c) for c in values}
        if self.value_schema is not None:
            value_columns = {f.name: (value_columns[f.name].cast(f.type) if f.name in value_columns
                                      else pa.nulls(events.num_rows, f.type)) for f in self.value_schema}
        n = events.num_rows
        table = pa.table({KEY_COLUMN: keys.cast(pa.binary()),
                          TIMESTAMP_COLUMN: events.column(TIMESTAMP_COLUMN).cast(pa.int64()), **value_columns})
        return tag_events(table, 0, np.arange(self._fed, self._fed + n, dtype=np.int64),
                          pa.nulls(n, pa.int64()), self.key_groups, len(self._ranges))[0]

    def _schema_of(self, rows: list[dict]) -> pa.Schema | None:
        """The schema of event dicts: key and timestamp, then ``value_schema`` (None:
        pyarrow infers the value columns)."""
        if self.value_schema is None:
            return None
        return pa.schema([pa.field(KEY_COLUMN, pa.binary()), pa.field(TIMESTAMP_COLUMN, pa.int64()),
                          *self.value_schema])

    def _task_spec(self, epoch: int, r: int, kr: KeyGroupRange, watermark_after: int) -> TaskSpec:
        """Range ``r``'s task of one step, as the driver (``JobRunner``) plans it for the
        first operator of a job reading the harness's input: the last one, or, with only a
        ``main`` output, one feeding a next operator over the same key groups."""
        return TaskSpec(job_prefix=self._prefix, epoch=epoch, op_index=0, range_index=r, key_group_range=kr,
                        manifest_key=self._manifests.get(kr.label), parent_manifests=self._parents.get(kr.label, ()),
                        watermark_before=self._watermark, watermark_after=watermark_after,
                        next_key_groups=self.key_groups if self._forward else None,
                        next_parallelism=1 if self._forward else None,
                        on_operator_error=self.on_operator_error, input_name=HARNESS_INPUT,
                        input_partitions=(HARNESS_INPUT,), processing_time=self._processing_time)

    def _run_epoch(self, events: pa.Table | None, watermark_after: int) -> None:
        """Runs every range's task of one step; keeps the step (manifests, output,
        watermark, input position) only if every task returned, as the driver commits
        an epoch only when all its tasks did."""
        epoch = self._epoch + 1
        ranges = events.column(RANGE_COLUMN).to_numpy() if events is not None and events.num_rows else None
        results: list[TaskResult] = []
        try:
            for r, kr in enumerate(self._ranges):
                spec = self._task_spec(epoch, r, kr, watermark_after)
                rows = _EMPTY_INPUT if ranges is None else events.filter(pa.array(ranges == r))
                results.append(run_task(self.operator, spec, rows, self._store, sinks=self._sinks,
                                        dkv_options=self.dkv_options, open_state=self._open))
        except BaseException:
            # The step is not kept: its files go; the ranges that ran reopen from the last
            # step's manifests (their open instances are past it).
            for res in results:
                for key in [*res.staged_outputs.values(), res.dead_letter_key]:
                    if key is not None:
                        self._store.delete(key)
            raise
        self._epoch, self._watermark = epoch, watermark_after
        self._fed += 0 if events is None else events.num_rows
        self._manifests = {res.range_label: res.manifest_key for res in results}
        self._parents = {}
        for res in results:
            for name, key in res.staged_outputs.items():
                self._outputs[name].append(self._take_staged(key))
            if res.forwarded is not None and res.forwarded.num_rows:
                # ``forwarded_schema``: the output's columns, then key and timestamp (by
                # position: the output may have columns of those names itself).
                n = len(self.operator.outputs[MAIN_OUTPUT])
                self._outputs[MAIN_OUTPUT].append(res.forwarded.select(list(range(n))))
                self._emitted_at.append((res.forwarded.column(n), res.forwarded.column(n + 1)))
            if res.dead_letter_key is not None:
                self._dead.append(self._take_staged(res.dead_letter_key))

    def _take_staged(self, key: str) -> pa.Table:
        """A staged Parquet file's rows; the object is dropped (nothing publishes it)."""
        table = pq.read_table(arrow_input(self._store.get(key)))
        self._store.delete(key)
        return table

    def _manifests_now(self) -> dict[str, str]:
        """Every range's manifest of the last step, or the parents' when none ran since a
        rescale (a second rescale in a row keys them by the older ranges)."""
        if self._manifests or not self._parents:
            return dict(self._manifests)
        raise ValueError("restart(parallelism=...) twice without a step between them: run a step first")

    @contextlib.contextmanager
    def _reading(self, r: int) -> Iterator[DKV | None]:
        """Range ``r``'s DKV as the last step left it (None: no state yet). The instance
        the tasks keep open is lent and kept again; after a restart or rescale the range
        is opened from its checkpoint."""
        kr = self._ranges[r]
        state_prefix = paths.state_prefix(self._prefix, self.operator.name, kr.label)
        parents = self._parents.get(kr.label)
        if parents:
            db = DKV.open_from_parents(self._store, state_prefix, list(parents), kr.key_interval, self.dkv_options)
            try:
                yield db
            finally:
                db.close()
            return
        manifest = self._manifests.get(kr.label)
        if manifest is None:
            yield None
            return
        taken = self._open.take(self._store.root_uri, state_prefix, manifest, self.dkv_options)
        db, timers = taken if taken is not None else (DKV.open(self._store, state_prefix, manifest,
                                                               self.dkv_options), None)
        try:
            yield db
        finally:
            self._open.keep(self._store.root_uri, state_prefix, manifest, self.dkv_options, db, timers)


# The input of a range without events in a step: it still fires its due timers.
_EMPTY_INPUT = stage_input_schema(pa.schema([])).empty_table()
