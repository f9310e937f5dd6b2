"""The whole-store scan of an erasure: which objects still hold a key's bytes.

``scan_store(store, key, prefix)`` LISTs every object under ``prefix`` (the whole store by
default: other jobs, savepoints, sources, topics) and reads each one whole. An object
*holds* the key when the key's bytes occur in it:

* in its raw bytes (any object: text, JSON, Parquet footers and statistics, uncompressed
  pages, WAL records, uncompressed log batches);
* or, after decoding what a raw search cannot see through:

  - DKV SSTables (magic ``DKVSST``; zstd-compressed blocks): every key and value;
  - DKV WAL objects (``DKVWAL``): every record's key and value (also found raw);
  - log segment files (``DKVLOG01``, ``dkvstream.storage.log``; batches may be
    zstd-compressed): every record's key and value;
  - Parquet files (``PAR1``; compressed, dictionary- or delta-encoded pages): every
    string and binary value of every column (nested ones flattened);
  - JSON and JSON lines (Delta logs, DKV manifests and compaction results, checkpoint
    and control records): every string, a string that is itself JSON (a Delta
    ``stats`` field, whose ``minValues``/``maxValues`` may be the key) decoded again, and
    a string of hex digits (DKV manifests record tables' first and last keys in hex)
    taken as the bytes it spells too;
  - a zstd frame (magic ``28 b5 2f fd``): its decompressed bytes, searched again.

The search is a substring search, so a key of a byte or two is found nearly everywhere:
scan for keys as long as the subject identifiers they are. An object that does not
decode as its magic says is reported as holding the key (``how`` names the error): what
cannot be read cannot be proven clean.

Cost: one LIST page per 1,000 objects, one GET of every object, and the decoding, on the
caller's machine; a store of many GB takes minutes. Scan a job (``prefix="jobs/<job>/"``)
to check one job.
"""
from __future__ import annotations

import io
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass, field

import zstandard

from dkvstream.storage.dkv.sstable import MAGIC as SST_MAGIC
from dkvstream.storage.dkv.sstable import SSTableReader
from dkvstream.storage.dkv.wal import MAGIC as WAL_MAGIC
from dkvstream.storage.dkv.wal import decode_wal_columns
from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore, map_requests
from dkvstream.storage.objectstore.memory import MemoryObjectStore

_SST_MAGIC = SST_MAGIC.to_bytes(8, "little")  # the footer's last 8 bytes
_LOG_MAGIC = b"DKVLOG01"
_PARQUET_MAGIC = b"PAR1"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_HEX = frozenset(string.hexdigits)


@dataclass(frozen=True)
class Holding:
    """An object holding the key: ``key`` (the object's key) and ``how`` it was found
    (``"raw bytes"``, ``"sstable"``, ``"wal"``, ``"log segment"``, ``"parquet"``,
    ``"json"``, ``"zstd"``, or ``"undecodable <kind>: <error>"``)."""

    key: str
    how: str


@dataclass
class ScanResult:
    """What ``scan_store`` found.

    Attributes:
        prefix: the prefix scanned ("" = the whole store).
        objects_scanned: objects read.
        bytes_scanned: their total size, bytes.
        holding: the objects holding the key, in key order (empty: the key is gone).
    """

    prefix: str
    objects_scanned: int = 0
    bytes_scanned: int = 0
    holding: list[Holding] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "objects_scanned": self.objects_scanned,
                "bytes_scanned": self.bytes_scanned,
                "holding": [{"key": h.key, "how": h.how} for h in self.holding]}


def scan_store(store: ObjectStore, key: bytes, prefix: str = "") -> ScanResult:
    """Lists every object under ``prefix`` and returns those holding ``key`` (module
    docstring).

    Args:
        store: the object store.
        key: the subject key's bytes (non-empty).
        prefix: where to scan; "" scans the whole store.

    Returns:
        A ``ScanResult``.

    Raises:
        ValueError: ``key`` is empty.
    """
    if not key:
        raise ValueError("scan_store: the key is empty; every object would hold it")
    result = ScanResult(prefix)

    def one(obj: str) -> tuple[int, str | None]:
        try:
            data = store.get(obj)
        except ObjectNotFoundError:  # deleted since the listing: holds nothing now
            return 0, None
        return len(data), object_holds(store, obj, data, key)

    keys = sorted(store.list(prefix))
    for obj, (size, how) in zip(keys, map_requests(one, keys)):
        result.objects_scanned += 1
        result.bytes_scanned += size
        if how is not None:
            result.holding.append(Holding(obj, how))
    return result


