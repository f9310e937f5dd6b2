"""The per-range, per-checkpoint manifest: encoding, decoding and publishing.

A manifest names exactly the state of one DKV instance at one checkpoint: the live tables
per level, the WAL objects whose records are not in any table yet, and the last sequence
number. Restoring it (``DKV.open(store, prefix, manifest_key)``) reproduces that state.

On-bucket format (``<prefix>/manifests/<checkpoint>.json``), two lines of UTF-8::

    <body>\\n
    {"crc32c":"<8 lowercase hex digits>"}\\n

``crc32c`` covers the raw bytes of ``<body>``. ``<body>`` is compact JSON with sorted keys::

    {"format_version": 2,
     "name": "<checkpoint name>",
     "prefix": "<DKV prefix>",
     "last_seq": int,            # newest sequence number assigned so far
     "flushed_seq": int,         # every seq <= this is in a table; WAL seqs are above it
     "levels": [[table, ...], ...],   # L0 newest first, then sorted runs
     "wal": [{"key": str, "first_seq": int, "last_seq": int, "size": int, "records": int}, ...],
     "key_range": [lo hex, hi hex | null] | null,   # the instance's range (after a rescale)
     "handled_compactions": [id, ...],              # remote results installed or discarded
     "compaction_filter": {"kind": "expiry", "marker_offset": int,
                           "clocks": [[marker, clock], ...]}}   # optional, see expiry.py
    table := {"key": str, "min_key": hex, "max_key": hex, "min_seq": int, "max_seq": int,
              "size": int, "entries": int[, "clip": [lo hex, hi hex | null]]}

``key`` of a table or WAL object may lie under another prefix (a parent range's, after a
rescale; see ``DKV.open_from_parents``). A table with ``clip`` is shared: only its keys in
``[min_key, max_key]`` (the file's keys inside the clip) are visible. Version 1 manifests
(no ``key_range``, ``handled_compactions`` or ``clip``) are still read. Without
``compaction_filter`` (absent or null) compaction drops no live entry; with it, every
compaction planned from the manifest (inline after it, or remote) drops the entries the
filter finds expired at the manifest's clocks (``expiry.py``).

A remote compaction result (``<prefix>/compactions/<id>.json``, see
``remote_compaction.py``) uses the same two-line framing with this body::

    {"format_version": 1, "id": str, "prefix": str, "base_manifest": str,
     "inputs": [{"level": int, "table": table}, ...], "output_level": int,
     "outputs": [table, ...], "drop_tombstones": bool, "deeper": [table key, ...],
     "reason": str}

Publishing uses ``put_if_absent``: a manifest is written once and never replaced. A name
collision raises ``ManifestConflictError`` (the checkpoint name was reused; pick another).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from crc32c import crc32c

from dkvstream.storage.dkv.expiry import ExpiryFilter
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.errors import CorruptionError, ManifestConflictError, ObjectExistsError
from dkvstream.storage.objectstore import ObjectStore

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
RESULT_FORMAT_VERSION = 1
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
    key_range: tuple[bytes, bytes | None] | None = None
    handled_compactions: tuple[str, ...] = ()
    compaction_filter: ExpiryFilter | None = None


@dataclass(frozen=True)
class RemoteResult:
    """A published remote compaction result; see the module docstring for the format.

    Attributes:
        id: Unique id, also the result's file name and its outputs' directory.
        prefix: DKV prefix the result belongs to.
        base_manifest: Key of the manifest the plan was made from.
        inputs: ``(level, table)`` of every input, as the base manifest listed it.
        output_level: Level of the outputs.
        outputs: Tables written (keys under ``<prefix>/compactions/<id>/``).
        drop_tombstones: Whether the merge dropped tombstones.
        deeper: Tables below ``output_level`` overlapping the inputs when planned.
        reason: The plan's reason.
    """

    id: str
    prefix: str
    base_manifest: str
    inputs: tuple[tuple[int, TableInfo], ...]
    output_level: int
    outputs: tuple[TableInfo, ...]
    drop_tombstones: bool
    deeper: tuple[str, ...] = ()
    reason: str = ""


def _range_to_json(r: tuple[bytes, bytes | None] | None) -> list | None:
    if r is None:
        return None
    return [r[0].hex(), None if r[1] is None else r[1].hex()]


def _range_from_json(r: list | None) -> tuple[bytes, bytes | None] | None:
    if r is None:
        return None
    lo, hi = r
    return bytes.fromhex(lo), None if hi is None else bytes.fromhex(hi)


def table_to_json(t: TableInfo) -> dict:
    """Encodes one table reference (manifest and result format)."""
    d = {
        "key": t.key, "min_key": t.min_key.hex(), "max_key": t.max_key.hex(),
        "min_seq": t.min_seq, "max_seq": t.max_seq, "size": t.size, "entries": t.entries,
    }
    if t.clip is not None:
        d["clip"] = _range_to_json(t.clip)
    return d


def table_from_json(d: dict) -> TableInfo:
    """Decodes one table reference."""
    return TableInfo(
        key=str(d["key"]), size=int(d["size"]), entries=int(d["entries"]),
        min_key=bytes.fromhex(d["min_key"]), max_key=bytes.fromhex(d["max_key"]),
        min_seq=int(d["min_seq"]), max_seq=int(d["max_seq"]),
        clip=_range_from_json(d.get("clip")),
    )


_table_to_json = table_to_json
_table_from_json = table_from_json


def frame(body: dict) -> bytes:
    """Encodes ``body`` as compact sorted JSON plus the crc32c line."""
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return raw + b"\n" + b'{"crc32c":"%08x"}\n' % crc32c(raw)


def unframe(data: bytes, uri: str) -> dict:
    """Verifies the framing and checksum of ``data`` and returns the JSON body.

    Raises:
        CorruptionError: Bad framing, checksum or JSON.
    """
    parts = data.split(b"\n")
    if len(parts) != 3 or parts[2] != b"":
        # A truncated object lacks a newline: the damage starts at its end at the latest.
        at = len(data) if len(parts) < 3 else len(parts[0]) + len(parts[1]) + 2
        raise CorruptionError(f"{uri}: framing broken at offset {at} of {len(data)} bytes "
                              "(expected a body line and a crc line; truncated?)")
    raw, trailer = parts[0], parts[1]
    m = _TRAILER_RE.match(trailer)
    if m is None:
        raise CorruptionError(f"{uri}: crc line malformed at offset {len(raw) + 1}")
    if crc32c(raw) != int(m.group(1), 16):
        raise CorruptionError(f"{uri}: crc32c mismatch over bytes [0, {len(raw)})")
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise CorruptionError(f"{uri}: malformed JSON body at offset {getattr(e, 'pos', 0)}: {e}") from None
    if not isinstance(body, dict):
        raise CorruptionError(f"{uri}: body at offset 0 is not a JSON object")
    return body


def encode_result(r: RemoteResult) -> bytes:
    """Encodes a remote compaction result."""
    return frame({
        "format_version": RESULT_FORMAT_VERSION, "id": r.id, "prefix": r.prefix,
        "base_manifest": r.base_manifest,
        "inputs": [{"level": lvl, "table": table_to_json(t)} for lvl, t in r.inputs],
        "output_level": r.output_level, "outputs": [table_to_json(t) for t in r.outputs],
        "drop_tombstones": r.drop_tombstones, "deeper": list(r.deeper), "reason": r.reason,
    })


def decode_result(data: bytes, uri: str) -> RemoteResult:
    """Decodes and verifies a remote compaction result.

    Raises:
        CorruptionError: Bad framing, checksum, version or structure.
    """
    body = unframe(data, uri)
    try:
        if body["format_version"] != RESULT_FORMAT_VERSION:
            raise ValueError(f"unsupported result format_version {body['format_version']}")
        return RemoteResult(
            id=str(body["id"]), prefix=str(body["prefix"]),
            base_manifest=str(body["base_manifest"]),
            inputs=tuple((int(i["level"]), table_from_json(i["table"])) for i in body["inputs"]),
            output_level=int(body["output_level"]),
            outputs=tuple(table_from_json(t) for t in body["outputs"]),
            drop_tombstones=bool(body["drop_tombstones"]),
            deeper=tuple(str(k) for k in body["deeper"]), reason=str(body.get("reason", "")),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{uri}: malformed compaction result: {e}") from None


def encode_manifest(m: Manifest) -> bytes:
    """Encodes ``m`` in the on-bucket format."""
    body = {
        "format_version": FORMAT_VERSION,
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
        "key_range": _range_to_json(m.key_range),
        "handled_compactions": list(m.handled_compactions),
    }
    if m.compaction_filter is not None:
        body["compaction_filter"] = m.compaction_filter.to_json()
    return frame(body)


def decode_manifest(data: bytes, uri: str) -> Manifest:
    """Decodes and verifies a manifest.

    Args:
        data: The object's bytes.
        uri: Its URI, for error messages.

    Raises:
        CorruptionError: Bad framing, checksum, version or structure.
    """
    body = unframe(data, uri)
    try:
        if body["format_version"] not in READABLE_VERSIONS:
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
            format_version=int(body["format_version"]),
            key_range=_range_from_json(body.get("key_range")),
            handled_compactions=tuple(str(i) for i in body.get("handled_compactions", ())),
            compaction_filter=(None if body.get("compaction_filter") is None
                               else ExpiryFilter.from_json(body["compaction_filter"])),
        )
    except (ValueError, KeyError, TypeError) as e:
        end = data.find(b"\n")
        raise CorruptionError(f"{uri}: malformed manifest body in bytes [0, {end}): {e}") from None


def files_of(m: Manifest) -> dict[str, int]:
    """The tables and WAL objects ``m`` names (not the manifest itself): key -> size, bytes."""
    out = {t.key: t.size for t in m.levels.all_tables()}
    out.update((w.key, w.size) for w in m.wal)
    return out


def dropped_files(old_key: str, old: Manifest, new: Manifest) -> dict[str, int] | None:
    """What stops being needed when one range's checkpoint moves from manifest ``old``
    (stored at ``old_key``) to ``new``: the old manifest itself and every table or WAL
    object it named that ``new`` does not. Pure; sizes come from the manifests (the old
    manifest's is its encoded length), no request is made.

    These objects are garbage once no retained checkpoint names ``old`` (checkpoint
    retention, ``dkvstream.operators.runtime.cleanup``), provided no other range names them. A
    table referenced with a ``clip`` may be named by another range too (a table shared
    after a rescale, ``rescale.py``), and only a reference count over every range could
    tell; so when such a table is dropped the answer is None (unknown: a full sweep
    must decide). Any other table lies inside this range's key interval, which no other
    range of the operator overlaps.

    Args:
        old_key / old: the manifest the range was opened at (or last checkpointed).
        new: the manifest just published.

    Returns:
        ``{object key: size in bytes}``, or None (see above).
    """
    keep = files_of(new)
    if any(t.clip is not None and t.key not in keep for t in old.levels.all_tables()):
        return None
    dropped = {old_key: len(encode_manifest(old))}
    dropped.update((k, n) for k, n in files_of(old).items() if k not in keep)
    return dropped


def unkept_files(new: Manifest, written: Mapping[str, int]) -> dict[str, int]:
    """The objects written for a checkpoint that its manifest ``new`` does not name (an
    L0 table compacted away before the checkpoint): garbage as soon as the checkpoint
    is committed, since no manifest ever named them. Pure.

    Args:
        new: the manifest just published.
        written: ``{object key: bytes}`` written since the previous checkpoint.
    """
    keep = files_of(new)
    return {k: n for k, n in written.items() if k not in keep}


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
