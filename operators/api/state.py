"""State specs and the state objects they hand out, over DKV.

DKV key layout of a state entry (docs/design.md, "Key groups and keys")::

    key_group   u16 big-endian     one range = one contiguous key interval
    schema      u8                 0x00 state, 0x01 timer (dkvstream.operators.runtime.timers),
                                   0x02 state with an event-time TTL,
                                   0x03 state with a processing-time TTL
    key_len     u32 big-endian     length of the subject key
    key         key_len bytes      the subject key
    id_len      u16 big-endian     length of the state id
    state_id    id_len bytes       UTF-8 state id (attribute name by default)
    map_key     rest               MapState only: the map key, encoded by its codec

A ``ValueState`` is one entry. A ``ListState`` is one entry holding the whole list
(u32 length + bytes per element), like Flink's RocksDB list state: ``append`` is a
read-modify-write, fine for short lists. A ``MapState`` is one entry per map key under
the state's prefix, so ``items()`` is a DKV ``scan_prefix`` in map-key byte order.

A state declared with a ``StateTtl`` has schema byte 0x02 (event time) or 0x03
(processing time), and each of its entries' values starts with the entry's expiry, ms,
signed 64-bit big-endian, before the encoded value (a list's whole entry, a map's each
entry). An entry is invisible once its clock reaches the expiry (``StateClock``); the
task records both clocks in the DKV manifest at each checkpoint as an ``ExpiryFilter``
(``dkvstream.storage.dkv.expiry``), with which DKV compaction drops expired entries.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from dkvstream.operators.api.codecs import Codec
from dkvstream.operators.errors import StateTypeError
from dkvstream.storage.dkv.expiry import EXPIRY, ExpiryFilter
from dkvstream.storage.dkv.native import NATIVE

if TYPE_CHECKING:
    from dkvstream.operators.api.operator import Subject

K = TypeVar("K")
V = TypeVar("V")

SCHEMA_STATE = 0x00
SCHEMA_TIMER = 0x01  # event-time timers (dkvstream.operators.runtime.timers)
SCHEMA_STATE_TTL_EVENT = 0x02
SCHEMA_STATE_TTL_PROCESSING = 0x03
SCHEMA_PROCESSING_TIMER = 0x04  # processing-time timers
STATE_SCHEMAS = (SCHEMA_STATE, SCHEMA_STATE_TTL_EVENT, SCHEMA_STATE_TTL_PROCESSING)
_TIME_MAX = (1 << 63) - 1
_TIME_MIN = -(1 << 63)  # the watermark before the job has one (WATERMARK_MIN)

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")

# What a codec's ``encode`` raises for a value of the wrong type or range (``AttributeError``:
# ``StrCodec`` given bytes; ``struct.error``: a number out of range).
ENCODE_ERRORS = (TypeError, ValueError, AttributeError, OverflowError, struct.error)


class StateStore(Protocol):
    """The part of DKV state objects use (``dkvstream.storage.dkv.DKV`` satisfies it)."""

    def get(self, key: bytes) -> bytes | None: ...
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
    def scan_range(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]: ...
    def write_batch(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None: ...


def subject_prefix(key_group: int, key: bytes, schema: int = SCHEMA_STATE) -> bytes:
    """The DKV key prefix of every state entry of ``key`` with schema byte ``schema``
    (see module docstring)."""
    return _U16.pack(key_group) + bytes((schema,)) + _U32.pack(len(key)) + key


def state_keys(keys: Sequence[bytes], key_groups: Sequence[int], suffix: bytes,
               schema: int = SCHEMA_STATE) -> list[bytes]:
    """``subject_prefix(key_groups[i], keys[i], schema) + suffix`` for every row (aligned
    sequences), without a function call and two ``struct`` calls per row."""
    heads = {kg: _U16.pack(kg) + bytes((schema,)) for kg in set(key_groups)}
    return [heads[kg] + len(k).to_bytes(4, "big") + k + suffix for k, kg in zip(keys, key_groups)]


def state_key_column(keys: pa.Array | pa.ChunkedArray, key_groups: Any, suffix: bytes,
                     tail: tuple[Any, Any] | None = None, schema: int = SCHEMA_STATE) -> list[bytes]:
    """``state_keys`` from columns: ``subject_prefix(key_groups[i], keys[i]) + suffix +
    tail row i`` for every row, built in one C loop (``concat_rows``) from the Arrow
    buffers, without a Python object per subject key.

    Args:
        keys: the subject keys, an Arrow binary (or large binary) column without nulls.
        key_groups: their key groups (Arrow or numpy integers, or a list).
        suffix: bytes after the subject prefix in every row (the encoded state id).
        tail: an encoded column appended to each row, as ``Codec.encode_column``
            returns it (the map keys of a ``MapState``), or None.
        schema: the schema byte (``STATE_SCHEMAS``).

    Raises:
        TypeError: ``keys`` is not a binary column or holds nulls.
        ValueError: the columns differ in length, or a key group is outside [0, 65535].
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        raise TypeError(f"subject keys must be an Arrow binary column, got {keys.type}")
    if keys.null_count:
        raise TypeError(f"subject keys hold {keys.null_count} nulls; every event needs a key")
    n = len(keys)
    kg = key_groups.to_numpy() if isinstance(key_groups, (pa.Array, pa.ChunkedArray)) else np.asarray(key_groups)
    if len(kg) != n:
        raise ValueError(f"{n} keys but {len(kg)} key groups")
    if n and (kg.min() < 0 or kg.max() > 0xFFFF):
        raise ValueError(f"key groups must be in [0, 65535], got {kg.min()}..{kg.max()}")
    width = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    offsets = np.frombuffer(keys.buffers()[1], width, n + 1, keys.offset * np.dtype(width).itemsize)
    offsets = offsets.astype(np.int64)
    data = keys.buffers()[2] or b""
    # The 7 bytes before the key: key group (u16 BE), the state schema byte, key length (u32 BE).
    head = np.empty((n, 7), np.uint8)
    head[:, :2] = kg.astype(">u2").view(np.uint8).reshape(n, 2)
    head[:, 2] = schema
    head[:, 3:] = np.diff(offsets).astype(">u4").view(np.uint8).reshape(n, 4)
    parts: list[Any] = [(head, 7), (data, offsets), suffix]
    if tail is not None:
        parts.append(tail)
    if NATIVE is not None:
        return NATIVE.concat_rows(n, parts)
    return concat_rows_py(n, parts)


