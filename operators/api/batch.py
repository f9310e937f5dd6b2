"""The vectorised operator form: one call per epoch and key-group range, not per event.

A ``BatchOperator`` receives all of an epoch's events of its task's key-group range as one
Arrow table sorted by (key, timestamp), so it can aggregate with pyarrow or numpy and then
touch state once per distinct key (or key and window) instead of once per event. Due
timers arrive the same way, as a table. It is the same contract as ``Operator.on_event``
and ``on_timer_expired``, batched:

* state is the same: the same ``ValueSpec``/``ListSpec``/``MapSpec`` declarations and DKV
  layout (a job can switch forms across a restart and read its state), accessed in bulk
  through ``BatchContext.state(spec)``;
* events with ``timestamp <= ctx.watermark`` in ``on_batch`` are late, as in ``on_event``;
* ``on_timers`` receives every timer due at the new watermark, sorted by (timestamp, key
  group, key), then (in later calls) every processing-time timer due at the epoch's
  processing time; its ``domain`` column says which (``TimeDomain``); timers it sets that
  are already due arrive in a following ``on_timers`` call of the same epoch
  (``on_timer_expired`` would see them within the same pass; the set of outputs is the
  same, the order of rows within an epoch may differ).

Flink's counterpart is a ``ProcessFunction`` over a bundle (``AbstractStreamOperator``
with bundle processing); Spark's is ``applyInArrow`` over a group. Both forms are run on
the same jobs by the tests and must give identical output.
"""
from __future__ import annotations

import struct
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from dkvstream.operators.api.operator import MAIN_OUTPUT, KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import (
    ENCODE_ERRORS,
    ListSpec,
    MapSpec,
    StateClock,
    StateStore,
    ValueSpec,
    bad_state_value,
    list_payload,
    state_key_column,
    state_keys,
    subject_prefix,
)

K = TypeVar("K")
V = TypeVar("V")

_U32 = struct.Struct(">I")

class BulkTimers(Protocol):
    """The timers a ``BatchContext`` registers through: the task's timer service
    (``dkvstream.operators.runtime.timers.TimerService``). Rows of the three sequences are aligned;
    timestamps in ms."""

    def set_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None: ...

    def delete_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None: ...


