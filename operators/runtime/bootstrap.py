"""Bootstrap: a job's initial state written from tables, before its first epoch (Flink's
State Processor API ``SavepointWriter`` with a ``KeyedStateBootstrapFunction``; Spark's
``transformWithState`` initial state). docs/bootstrap.md is the users' page.

``bootstrap(store, job, states)`` takes, per operator and state id, a table of entries
(an Arrow table, a Parquet file or directory, a Delta table, or with ``spark`` a Spark
DataFrame) and writes what the job's tasks would have written had they built that state
themselves:

* each entry's DKV key and value exactly as ``dkvstream.operators.api.state`` lays them
  out: the subject key's key group (``xxh3_64(key) mod K``), the state's schema byte (a
  TTL'd state's own), the state id, a map entry's encoded map key; the value encoded by
  the spec's codec, a list as its elements, a TTL'd entry behind its expiry;
* event- and processing-time timers as ``dkvstream.operators.runtime.timers`` stores them;
* one DKV instance per key-group range of each operator named, at the job's parallelism
  for that operator: its entries sorted, written in one write batch, flushed to SSTables
  by DKV itself (merged once into one sorted run when they reach the level-0 trigger)
  and published as the range's first manifest (a range without entries
  gets an empty manifest, so the checkpoint names every range and the first epoch opens
  them as any later epoch would);
* then the job's first checkpoint, at ``epoch`` (1 by default: the commit log counts
  epochs from 1, 0 being "nothing committed"), committed through the commit fence
  (``checkpoints.commit_checkpoint``): no source offsets (the next epoch reads every
  partition from its start offset), the watermark before any event, the state schemas
  a first run records (``state_schema.evolve_job``), the lower bounds of the timers
  written. The next run of the job restarts from it as from any checkpoint, at the same
  or another parallelism.

Until that commit nothing is visible. In this process every table is encoded and every
range checked before the first file is written, so a refused table leaves nothing; on
Spark each range task checks its own entries, and a bootstrap that fails there (or
while writing) leaves range files no checkpoint names, garbage for cleanup's full
sweep. Either way it can be run again (each run's manifests carry their own token). A
job that has a checkpoint already is refused.

Table shapes (column names as the state reader's, so ``read_state``'s output can be
written back as it is, and ``list_timers``' as an operator's timers; ``state_id``,
``operator`` and ``key_group`` are then checked and otherwise ignored):

=========  ===================================================================
spec       columns
=========  ===================================================================
ValueSpec  ``key`` (or ``subject_key``), ``value``; for a ``RecordCodec`` the
           record's fields may be columns of their own instead of ``value``
ListSpec   ``key``, ``value`` (a list of the codec's type)
MapSpec    ``key``, ``map_key``, ``value``
timers     ``key``, ``timestamp`` (int64 ms, or an Arrow timestamp), optional
           ``domain`` (``event_time``, the default, or ``processing_time``)
=========  ===================================================================

``key`` is binary, or text taken as UTF-8 (as sources key events). ``value`` has the
codec's Arrow type (``Codec.arrow_type``; lossless widenings such as int32 to int64 are
applied); for ``JsonCodec`` it is the JSON text and for ``MsgpackCodec`` the msgpack
bytes, as the state reader shows them. A state with a TTL takes an optional ``expiry``
column (int64 ms of the TTL's clock); without it every entry expires ``ttl_ms`` after
``ttl_from_ms`` (default for a processing-time TTL: the wall clock at the bootstrap; an
event-time TTL needs one of the two, since no watermark exists yet).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators import paths
from dkvstream.operators.api.codecs import Codec, RecordCodec
from dkvstream.operators.api.columns import DOMAIN_COLUMN, KEY_COLUMN, KEY_GROUP_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.keygroups import key_group_ranges, key_groups_of_column, range_indexes_of
from dkvstream.operators.api.operator import WATERMARK_MIN, TimeDomain
from dkvstream.operators.api.state import (
    ENCODE_ERRORS,
    SCHEMA_PROCESSING_TIMER,
    SCHEMA_TIMER,
    ListSpec,
    MapSpec,
    decode_state_key,
    state_key_column,
    state_specs,
)
from dkvstream.operators.api.state_schema import bound_value_codec, describe, evolve_job
from dkvstream.operators.errors import BootstrapError
from dkvstream.operators.io.sources import lossless_cast
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, commit_checkpoint, read_commit_log
from dkvstream.operators.runtime.task_errors import carry_errors, task_error
from dkvstream.operators.runtime.timers import SCHEMAS, decode_timer_key, timer_keys
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.expiry import EXPIRY
from dkvstream.storage.objectstore import ObjectStore, open_object_store

#: The column of a subject key in the state reader's tables, taken in place of ``key``.
SUBJECT_KEY_COLUMN = "subject_key"
STATE_ID_COLUMN = "state_id"
OPERATOR_COLUMN = "operator"  # the state reader's timer tables
MAP_KEY_COLUMN = "map_key"
VALUE_COLUMN = "value"
EXPIRY_COLUMN = "expiry"
_TIME_MAX = (1 << 63) - 1
# The encoded entries between the encoding and the range writes: the global index of
# the entry's range (``_Plan.ranges``), its DKV key and value.
_ENCODED = pa.schema([("part", pa.int32()), ("k", pa.binary()), ("v", pa.binary())])


@dataclass(frozen=True)
class RangeWrite:
    """What the bootstrap wrote for one key-group range of one operator.

    Attributes:
        operator: the operator's name; range_label: the range (``kg-0000-0127``).
        manifest_key: the object key of the range's first DKV manifest.
        entries: DKV entries written (state entries and timers).
        tables: SSTables the manifest names; table_bytes: their bytes on the store.
        next_timers: the earliest timer written per time domain (``event_time``,
            ``processing_time``), ms; a domain without timers is absent.
    """

    operator: str
    range_label: str
    manifest_key: str
    entries: int
    tables: int
    table_bytes: int
    next_timers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BootstrapResult:
    """The bootstrap's checkpoint and its ranges.

    Attributes:
        job: the job's name; epoch: the checkpoint's epoch (the job's next run starts
            with ``epoch + 1``); checkpoint_uri: where the checkpoint is.
        ranges: one ``RangeWrite`` per key-group range of each operator written.
    """

    job: str
    epoch: int
    checkpoint_uri: str
    ranges: list[RangeWrite]

    @property
    def entries(self) -> int:
        """DKV entries written over all ranges."""
        return sum(r.entries for r in self.ranges)

    @property
    def tables(self) -> int:
        """SSTables written over all ranges."""
        return sum(r.tables for r in self.ranges)

    @property
    def table_bytes(self) -> int:
        """Bytes of those SSTables."""
        return sum(r.table_bytes for r in self.ranges)


@dataclass(frozen=True)
class _Encoder:
    """Turns one table of a state (or of an operator's timers) into the DKV entries the
    job's tasks would hold: ``encode`` gives ``_ENCODED`` rows. Picklable: on Spark it
    runs in the tasks (``batches``).

    Attributes:
        where: the table, for messages (operator, state id, path).
        kind: ``value``, ``list``, ``map`` or ``timers``.
        suffix: the encoded state id (``_Spec._id_bytes``); schema: its schema byte.
        codec: the value codec (None for timers); key_codec: a map's key codec.
        ttl_ms: the state's TTL (None: none); default_expiry: the expiry of entries
            without an ``expiry`` column (None: the column is required).
        key_groups, parallelism: the job's K and the operator's P.
        range_base: the global index of the operator's first range (``_Plan.ranges``).
        operator, state_id: for the ``operator`` and ``state_id`` column checks
            (``state_id`` None for timers).
    """

    where: str
    operator: str
    kind: str
    suffix: bytes
    schema: int
    codec: Codec | None
    key_codec: Codec | None
    ttl_ms: int | None
    default_expiry: int | None
    key_groups: int
    parallelism: int
    range_base: int
    state_id: str | None

    def encode(self, table: pa.Table, first_row: int = 0) -> pa.Table:
        """The entries of ``table`` (rows numbered from ``first_row`` in messages).

        Raises:
            BootstrapError: a missing, unknown or mistyped column, a null or empty key,
                a null value, a value the codec refuses, a ``key_group`` or
                ``state_id`` column that disagrees (names column and row).
        """
        names = table.column_names
        key_name = KEY_COLUMN if KEY_COLUMN in names else SUBJECT_KEY_COLUMN if SUBJECT_KEY_COLUMN in names else None
        if key_name is None:
            raise BootstrapError(f"{self.where}: no column {KEY_COLUMN!r} (the subject key: binary, or text "
                                 f"taken as UTF-8); the table has {names}")
        expected = self._columns(names)
        checked = (key_name, KEY_GROUP_COLUMN, STATE_ID_COLUMN, OPERATOR_COLUMN)
        unknown = [n for n in names if n not in expected and n not in checked]
        if unknown:
            raise BootstrapError(f"{self.where}: unknown column(s) {unknown}; a {self.kind} table has "
                                 f"{[key_name, *expected]} (drop the others)")
        keys = self._conform(table, key_name, pa.binary(), first_row)
        self._no_nulls(keys, key_name, first_row, None)
        empty = pc.equal(pc.binary_length(keys), 0)
        if pc.any(empty).as_py():
            row = int(pc.index(empty, True).as_py())
            raise BootstrapError(f"{self.where}: row {first_row + row}: the key is empty; every entry needs a "
                                 f"subject key")
        kgs = key_groups_of_column(keys, self.key_groups)
        self._check_given(table, keys, kgs, first_row)
        if self.kind == "timers":
            dkv_keys = self._timer_keys(table, keys, kgs, first_row)
            values = [b""] * len(dkv_keys)
        else:
            tail = None
            if self.kind == "map":
                map_keys = self._conform(table, MAP_KEY_COLUMN, self.key_codec.arrow_type, first_row)
                self._no_nulls(map_keys, MAP_KEY_COLUMN, first_row, keys)
                tail = self._encode_map_keys(map_keys, keys, first_row)
            dkv_keys = state_key_column(keys, kgs, self.suffix, tail, self.schema)
            values = self._values(table, keys, first_row)
        parts = range_indexes_of(kgs, self.key_groups, self.parallelism) + self.range_base
        return pa.Table.from_arrays([pa.array(parts, pa.int32()), pa.array(dkv_keys, pa.binary()),
                                     pa.array(values, pa.binary())], schema=_ENCODED)

    def batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``encode`` of each batch (Spark's ``mapInArrow``); rows are numbered within
        the task's batches, so messages also name the key."""
        row = 0
        for batch in batches:
            yield from self.encode(pa.Table.from_batches([batch]), row).to_batches()
            row += batch.num_rows

    # -- columns ----------------------------------------------------------------------

    def _columns(self, names: list[str]) -> list[str]:
        """The columns the table must have besides the key."""
        if self.kind == "timers":
            return [TIMESTAMP_COLUMN] + [DOMAIN_COLUMN] * (DOMAIN_COLUMN in names)
        cols = [MAP_KEY_COLUMN] if self.kind == "map" else []
        if self.kind == "value" and isinstance(self.codec, RecordCodec) and VALUE_COLUMN not in names:
            cols += list(self.codec.fields)  # the record's fields as columns of their own
        else:
            cols.append(VALUE_COLUMN)
        if self.ttl_ms is not None and (EXPIRY_COLUMN in names or self.default_expiry is None):
            cols.append(EXPIRY_COLUMN)
        return cols

    def _conform(self, table: pa.Table, name: str, want: pa.DataType, first_row: int) -> pa.Array:
        """Column ``name`` of ``table`` as type ``want`` (a lossless cast; a struct or
        list conformed field by field)."""
        if name not in table.column_names:
            raise BootstrapError(f"{self.where}: column {name!r} is missing ({self._shape()}); the table has "
                                 f"{table.column_names}")
        column = table.column(name).combine_chunks()
        return self._conform_array(column, want, name)

    def _conform_array(self, column: pa.Array, want: pa.DataType, name: str) -> pa.Array:
        have = column.type
        if have == want:
            return column
        if pa.types.is_struct(want) and pa.types.is_struct(have):
            given = {have.field(i).name: i for i in range(have.num_fields)}
            missing = [f.name for f in want if f.name not in given]
            if missing:
                raise BootstrapError(f"{self.where}: column {name!r} has no field(s) {missing} of the record "
                                     f"{want} ({self._shape()})")
            children = [self._conform_array(column.field(given[f.name]), f.type, f"{name}.{f.name}") for f in want]
            return pa.StructArray.from_arrays(children, fields=list(want), mask=column.is_null())
        if pa.types.is_list(want) and (pa.types.is_list(have) or pa.types.is_large_list(have)):
            offsets = column.offsets
            child = self._conform_array(column.flatten(), want.value_type, f"{name}[]")
            return pa.ListArray.from_arrays(pc.subtract(offsets, offsets[0]).cast(pa.int32()), child,
                                            mask=column.is_null())
        if pa.types.is_timestamp(have) and want == pa.int64() and name == TIMESTAMP_COLUMN:
            return column.cast(pa.timestamp("ms", have.tz)).cast(pa.int64())  # raises rather than truncate
        if not lossless_cast(have, want) and name in (KEY_COLUMN, SUBJECT_KEY_COLUMN):
            raise BootstrapError(f"{self.where}: column {name!r} is {have}; a subject key is binary, or text taken "
                                 f"as UTF-8, as sources key events: give the key as the job's source does (e.g. "
                                 f"cast the column to string)")
        if not lossless_cast(have, want):
            raise BootstrapError(f"{self.where}: column {name!r} is {have}, the state stores {want} "
                                 f"({self._shape()}); cast it (only lossless widenings such as int32 to int64 "
                                 f"are applied here)")
        return column.cast(want)

    def _shape(self) -> str:
        """The table shape of this state, for messages."""
        if self.kind == "timers":
            return "timers: key, timestamp (int64 ms) and optionally domain"
        value = self.codec.arrow_type if self.kind != "list" else pa.list_(self.codec.arrow_type)
        head = f"key, map_key ({self.key_codec.arrow_type}), " if self.kind == "map" else "key, "
        ttl = ", expiry (int64 ms)" if self.ttl_ms is not None else ""
        return f"a {self.kind} state's table: {head}value ({value}){ttl}"

    def _no_nulls(self, column: pa.Array, name: str, first_row: int, keys: pa.Array | None) -> None:
        if column.null_count:
            row = int(pc.index(column.is_null(), True).as_py())
            key = "" if keys is None else f" (key {keys[row].as_py()!r})"
            raise BootstrapError(f"{self.where}: column {name!r} is null in row {first_row + row}{key}; give a "
                                 f"value, or leave the row out")

    def _check_given(self, table: pa.Table, keys: pa.Array, kgs: np.ndarray, first_row: int) -> None:
        """The ``key_group`` and ``state_id`` columns of a state reader's table, if
        present, must say what this job computes."""
        if KEY_GROUP_COLUMN in table.column_names:
            given = table.column(KEY_GROUP_COLUMN).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(given != kgs)
            if len(bad):
                i = int(bad[0])
                raise BootstrapError(
                    f"{self.where}: row {first_row + i} (key {keys[i].as_py()!r}): column {KEY_GROUP_COLUMN!r} "
                    f"says {given[i]}, this job's {self.key_groups} key groups give {kgs[i]}; the table was read "
                    f"from a job with other key_groups: drop the column (key groups are recomputed)")
        for column, want, what in ((STATE_ID_COLUMN, self.state_id, "state"),
                                   (OPERATOR_COLUMN, self.operator, "operator")):
            if column not in table.column_names or want is None:
                continue
            given = table.column(column)
            other = pc.invert(pc.fill_null(pc.equal(given, want), False))
            if pc.any(other).as_py():
                i = int(pc.index(other, True).as_py())
                raise BootstrapError(f"{self.where}: row {first_row + i}: column {column!r} says "
                                     f"{given[i].as_py()!r}, the table is given for {what} {want!r}")

    # -- encoding ---------------------------------------------------------------------

    def _bad_value(self, name: str, codec: Codec, values: list, keys: pa.Array, first_row: int,
                   encode=None) -> BootstrapError:
        """The error naming the first row of ``values`` that ``codec`` refuses."""
        encode = encode or codec.encode
        for i, v in enumerate(values):
            try:
                encode(v)
            except ENCODE_ERRORS as e:
                return BootstrapError(f"{self.where}: row {first_row + i} (key {keys[i].as_py()!r}): column "
                                      f"{name!r} holds {v!r}, which codec {codec.name} cannot encode ({e}); it "
                                      f"expects {codec.expects}")
        return BootstrapError(f"{self.where}: column {name!r}: codec {codec.name} refused the values")

    def _encode_map_keys(self, map_keys: pa.Array, keys: pa.Array, first_row: int) -> tuple[Any, Any]:
        try:
            return self.key_codec.encode_column(map_keys)
        except ENCODE_ERRORS as e:
            raise self._bad_value(MAP_KEY_COLUMN, self.key_codec, map_keys.to_pylist(), keys, first_row) from e

    def _encoder_of(self, codec: Codec):
        """Python value of ``codec.arrow_type`` -> stored bytes. A codec whose state-reader
        column is its stored form (``JsonCodec``'s text, ``MsgpackCodec``'s bytes) is
        given that form: decoded, so a malformed one is refused, and encoded again."""
        if type(codec).arrow_value is Codec.arrow_value:
            return codec.encode

        def stored(v):
            return codec.encode(codec.decode(v.encode("utf-8") if isinstance(v, str) else v))
        return stored

    def _values(self, table: pa.Table, keys: pa.Array, first_row: int) -> list[bytes]:
        codec = self.codec
        if self.kind == "list":
            column = self._conform(table, VALUE_COLUMN, pa.list_(codec.arrow_type), first_row)
        elif isinstance(codec, RecordCodec) and VALUE_COLUMN not in table.column_names:
            fields = [self._conform(table, n, t, first_row) for n, t in codec.fields.items()]
            column = pa.StructArray.from_arrays(fields, fields=list(codec.arrow_type))
        else:
            column = self._conform(table, VALUE_COLUMN, codec.arrow_type, first_row)
        self._no_nulls(column, VALUE_COLUMN, first_row, keys)
        encode = self._encoder_of(codec)
        if self.kind == "list":
            lists = column.to_pylist()
            values = []
            for i, items in enumerate(lists):
                try:
                    encoded = [encode(v) for v in items]
                except ENCODE_ERRORS as e:
                    raise self._bad_value(VALUE_COLUMN, codec, items, pa.array([keys[i].as_py()] * len(items)),
                                          first_row + i, encode) from e
                values.append(b"".join(len(e).to_bytes(4, "big") + e for e in encoded))
        elif isinstance(codec, RecordCodec):
            try:
                values = codec.encode_struct(column)
            except ENCODE_ERRORS as e:
                raise self._bad_value(VALUE_COLUMN, codec, column.to_pylist(), keys, first_row) from e
        else:
            py = column.to_pylist()
            try:
                values = [encode(v) for v in py]
            except ENCODE_ERRORS as e:
                raise self._bad_value(VALUE_COLUMN, codec, py, keys, first_row, encode) from e
        if self.ttl_ms is None:
            return values
        if self.default_expiry is None and EXPIRY_COLUMN not in table.column_names:
            raise BootstrapError(f"{self.where}: column {EXPIRY_COLUMN!r} is missing: the state has an event-time "
                                 f"TTL and no watermark exists before the first epoch; give each entry's expiry "
                                 f"(int64 ms of event time), or pass ttl_from_ms (the event time its TTL counts "
                                 f"from)")
        if EXPIRY_COLUMN in table.column_names:
            expiry = self._conform(table, EXPIRY_COLUMN, pa.int64(), first_row)
            self._no_nulls(expiry, EXPIRY_COLUMN, first_row, keys)
            pack = EXPIRY.pack
            return [pack(x) + v for x, v in zip(expiry.to_pylist(), values)]
        header = EXPIRY.pack(self.default_expiry)
        return [header + v for v in values]

    def _timer_keys(self, table: pa.Table, keys: pa.Array, kgs: np.ndarray, first_row: int) -> list[bytes]:
        ts = self._conform(table, TIMESTAMP_COLUMN, pa.int64(), first_row)
        self._no_nulls(ts, TIMESTAMP_COLUMN, first_row, keys)
        schemas = np.full(len(keys), SCHEMA_TIMER, np.int32)
        if DOMAIN_COLUMN in table.column_names:
            domains = table.column(DOMAIN_COLUMN).to_pylist()
            for i, d in enumerate(domains):
                if d not in (TimeDomain.EVENT_TIME.value, TimeDomain.PROCESSING_TIME.value):
                    raise BootstrapError(f"{self.where}: row {first_row + i} (key {keys[i].as_py()!r}): column "
                                         f"{DOMAIN_COLUMN!r} says {d!r}; give 'event_time' or 'processing_time'")
                schemas[i] = SCHEMAS[TimeDomain(d)]
        key_list, ts_list, kg_list = keys.to_pylist(), ts.to_pylist(), kgs.tolist()
        out: list[bytes] = [b""] * len(key_list)
        for schema in np.unique(schemas).tolist():
            rows = np.flatnonzero(schemas == schema).tolist()
            for i, k in zip(rows, timer_keys([kg_list[i] for i in rows], [ts_list[i] for i in rows],
                                             [key_list[i] for i in rows], schema)):
                out[i] = k
        return out


@dataclass(frozen=True)
class _Plan:
    """What the range writes share: the store, where each range goes, the manifest name.

    Attributes:
        store_uri: the store's root URI (tasks reopen it).
        job_prefix, layout: where the job's range files go (``paths.state_prefix``).
        ranges: every range written, ``(operator, range label)``, by global index.
        manifest_name: the DKV checkpoint name of every range (unique per bootstrap run).
        options: the DKV options of the writes.
    """

    store_uri: str
    job_prefix: str
    layout: int
    ranges: tuple[tuple[str, str], ...]
    manifest_name: str
    options: DKVOptions

    def sorted_entries(self, index: int, keys: list[bytes], values: list[bytes]
                       ) -> tuple[list[bytes], list[bytes]]:
        """Range ``index``'s entries (any order) sorted by DKV key, a repeated timer once.

        Raises:
            BootstrapError: a DKV key given twice (a key repeated in a ValueSpec or
                ListSpec table, a (key, map key) in a MapSpec table).
        """
        operator, _ = self.ranges[index]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        sorted_keys, sorted_values = [], []
        for i in order:
            k = keys[i]
            if sorted_keys and sorted_keys[-1] == k:
                if k[2] in (SCHEMA_TIMER, SCHEMA_PROCESSING_TIMER):
                    continue  # setting a timer twice registers it once
                _, subject, state_id, map_key = decode_state_key(k)
                what = f"key {subject!r}" + (f" with map key bytes {map_key!r}" if map_key else "")
                raise BootstrapError(f"operator {operator!r} state {state_id!r}: {what} appears twice; a table "
                                     f"holds one row per key (per key and map key for a MapSpec): deduplicate it")
            sorted_keys.append(k)
            sorted_values.append(values[i])
        return sorted_keys, sorted_values

    def write(self, store: ObjectStore, index: int, sorted_keys: list[bytes], sorted_values: list[bytes]
              ) -> RangeWrite:
        """Writes range ``index`` from its ``sorted_entries`` (one write batch, flushed to
        SSTables) and publishes its manifest."""
        operator, label = self.ranges[index]
        next_timers: dict[str, int] = {}
        for domain, schema in SCHEMAS.items():
            stamps = [decode_timer_key(k, schema)[1] for k in sorted_keys if k[2] == schema]
            if stamps:
                next_timers[domain.value] = min(stamps)
        prefix = paths.state_prefix(self.job_prefix, operator, label, self.layout)
        # No compaction while the memtable flushes: the entries come sorted, so the level-0
        # tables do not overlap, and merging them step by step would rewrite them once per
        # step. Past the level-0 trigger they are merged once, into one sorted run.
        db = DKV.open(store, prefix, None, dataclasses.replace(self.options, max_inline_compaction_bytes=0))
        try:
            db.write_batch(sorted_keys, sorted_values)
            db.flush_memtable()
            if len(db.levels.l0) >= self.options.l0_compaction_trigger:
                db.compact_all()
            manifest_key = db.checkpoint(self.manifest_name)
            tables = list(db.levels.all_tables())
        finally:
            db.close()
        return RangeWrite(operator, label, manifest_key, len(sorted_keys), len(tables),
                          sum(t.size for t in tables), next_timers)

    def spark_task(self, index: int, rows: Iterator[Any]) -> Iterator[RangeWrite]:
        """The Spark task of range ``index``: its ``(part, (key, value))`` rows."""
        keys, values = [], []
        for _, (k, v) in rows:
            keys.append(bytes(k))
            values.append(bytes(v))
        yield self.write(open_object_store(self.store_uri), index, *self.sorted_entries(index, keys, values))


def bootstrap(store: ObjectStore | str, job: Job, states: Mapping[str, Mapping[str, Any]], *,
              timers: Mapping[str, Any] | None = None, epoch: int = 1, spark=None,
              ttl_from_ms: int | None = None, dkv_options: DKVOptions | None = None) -> BootstrapResult:
    """Writes a job's initial state from tables and commits it as the job's first
    checkpoint (module docstring).

    Args:
        store: the job's object store (or its root URI).
        job: the job; its operators' state specs give codecs and TTLs, its key groups
            and (per operator) parallelism the ranges.
        states: ``{operator name: {state id: table}}``; a table is a ``pyarrow.Table``,
            a pandas DataFrame, a path of a Parquet file or directory or of a Delta
            table, or (with ``spark``) a Spark DataFrame. Shapes: module docstring.
        timers: ``{operator name: table of key, timestamp[, domain]}``, or None.
        epoch: the checkpoint's epoch (>= 1); the job's next run starts at ``epoch + 1``.
        spark: a SparkSession: tables are read and encoded, and each key-group range
            written, in Spark tasks (one per range); the driver only writes the
            checkpoint. None: everything in this process.
        ttl_from_ms: for TTL'd states given without an ``expiry`` column, the time
            (ms of the TTL's clock) their TTL counts from; None: the wall clock for a
            processing-time TTL, and an event-time TTL then needs ``expiry``.
        dkv_options: DKV options of the range writes (the job's runs may use others).

    Returns:
        A ``BootstrapResult``: the checkpoint and what each range holds.

    Raises:
        BootstrapError: the job already has a checkpoint; an unknown operator or state
            id; a table that is missing a column, has one of the wrong type, a null or
            empty key, a value its codec refuses or a key twice (names table, column
            and row or key); ``epoch`` < 1; a Spark DataFrame without ``spark``.
        JobFencedError: another writer committed a checkpoint of the job meanwhile.
    """
    store = open_object_store(store) if isinstance(store, str) else store
    if not isinstance(epoch, int) or epoch < 1:
        raise BootstrapError(f"job {job.name}: epoch must be an int >= 1 (the commit log counts epochs from 1), "
                             f"got {epoch!r}")
    commits = read_commit_log(store, job.prefix)
    if commits.newest_committed:
        raise BootstrapError(
            f"job {job.name} has checkpoints already (up to epoch {commits.newest_committed}, under "
            f"{store.uri(paths.checkpoint_prefix(job.prefix))}): bootstrap writes a new job's first state. "
            f"Bootstrap a job under a new name, or remove this job's files (jobs/{job.name}/) first")
    encoders = _encoders(job, states, timers or {}, ttl_from_ms)
    ranges: list[tuple[str, str]] = []
    for op in job.operators:
        if op.name in encoders:
            ranges += [(op.name, r.label) for r in key_group_ranges(job.key_groups, job.parallelism_of(op.name))]
    plan = _Plan(store.root_uri, job.prefix, paths.LAYOUTS[job.key_layout], tuple(ranges),
                 f"e{epoch:010d}-bootstrap-{uuid.uuid4().hex[:8]}", dkv_options or DKVOptions())
    items = [(enc, source) for per_op in encoders.values() for enc, source in per_op]
    if not items:
        written = []
    elif spark is None:
        written = _write_in_process(store, plan, items)
    else:
        written = _write_on_spark(spark, plan, items)
    ckpt = _checkpoint(job, epoch, plan, written)
    key = commit_checkpoint(store, job.prefix, ckpt)
    return BootstrapResult(job.name, epoch, store.uri(key), written)


def _encoders(job: Job, states: Mapping[str, Mapping[str, Any]], timers: Mapping[str, Any],
              ttl_from_ms: int | None) -> dict[str, list[tuple[_Encoder, Any]]]:
    """``{operator: [(encoder, table source)]}`` for every table given, checked
    against the job's operators and specs."""
    operators = {op.name: op for op in job.operators}
    for name in [*states, *timers]:
        if name not in operators:
            raise BootstrapError(f"job {job.name} has no operator {name!r} (operators: {sorted(operators)})")
    # The global range indexes: the ranges of each operator with a table, in job order
    # (``bootstrap`` lists ``_Plan.ranges`` the same way).
    named = {name for name, per_state in states.items() if per_state} | set(timers)
    base, range_base = {}, 0
    for op in job.operators:
        base[op.name] = range_base
        if op.name in named:
            range_base += job.parallelism_of(op.name)
    now_ms = time.time_ns() // 1_000_000
    out: dict[str, list[tuple[_Encoder, Any]]] = {}
    for name, per_state in states.items():
        specs = state_specs(operators[name])
        for state_id, source in per_state.items():
            if state_id not in specs:
                raise BootstrapError(f"operator {name!r} declares no state {state_id!r} (states: {sorted(specs)})")
            spec = specs[state_id]
            where = f"operator {name!r} state {state_id!r} ({_describe_source(source)})"
            kind = "map" if isinstance(spec, MapSpec) else "list" if isinstance(spec, ListSpec) else "value"
            default_expiry = None
            if spec.ttl is not None:
                start = ttl_from_ms if ttl_from_ms is not None else now_ms if spec.ttl.time == "processing" else None
                default_expiry = None if start is None else min(start + spec.ttl.ttl_ms, _TIME_MAX)
            out.setdefault(name, []).append((_Encoder(
                where=where, operator=name, kind=kind, suffix=spec._id_bytes, schema=spec.schema,
                codec=bound_value_codec(spec, describe(spec)),
                key_codec=spec.key_codec if isinstance(spec, MapSpec) else None,
                ttl_ms=None if spec.ttl is None else spec.ttl.ttl_ms, default_expiry=default_expiry,
                key_groups=job.key_groups, parallelism=job.parallelism_of(name), range_base=base[name],
                state_id=state_id), source))
    for name, source in timers.items():
        out.setdefault(name, []).append((_Encoder(
            where=f"operator {name!r} timers ({_describe_source(source)})", operator=name, kind="timers", suffix=b"",
            schema=SCHEMA_TIMER, codec=None, key_codec=None, ttl_ms=None, default_expiry=None,
            key_groups=job.key_groups, parallelism=job.parallelism_of(name), range_base=base[name],
            state_id=None), source))
    return out


def _describe_source(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return type(source).__name__


def read_table(source: Any, where: str = "") -> pa.Table:
    """A bootstrap table in this process: an Arrow table or record batch, a pandas
    DataFrame, or a path of a Parquet file or directory or of a Delta table (a
    directory with ``_delta_log/``).

    Raises:
        BootstrapError: a path that does not exist, a Spark DataFrame (pass ``spark``),
            or another type.
    """
    if isinstance(source, pa.Table):
        return source
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source])
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise BootstrapError(f"{where}: {path}: no such file or directory")
        if os.path.isdir(os.path.join(path, "_delta_log")):
            from deltalake import DeltaTable

            from dkvstream.operators.io.table_reader import delta_dataset

            return delta_dataset(DeltaTable(path)).to_table()
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if hasattr(source, "mapInArrow"):
        raise BootstrapError(f"{where}: a Spark DataFrame is written by Spark tasks: pass spark=<the session>")
    try:
        import pandas as pd

        if isinstance(source, pd.DataFrame):
            return pa.Table.from_pandas(source, preserve_index=False)
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    raise BootstrapError(f"{where}: a table must be a pyarrow Table, a pandas DataFrame or a Parquet/Delta path, "
                         f"got {type(source).__name__}")


