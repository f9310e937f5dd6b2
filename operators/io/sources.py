"""Sources: partitioned, replayable event streams addressed by offsets.

A source partition is a sequence of events numbered by offset 0, 1, 2, ... The runtime
plans each epoch as one offset range ``[committed, end)`` per partition and commits the
new offsets with the epoch's checkpoint, so replaying from a checkpoint re-reads exactly
the same events (exactly-once needs a replayable source, as with Kafka offsets).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import pyarrow as pa

from dkvstream.operators.api.columns import (
    ERROR_COLUMN,
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    OFFSET_COLUMN,
    RAW_VALUE_COLUMN,
    TIMESTAMP_COLUMN,
)


class Source(ABC):
    """A partitioned source of keyed events.

    ``read`` returns an Arrow table with a ``key`` column (binary), a ``timestamp``
    column (int64, ms since the Unix epoch, UTC) and the value columns of
    ``value_schema``; each row becomes ``KeyedEvent(key, timestamp, {value columns})``.
    The driver checks each slice against these types (``check_slice``): a column of
    another type fails the epoch unless it widens losslessly. A row the source cannot
    decode should not raise: set its ``_error`` column (and ``_raw_value``), and the
    runtime sends it to the dead-letter table, as it does rows with a null or empty key or
    a timestamp before the Unix epoch or too far in the future. The columns' names and
    types: ``dkvstream.operators.api.columns``.

    Where each part runs: the driver calls ``attach``, ``partitions``, ``start_offset``,
    ``end_offsets``, ``bounded``, ``value_schema``, ``snapshot_state``, ``restore_state``
    and ``close`` (planning, offsets and their checkpointed state);
    ``read`` runs in Spark's read tasks on the executors, one per planned slice
    (``dkvstream.operators.runtime.splits``), on a copy of the source unpickled there. So a source
    must pickle small (configuration, not data: load data lazily in ``read``, caching it
    per process if costly) and be importable on the executors, and ``read`` must not
    depend on state the driver's copy gathered.
    """

    name: str = "source"

    def attach(self, store, job_prefix: str) -> None:
        """Called once by the runtime (``JobRunner``, sensors) before any other method,
        with the job's object store and prefix: a source that keeps its own metadata
        (a file source's list of discovered files) keeps it under
        ``dkvstream.operators.paths.source_prefix(job_prefix, self.name)``. Default: nothing."""

    def use_tasks(self, map_in_tasks: Callable[[Callable, list], list]) -> None:
        """Called by ``JobRunner`` after ``attach`` with its ``map_in_tasks(fn, items)``
        (``[fn(item) for item in items]`` in Spark tasks, as ``Sink.publish_in_tasks``'s):
        a source whose ``end_offsets`` would otherwise read data in the driver (a file
        source counting a new file's rows) does that in tasks. Not kept when the source
        is pickled. Default: nothing."""

    @abstractmethod
    def partitions(self) -> list[str]:
        """Partition names, in a fixed order. A live source may add partitions later
        (never remove or reorder them); the runtime reads a new one from
        ``start_offset``."""

    def start_offset(self, partition: str) -> int:
        """The first offset a job reads of ``partition`` when no checkpoint has it
        (Kafka: the log start offset). Default 0."""
        return 0

    @abstractmethod
    def end_offsets(self) -> dict[str, int]:
        """The offset one past the last available event of each partition."""

    @property
    def bounded(self) -> bool:
        """True if the end offsets are final (a file); the job then ends its input
        with a watermark of +infinity once every partition is read."""
        return True

    @property
    @abstractmethod
    def value_schema(self) -> pa.Schema:
        """Schema of the value columns of ``read``."""

    def snapshot_state(self, offsets: dict[str, int]) -> dict | None:
        """What a checkpoint committing ``offsets`` must record for a restart to check
        that the source still maps those offsets to the same events (Flink's
        ``snapshotState``): a source whose offsets are defined by metadata of its own
        (a file source's file log) records a digest of it. Called by the driver at each
        commit, after ``end_offsets``; must be small (it is in every checkpoint) and
        JSON-serialisable. Default None: nothing to record.

        Args:
            offsets: the next offset to read per partition, as committed.
        """
        return None

    def restore_state(self, offsets: dict[str, int], state: dict | None) -> None:
        """Called by the driver on a restart, before ``end_offsets``, with the offsets and
        the ``snapshot_state`` of the checkpoint it continues from (None for a checkpoint
        written without one, which is not checked). Default: nothing.

        Raises:
            RecoveryRefusedError: the source's metadata no longer maps ``offsets`` to the
                events the checkpoint read (a lost or rewritten object); names the objects
                and what to do.
        """

    def close(self) -> None:
        """Releases what the source holds open (a Kafka consumer, connections). Called by
        the runtime when a run ends (``JobRunner.epochs`` returns or raises) and by
        ``JobRunner.close()``; a source must work again after it (reopening lazily), as
        the next run of the same runner uses it. Idempotent. Default: nothing."""

    @abstractmethod
    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """Events at offsets ``[start, end)`` of ``partition``, in offset order: one row
        per offset, or, for a source whose offsets have gaps, fewer rows with their
        offsets in an ``_offset`` column (``OFFSET_COLUMN``). Optionally an
        ``_ingest_time`` column (``INGEST_TIME_COLUMN``).

        Raises:
            KeyError: unknown partition.
            IndexError: range outside ``[0, end_offsets()[partition]]``.
        """


def check_slice(source: Source, partition: str, start: int, end: int, table: pa.Table) -> pa.Table:
    """Checks what ``source.read(partition, start, end)`` returned against the source's
    schema, and returns it in that schema.

    The schema: ``key`` binary, ``timestamp`` int64 (ms since the Unix epoch, UTC), the
    fields of ``source.value_schema`` in their order, then ``_error`` (string),
    ``_raw_value`` (binary), ``_offset`` (int64) and ``_ingest_time`` (int64) if present. Every slice of every
    partition comes out in this one schema, so the driver can concatenate them. The check compares types only (no
    per-row work); null, empty or out-of-range keys and timestamps are row-level and go
    to the dead-letter table later (``dkvstream.operators.io.dead_letter``).

    Casts: a column is cast only if the cast is lossless for every possible value, and
    then silently (zero-copy or a widening):

    * integers to a wider integer of the same signedness, unsigned to a wider signed one,
      floats to a wider float, integers to a float whose mantissa holds them (int32 to
      float64, int16 to float32);
    * ``string``, ``large_string``, ``large_binary`` and the view types to ``binary``
      (a ``str`` key becomes its UTF-8 bytes), ``large_string`` and ``string_view`` to
      ``string``;
    * a dictionary-encoded column as its value type; an all-null (``null`` type) column
      to any type.

    Anything else is refused, as Flink and Spark refuse an implicit lossy cast: int64 to
    int32 or float64 to int64 (truncation), uint64 to int64 (overflow), binary to string
    (not all bytes are UTF-8), and any Arrow timestamp or date as ``timestamp`` (unit and
    time zone must be decided by the source: a naive timestamp may be local time).

    Args:
        source: the source that returned ``table`` (its ``name`` and ``value_schema``).
        partition, start, end: the slice read (offsets ``[start, end)``).
        table: what ``read`` returned.

    Returns:
        ``table`` with its columns in the schema above (no data copied unless cast).

    Raises:
        ValueError: ``table`` has not one row per offset (without ``_offset``), or its
            ``_offset`` column is null, not strictly increasing or outside ``[start, end)``.
        TypeError: a column is missing, unknown, repeated, or of a type that does not
            cast losslessly; the message names source, partition, offsets and column and
            says what to do.
    """
    where = f"source {source.name} partition {partition} offsets [{start}, {end})"
    names = table.column_names
    if OFFSET_COLUMN in names:
        _check_offsets(where, start, end, table.column(OFFSET_COLUMN))
    elif table.num_rows != end - start:
        raise ValueError(f"{where}: {table.num_rows} rows for {end - start} offsets; read must "
                         f"return one row per offset, in offset order (or an {OFFSET_COLUMN} "
                         f"column if offsets have gaps)")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise TypeError(f"{where}: column {twice!r} appears twice; read must return each column "
                        f"once")
    value_schema = source.value_schema
    value_names = ", ".join(value_schema.names) or "none"
    fields = [pa.field(KEY_COLUMN, pa.binary()), pa.field(TIMESTAMP_COLUMN, pa.int64()),
              *value_schema]
    fields += [pa.field(ERROR_COLUMN, pa.string())] * (ERROR_COLUMN in names)
    fields += [pa.field(RAW_VALUE_COLUMN, pa.binary())] * (RAW_VALUE_COLUMN in names)
    fields += [pa.field(OFFSET_COLUMN, pa.int64())] * (OFFSET_COLUMN in names)
    fields += [pa.field(INGEST_TIME_COLUMN, pa.int64())] * (INGEST_TIME_COLUMN in names)
    known = {f.name for f in fields}
    for name in names:
        if name not in known:
            raise TypeError(f"{where}: column {name!r} is not in value_schema (value columns: "
                            f"{value_names}); drop it in read, or add it to value_schema")
    columns = []
    for f in fields:
        if f.name not in names:
            what = "of value_schema " if f.name in value_schema.names else ""
            raise TypeError(f"{where}: column {f.name!r} {what}is missing; read must return "
                            f"{KEY_COLUMN} (binary), {TIMESTAMP_COLUMN} (int64 ms) and the "
                            f"value_schema columns ({value_names})")
        column = table.column(f.name)
        if column.type != f.type:
            if not lossless_cast(column.type, f.type):
                raise TypeError(f"{where}: column {f.name!r} is "
                                f"{column.type}{_what_to_do(f, column.type)}")
            column = column.cast(f.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _check_offsets(where: str, start: int, end: int, offsets: pa.ChunkedArray) -> None:
    """The ``_offset`` column of a slice: no nulls, strictly increasing, in ``[start, end)``."""
    if offsets.null_count:
        raise ValueError(f"{where}: column {OFFSET_COLUMN!r} has nulls; every row needs its offset")
    if not len(offsets):
        return
    values = offsets.to_numpy().astype("int64", copy=False)
    if values[0] < start or values[-1] >= end:
        raise ValueError(f"{where}: offsets {values[0]}..{values[-1]} in column {OFFSET_COLUMN!r} "
                         f"are outside the slice read")
    if len(values) > 1 and not (values[1:] > values[:-1]).all():
        i = int((values[1:] <= values[:-1]).argmax())
        raise ValueError(f"{where}: column {OFFSET_COLUMN!r} is not strictly increasing at row "
                         f"{i + 1} ({values[i]} then {values[i + 1]})")


def _what_to_do(field: pa.Field, have: pa.DataType) -> str:
    """The rest of a refused column's message: what the runtime wants, what to do."""
    if field.name == KEY_COLUMN:
        return (" but the runtime keys events by binary: encode the key column to bytes in read "
                "(a str column is taken as UTF-8)")
    if field.name == TIMESTAMP_COLUMN:
        hint = (", e.g. column.cast(pa.timestamp('ms')).cast(pa.int64()) (it raises rather than "
                "truncate)" if pa.types.is_temporal(have) else "")
        return (f" but the runtime wants int64 milliseconds since the Unix epoch (UTC): cast the "
                f"timestamp column to int64 milliseconds in read{hint}")
    if field.name in (ERROR_COLUMN, RAW_VALUE_COLUMN, OFFSET_COLUMN, INGEST_TIME_COLUMN):
        return f" but must be {field.type}"
    return (f", value_schema says {field.type}; cast it in the source's read, or declare {have} "
            f"in value_schema (only lossless widenings, such as int32 to int64, are applied here)")


_BINARY_LIKE = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
_STRING_LIKE = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_MANTISSA_BITS = {16: 11, 32: 24, 64: 53}


def lossless_cast(have: pa.DataType, want: pa.DataType) -> bool:
    """True if every value of type ``have`` casts to ``want`` unchanged: the widenings a
    source's slice (``check_slice``) and a bootstrap table may take (a null column, a
    dictionary's values, a wider integer or float, an integer to a float that holds it
    exactly, text to binary, a string or binary type to its large form)."""
    if have == want or pa.types.is_null(have):
        return True
    if pa.types.is_dictionary(have):
        return lossless_cast(have.value_type, want)
    if pa.types.is_integer(have) and pa.types.is_integer(want):
        if pa.types.is_signed_integer(have) == pa.types.is_signed_integer(want):
            return have.bit_width <= want.bit_width
        return pa.types.is_unsigned_integer(have) and have.bit_width < want.bit_width
    if pa.types.is_floating(have) and pa.types.is_floating(want):
        return have.bit_width <= want.bit_width
    if pa.types.is_integer(have) and pa.types.is_floating(want):
        return have.bit_width - pa.types.is_signed_integer(have) <= _MANTISSA_BITS[want.bit_width]
    if any(t(want) for t in _BINARY_LIKE):
        return any(t(have) for t in _BINARY_LIKE + _STRING_LIKE)
    if any(t(want) for t in _STRING_LIKE):
        return any(t(have) for t in _STRING_LIKE)
    return False