def object_holds(store: ObjectStore, obj: str, data: bytes, key: bytes) -> str | None:
    """How object ``obj`` (its bytes ``data``) holds ``key``, or None if it does not
    (module docstring)."""
    if key in data:
        return "raw bytes"
    kind = _kind(data)
    if kind is None:
        return None
    try:
        found = any(key in piece for piece in _DECODERS[kind](store, obj, data))
    except Exception as e:  # noqa: BLE001 - an object that does not decode is not proven clean
        return f"undecodable {kind}: {type(e).__name__}: {e}"
    return kind if found else None


def _kind(data: bytes) -> str | None:
    if data.endswith(_SST_MAGIC):
        return "sstable"
    if data.startswith(WAL_MAGIC):
        return "wal"
    if data.endswith(_LOG_MAGIC):
        return "log segment"
    if data.startswith(_PARQUET_MAGIC) and data.endswith(_PARQUET_MAGIC):
        return "parquet"
    if data.startswith(_ZSTD_MAGIC):
        return "zstd"
    if data[:1] in (b"{", b"["):
        return "json"
    return None


def _sstable(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    # A reader over a private copy: the job's own block cache is not involved.
    for k, _seq, v in SSTableReader(MemoryObjectStore(), obj, whole=data).iter_from(b""):
        yield k
        if v is not None:
            yield v


def _wal(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    _seqs, keys, values = decode_wal_columns(data, store.uri(obj))
    yield from keys
    yield from (v for v in values if v is not None)


def _log_segment(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    from dkvstream.storage.log.segment import chunk_batches, read_directory

    where = store.uri(obj)
    for chunk in read_directory(store, obj, data):
        for _pos, batch in chunk_batches(data, chunk, 0, where):
            yield from (k for k in batch.keys() if k is not None)
            yield from (v for v in batch.values() if v is not None)
            for headers in batch.headers():
                for name, value in headers:
                    yield name.encode()
                    yield value


def _parquet(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    for column in table.flatten().columns:
        yield from _arrow_strings(pa, column)


def _arrow_strings(pa, column) -> Iterator[bytes]:
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.cast(t.value_type)
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        yield from _arrow_strings(pa, column.combine_chunks().flatten() if hasattr(column, "combine_chunks")
                                  else column.flatten())
        return
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        yield from (s.encode() for s in column.to_pylist() if s is not None)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        yield from (b for b in column.to_pylist() if b is not None)


def _json(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    try:  # one document (pretty-printed or not), else JSON lines (a Delta log, a framed manifest)
        whole = json.loads(data)
    except ValueError:
        pass
    else:
        yield from _json_strings(whole)
        return
    for line in data.splitlines():
        line = line.strip()
        if line:
            yield from _json_strings(json.loads(line))


def _json_strings(value) -> Iterator[bytes]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_strings(k)
            yield from _json_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _json_strings(v)
    elif isinstance(value, str):
        yield value.encode("utf-8", "surrogatepass")
        if len(value) % 2 == 0 and value and set(value) <= _HEX:
            yield bytes.fromhex(value)
        if value[:1] in ("{", "["):
            try:
                inner = json.loads(value)
            except ValueError:
                return
            yield from _json_strings(inner)


def _zstd(store: ObjectStore, obj: str, data: bytes) -> Iterator[bytes]:
    yield zstandard.ZstdDecompressor().decompressobj().decompress(data)


_DECODERS = {"sstable": _sstable, "wal": _wal, "log segment": _log_segment, "parquet": _parquet,
             "json": _json, "zstd": _zstd}