def concat_rows_py(n: int, parts: Sequence[Any]) -> list[bytes]:
    """``n`` rows, row i the concatenation of each part's row i (pure-Python reference
    of ``_native.concat_rows``): a part is bytes (a constant), ``(data, width)`` or
    ``(data, offsets)`` (int64, ``n + 1`` of them).

    Raises:
        ValueError: a part does not hold ``n`` rows, or its offsets are out of order.
    """
    columns = []
    for part in parts:
        if isinstance(part, bytes):
            columns.append([part] * n)
            continue
        data, second = part
        raw = data if isinstance(data, bytes) else memoryview(data).tobytes()
        if isinstance(second, int):
            if second < 0 or len(raw) < n * second:
                raise ValueError(f"part of {len(raw)} bytes does not hold {n} rows of {second}")
            columns.append([raw[i * second:(i + 1) * second] for i in range(n)])
        else:
            o = [int(x) for x in second[:n + 1]]
            if len(o) < n + 1 or any(a < 0 or a > b for a, b in zip(o, o[1:])) or (n and o[n] > len(raw)):
                raise ValueError("part's offsets are out of order or outside its data")
            columns.append([raw[o[i]:o[i + 1]] for i in range(n)])
    return [b"".join(row) for row in zip(*columns)] if columns else [b""] * n


def decode_state_key(dkv_key: bytes) -> tuple[int, bytes, str, bytes]:
    """Split a state entry's DKV key into (key group, subject key, state id, map key).

    Raises:
        ValueError: if ``dkv_key`` is not a state key.
    """
    if len(dkv_key) < 7 or dkv_key[2] not in STATE_SCHEMAS:
        raise ValueError(f"not a state key: {dkv_key!r}")
    key_group = _U16.unpack_from(dkv_key, 0)[0]
    key_len = _U32.unpack_from(dkv_key, 3)[0]
    key = dkv_key[7 : 7 + key_len]
    pos = 7 + key_len
    id_len = _U16.unpack_from(dkv_key, pos)[0]
    state_id = dkv_key[pos + 2 : pos + 2 + id_len].decode("utf-8")
    return key_group, key, state_id, dkv_key[pos + 2 + id_len :]