class BatchContext:
    """What a ``BatchOperator`` acts through during one task.

    Attributes:
        watermark: ms. In ``on_batch``, the watermark reached before this epoch (events at
            or below it are late); in ``on_timers``, the watermark being advanced to.
        state_clock: the clocks of TTL'd state (``state.StateClock``), set by the task;
            None: made from ``watermark`` and the wall clock.
        processing_time: the epoch's processing time, ms since the Unix epoch
            (``Subject.processing_time``).

    Args:
        db, outputs, operator: the task's state store, the operator's outputs and name.
        timers: the event-time timers; processing_timers: the processing-time timers
            (None: ``set_processing_timers`` raises ``NotImplementedError``).
    """

    def __init__(self, db: StateStore, timers: BulkTimers, outputs: dict[str, pa.Schema],
                 operator: str = "operator", processing_timers: BulkTimers | None = None) -> None:
        self._db = db
        self._timers = timers
        self._processing_timers = processing_timers
        self._outputs = outputs
        self._operator = operator  # its name, for errors
        self.watermark = 0
        self.state_clock: StateClock | None = None
        self.processing_time = 0
        # output name -> list of (values table, keys, timestamps)
        self.emitted: dict[str, list[tuple[pa.Table, list, list]]] = {name: [] for name in outputs}

    def state(self, spec: ValueSpec | ListSpec | MapSpec) -> Any:
        """Bulk access to a declared state: ``BulkValueState``, ``BulkListState`` or
        ``BulkMapState`` for a ``ValueSpec``, ``ListSpec`` or ``MapSpec``. A state with a
        TTL reads and writes at ``state_clock``, as ``spec.state_for`` does in ``on_event``.

        Raises:
            TypeError: ``spec`` is not a state spec.
        """
        if isinstance(spec, ValueSpec):
            return BulkValueState(spec.store_for(self._db, self), spec)
        if isinstance(spec, ListSpec):
            return BulkListState(spec.store_for(self._db, self), spec)
        if isinstance(spec, MapSpec):
            return BulkMapState(spec.store_for(self._db, self), spec)
        raise TypeError(f"not a state spec: {spec!r}")

    def set_timers(self, keys: Sequence[bytes], key_groups: Sequence[int], timestamps: Sequence[int]) -> None:
        """Registers one event-time timer per row (idempotent, as ``Subject.set_timer``).

        Args:
            keys: subject keys.
            key_groups: their key groups (the ``key_group`` column of the events).
            timestamps: timer times (ms).
        """
        self._timers.set_many(key_groups, timestamps, keys)

    def delete_timers(self, keys: Sequence[bytes], key_groups: Sequence[int], timestamps: Sequence[int]) -> None:
        """Removes timers; no error for timers that are not set."""
        self._timers.delete_many(key_groups, timestamps, keys)

    def set_processing_timers(self, keys: Sequence[bytes], key_groups: Sequence[int],
                              timestamps: Sequence[int]) -> None:
        """Registers one processing-time timer per row (as ``Subject.set_processing_timer``;
        arguments as ``set_timers``, timestamps in ms of wall clock).

        Raises:
            NotImplementedError: the context has no processing-time timers.
        """
        self._processing().set_many(key_groups, timestamps, keys)

    def delete_processing_timers(self, keys: Sequence[bytes], key_groups: Sequence[int],
                                 timestamps: Sequence[int]) -> None:
        """Removes processing-time timers; no error for timers that are not set."""
        self._processing().delete_many(key_groups, timestamps, keys)

    def _processing(self) -> BulkTimers:
        if self._processing_timers is None:
            raise NotImplementedError("this BatchContext has no processing-time timers")
        return self._processing_timers

    def emit(self, values: pa.Table | dict[str, Any], *, output: str = MAIN_OUTPUT,
             keys: Sequence[bytes], timestamps: Sequence[int]) -> None:
        """Emits one record per row.

        Args:
            values: the records' columns (a table, or a ``{column: array or list}`` dict),
                converted to the operator's ``outputs[output]`` schema (an Arrow column with
                Arrow's safe cast, which raises rather than lose data; a list, numpy
                array or pandas Series with ``pa.array``, a float NaN staying NaN as in
                ``Subject.emit``, not null); a nullable field left out is null.
            output: output name.
            keys: key of each record (routes it to the next operator's key group).
            timestamps: event time of each record (ms).

        Raises:
            KeyError: the operator declares no such output.
            ValueError: the lengths of ``values``, ``keys`` and ``timestamps`` differ.
            TypeError: a column is not in the output schema, a non-nullable field is
                missing or null, or a column does not cast to its field's type; the
                message names the operator, output and field.
        """
        try:
            sink = self.emitted[output]
        except KeyError:
            raise KeyError(f"operator declares no output {output!r} (outputs: {sorted(self._outputs)})") from None
        schema = self._outputs[output]
        is_table = isinstance(values, pa.Table)
        names = values.column_names if is_table else list(values)
        check_emitted_names(self._operator, output, schema, names)
        keys, timestamps = list(keys), list(timestamps)
        n = values.num_rows if is_table else (len(values[names[0]]) if names else len(keys))
        columns = []
        for f in schema:
            if f.name not in names:
                columns.append(pa.nulls(n, f.type))
                continue
            column = values.column(f.name) if is_table else values[f.name]
            try:
                if isinstance(column, (pa.Array, pa.ChunkedArray)):
                    columns.append(column if column.type == f.type else column.cast(f.type))
                else:
                    # from_pandas=False: a pandas Series' NaN stays NaN, as in on_event's rows
                    # (pyarrow would make it null by default).
                    columns.append(pa.array(column, f.type, from_pandas=False))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                    ValueError, OverflowError) as e:
                raise TypeError(f"operator {self._operator} output {output!r}: field {f.name!r} "
                                f"({f.type}): {_one_line(e)}") from e
        try:
            table = pa.Table.from_arrays(columns, schema=schema)
        except pa.ArrowInvalid as e:  # columns of different lengths
            raise ValueError(f"emit to {output!r}: {_one_line(e)}") from e
        check_not_null(self._operator, output, schema, table)
        if not len(keys) == len(timestamps) == table.num_rows:
            raise ValueError(f"emit to {output!r}: {table.num_rows} rows, {len(keys)} keys, "
                             f"{len(timestamps)} timestamps")
        if table.num_rows:
            sink.append((table, keys, timestamps))