def _write_in_process(store: ObjectStore, plan: _Plan, items: list[tuple[_Encoder, Any]]) -> list[RangeWrite]:
    by_range: dict[int, list[pa.Table]] = {}
    for enc, source in items:
        encoded = enc.encode(read_table(source, enc.where))
        parts = encoded.column("part").to_numpy()
        for part in np.unique(parts).tolist():
            by_range.setdefault(part, []).append(encoded.filter(pa.array(parts == part)))
    entries = []  # every range checked before any is written: a refused table leaves no files
    for index in range(len(plan.ranges)):
        tables = by_range.get(index, [])
        t = pa.concat_tables(tables) if tables else _ENCODED.empty_table()
        entries.append(plan.sorted_entries(index, t.column("k").to_pylist(), t.column("v").to_pylist()))
    return [plan.write(store, index, *sorted_kv) for index, sorted_kv in enumerate(entries)]


def _write_on_spark(spark, plan: _Plan, items: list[tuple[_Encoder, Any]]) -> list[RangeWrite]:
    """One Spark job: the tables encoded in their own tasks (``mapInArrow``), the
    entries routed to one partition per range (an identity partitioner), one task per
    range writing it; the driver collects the ``RangeWrite``s only."""
    frames = []
    for enc, source in items:
        frame = _spark_frame(spark, source, enc.where)
        frames.append(frame.mapInArrow(carry_errors(enc.batches), "part int, k binary, v binary"))
    union = functools.reduce(lambda a, b: a.unionByName(b), frames)
    n = len(plan.ranges)
    routed = union.rdd.map(lambda row: (row[0], (row[1], row[2]))).partitionBy(n, lambda part: part)
    try:
        written = routed.mapPartitionsWithIndex(carry_errors(plan.spark_task)).collect()
    except Exception as e:
        error = task_error(e)
        if error is not None:
            raise error from e
        raise
    return sorted(written, key=lambda w: plan.ranges.index((w.operator, w.range_label)))