@dataclass(frozen=True)
class StateTtl:
    """A state's time-to-live: an entry not written (or, with ``update=
    "on_read_and_write"``, not read either) for ``ttl_ms`` of its clock is expired:
    invisible at once, as if never set, and dropped from storage by later compactions
    (Flink's ``StateTtlConfig`` with ``NeverReturnExpired``; Spark's ``TTLConfig``).

    Args:
        ttl_ms: time to live, ms (> 0).
        time: ``"event"``: the clock is the watermark; an entry written in an epoch
            expires once the watermark passes that epoch's watermark plus ``ttl_ms``.
            ``"processing"``: the clock is the epoch's processing time (wall clock, ms,
            taken by the driver once per epoch).
        update: when the expiry is reset to now plus ``ttl_ms``: ``"on_create_and_write"``
            (every write: ``set``, ``append``, a map's ``set`` of that entry) or
            ``"on_read_and_write"`` (reads that find the entry too).

    Raises:
        ValueError: ``ttl_ms`` not positive, or an unknown ``time`` or ``update``.
    """

    ttl_ms: int
    time: str = "event"
    update: str = "on_create_and_write"

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0:
            raise ValueError(f"StateTtl: ttl_ms must be a positive int (ms), got {self.ttl_ms!r}")
        if self.time not in ("event", "processing"):
            raise ValueError(f"StateTtl: time must be 'event' or 'processing', got {self.time!r}")
        if self.update not in ("on_create_and_write", "on_read_and_write"):
            raise ValueError("StateTtl: update must be 'on_create_and_write' or 'on_read_and_write', "
                             f"got {self.update!r}")

    @property
    def schema(self) -> int:
        """The schema byte of the state's DKV keys (module docstring)."""
        return SCHEMA_STATE_TTL_EVENT if self.time == "event" else SCHEMA_STATE_TTL_PROCESSING