def check_emitted_names(operator: str, output: str, schema: pa.Schema,
                        names: Iterable[Any]) -> None:
    """Checks that every emitted field name is a field of the output's schema.

    Args:
        operator: the operator's name; output: the output's name (both for the message).
        schema: the output's schema (``Operator.outputs[output]``).
        names: the field names of the emitted rows (a column list, or the union of the
            rows' dict keys: checked once per emit, not per value).

    Raises:
        TypeError: a name is not in ``schema`` (a misspelled field would otherwise be
            dropped and its field left null).
    """
    unknown = set(names).difference(schema.names)
    if unknown:
        first, *more = sorted(unknown, key=str)
        also = f" (also {', '.join(map(repr, more))})" if more else ""
        raise TypeError(f"operator {operator} output {output!r}: emitted field {first!r} is not in "
                        f"the output schema{also}; fields: {', '.join(schema.names)}. Rename it, "
                        f"or declare it in outputs[{output!r}]")


def check_not_null(operator: str, output: str, schema: pa.Schema, table: pa.Table) -> None:
    """Checks that no non-nullable field of ``schema`` is null in ``table`` (a field left
    out of an emitted row is null). Column-level: one ``null_count`` per such field.

    Raises:
        TypeError: naming the operator, output, field and how many rows are null.
    """
    for f in schema:
        if not f.nullable:
            nulls = table.column(f.name).null_count
            if nulls:
                raise TypeError(f"operator {operator} output {output!r}: field {f.name!r} is not "
                                f"nullable but is missing or null in {nulls} of {table.num_rows} "
                                f"emitted rows; emit a value in every row, or declare the field "
                                f"nullable")


def _one_line(e: BaseException) -> str:
    """An Arrow error message on one line (the driver reports a task error's last line)."""
    return " ".join(str(e).split())


def _encode_many(spec: Any, role: str, codec: Any, values: Sequence) -> list[bytes]:
    """``codec.encode_many(values)``; a value it cannot encode raises ``StateTypeError``
    naming the operator, state, codec and the value (``state.bad_state_value``)."""
    try:
        return codec.encode_many(values)
    except ENCODE_ERRORS as e:
        raise bad_state_value(spec, role, codec, values, e) from e


