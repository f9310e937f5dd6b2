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
import pyarrow as pa

T = TypeVar("T")

_I64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_SIGN = 1 << 63
# msgpack arrays as tuples: the rows of ``RecordCodec.decode_rows``, decoded without a
# Python frame per value.
_unpack_tuple = functools.partial(msgpack.unpackb, raw=False, use_list=False)


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

    Args:
        fields: ``{name: pyarrow type}`` (int, float, bool, string and binary types).
    """

    name = "record"

    def __init__(self, fields: dict[str, pa.DataType]) -> None:
        if not fields:
            raise ValueError("RecordCodec needs at least one field")
        self.fields = dict(fields)
        self._names = tuple(self.fields)
        self.arrow_type = pa.struct([pa.field(n, t) for n, t in self.fields.items()])
        self.name = "record<" + ",".join(f"{n}:{t}" for n, t in self.fields.items()) + ">"
        self.expects = "a dict with fields " + ", ".join(f"{n}: {t}" for n, t in self.fields.items())

    def encode(self, value: dict) -> bytes:
        get = value.get
        return msgpack.packb([get(n) for n in self._names], use_bin_type=True)

    def encode_many(self, values: Sequence[dict]) -> list[bytes]:
        # One Packer per call (a Packer is not safe to share between threads), and the
        # fields taken by one itemgetter call per record; byte-identical to ``encode``
        # (msgpack writes a tuple as the array a list makes).
        pack = msgpack.Packer(use_bin_type=True).pack
        # Plain dicts only: a mapping with ``__missing__`` (defaultdict, Counter) gives
        # another value for a missing field under ``[]`` than under ``get``.
        if len(self._names) > 1 and set(map(type, values)) == {dict}:
            try:
                return list(map(pack, map(itemgetter(*self._names), values)))
            except KeyError:  # a record missing a field: encode it as null
                pass
        return [pack([v.get(n) for n in self._names]) for v in values]

    def decode(self, data: bytes) -> dict:
        values = msgpack.unpackb(data, raw=False)
        if len(values) != len(self._names):
            raise ValueError(f"record has {len(values)} fields, codec {self.name} expects {len(self._names)}")
        return dict(zip(self._names, values))

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
        return list(map(pack, rows))

    def decode_rows(self, raws: Sequence[bytes | None]) -> list[tuple | None]:
        """Each value as a tuple of its field values in ``fields`` order (None stays
        None): ``decode_many`` without a dict per record, for operators that aggregate
        by position.

        Raises:
            ValueError: a value does not hold one record of this codec's field count
                (msgpack's ``ExtraData``, a ``ValueError``, for trailing bytes).
        """
        present = [raw for raw in raws if raw is not None]
        rows = list(map(_unpack_tuple, present))
        n = len(self._names)
        if set(map(type, rows)) - {tuple} or set(map(len, rows)) - {n}:
            bad = next(r for r in rows if type(r) is not tuple or len(r) != n)
            raise ValueError(f"record {bad!r} is not {n} fields of codec {self.name}")
        if len(present) == len(raws):
            return rows
        it = iter(rows)
        return [None if raw is None else next(it) for raw in raws]

    def __repr__(self) -> str:
        return f"RecordCodec({self.fields!r})"
