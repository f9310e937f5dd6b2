"""Topics as job sources and sinks (``dkvstream.storage.log``).

``TopicSource``: source partition ``<topic>-<n>`` is partition n of the topic, and the
runtime's source offsets are the topic's offsets, so they are committed with the job's
checkpoint and a restart replays from them (Kafka offsets in a Flink checkpoint). Every
slice carries its records' offsets (``_offset``): a compacted topic has gaps where the
cleaner removed records, and a slice holds the records that survive in its range, as a
Kafka consumer of a compacted topic sees them. A replay reads what survives at that
time: the latest record of each key is never removed, and nor are the records after the
cleaner's checkpoint. Each row's ``_ingest_time`` is its append time (the commit that
made it readable), null for records rewritten by the cleaner (it mixes many appends).

``TopicSink``: exactly-once. A task writes its records as one segment file under its
staging prefix (unique per epoch, range and attempt); nothing is visible. Publishing
the committed epoch copies every staged file of the epoch into the log and appends
them all in **one** metadata commit, made idempotent by the producer id
``<job>/<sink>`` and sequence = epoch: a publish redone after a crash (the runtime
re-publishes the newest checkpoint on restart) finds its sequence applied and adds
nothing. Records of an epoch become visible together, after the epoch's checkpoint;
records of failed attempts or uncommitted epochs never do.

Values: by default a record's value is the JSON object of the row's columns other
than the key column (sorted keys, compact); ``TopicSource(value_schema=...)`` decodes
such values back into columns (a value that does not decode, or has a field its column
cannot hold as written, such as ``true`` or ``NaN`` in a float column or ``6.5`` in an int
column, goes to the job's dead-letter table, see ``decode_json_values``), otherwise the
source yields one binary ``value`` column.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from dkvstream.operators.api.columns import (
    ERROR_COLUMN,
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    OFFSET_COLUMN,
    RAW_VALUE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import Sink, staged_keys
from dkvstream.operators.io.sources import Source
from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.log import Log, TopicConfig
from dkvstream.storage.log.cleaner import erase_keys
from dkvstream.storage.log.consumer import fetch, with_fresh_metadata
from dkvstream.storage.log.errors import InvalidRecordError
from dkvstream.storage.log.metadata import NO_CHANGE, LogMetadata
from dkvstream.storage.log.producer import append_file, now_ms, partition_for
from dkvstream.storage.log.records import Record
from dkvstream.storage.log.segment import SegmentWriter, chunk_batches, read_directory
from dkvstream.storage.objectstore import ObjectStore, map_requests, open_object_store

VALUE_COLUMN = "value"


class TopicSource(Source):
    """Reads a topic of a ``Log``, plain or compacted (module docstring).

    Args:
        store_uri: object-store root of the log (``open_object_store``).
        topic: topic name; must exist.
        log_prefix: the log's prefix in the store.
        value_schema: decode JSON-object values into these columns (default: one
            binary ``value`` column). A tombstone (null value) decodes to nulls.
        bounded: True: the job ends (watermark +infinity) once it has read up to the
            end offsets; False (default): a live topic: a continuous run
            (``JobRunner.epochs(continuous=True)``) keeps reading as records are
            appended; any other run reads what was appended since the last one and
            returns when caught up.

    ``read`` returns ``key``, ``timestamp``, the value columns, ``_offset`` and
    ``_ingest_time`` (ms; null for records the cleaner rewrote).

    Raises:
        UnknownTopicError: no such topic.
    """

    def __init__(self, store_uri: str, topic: str, log_prefix: str = "log",
                 value_schema: pa.Schema | None = None, bounded: bool = False) -> None:
        self.store_uri, self.topic, self.log_prefix = store_uri, topic, log_prefix
        self._value_schema = value_schema
        self._bounded = bounded
        self.name = f"topic:{topic}"
        self._cached_log: Log | None = None
        self._partitions = self._log().metadata().topic(topic).config.partitions

    def __getstate__(self) -> dict:
        # The log keeps the newest metadata it read; a copy elsewhere reads its own.
        return {**self.__dict__, "_cached_log": None}

    def _log(self) -> Log:
        """One ``Log`` per source: it keeps the metadata it read, so each call GETs only
        the versions committed since."""
        if self._cached_log is None:
            self._cached_log = Log(open_object_store(self.store_uri), self.log_prefix)
        return self._cached_log

    def partitions(self) -> list[str]:
        return [f"{self.topic}-{p}" for p in range(self._partitions)]

    def _partition_index(self, name: str) -> int:
        prefix, _, n = name.rpartition("-")
        if prefix != self.topic or not n.isdigit() or int(n) >= self._partitions:
            raise KeyError(f"{self.name}: unknown partition {name!r}")
        return int(n)

    def start_offset(self, partition: str) -> int:
        """The partition's log start offset (Kafka's ``auto.offset.reset=earliest``)."""
        return self._log().start_offsets(self.topic)[self._partition_index(partition)]

    def end_offsets(self) -> dict[str, int]:
        return dict(zip(self.partitions(), self._log().end_offsets(self.topic)))

    @property
    def bounded(self) -> bool:
        return self._bounded

    @property
    def value_schema(self) -> pa.Schema:
        return self._value_schema or pa.schema([pa.field(VALUE_COLUMN, pa.binary())])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """The records with offsets in ``[start, end)`` that the log holds (all of them
        in a plain topic; the survivors of compaction in a compacted one), in offset
        order, with ``_offset`` and ``_ingest_time`` columns.

        Raises:
            KeyError: unknown partition.
            IndexError: ``[start, end)`` outside ``[log start offset, next offset]``.
            CorruptionError: a batch or index fails its checksum (names file and byte).
        """
        p = self._partition_index(partition)
        records, appended = with_fresh_metadata(self._log(), lambda md: self._read(md, p, start, end))
        keys = pa.array([r.key for r in records], pa.binary())
        ts = pa.array(np.fromiter((r.timestamp for r in records), np.int64, len(records)))
        extra = {OFFSET_COLUMN: pa.array(np.fromiter((r.offset for r in records), np.int64, len(records))),
                 INGEST_TIME_COLUMN: pa.array(appended, pa.int64())}
        if self._value_schema is None:
            values = {VALUE_COLUMN: pa.array([r.value for r in records], pa.binary())}
            return pa.table({KEY_COLUMN: keys, TIMESTAMP_COLUMN: ts, **values, **extra})
        values, errors = decode_json_values([r.value for r in records], self._value_schema)
        return pa.table({KEY_COLUMN: keys, TIMESTAMP_COLUMN: ts, **values, ERROR_COLUMN: errors,
                         RAW_VALUE_COLUMN: pa.array([r.value for r in records], pa.binary()), **extra})

    def _read(self, md: LogMetadata, p: int, start: int, end: int) -> tuple[list[Record], list[int | None]]:
        """``(records in [start, end), each one's append time)`` from one metadata version."""
        part = md.partition(self.topic, p)
        if not part.log_start <= start <= end <= part.next_offset:
            raise IndexError(f"{self.name}/{self.topic}-{p}: offsets [{start}, {end}) outside "
                             f"[{part.log_start}, {part.next_offset}] (log start, next offset)")
        if end == start:
            return [], []
        # At most end - start records lie in the range; a fetch past a gap may return
        # records beyond it, which are dropped.
        records = [r for r in fetch(self._log(), self.topic, p, start, end - start, md=md).records if r.offset < end]
        appended: list[int | None] = []
        entries = part.entries_from(start)
        i = 0
        for r in records:  # records and entries both in offset order
            while entries[i].end <= r.offset:
                i += 1
            appended.append(entries[i].appended_at)
        return records, appended


def decode_json_values(raw: list[bytes | None], schema: pa.Schema) -> tuple[dict[str, pa.Array], pa.Array]:
    """Decodes JSON-object record values into the columns of ``schema``: the result of
    ``decode_json_values_per_record``, computed by Arrow's JSON reader over the
    newline-joined values when that is sure to give the same (``_decode_json_arrow``),
    else record by record. A batch with a bad value, or one the fast path cannot vouch
    for, takes the per-record path whole, so dead letters and their messages are the
    same either way.

    Returns:
        ``({column: array}, errors)`` as ``decode_json_values_per_record``.
    """
    fast = _decode_json_arrow(raw, schema) if raw else None
    return fast if fast is not None else decode_json_values_per_record(raw, schema)


# Column types the Arrow fast path decodes exactly as ``pa.array`` converts the values of
# json.loads; any other type takes the per-record path.
def _fast_type(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
            or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t))