def _prefixes(keys: Sequence[bytes] | pa.Array | pa.ChunkedArray, key_groups: Sequence[int],
              spec: Any) -> list[bytes]:
    """The DKV keys of state ``spec`` of many subjects: from the Arrow buffers in one C
    loop when ``keys`` is an Arrow column (``state_key_column``), else per key."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return state_key_column(keys, key_groups, spec._id_bytes, schema=spec.schema)
    return state_keys(keys, key_groups, spec._id_bytes, spec.schema)


def _record_codec(codec: Any) -> Any:
    """``codec`` if it has a columns form (a ``RecordCodec``), else TypeError."""
    if not hasattr(codec, "decode_struct"):
        raise TypeError(f"value codec {codec!r} has no columns form (use a RecordCodec)")
    return codec


class BulkValueState(Generic[V]):
    """``ValueState`` of many subject keys at once (rows are aligned)."""

    def __init__(self, db: StateStore, spec: ValueSpec[V]) -> None:
        self._db, self._id, self._codec, self._spec = db, spec._id_bytes, spec.codec, spec

    def get(self, keys: Sequence[bytes], key_groups: Sequence[int]) -> list[V | None]:
        """Returns each key's value, None where unset."""
        return self._codec.decode_many(self._db.get_many(_prefixes(keys, key_groups, self._spec)))

    def set(self, keys: Sequence[bytes], key_groups: Sequence[int], values: Sequence[V]) -> None:
        """Stores one value per key (one DKV write batch; a key given twice keeps its
        later value).

        Raises:
            StateTypeError: the codec cannot encode a value (names operator, state, codec).
        """
        self._db.write_batch(_prefixes(keys, key_groups, self._spec),
                             _encode_many(self._spec, "value", self._codec, values))

    def drop(self, keys: Sequence[bytes], key_groups: Sequence[int]) -> None:
        """Removes the values (tombstones, one DKV write batch)."""
        dks = _prefixes(keys, key_groups, self._spec)
        self._db.write_batch(dks, [None] * len(dks))

    def get_columns(self, keys: pa.Array | Sequence[bytes], key_groups: Any) -> pa.StructArray:
        """``get`` for a ``RecordCodec`` value, as one Arrow column of the codec's
        ``arrow_type``: a null row where unset (``RecordCodec.decode_struct``).

        Args:
            keys: subject keys, best an Arrow binary column (the ``key`` column of the
                events: its DKV keys are then built without a Python step per key).
            key_groups: their key groups (the ``key_group`` column).

        Raises:
            TypeError: the value codec has no columns form (not a ``RecordCodec``).
        """
        codec = _record_codec(self._codec)
        return codec.decode_struct(self._db.get_many(_prefixes(keys, key_groups, self._spec)))

    def set_columns(self, keys: pa.Array | Sequence[bytes], key_groups: Any,
                    values: pa.StructArray | pa.Table | dict[str, Any]) -> None:
        """``set`` for a ``RecordCodec`` value with the records given as columns
        (``RecordCodec.encode_struct``); arguments as ``get_columns``.

        Raises:
            TypeError: the value codec has no columns form, or a record row is null.
            ValueError: a field's column is missing, or the lengths differ.
        """
        codec = _record_codec(self._codec)
        dks = _prefixes(keys, key_groups, self._spec)
        encoded = codec.encode_struct(values)
        if len(encoded) != len(dks):
            raise ValueError(f"{len(dks)} keys but {len(encoded)} records")
        self._db.write_batch(dks, encoded)


class BulkListState(Generic[V]):
    """``ListState`` of many subject keys at once."""

    def __init__(self, db: StateStore, spec: ListSpec[V]) -> None:
        self._db, self._id, self._codec, self._spec = db, spec._id_bytes, spec.codec, spec

    def get(self, keys: Sequence[bytes], key_groups: Sequence[int]) -> list[list[V]]:
        """Returns each key's list (empty if none)."""
        get, decode = self._db.get, self._codec.decode
        out = []
        for dk in _prefixes(keys, key_groups, self._spec):
            raw = get(dk)
            out.append([] if raw is None else [decode(e) for e in list_payload(raw)])
        return out

    def append(self, keys: Sequence[bytes], key_groups: Sequence[int], values: Sequence[V]) -> None:
        """Appends one element per row (rows of one key append in row order).

        Raises:
            StateTypeError: the codec cannot encode a value (names operator, state, codec);
                no element is appended then.
        """
        db = self._db
        for dk, enc in zip(_prefixes(keys, key_groups, self._spec),
                           _encode_many(self._spec, "value", self._codec, values)):
            db.put(dk, (db.get(dk) or b"") + _U32.pack(len(enc)) + enc)

    def clear(self, keys: Sequence[bytes], key_groups: Sequence[int]) -> None:
        """Removes the lists (one DKV write batch)."""
        dks = _prefixes(keys, key_groups, self._spec)
        self._db.write_batch(dks, [None] * len(dks))