@dataclass(frozen=True)
class StateClock:
    """The clocks TTL'd state is read and written at while a task handles one epoch.

    Attributes:
        watermark: the watermark reached before the epoch, ms: an event-time entry is
            visible iff its expiry is above it.
        epoch_watermark: the watermark the epoch reaches, ms: an event-time write sets
            the expiry to it plus the TTL. It is the clock of the epoch's DKV checkpoint
            (``compaction_filter``), so an entry is visible up to and including the first
            epoch it has not expired before.
        processing_time: the epoch's processing time, ms: processing-time entries are
            visible iff their expiry is above it, and written with it plus the TTL.
        newest_event_time: the newest event time of the task's input this epoch, ms, or
            None: before the job has a watermark (``epoch_watermark`` is the minimum),
            event-time writes count their TTL from it, so that an entry written then does
            not expire at the first watermark (deterministic: a replay reads the same
            input).
    """

    watermark: int
    epoch_watermark: int
    processing_time: int
    newest_event_time: int | None = None

    @classmethod
    def of(cls, holder: Any) -> StateClock:
        """The clock of a ``Subject`` or ``BatchContext`` (its ``state_clock``); one made
        from its ``watermark`` and the wall clock if it has none (a hand-made subject)."""
        clock = getattr(holder, "state_clock", None)
        if clock is not None:
            return clock
        return cls(holder.watermark, holder.watermark, time.time_ns() // 1_000_000)

    def now(self, ttl: StateTtl) -> int:
        """The time ``ttl``'s entries are read at, ms."""
        return self.watermark if ttl.time == "event" else self.processing_time

    def expiry(self, ttl: StateTtl) -> int:
        """The expiry a write of ``ttl``'s entries sets, ms (saturating at 2**63 - 1)."""
        if ttl.time == "processing":
            base = self.processing_time
        elif self.epoch_watermark == _TIME_MIN and self.newest_event_time is not None:
            base = self.newest_event_time  # no watermark yet (class docstring)
        else:
            base = self.epoch_watermark
        return max(_TIME_MIN, min(base + ttl.ttl_ms, _TIME_MAX))

    def compaction_filter(self) -> ExpiryFilter:
        """The DKV compaction filter of the epoch's checkpoint: entries expired at the
        watermark the epoch reaches and at its processing time, by schema byte."""
        return ExpiryFilter(2, ((SCHEMA_STATE_TTL_EVENT, self.epoch_watermark),
                                (SCHEMA_STATE_TTL_PROCESSING, self.processing_time)))


class TtlStore:
    """The ``StateStore`` a TTL'd state's objects use: the DKV entries of one state
    with their expiry header (module docstring) added on write, checked and removed on
    read, expired entries read as absent; reads refresh the expiry if the TTL says so."""

    __slots__ = ("_db", "_header", "_now", "_refresh")

    def __init__(self, db: StateStore, ttl: StateTtl, clock: StateClock) -> None:
        self._db = db
        self._now = clock.now(ttl)
        self._header = EXPIRY.pack(clock.expiry(ttl))
        self._refresh = ttl.update == "on_read_and_write"

    def get(self, key: bytes) -> bytes | None:
        """The encoded value without its expiry; None if absent or expired."""
        raw = self._db.get(key)
        if raw is None or EXPIRY.unpack_from(raw)[0] <= self._now:
            return None
        if self._refresh:
            self._db.put(key, self._header + raw[8:])
        return raw[8:]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``get`` of each key (refreshes in one write batch)."""
        now, unpack = self._now, EXPIRY.unpack_from
        out = [None if raw is None or unpack(raw)[0] <= now else raw[8:] for raw in self._db.get_many(keys)]
        if self._refresh:
            live = [i for i, v in enumerate(out) if v is not None]
            self._db.write_batch([keys[i] for i in live], [self._header + out[i] for i in live])  # type: ignore[operator]
        return out

    def put(self, key: bytes, value: bytes) -> None:
        """Stores ``value`` with the expiry of a write now."""
        self._db.put(key, self._header + value)

    def delete(self, key: bytes) -> None:
        """A tombstone, as without TTL."""
        self._db.delete(key)

    def write_batch(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """``put`` of each value, a tombstone for None, in one DKV write batch."""
        h = self._header
        self._db.write_batch(keys, [None if v is None else h + v for v in values])

    def _live(self, pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        now, unpack = self._now, EXPIRY.unpack_from
        live = [(k, v[8:]) for k, v in pairs if unpack(v)[0] > now]
        if self._refresh and live:
            self._db.write_batch([k for k, _ in live], [self._header + v for _, v in live])
        return iter(live)

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The unexpired entries under ``prefix``, values without their expiry."""
        return self._live(self._db.scan_prefix(prefix))

    def scan_range(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The unexpired entries in ``[start, end)``, values without their expiry."""
        return self._live(self._db.scan_range(start, end))


class _Spec:
    """Common part of state specs: the state id and its encoded form, and the TTL."""

    def __init__(self, id: str | None, ttl: StateTtl | None = None) -> None:
        if ttl is not None and not isinstance(ttl, StateTtl):
            raise TypeError(f"ttl must be a StateTtl or None, got {ttl!r}")
        self.id = id
        self.ttl = ttl
        self.schema = SCHEMA_STATE if ttl is None else ttl.schema
        self._id_bytes = b"" if id is None else self._encode_id(id)
        self.owner: type | None = None  # the operator class declaring it, for errors

    def store_for(self, db: StateStore, holder: Any) -> StateStore:
        """``db`` as this state's objects see it: itself, or with a TTL a ``TtlStore`` at
        the clock of ``holder`` (a ``Subject`` or ``BatchContext``)."""
        return db if self.ttl is None else TtlStore(db, self.ttl, StateClock.of(holder))

    @staticmethod
    def _encode_id(state_id: str) -> bytes:
        raw = state_id.encode("utf-8")
        if not raw or len(raw) > 0xFFFF:
            raise ValueError(f"state id must be 1..65535 UTF-8 bytes, got {state_id!r}")
        return _U16.pack(len(raw)) + raw

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner = owner
        if self.id is None:
            self.id = name
            self._id_bytes = self._encode_id(name)

    def _key(self, subject: Subject) -> bytes:
        if self.id is None:
            raise ValueError("state spec has no id: pass id=... or declare it as a class attribute")
        prefix = subject._state_prefix  # type: ignore[attr-defined]
        if self.ttl is not None:
            prefix = prefix[:2] + bytes((self.schema,)) + prefix[3:]
        return prefix + self._id_bytes


def bad_state_value(spec: _Spec, role: str, codec: Codec, values: Sequence, error: Exception) -> StateTypeError:
    """The error for a value (or map key) ``codec`` could not encode: names the operator,
    the state id, the codec, what it expects and the first offending value of ``values``.

    Args:
        spec: the state's spec.
        role: ``"value"`` or ``"map key"``.
        codec: the codec that failed.
        values: the values given to it (one, or a bulk call's).
        error: what the codec raised (the fallback when no single value fails alone).
    """
    bad, cause = None, error
    for v in values:
        try:
            codec.encode(v)
        except ENCODE_ERRORS as e:
            bad, cause = v, e
            break
    operator = getattr(spec.owner, "name", None) or getattr(spec.owner, "__qualname__", "?")
    return StateTypeError(
        f"operator {operator!r} state {spec.id!r}: the {role} codec {codec!r} ({codec.name}) expects "
        f"{codec.expects}, got {type(bad).__name__} {bad!r} ({cause}); convert the {role} before "
        f"storing it, or declare the state with a codec for this type")


def state_specs(operator: object) -> dict[str, _Spec]:
    """The state specs an operator declares, by state id (class attributes, base
    classes included)."""
    specs: dict[str, _Spec] = {}
    for cls in reversed(type(operator).__mro__):
        for value in vars(cls).values():
            if isinstance(value, _Spec) and value.id is not None:
                specs[value.id] = value
    return specs


def list_payload(raw: bytes) -> list[bytes]:
    """Split a ``ListState`` entry into its encoded elements (u32 length + bytes each)."""
    out, pos, view = [], 0, memoryview(raw)
    while pos < len(raw):
        (n,) = _U32.unpack_from(raw, pos)
        out.append(bytes(view[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return out


class ValueState(Generic[V]):
    """One value per subject key and state id."""

    __slots__ = ("_codec", "_db", "_key", "_spec")

    def __init__(self, db: StateStore, key: bytes, spec: ValueSpec[V]) -> None:
        self._db, self._key, self._codec, self._spec = db, key, spec.codec, spec

    def get(self, default: V | None = None) -> V | None:
        """Return the value, or ``default`` if none is set."""
        raw = self._db.get(self._key)
        return default if raw is None else self._codec.decode(raw)

    def set(self, value: V) -> None:
        """Store ``value``, replacing any previous one.

        Raises:
            StateTypeError: the codec cannot encode ``value`` (names operator, state, codec).
        """
        try:
            enc = self._codec.encode(value)
        except ENCODE_ERRORS as e:
            raise bad_state_value(self._spec, "value", self._codec, [value], e) from e
        self._db.put(self._key, enc)

    def drop(self) -> None:
        """Remove the value (a DKV tombstone)."""
        self._db.delete(self._key)


class ValueSpec(_Spec, Generic[V]):
    """Declares a ``ValueState``.

    Args:
        codec: the value codec.
        id: state id; defaults to the class attribute name it is assigned to.
        ttl: the entries' time to live (``StateTtl``), or None: kept until dropped.
    """

    def __init__(self, codec: Codec[V], id: str | None = None, ttl: StateTtl | None = None) -> None:
        super().__init__(id, ttl)
        self.codec = codec

    def state_for(self, subject: Subject) -> ValueState[V]:
        """The state of ``subject.key``."""
        db = subject._db if self.ttl is None else self.store_for(subject._db, subject)  # type: ignore[attr-defined]
        return ValueState(db, self._key(subject), self)


class ListState(Generic[V]):
    """A list per subject key; elements in append order."""

    __slots__ = ("_codec", "_db", "_key", "_spec")

    def __init__(self, db: StateStore, key: bytes, spec: ListSpec[V]) -> None:
        self._db, self._key, self._codec, self._spec = db, key, spec.codec, spec

    def get(self) -> list[V]:
        """Return all elements (empty list if none)."""
        raw = self._db.get(self._key)
        if raw is None:
            return []
        decode = self._codec.decode
        return [decode(e) for e in list_payload(raw)]

    def append(self, value: V) -> None:
        """Append one element.

        Raises:
            StateTypeError: the codec cannot encode ``value`` (names operator, state, codec).
        """
        try:
            enc = self._codec.encode(value)
        except ENCODE_ERRORS as e:
            raise bad_state_value(self._spec, "value", self._codec, [value], e) from e
        raw = self._db.get(self._key) or b""
        self._db.put(self._key, raw + _U32.pack(len(enc)) + enc)

    def clear(self) -> None:
        """Remove all elements."""
        self._db.delete(self._key)


class ListSpec(_Spec, Generic[V]):
    """Declares a ``ListState``; arguments as ``ValueSpec``. With a TTL the list is one
    entry with one expiry: an ``append`` refreshes the whole list (Flink expires each
    element on its own)."""

    def __init__(self, codec: Codec[V], id: str | None = None, ttl: StateTtl | None = None) -> None:
        super().__init__(id, ttl)
        self.codec = codec

    def state_for(self, subject: Subject) -> ListState[V]:
        """The state of ``subject.key``."""
        db = subject._db if self.ttl is None else self.store_for(subject._db, subject)  # type: ignore[attr-defined]
        return ListState(db, self._key(subject), self)


class MapState(Generic[K, V]):
    """A map per subject key, one DKV entry per map key."""

    __slots__ = ("_db", "_kc", "_prefix", "_spec", "_vc")

    def __init__(self, db: StateStore, prefix: bytes, spec: MapSpec[K, V]) -> None:
        self._db, self._prefix, self._spec = db, prefix, spec
        self._kc, self._vc = spec.key_codec, spec.value_codec

    def _bad(self, map_key: K, value: V, error: Exception) -> StateTypeError:
        """The error for a ``set`` that failed to encode: its map key's or its value's."""
        try:
            self._kc.encode(map_key)
        except ENCODE_ERRORS:
            return bad_state_value(self._spec, "map key", self._kc, [map_key], error)
        return bad_state_value(self._spec, "value", self._vc, [value], error)

    def get(self, map_key: K, default: V | None = None) -> V | None:
        """Return the value at ``map_key``, or ``default``.

        Raises:
            StateTypeError: the key codec cannot encode ``map_key``.
        """
        try:  # inline, not ``_map_key``: one call less per state access
            dkv_key = self._prefix + self._kc.encode(map_key)
        except ENCODE_ERRORS as e:
            raise bad_state_value(self._spec, "map key", self._kc, [map_key], e) from e
        raw = self._db.get(dkv_key)
        return default if raw is None else self._vc.decode(raw)

    def set(self, map_key: K, value: V) -> None:
        """Store ``value`` at ``map_key``.

        Raises:
            StateTypeError: a codec cannot encode ``map_key`` or ``value`` (names
                operator, state, codec).
        """
        try:
            dkv_key = self._prefix + self._kc.encode(map_key)
            enc = self._vc.encode(value)
        except ENCODE_ERRORS as e:
            raise self._bad(map_key, value, e) from e
        self._db.put(dkv_key, enc)

    def delete(self, map_key: K) -> None:
        """Remove ``map_key``; no error if absent.

        Raises:
            StateTypeError: the key codec cannot encode ``map_key``.
        """
        try:
            dkv_key = self._prefix + self._kc.encode(map_key)
        except ENCODE_ERRORS as e:
            raise bad_state_value(self._spec, "map key", self._kc, [map_key], e) from e
        self._db.delete(dkv_key)

    def items(self) -> Iterator[tuple[K, V]]:
        """All entries in ascending encoded-map-key order."""
        n = len(self._prefix)
        kd, vd = self._kc.decode, self._vc.decode
        for k, v in self._db.scan_prefix(self._prefix):
            yield kd(k[n:]), vd(v)

    def keys(self) -> Iterator[K]:
        """All map keys in ascending encoded order."""
        for k, _ in self.items():
            yield k

    def size(self) -> int:
        """Number of entries (a prefix scan)."""
        return sum(1 for _ in self._db.scan_prefix(self._prefix))

    def clear(self) -> None:
        """Remove every entry."""
        for k, _ in list(self._db.scan_prefix(self._prefix)):
            self._db.delete(k)


class MapSpec(_Spec, Generic[K, V]):
    """Declares a ``MapState``.

    Args:
        key_codec: codec of map keys (order-preserving if ``items()`` order matters).
        value_codec: codec of map values.
        id: state id; defaults to the class attribute name.
        ttl: each map entry's time to live (``StateTtl``), or None.
    """

    def __init__(self, key_codec: Codec[K], value_codec: Codec[V], id: str | None = None,
                 ttl: StateTtl | None = None) -> None:
        super().__init__(id, ttl)
        self.key_codec, self.value_codec = key_codec, value_codec

    def state_for(self, subject: Subject) -> MapState[K, V]:
        """The state of ``subject.key``."""
        db = subject._db if self.ttl is None else self.store_for(subject._db, subject)  # type: ignore[attr-defined]
        return MapState(db, self._key(subject), self)