def _spark_frame(spark, source: Any, where: str):
    """A bootstrap table as a Spark DataFrame: as given, a Parquet or Delta path read
    by Spark, or a local table handed to Spark."""
    if hasattr(source, "mapInArrow"):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(os.path.join(path, "_delta_log")):
            return spark.read.format("delta").load(path)
        return spark.read.parquet(path)
    return spark.createDataFrame(read_table(source, where))


def _checkpoint(job: Job, epoch: int, plan: _Plan, written: list[RangeWrite]) -> JobCheckpoint:
    """The bootstrap's checkpoint: what ``JobRunner``'s first epoch would start from,
    with the ranges written named."""
    operators: dict[str, dict[str, str]] = {op.name: {} for op in job.operators}
    for w in written:
        operators[w.operator][w.range_label] = w.manifest_key

    def next_timer(domain: str) -> int | None:
        stamps = [w.next_timers[domain] for w in written if domain in w.next_timers]
        return min(stamps) if stamps else None

    return JobCheckpoint(
        job=job.name, epoch=epoch, watermark=WATERMARK_MIN, source_offsets={}, partition_max_ts={},
        finished=False, key_groups=job.key_groups, parallelism=job.parallelism, operators=operators,
        outputs={}, layout=paths.LAYOUTS[job.key_layout],
        metrics={"bootstrap": {"entries": sum(w.entries for w in written), "tables": sum(w.tables for w in written),
                               "table_bytes": sum(w.table_bytes for w in written), "ranges": len(written)}},
        dropped={op: {} for op in operators}, unkept={op: {} for op in operators},
        state_schemas=evolve_job(job.operators, {}),
        next_event_timer_ms=next_timer(TimeDomain.EVENT_TIME.value),
        next_processing_timer_ms=next_timer(TimeDomain.PROCESSING_TIME.value),
    )