class BulkMapState(Generic[K, V]):
    """``MapState`` of many subject keys at once: row i addresses ``map_keys[i]`` of
    ``keys[i]``."""

    def __init__(self, db: StateStore, spec: MapSpec[K, V]) -> None:
        self._db, self._id, self._spec = db, spec._id_bytes, spec
        self._kc, self._vc = spec.key_codec, spec.value_codec

    def dkv_keys(self, keys: Sequence[bytes] | pa.Array, key_groups: Any, map_keys: Any) -> list[bytes]:
        """The DKV key of each row, for ``get_at``/``set_at``/``delete_at``: an operator
        that reads, then writes or deletes the same rows builds the keys once.

        Args:
            keys: subject keys: bytes, or an Arrow binary column (the events' ``key``
                column; the keys are then built from its buffers in one C loop).
            key_groups: their key groups (list, numpy or Arrow integers).
            map_keys: the map keys (list, numpy or Arrow; with Arrow ``keys``, an
                ``IntCodec`` encodes a numpy or Arrow column in one numpy pass).

        Raises:
            StateTypeError: the key codec cannot encode a map key.
        """
        if isinstance(keys, (pa.Array, pa.ChunkedArray)):
            try:
                tail = self._kc.encode_column(map_keys)
            except ENCODE_ERRORS as e:
                values = map_keys.to_pylist() if isinstance(map_keys, (pa.Array, pa.ChunkedArray)) else \
                    list(map_keys)
                raise bad_state_value(self._spec, "map key", self._kc, values, e) from e
            return state_key_column(keys, key_groups, self._id, tail, self._spec.schema)
        return list(map(bytes.__add__, _prefixes(keys, key_groups, self._spec),
                        _encode_many(self._spec, "map key", self._kc, map_keys)))

    def get_at(self, dkv_keys: Sequence[bytes]) -> list[V | None]:
        """``get`` by keys from ``dkv_keys``."""
        return self._vc.decode_many(self._db.get_many(dkv_keys))

    def set_at(self, dkv_keys: Sequence[bytes], values: Sequence[V]) -> None:
        """``set`` by keys from ``dkv_keys``.

        Raises:
            StateTypeError: the codec cannot encode a value (names operator, state, codec).
        """
        self._db.write_batch(dkv_keys, _encode_many(self._spec, "value", self._vc, values))

    def get_rows_at(self, dkv_keys: Sequence[bytes]) -> list[tuple | None]:
        """``get_at`` for a ``RecordCodec`` value: each record as a tuple of its field
        values in the codec's field order (``RecordCodec.decode_rows``), None where
        absent; no dict per record.

        Raises:
            TypeError: the value codec has no rows form (not a ``RecordCodec``).
        """
        return self._rows_codec().decode_rows(self._db.get_many(dkv_keys))

    def set_rows_at(self, dkv_keys: Sequence[bytes], rows: Sequence[Sequence[Any]]) -> None:
        """``set_at`` with records given as rows in the codec's field order (the same
        bytes as ``set_at`` with the equivalent dicts).

        Raises:
            TypeError: the value codec has no rows form (not a ``RecordCodec``).
        """
        self._db.write_batch(dkv_keys, self._rows_codec().encode_rows(rows))

    def get_columns_at(self, dkv_keys: Sequence[bytes]) -> pa.StructArray:
        """``get_at`` for a ``RecordCodec`` value, as one Arrow column of the codec's
        ``arrow_type``: a null row where absent, a null field where the record holds
        null (``RecordCodec.decode_struct``).

        Raises:
            TypeError: the value codec has no columns form (not a ``RecordCodec``).
            ValueError: a stored value is not a record of the codec.
        """
        return _record_codec(self._vc).decode_struct(self._db.get_many(dkv_keys))

    def set_columns_at(self, dkv_keys: Sequence[bytes], values: pa.StructArray | pa.Table | dict[str, Any]) -> None:
        """``set_at`` with the records given as columns: a struct column or table with
        the codec's fields, or ``{field: array or list}`` (``RecordCodec.encode_struct``;
        the same bytes as ``set_at`` with the equivalent dicts).

        Raises:
            TypeError: the value codec has no columns form, or a record row is null.
            ValueError: a field's column is missing, or the lengths differ.
        """
        encoded = _record_codec(self._vc).encode_struct(values)
        if len(encoded) != len(dkv_keys):
            raise ValueError(f"{len(dkv_keys)} keys but {len(encoded)} records")
        self._db.write_batch(dkv_keys, encoded)

    def _rows_codec(self) -> Any:
        if not hasattr(self._vc, "decode_rows"):
            raise TypeError(f"value codec {self._vc!r} has no rows form (use a RecordCodec)")
        return self._vc

    def delete_at(self, dkv_keys: Sequence[bytes]) -> None:
        """``delete`` by keys from ``dkv_keys``."""
        self._db.write_batch(dkv_keys, [None] * len(dkv_keys))

    def get(self, keys: Sequence[bytes], key_groups: Sequence[int], map_keys: Sequence[K]) -> list[V | None]:
        """Returns the value at each row's map key, None where absent."""
        return self.get_at(self.dkv_keys(keys, key_groups, map_keys))

    def set(self, keys: Sequence[bytes], key_groups: Sequence[int], map_keys: Sequence[K],
            values: Sequence[V]) -> None:
        """Stores one value per row (one DKV write batch; a row repeating an earlier
        row's key and map key overrides it)."""
        self.set_at(self.dkv_keys(keys, key_groups, map_keys), values)

    def delete(self, keys: Sequence[bytes], key_groups: Sequence[int], map_keys: Sequence[K]) -> None:
        """Removes one entry per row (one DKV write batch); no error if absent."""
        self.delete_at(self.dkv_keys(keys, key_groups, map_keys))

    def items(self, key: bytes, key_group: int) -> Iterator[tuple[K, V]]:
        """All entries of one subject key, in ascending encoded-map-key order."""
        prefix = subject_prefix(key_group, key, self._spec.schema) + self._id
        n = len(prefix)
        kd, vd = self._kc.decode, self._vc.decode
        for k, v in self._db.scan_prefix(prefix):
            yield kd(k[n:]), vd(v)


class BatchOperator(Operator):
    """A keyed, stateful operator in vectorised form (see the module docstring).

    Subclasses set ``name`` and ``outputs`` and declare state specs as ``Operator`` does,
    and implement ``on_batch`` (and ``on_timers`` if they set timers).
    """

    @abstractmethod
    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        """Handle all of an epoch's events of one key-group range.

        Args:
            ctx: state, timers and outputs of the task.
            events: columns ``key`` (binary), ``timestamp`` (int64, ms), ``key_group``
                (int32) and the source's value columns, sorted by (key, timestamp); ties in
                timestamp keep source order (partition, offset).
        """

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        """Handle timers that the watermark (event time) or the epoch's processing time
        passed; one call holds timers of one domain, event time first.

        Args:
            ctx: as in ``on_batch``; ``ctx.watermark`` is the new watermark.
            timers: columns ``key``, ``key_group``, ``timestamp``, ``domain`` (string:
                ``"event_time"`` or ``"processing_time"``, ``TimeDomain``), sorted by
                (timestamp, key group, key).
        """

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        raise TypeError(f"{type(self).__name__} is a BatchOperator: the runtime calls on_batch")
