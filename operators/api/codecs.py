"""Codecs: how state values and map keys become DKV bytes and back.

Every codec has a stable ``name`` (written into state-reader output so old state stays
readable) and an ``arrow_type`` so state can be read back as typed Arrow columns.
Codecs used for map keys should be order-preserving when ``MapState.items()`` order
matters: ``IntCodec`` and ``StrCodec``/``BytesCodec`` are.
"""
from __future__ import annotations

import functools
import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, Generic, TypeVar

import msgpack
import numpy as np
import pyarrow as pa

from dkvstream.storage.dkv.native import NATIVE

T = TypeVar("T")

_I64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_SIGN = 1 << 63
# msgpack arrays as tuples: the rows of ``RecordCodec.decode_rows``, decoded without a
# Python frame per value.
_unpack_tuple = functools.partial(msgpack.unpackb, raw=False, use_list=False)
# The C loops take a schema version's header themselves (their third argument) in a
# module built from this source; one built before that takes two arguments, and the
# header is then added and checked here, one Python step per value.
_NATIVE_HEADERS = NATIVE is not None and "header" in (NATIVE.unpack_int_rows.__doc__ or "")


class Codec(ABC, Generic[T]):
    """Encodes values of type ``T`` to bytes and back.

    Subclasses define ``name`` and ``arrow_type`` and implement both directions.
    ``decode(encode(x)) == x`` for every accepted ``x``.
    """

    name: str = "codec"
    arrow_type: pa.DataType = pa.binary()
    #: what ``encode`` accepts, in words, for error messages ("int", "str", ...)
    expects: str = "a value of this codec"

    @abstractmethod
    def encode(self, value: T) -> bytes:
        """Return the bytes of ``value``; raise ``TypeError``/``ValueError`` on bad input."""

    @abstractmethod
    def decode(self, data: bytes) -> T:
        """Return the value encoded in ``data``."""

    def encode_many(self, values: Sequence[T]) -> list[bytes]:
        """``encode`` of every value, in order (the vectorised operator form's bulk
        state writes); subclasses may do it without a call per value."""
        return list(map(self.encode, values))

    def decode_many(self, raws: Sequence[bytes | None]) -> list[T | None]:
        """``decode`` of every value, in order; None stays None (an absent entry)."""
        decode = self.decode
        return [None if raw is None else decode(raw) for raw in raws]

    def encode_column(self, values: Any) -> tuple[Any, Any]:
        """The encodings of ``values`` as one buffer: ``(data, offsets)``, Arrow's binary
        layout (``offsets``: int64 numpy array, ``len(values) + 1`` of them), or
        ``(data, width)`` for a codec whose encodings all have ``width`` bytes. What
        bulk state accesses build DKV keys from (``state.concat_rows``).

        Args:
            values: a sequence, numpy array or Arrow array of values of this codec.

        Raises:
            as ``encode_many``.
        """
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = values.to_pylist()
        encoded = self.encode_many(values)
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
        return b"".join(encoded), offsets

    def arrow_value(self, data: bytes) -> Any:
        """``data`` as a Python value of ``arrow_type`` (the state reader's column)."""
        return self.decode(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BytesCodec(Codec[bytes]):
    """Raw bytes, unchanged (order-preserving)."""

    name = "bytes"
    arrow_type = pa.binary()
    expects = 'bytes'

    def encode(self, value: bytes) -> bytes:
        if isinstance(value, int):  # bytes(5) would silently store five zero bytes
            raise TypeError(f"expected bytes, got int {value!r}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data


class StrCodec(Codec[str]):
    """UTF-8 text (order-preserving by code point)."""

    name = "str"
    arrow_type = pa.string()
    expects = 'str'

    def encode(self, value: str) -> bytes:
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return data.decode("utf-8")


class IntCodec(Codec[int]):
    """Signed 64-bit integers as 8 big-endian bytes with the sign bit flipped, so byte
    order equals numeric order (usable for map keys and range scans)."""

    name = "int64"
    arrow_type = pa.int64()
    expects = 'int (64-bit signed)'

    def encode(self, value: int) -> bytes:
        # No mask: ``pack`` raises ``struct.error`` outside [-2**63, 2**63) rather than
        # store a wrapped-around value.
        return _I64.pack(value + _SIGN)

    def encode_many(self, values: Sequence[int]) -> list[bytes]:
        # ``encode`` inlined: no method call per value (map keys of bulk state accesses).
        pack = _I64.pack
        return [pack(v + _SIGN) for v in values]

    def decode(self, data: bytes) -> int:
        return _I64.unpack(data)[0] - _SIGN

    def encode_column(self, values: Any) -> tuple[Any, Any]:
        # Adding 2**63 modulo 2**64 flips the sign bit: one numpy pass, 8 bytes a value.
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            if values.null_count:
                raise TypeError(f"{self.name} codec: {values.null_count} null values; expects {self.expects}")
            values = values.to_numpy()
        arr = np.asarray(values)
        if arr.dtype.kind not in "iu" or (arr.dtype.kind == "u" and arr.size and arr.max() >= _SIGN):
            return super().encode_column(arr.tolist())  # floats, objects, big ints: checked per value
        encoded = (arr.astype(np.int64).view(np.uint64) ^ np.uint64(_SIGN)).astype(">u8")
        return encoded, 8


class FloatCodec(Codec[float]):
    """IEEE-754 float64, big-endian (not order-preserving for negatives)."""

    name = "float64"
    arrow_type = pa.float64()
    expects = 'float'

    def encode(self, value: float) -> bytes:
        return _F64.pack(value)

    def decode(self, data: bytes) -> float:
        return _F64.unpack(data)[0]


class JsonCodec(Codec[Any]):
    """Any JSON-serialisable value, as compact UTF-8 JSON."""

    name = "json"
    arrow_type = pa.string()
    expects = 'a JSON-serialisable value'

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data)

    def arrow_value(self, data: bytes) -> str:
        return data.decode("utf-8")


class MsgpackCodec(Codec[Any]):
    """Any msgpack-serialisable value (smaller and faster than JSON)."""

    name = "msgpack"
    arrow_type = pa.binary()
    expects = 'a msgpack-serialisable value'

    def encode(self, value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False)

    def arrow_value(self, data: bytes) -> bytes:
        return data


class RecordCodec(Codec[dict]):
    """Records with a fixed Arrow schema, stored as a msgpack array in field order.

    Field names are not repeated per value, and the state reader decodes records into
    an Arrow struct column of ``arrow_type``. Missing fields encode as null.

    The fields may change between releases of a job (add, drop, reorder, widen a type):
    the job's checkpoint records each version of a state's fields and the runtime binds
    that history to the codec (``bind``), so an entry written under an older version is
    read in the current fields (``dkvstream.operators.api.state_schema``; the rules are
    ``resolution_problem``'s). Entries of version v > 0 start with a 3-byte version
    header (``VERSION_MARK``, v as u16 big-endian) before the array; version 0 entries
    have none, so state written before a schema changed stays readable as it is.

    Args:
        fields: ``{name: pyarrow type}`` (int, float, bool, string and binary types).
        defaults: ``{name: value}``, what an entry written before a field existed
            reads as for that field (null for an added field without one).

    Raises:
        ValueError: no fields, or a default for a field not in ``fields`` or not a
            value of its type.
    """

    name = "record"

    def __init__(self, fields: dict[str, pa.DataType], defaults: dict[str, Any] | None = None) -> None:
        if not fields:
            raise ValueError("RecordCodec needs at least one field")
        self.fields = dict(fields)
        self.defaults = dict(defaults or {})
        unknown = sorted(set(self.defaults) - set(self.fields))
        if unknown:
            raise ValueError(f"RecordCodec defaults name fields it does not have: {', '.join(unknown)} "
                             f"(fields: {', '.join(self.fields)})")
        for n, v in self.defaults.items():
            try:
                pa.array([v], self.fields[n])
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                raise ValueError(f"RecordCodec default of field {n!r} ({self.fields[n]}): {v!r} is not "
                                 f"a value of that type ({' '.join(str(e).split())})") from None
        self._names = tuple(self.fields)
        self.arrow_type = pa.struct([pa.field(n, t) for n, t in self.fields.items()])
        self.name = "record<" + ",".join(f"{n}:{t}" for n, t in self.fields.items()) + ">"
        self.expects = "a dict with fields " + ", ".join(f"{n}: {t}" for n, t in self.fields.items())
        # Unbound: the only version is this one (version 0, no header); ``bind`` sets these.
        self.version = 0
        self.versions: tuple[tuple[tuple[str, str], ...], ...] = (self.schema_fields(),)
        self._header = b""
        self._plans: tuple[tuple[tuple[int, Any, Any], ...] | None, ...] = (None,)

    def schema_fields(self) -> tuple[tuple[str, str], ...]:
        """The fields as ``((name, Arrow type name), ...)`` in order: what a checkpoint
        records of this version (``str(pa type)``, e.g. ``"int64"``, ``"double"``)."""
        return tuple((n, str(t)) for n, t in self.fields.items())

    def bind(self, versions: Sequence[Sequence[Sequence[str]]]) -> RecordCodec:
        """A copy of this codec that reads entries of every version in ``versions`` and
        writes the last one.

        Args:
            versions: each version's fields as ``schema_fields`` gives them, oldest
                first (a checkpoint's record, JSON lists accepted); the last one must
                be this codec's fields.

        Returns:
            A ``RecordCodec`` with the same fields and defaults; ``version`` is
            ``len(versions) - 1``.

        Raises:
            ValueError: the last version is not this codec's fields, there are more
                than 65,536 versions, or an older version cannot be read in these
                fields (``resolution_problem``).
        """
        history = tuple(tuple((str(n), str(t)) for n, t in v) for v in versions)
        if not history or history[-1] != self.schema_fields():
            raise ValueError(f"codec {self.name}: the newest recorded version must be its own fields, "
                             f"got {history[-1] if history else 'none'}")
        if len(history) > 1 << 16:
            raise ValueError(f"codec {self.name}: {len(history)} schema versions, at most 65,536")
        bound = RecordCodec(self.fields, self.defaults)
        plans: list = []
        for w, writer in enumerate(history[:-1]):
            problem = resolution_problem(writer, bound)
            if problem is not None:
                raise ValueError(f"codec {self.name} cannot read version {w}: {problem}")
            plans.append(bound._plan(writer))
        plans.append(None)  # the current version: read as it is
        bound.version = len(history) - 1
        bound.versions = history
        bound._header = b"" if bound.version == 0 else _version_header(bound.version)
        bound._plans = tuple(plans)
        return bound

    def _plan(self, writer: Sequence[tuple[str, str]]) -> tuple[tuple[int, Any, Any], ...]:
        """How to read a row of ``writer``'s fields in this codec's: per field of this
        codec, ``(position in the writer's row or -1, conversion or None, default)``."""
        at = {name: (i, t) for i, (name, t) in enumerate(writer)}
        plan = []
        for name, t in self.fields.items():
            if name not in at:
                plan.append((-1, None, self.defaults.get(name)))
                continue
            i, wt = at[name]
            convert = float if wt in _INTEGER_TYPES and str(t) in _FLOAT_TYPES else None
            plan.append((i, convert, None))
        return tuple(plan)

    def _split(self, data: bytes) -> tuple[int, bytes]:
        """``(writer version, msgpack array bytes)`` of a stored value."""
        if data[:1] != _VERSION_MARK_BYTE:
            return 0, data
        if len(data) < 3:
            raise ValueError(f"codec {self.name}: a {len(data)}-byte value is a truncated version header")
        return int.from_bytes(data[1:3], "big"), data[3:]

    def _read_row(self, data: bytes) -> tuple:
        """One stored value of any known version as a tuple in this codec's field order.

        Raises:
            ValueError: a version this codec was not bound to, or a field count that
                is not the version's.
        """
        w, body = self._split(data)
        row = _unpack_tuple(body)
        if w >= len(self.versions):
            raise ValueError(
                f"codec {self.name}: value written with schema version {w}, this codec knows versions "
                f"0..{len(self.versions) - 1}; read state through the job (its restart binds the "
                f"checkpoint's schema history) or dkvstream.operators.tools.state_reader")
        writer = self.versions[w]
        if type(row) is not tuple or len(row) != len(writer):
            raise ValueError(f"record {row!r} is not {len(writer)} fields of codec {self.name} version {w}")
        plan = self._plans[w]
        if plan is None:
            return row
        return tuple(default if i < 0 else (row[i] if convert is None or row[i] is None else convert(row[i]))
                     for i, convert, default in plan)

    def _current_bodies(self, present: list[bytes]) -> list[bytes] | None:
        """The msgpack arrays of ``present`` if every one is of the current version
        (its header taken off), else None (some must be resolved, ``_read_row``)."""
        header = self._header
        if not header:  # version 0 is the only version: no value has a header
            return present
        k = len(header)
        if not all(r[:k] == header for r in present):
            return None
        return [r[k:] for r in present]

    def encode(self, value: dict) -> bytes:
        get = value.get
        return self._header + msgpack.packb([get(n) for n in self._names], use_bin_type=True)

    def encode_many(self, values: Sequence[dict]) -> list[bytes]:
        # One Packer per call (a Packer is not safe to share between threads), and the
        # fields taken by one itemgetter call per record; byte-identical to ``encode``
        # (msgpack writes a tuple as the array a list makes).
        pack = msgpack.Packer(use_bin_type=True).pack
        # Plain dicts only: a mapping with ``__missing__`` (defaultdict, Counter) gives
        # another value for a missing field under ``[]`` than under ``get``.
        if len(self._names) > 1 and set(map(type, values)) == {dict}:
            try:
                return self._headed(list(map(pack, map(itemgetter(*self._names), values))))
            except KeyError:  # a record missing a field: encode it as null
                pass
        return self._headed([pack([v.get(n) for n in self._names]) for v in values])

    def _headed(self, encoded: list[bytes]) -> list[bytes]:
        """``encoded`` with the current version's header (none for version 0)."""
        header = self._header
        return [header + e for e in encoded] if header else encoded

    def decode(self, data: bytes) -> dict:
        if self.version == 0 and data[:1] != _VERSION_MARK_BYTE:
            values = msgpack.unpackb(data, raw=False)
            if len(values) != len(self._names):
                raise ValueError(f"record has {len(values)} fields, codec {self.name} expects {len(self._names)}")
            return dict(zip(self._names, values))
        return dict(zip(self._names, self._read_row(data)))

    def encode_rows(self, rows: Sequence[Sequence[Any]]) -> list[bytes]:
        """Records given as rows (a tuple or list of the field values in ``fields``
        order): the bytes ``encode`` gives the same record as a dict, without building
        the dict.

        Raises:
            ValueError: a row's length differs from the number of fields.
        """
        n = len(self._names)
        if any(len(r) != n for r in rows):
            bad = next(r for r in rows if len(r) != n)
            raise ValueError(f"row {bad!r} has {len(bad)} fields, codec {self.name} expects {n}")
        pack = msgpack.Packer(use_bin_type=True).pack
        return self._headed(list(map(pack, rows)))

    def decode_rows(self, raws: Sequence[bytes | None]) -> list[tuple | None]:
        """Each value as a tuple of its field values in ``fields`` order (None stays
        None): ``decode_many`` without a dict per record, for operators that aggregate
        by position. Values of an older schema version are resolved to these fields
        (``bind``), one at a time.

        Raises:
            ValueError: a value does not hold one record of this codec's field count
                (msgpack's ``ExtraData``, a ``ValueError``, for trailing bytes).
        """
        present = [raw for raw in raws if raw is not None]
        bodies = self._current_bodies(present)
        if bodies is None:
            rows = list(map(self._read_row, present))
        else:
            rows = list(map(_unpack_tuple, bodies))
            n = len(self._names)
            if set(map(type, rows)) - {tuple} or set(map(len, rows)) - {n}:
                bad = next(r for r in rows if type(r) is not tuple or len(r) != n)
                raise ValueError(f"record {bad!r} is not {n} fields of codec {self.name}")
        if len(present) == len(raws):
            return rows
        it = iter(rows)
        return [None if raw is None else next(it) for raw in raws]

    def decode_struct(self, raws: Sequence[bytes | None]) -> pa.StructArray:
        """The values as one Arrow column of ``arrow_type``: a null row where a value is
        None (absent), a null field where the record holds null. Records of int64 fields
        only, all of the current schema version, are decoded in one C loop
        (``_native.unpack_int_rows``) when it is built; older versions are resolved.

        Raises:
            ValueError: a value does not hold one record of this codec (``decode_rows``).
        """
        raws = raws if type(raws) is list else list(raws)
        n, f = len(raws), len(self._names)
        if NATIVE is not None and self._all_int64 and f <= 15:
            if _NATIVE_HEADERS:  # the C loop checks and skips the current version's header
                got = NATIVE.unpack_int_rows(raws, f, self._header)
            elif not self._header:
                got = NATIVE.unpack_int_rows(raws, f)
            else:
                present = [r for r in raws if r is not None]
                bodies = self._current_bodies(present)
                if bodies is not None and len(bodies) < n:
                    it = iter(bodies)
                    bodies = [None if r is None else next(it) for r in raws]
                got = None if bodies is None else NATIVE.unpack_int_rows(bodies, f)
            if got is not None:
                values, valid, present = got
                values = np.frombuffer(values, np.int64).reshape(n, f)
                valid = np.frombuffer(valid, np.bool_).reshape(n, f)
                return self._int_struct(values, valid, np.frombuffer(present, np.bool_))
            if _NATIVE_HEADERS and len(self.versions) > 1:
                got = self._int_rows_by_version(raws)
                if got is not None:
                    return self._int_struct(*got)
        rows = self.decode_rows(raws)
        children = [pa.array([None if r is None else r[j] for r in rows], t)
                    for j, t in enumerate(self.fields.values())]
        return pa.StructArray.from_arrays(children, fields=list(self.arrow_type),
                                          mask=pa.array([r is None for r in rows], pa.bool_()))

    def _int_struct(self, values: np.ndarray, valid: np.ndarray, present: np.ndarray) -> pa.StructArray:
        """The struct column of int64 fields from an (n, fields) matrix, its validity and
        the rows present."""
        children = [pa.array(values[:, j], pa.int64(), mask=~valid[:, j]) for j in range(len(self._names))]
        return pa.StructArray.from_arrays(children, fields=list(self.arrow_type), mask=pa.array(~present))

    def _int_rows_by_version(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``decode_struct``'s matrices (values, valid, present) for int64 fields over
        values of several schema versions: one C pass (``unpack_int_rows``) per writer
        version, its fields placed by ``_plan``; None when a version has a field that is
        not an integer (or more than 15), or a value is not a record of its version
        (the general path then reads them one by one, and names a bad one)."""
        n, f = len(raws), len(self._names)
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(raws):
            if r is not None:
                groups.setdefault(int.from_bytes(r[1:3], "big") if r[:1] == _VERSION_MARK_BYTE else 0, []).append(i)
        values, valid = np.zeros((n, f), np.int64), np.zeros((n, f), np.bool_)
        for w, rows in groups.items():
            writer = self.versions[w] if w < len(self.versions) else None
            if writer is None or len(writer) > 15 or any(t not in _INTEGER_TYPES for _, t in writer):
                return None
            got = NATIVE.unpack_int_rows([raws[i] for i in rows], len(writer), _version_header(w) if w else b"")
            if got is None:
                return None
            wv = np.frombuffer(got[0], np.int64).reshape(len(rows), len(writer))
            wok = np.frombuffer(got[1], np.bool_).reshape(len(rows), len(writer))
            at = np.asarray(rows)
            plan = self._plans[w] or tuple((j, None, None) for j in range(f))
            for j, (i, _, default) in enumerate(plan):
                if i >= 0:
                    values[at, j], valid[at, j] = wv[:, i], wok[:, i]
                elif default is not None:
                    values[at, j], valid[at, j] = default, True
        return values, valid, np.array([r is not None for r in raws], np.bool_)

    def encode_struct(self, values: pa.StructArray | pa.Table | dict[str, Any]) -> list[bytes]:
        """Records given as columns (a struct column or table with this codec's fields,
        or ``{field: array or list}``): the bytes ``encode`` gives each row as a dict; a
        null is stored as null. Int64 fields without nulls are encoded in one C loop
        (``_native.pack_int_rows``) when it is built.

        Raises:
            ValueError: a field is missing, or the columns differ in length.
            TypeError: a struct column holds a null row (a record must be given).
        """
        if isinstance(values, (pa.StructArray, pa.ChunkedArray)):
            if values.null_count:
                raise TypeError(f"codec {self.name}: {values.null_count} null records; give a record in every row "
                                f"(delete the entry instead)")
            values = pa.Table.from_struct_array(values) if isinstance(values, pa.ChunkedArray) else \
                pa.table(values.flatten(), names=[f.name for f in values.type])
        get = values.column if isinstance(values, pa.Table) else values.__getitem__
        try:
            columns = [get(n) for n in self._names]
        except KeyError as e:
            raise ValueError(f"codec {self.name}: no column for field {e}") from None
        lengths = {len(c) for c in columns}
        if len(lengths) > 1:
            raise ValueError(f"codec {self.name}: columns of different lengths {sorted(lengths)}")
        if NATIVE is not None and self._all_int64 and len(columns) <= 15:
            arrays = [c for c in columns if isinstance(c, (pa.Array, pa.ChunkedArray))]
            if len(arrays) == len(columns) and all(a.type == pa.int64() and not a.null_count for a in arrays):
                matrix = np.column_stack([a.to_numpy() for a in arrays]) if lengths != {0} else np.zeros((0, 1))
                matrix = np.ascontiguousarray(matrix, np.int64)
                if _NATIVE_HEADERS:
                    return NATIVE.pack_int_rows(matrix, len(columns), self._header)
                return self._headed(NATIVE.pack_int_rows(matrix, len(columns)))
        lists = [c.to_pylist() if isinstance(c, (pa.Array, pa.ChunkedArray)) else list(c) for c in columns]
        return self.encode_rows(list(zip(*lists)))

    @functools.cached_property
    def _all_int64(self) -> bool:
        return all(t == pa.int64() for t in self.fields.values())

    def __repr__(self) -> str:
        if self.defaults:
            return f"RecordCodec({self.fields!r}, defaults={self.defaults!r})"
        return f"RecordCodec({self.fields!r})"


#: The first byte of a ``RecordCodec`` value of schema version > 0. msgpack never uses
#: 0xC1 ("never used" in its specification), so no version-0 value starts with it.
VERSION_MARK = 0xC1
_VERSION_MARK_BYTE = bytes([VERSION_MARK])


def _version_header(version: int) -> bytes:
    """The 3 bytes before a ``RecordCodec`` value of schema ``version`` (> 0)."""
    return _VERSION_MARK_BYTE + version.to_bytes(2, "big")


_INTEGER_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOAT_TYPES = ("halffloat", "float", "double")
# Arrow type name -> the type names a value of it can be read as without loss of its
# kind, as Avro's promotions (int -> long, float, double; float -> double; string <->
# bytes excluded: a text/bytes change is a type change here).
_WIDENS_TO: dict[str, frozenset[str]] = {
    "int8": frozenset({"int16", "int32", "int64", "float", "double"}),
    "int16": frozenset({"int32", "int64", "float", "double"}),
    "int32": frozenset({"int64", "float", "double"}),
    "int64": frozenset({"float", "double"}),
    "uint8": frozenset({"uint16", "uint32", "uint64", "int16", "int32", "int64", "float", "double"}),
    "uint16": frozenset({"uint32", "uint64", "int32", "int64", "float", "double"}),
    "uint32": frozenset({"uint64", "int64", "float", "double"}),
    "uint64": frozenset({"float", "double"}),
    "halffloat": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"large_string"}),
    "large_string": frozenset({"string"}),
    "binary": frozenset({"large_binary"}),
    "large_binary": frozenset({"binary"}),
}


def resolution_problem(writer: Sequence[tuple[str, str]], reader: RecordCodec) -> str | None:
    """Why entries written with ``writer``'s fields cannot be read as ``reader``'s, or
    None when they can.

    Allowed (Avro's schema resolution, by field name): a field added (read as the
    reader's default, or null), a field dropped (ignored), fields reordered, and a type
    widened: a smaller integer to a larger one, an integer to a float, a float to a
    double. Anything else that changes a field's type is refused: a narrowing (the old
    values may not fit) or another type (int64 to string).

    Args:
        writer: the writer's fields, ``((name, Arrow type name), ...)``.
        reader: the codec that is to read them.

    Returns:
        None, or one sentence naming the field, e.g. ``"field 'n' was int64, is int32:
        a narrowing"``.
    """
    for name, was in writer:
        if name not in reader.fields:
            continue
        now = str(reader.fields[name])
        if now == was or now in _WIDENS_TO.get(was, ()):
            continue
        kind = "a narrowing" if was in _WIDENS_TO.get(now, ()) else "a type change"
        return f"field {name!r} was {was}, is {now}: {kind}"
    return None
