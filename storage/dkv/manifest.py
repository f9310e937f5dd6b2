"""The per-range, per-checkpoint manifest: encoding, decoding and publishing.

A manifest names exactly the state of one DKV instance at one checkpoint: the live tables
per level, the WAL objects whose records are not in any table yet, and the last sequence
number. Restoring it (``DKV.open(store, prefix, manifest_key)``) reproduces that state.

On-bucket format (``<prefix>/manifests/<checkpoint>.json``), two lines of UTF-8::

    <body>\\n
    {"crc32c":"<8 lowercase hex digits>"}\\n

``crc32c`` covers the raw bytes of ``<body>``. ``<body>`` is compact JSON with sorted keys::

    {"format_version": 1,
     "name": "<checkpoint name>",
     "prefix": "<DKV prefix>",
     "last_seq": int,            # newest sequence number assigned so far
     "flushed_seq": int,         # every seq <= this is in a table; WAL seqs are above it
     "levels": [[table, ...], ...],   # L0 newest first, then sorted runs
     "wal": [{"key": str, "first_seq": int, "last_seq": int, "size": int, "records": int}, ...]}
    table := {"key": str, "min_key": hex, "max_key": hex, "min_seq": int, "max_seq": int,
              "size": int, "entries": int}

Publishing uses ``put_if_absent``: a manifest is written once and never replaced. A name
collision raises ``ManifestConflictError`` (the checkpoint name was reused; pick another).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from crc32c import crc32c

from storage.dkv.levels import LevelList
from storage.dkv.sstable import TableInfo
from storage.errors import CorruptionError, ManifestConflictError, ObjectExistsError
from storage.objectstore import ObjectStore

FORMAT_VERSION = 1
_TRAILER_RE = re.compile(rb'^\{"crc32c":"([0-9a-f]{8})"\}$')


@dataclass(frozen=True)
class WalRef:
    """A WAL object listed in a manifest."""

    key: str
    first_seq: int
    last_seq: int
    size: int
    records: int


@dataclass(frozen=True)
class Manifest:
    """Decoded manifest; see the module docstring for field meanings."""

    name: str
    prefix: str
    last_seq: int
    flushed_seq: int
    levels: LevelList = field(default_factory=LevelList)
    wal: tuple[WalRef, ...] = ()
    format_version: int = FORMAT_VERSION


def _table_to_json(t: TableInfo) -> dict:
    return {
        "key": t.key, "min_key": t.min_key.hex(), "max_key": t.max_key.hex(),
        "min_seq": t.min_seq, "max_seq": t.max_seq, "size": t.size, "entries": t.entries,
    }


def _table_from_json(d: dict) -> TableInfo:
    return TableInfo(
        key=str(d["key"]), size=int(d["size"]), entries=int(d["entries"]),
        min_key=bytes.fromhex(d["min_key"]), max_key=bytes.fromhex(d["max_key"]),
        min_seq=int(d["min_seq"]), max_seq=int(d["max_seq"]),
    )


def encode_manifest(m: Manifest) -> bytes:
    """Encodes ``m`` in the on-bucket format."""
    body = {
        "format_version": m.format_version,
        "name": m.name,
        "prefix": m.prefix,
        "last_seq": m.last_seq,
        "flushed_seq": m.flushed_seq,
        "levels": [[_table_to_json(t) for t in lvl] for lvl in m.levels.levels],
        "wal": [
            {"key": w.key, "first_seq": w.first_seq, "last_seq": w.last_seq, "size": w.size,
             "records": w.records}
            for w in m.wal
        ],
    }
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return raw + b"\n" + b'{"crc32c":"%08x"}\n' % crc32c(raw)


def decode_manifest(data: bytes, uri: str) -> Manifest:
    """Decodes and verifies a manifest.

    Args:
        data: The object's bytes.
        uri: Its URI, for error messages.

    Raises:
        CorruptionError: Bad framing, checksum, version or structure.
    """
    parts = data.split(b"\n")
    if len(parts) != 3 or parts[2] != b"":
        raise CorruptionError(f"{uri}: manifest framing broken (expected body and crc lines)")
    raw, trailer = parts[0], parts[1]
    m = _TRAILER_RE.match(trailer)
    if m is None:
        raise CorruptionError(f"{uri}: manifest crc line malformed at offset {len(raw) + 1}")
    if crc32c(raw) != int(m.group(1), 16):
        raise CorruptionError(f"{uri}: manifest crc32c mismatch over bytes [0, {len(raw)})")
    try:
        body = json.loads(raw)
        if body["format_version"] != FORMAT_VERSION:
            raise ValueError(f"unsupported manifest format_version {body['format_version']}")
        levels = LevelList(tuple(tuple(_table_from_json(t) for t in lvl) for lvl in body["levels"]))
        if not levels.levels:
            levels = LevelList()
        wal = tuple(
            WalRef(str(w["key"]), int(w["first_seq"]), int(w["last_seq"]), int(w["size"]),
                   int(w["records"]))
            for w in body["wal"]
        )
        return Manifest(
            name=str(body["name"]), prefix=str(body["prefix"]), last_seq=int(body["last_seq"]),
            flushed_seq=int(body["flushed_seq"]), levels=levels, wal=wal,
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{uri}: malformed manifest body: {e}") from None


def publish_manifest(store: ObjectStore, key: str, m: Manifest) -> None:
    """Writes ``m`` under ``key`` once, atomically.

    Raises:
        ManifestConflictError: ``key`` already exists.
    """
    try:
        store.put_if_absent(key, encode_manifest(m))
    except ObjectExistsError:
        raise ManifestConflictError(
            f"manifest already exists: {store.uri(key)} (checkpoint name reused)"
        ) from None


def load_manifest(store: ObjectStore, key: str) -> Manifest:
    """Reads and verifies the manifest at ``key``.

    Raises:
        ObjectNotFoundError: No such manifest.
        CorruptionError: It fails verification.
    """
    return decode_manifest(store.get(key), store.uri(key))