# Control characters other than the newline that separates values: json.loads refuses
# them inside strings, Arrow's reader may not (a tab), and \r would split a line.
# Counted as the bytes 0-31 deleted minus the newlines (faster than a regex search).
_CONTROL = bytes(range(32))
# Integer literals a float column may not hold exactly (beyond 2**53 in float64, 2**24
# in float32): Arrow's reader rounds them, ``pa.array`` refuses them. Conservative: any
# run of that many digits anywhere (a string, a fraction) sends the batch the slow way.
_LONG_DIGITS = {pa.float64(): re.compile(rb"[0-9]{16}"), pa.float32(): re.compile(rb"[0-9]{8}")}


def _decode_json_arrow(raw: list[bytes | None], schema: pa.Schema) -> tuple[dict[str, pa.Array], pa.Array] | None:
    """``decode_json_values_per_record(raw, schema)`` by ``pyarrow.json.read_json`` over
    the values joined by newlines (the explicit schema, other fields ignored), or None
    when that might differ from it: a column type outside ``_fast_type``; a null value;
    a value with a newline or another control character (``_CONTROL``), invalid UTF-8,
    or not starting with ``{`` (a leading space too); a long digit run with a float column (``_LONG_DIGITS``); Arrow
    refusing the batch (a value of the wrong JSON type, a fraction in an integer column,
    a duplicate field, a number out of range, bad JSON, ...); a row count other than
    ``len(raw)`` (two objects in one value); a non-finite float. Every such batch holds a
    value the per-record path must judge, or one Arrow would take differently."""
    if not all(_fast_type(f.type) for f in schema):
        return None
    try:
        joined = b"\n".join(raw)
    except TypeError:  # a null value (a tombstone)
        return None
    # Every value starts with "{" and holds no newline: one line each, each an object's
    # start (Arrow's reader takes a top-level null as a row of nulls, or crashes on one).
    if (not joined.startswith(b"{") or joined.count(b"\n{") != len(raw) - 1
            or joined.count(b"\n") != len(raw) - 1
            or len(joined) - len(joined.translate(None, _CONTROL)) != len(raw) - 1):
        return None
    for f in schema:
        digits = _LONG_DIGITS.get(f.type)
        if digits is not None and digits.search(joined) is not None:
            return None
    try:
        joined.decode("utf-8")  # Arrow's reader does not check
        table = pa_json.read_json(arrow_input(joined), parse_options=pa_json.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (UnicodeDecodeError, pa.ArrowException):
        return None
    if table.num_rows != len(raw) or table.schema.types != schema.types:
        return None
    columns = {f.name: table.column(f.name).combine_chunks() for f in schema}
    for f in schema:  # NaN, Infinity: json.loads and Arrow's reader take them, the column may not
        if pa.types.is_floating(f.type) and pc.any(pc.invert(pc.is_finite(columns[f.name]))).as_py():
            return None
    return columns, pa.nulls(len(raw), pa.string())


def decode_json_values_per_record(raw: list[bytes | None],
                                  schema: pa.Schema) -> tuple[dict[str, pa.Array], pa.Array]:
    """Decodes JSON-object record values into the columns of ``schema``, one
    ``json.loads`` per value (the reference ``decode_json_values`` follows).

    A value that is not JSON, not an object, or has a field its column cannot hold as
    written does not raise: its columns are null and its error message is set (naming
    the field: ``"field 'price': ..."``), so the runtime sends it to the dead-letter table
    (``dkvstream.operators.io.dead_letter``). Not held as written, rather than coerced:

    * ``true``/``false`` in a numeric column (Arrow would take it as 1/0);
    * a number with a fraction or exponent (``6.5``, also ``6.0``) in an integer column
      (Arrow would truncate it); integer columns take JSON integers only, as Spark's
      ``from_json`` does;
    * ``NaN``, ``Infinity``, ``-Infinity`` (not JSON, though Python reads them) and a
      number beyond the column's range (``1e400``, ``1e39`` in a float32 column) in a
      floating-point column: they would be stored as NaN or infinity;
    * an integer a float column cannot hold exactly (beyond 2**53 for float64), an
      integer beyond the integer column's range, and whatever else Arrow refuses.

    A field missing from the object, or ``null``, is null. Nested values (lists,
    structs) are converted by Arrow as they are.

    Returns:
        ``({column: array}, errors)``: one array per field of ``schema`` and a string
        array of error messages, null for the rows that decoded.
    """
    rows: list[dict] = []
    errors: list[str | None] = []
    for value in raw:
        try:
            row = json.loads(value) if value is not None else {}
            if not isinstance(row, dict):
                raise ValueError(f"value is a JSON {type(row).__name__}, not an object")  # noqa: TRY004 - caught below
            rows.append(row)
            errors.append(None)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            rows.append({})
            errors.append(f"{type(e).__name__}: {e}")
    return columns_of_rows(rows, errors, schema)


def columns_of_rows(rows: list[dict], errors: list[str | None],
                    schema: pa.Schema) -> tuple[dict[str, pa.Array], pa.Array]:
    """The columns of ``schema`` from decoded rows (``{field: value}`` dicts), with the
    checks of ``decode_json_values``: a field its column cannot hold as written sets the
    row's error, and a row with an error keeps no value in any column.

    Args:
        rows: one dict per record (``{}`` for a record that did not decode).
        errors: one message per record, None if it decoded; updated in place.
        schema: the value columns.

    Returns:
        ``({column: array}, errors)`` as ``decode_json_values``.
    """
    columns = {}
    for f in schema:
        cells = [row.get(f.name) for row in rows]
        for i, message in _not_held(cells, f.type):
            errors[i] = errors[i] or f"field {f.name!r}: {message}"
            cells[i] = None
        try:
            columns[f.name] = pa.array(cells, f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            # Some cell does not convert: find it row by row (rare, so the slow path is fine).
            for i, cell in enumerate(cells):
                try:
                    pa.array([cell], f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                    errors[i] = errors[i] or f"field {f.name!r}: {e}"
                    cells[i] = None
            columns[f.name] = pa.array(cells, f.type)
        if pa.types.is_floating(f.type) and columns[f.name].null_count < len(cells):
            # NaN and infinity read from the JSON, or a finite number beyond the type's range.
            finite = pc.fill_null(pc.is_finite(columns[f.name]), True)
            for i in np.flatnonzero(~finite.to_numpy(zero_copy_only=False)):
                errors[i] = errors[i] or (f"field {f.name!r}: NaN, infinity or a number beyond "
                                          f"the range of {f.type} (JSON has no NaN or infinity)")
    if any(errors):  # a row bad in one field keeps no value from another
        bad = pa.array([e is not None for e in errors])
        columns = {n: pc.if_else(bad, pa.nulls(len(rows), a.type), a) for n, a in columns.items()}
    return columns, pa.array(errors, pa.string())


def _not_held(cells: list, arrow_type: pa.DataType) -> list[tuple[int, str]]:
    """``(row, message)`` for the cells of a numeric column that Arrow would coerce: a
    bool as a number, a float literal as an integer. Cheap when there are none: one set
    of the cells' Python types per column."""
    numeric = pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
    if not numeric:
        return []
    suspect = {bool, float} if pa.types.is_integer(arrow_type) else {bool}
    if not suspect & set(map(type, cells)):
        return []
    found = []
    for i, cell in enumerate(cells):
        if type(cell) is bool:
            found.append((i, f"JSON {json.dumps(cell)} is not a number ({arrow_type} column)"))
        elif type(cell) is float and pa.types.is_integer(arrow_type):
            what = "has a fraction or exponent" if math.isfinite(cell) else "is not finite"
            found.append((i, (f"{cell!r} {what}; the {arrow_type} column takes JSON integers "
                              f"only (declare it float64 to take such numbers)")))
    return found


class TopicSink(Sink):
    """Writes an operator output to a topic, exactly once (module docstring).

    Args:
        topic: topic name (created by the caller).
        log_prefix: the log's prefix in the job's object store.
        key_column: column holding the record key (str or bytes); None: keyless
            records, spread round-robin.
        timestamp_column: column holding the record timestamp (ms); None: the time of
            writing.

    A compacted topic (``cleanup.policy=compact``) needs a key on every record, as
    ``Producer.send`` requires: its cleaner keeps the latest record per key, so it would
    keep one of all the keyless records. The sink refuses ``key_column=None`` or a null
    key there with ``InvalidRecordError`` before anything is staged (the epoch fails in
    its task), and again before the epoch is committed (``prepare``) and published.
    """

    def __init__(self, topic: str, log_prefix: str = "log", key_column: str | None = "key",
                 timestamp_column: str | None = None) -> None:
        self.topic, self.log_prefix = topic, log_prefix
        self.key_column, self.timestamp_column = key_column, timestamp_column
        self.name = topic

    def _check_keyed(self, cfg: TopicConfig, null_keys: int = 0, rows: int = 0) -> None:
        """Raises ``InvalidRecordError`` if keyless records would go to a compacted topic."""
        if not cfg.compacted:
            return
        if self.key_column is None:
            raise InvalidRecordError(
                f"topic {self.topic!r} is compacted (cleanup.policy=compact) and its sink has "
                f"key_column=None: the log cleaner would keep only the newest keyless record of "
                f"each partition; give every record a key: set TopicSink(key_column=...) to a "
                f"column of the output")
        if null_keys:
            raise InvalidRecordError(
                f"topic {self.topic!r} is compacted (cleanup.policy=compact) and {null_keys} of "
                f"{rows} records have a null in column {self.key_column!r}, their key: the log "
                f"cleaner would keep only the newest of them in each partition; give every "
                f"record a key (fill or drop those rows in the operator)")

    def prepare(self, store: ObjectStore, job_prefix: str, epoch: int,
                staged: list[str]) -> None:
        """Refuses the epoch if the topic became compacted while the sink writes keyless
        records (``InvalidRecordError``)."""
        self._check_keyed(Log(store, self.log_prefix).metadata().topic(self.topic).config)

    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        cfg = Log(store, self.log_prefix).metadata().topic(self.topic).config
        self._check_keyed(cfg)
        rows = table.to_pylist()
        keys: list[bytes | None] = []
        for row in rows:
            k = row.pop(self.key_column) if self.key_column else None
            keys.append(k.encode() if isinstance(k, str) else k)
        if self.key_column is not None:
            self._check_keyed(cfg, keys.count(None), len(keys))
        values = [json.dumps(row, sort_keys=True, separators=(",", ":"), default=str).encode() for row in rows]
        if self.timestamp_column:
            ts = [int(v) for v in table.column(self.timestamp_column).to_pylist()]
        else:
            ts = [now_ms()] * len(rows)
        parts = [i % cfg.partitions if k is None else partition_for(k, cfg.partitions) for i, k in enumerate(keys)]
        w = SegmentWriter(index_interval_bytes=cfg.index_interval_bytes)
        for p in sorted(set(parts)):
            idx = [i for i, q in enumerate(parts) if q == p]
            w.begin_chunk(self.topic, p)
            w.append(range(len(idx)), [ts[i] for i in idx], [keys[i] for i in idx], [values[i] for i in idx])
            w.end_chunk()
        data, _ = w.finish()
        key = f"{staging_prefix}/{self.name}.seg"
        store.put(key, data)
        return key

    def producer_id(self, job_prefix: str) -> str:
        """The idempotent producer id of this sink in a job."""
        return f"{job_prefix}/{self.name}"

    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        log = Log(store, self.log_prefix)
        pid = self.producer_id(job_prefix)
        md = log.metadata()
        if md.producers.get(pid, -1) >= epoch:
            return []  # already published (a restart redoing the newest checkpoint's publish)
        self._check_keyed(md.topic(self.topic).config)
        def copy(key: str) -> tuple[str, list]:
            # A server-side copy and the chunk directory's ranged reads: the segment's
            # bytes never pass through the driver.
            segment = log.new_file_key("p")
            store.copy(key, segment)
            return segment, read_directory(store, segment)

        files = map_requests(copy, staged)

        def mutate(md: LogMetadata):
            if md.producers.get(pid, -1) >= epoch:
                return NO_CHANGE
            for file, chunks in files:
                append_file(md, file, chunks)
            md.producers[pid] = epoch
            return [file for file, _ in files]

        _, published = log.meta.commit(mutate)
        if published is NO_CHANGE:
            for file, _ in files:
                store.delete(file)
            return []
        return published

    def erase_rows(self, store: ObjectStore, job_prefix: str, column: str, values: list) -> list[str]:
        """Erasure: removes the records whose key is one of ``values`` from the job's
        staged segments of this sink (rewritten without them, first: a publish racing
        with the erasure copies a rewritten one) and from the topic
        (``dkvstream.storage.log.cleaner.erase_keys``: a tombstone for a compacted
        topic, then a rewrite of the topic and of the files it shares; every topic of
        the log, not only this job's records of the key). Records of the key other
        producers append meanwhile stay.

        Cost: one LIST of the job's staging prefixes, one GET per staged segment of the
        sink and one PUT per rewritten one; then ``erase_keys``'s, once for all values.

        Args and returns: as ``Sink.erase_rows``; ``column`` must be the sink's key
        column, ``values`` keys as ``str`` (UTF-8) or ``bytes``.

        Raises:
            ValueError: ``column`` is not the key column.
        """
        if column != self.key_column:
            raise ValueError(f"topic sink {self.name}: records are erased by their key, column "
                             f"{self.key_column!r}, not {column!r}")
        keys = frozenset(v.encode() if isinstance(v, str) else bytes(v) for v in values)
        staged = [k for k in staged_keys(store, job_prefix) if k.endswith(f"/{self.name}.seg")]
        held = [k for k in map_requests(lambda k: k if _erase_from_segment(store, k, keys) else None, staged)
                if k is not None]
        return sorted(held + erase_keys(Log(store, self.log_prefix), self.topic, sorted(keys)))

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        applied = Log(store, self.log_prefix).metadata().producers.get(self.producer_id(job_prefix), -1)
        return [f"topic {self.topic}: producer {self.producer_id(job_prefix)} published epoch {applied}"] \
            if applied > epoch else []

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """Every record of the topic: ``partition``, ``offset``, ``key``, ``timestamp``, ``value``."""
        log = Log(store, self.log_prefix)
        rows = []
        for p in range(len(log.metadata().topic(self.topic).partitions)):
            rows += [{"partition": p, "offset": r.offset, "key": r.key, "timestamp": r.timestamp, "value": r.value}
                     for r in log.read(self.topic, p)]
        schema = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
                            ("timestamp", pa.int64()), ("value", pa.binary())])
        return pa.Table.from_pylist(rows, schema=schema)


def _erase_from_segment(store: ObjectStore, key: str, keys: frozenset[bytes]) -> bool:
    """Rewrites staged segment ``key`` without the records of ``keys`` (deltas renumbered
    from 0 in each chunk, as a staged segment has them); True if it held one. A chunk left
    without records is dropped."""
    try:
        data = store.get(key)
    except ObjectNotFoundError:  # collected meanwhile
        return False
    writer, held = SegmentWriter(), False
    for chunk in read_directory(store, key, data):
        records = [r for _, b in chunk_batches(data, chunk, 0, store.uri(key)) for r in b.records(0)]
        kept = [r for r in records if r.key not in keys]
        held |= len(kept) < len(records)
        if kept:
            writer.begin_chunk(chunk.topic, chunk.partition)
            writer.append(range(len(kept)), [r.timestamp for r in kept], [r.key for r in kept],
                          [r.value for r in kept], [r.headers for r in kept] if any(r.headers for r in kept) else None)
            writer.end_chunk()
    if held:
        store.put(key, writer.finish()[0])
    return held
