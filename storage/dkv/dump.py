"""Print the contents of DKV files, in the spirit of Kafka's ``DumpLogSegments``.

and of RocksDB's ``sst_dump`` and ``ldb``.

Usage::

    python -m dkvstream.storage.dkv.dump sstable <path-or-uri> [--entries N]
    python -m dkvstream.storage.dkv.dump manifest <path-or-uri>
    python -m dkvstream.storage.dkv.dump scan <sstable-or-manifest> [--from K] [--to K] [--hex] [--limit N]
    python -m dkvstream.storage.dkv.dump verify <sstable-or-manifest>...

``sstable`` prints the key and sequence ranges, entry count, Bloom filter size and bits
per key, block statistics (count, raw and compressed bytes, ratio) and the first N entries
(key as UTF-8 if printable else hex, seq, tombstone or value length). ``manifest`` prints
the header fields, WAL objects, and per level the table count, bytes and entries, then
each table. ``scan`` prints entries with ``from <= key < to`` as JSON lines: of an
SSTable every entry (``key``, ``seq``, ``value``, null for a tombstone); of a manifest
the live keys of the state it describes (tables and WAL merged, as a restore reads them:
``key``, ``value``). Keys and values print as UTF-8 text (undecodable bytes escaped), or
as hex with ``--hex``, which also makes ``--from``/``--to`` hex. ``verify`` reads every
block (and, for a manifest, every table and WAL object it names; ``dkvstream.storage.dkv.verify``)
and prints one line per file.

A manifest's tables may lie under another DKV prefix of the same store (a parent range
after a rescale), so a manifest is opened from the store root: its path minus
``<prefix>/manifests/<name>``. Exit status: 0 when all is well, 1 when a file is corrupt
or missing (the error names the file and offset), 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from dkvstream.storage.cli import parse_bytes, render_bytes, run_command
from dkvstream.storage.dkv.db import DKV
from dkvstream.storage.dkv.invariants import check_manifest
from dkvstream.storage.dkv.manifest import Manifest, load_manifest
from dkvstream.storage.dkv.sstable import SSTableReader
from dkvstream.storage.dkv.verify import VerifyReport, verify_manifest, verify_sstable
from dkvstream.storage.errors import StorageError
from dkvstream.storage.objectstore import ObjectStore, open_existing_store


def fmt_key(k: bytes | None) -> str:
    """UTF-8 in quotes if printable, else ``0x`` + hex; ``-`` for None."""
    if k is None:
        return "-"
    try:
        s = k.decode("utf-8")
        if s.isprintable():
            return repr(s)
    except UnicodeDecodeError:
        pass
    return "0x" + k.hex()


def open_location(loc: str) -> tuple[ObjectStore, str]:
    """Splits a file path or URI into (store rooted at its directory, object key).

    Raises:
        FileNotFoundError: a local directory that does not exist (never created here).
    """
    loc = loc.rstrip("/")
    if "://" in loc:
        scheme, rest = loc.split("://", 1)
        parent, name = posixpath.split(rest)
        return open_existing_store(f"{scheme}://{parent}"), name
    parent, name = posixpath.split(loc)
    return open_existing_store(parent or "."), name


def is_manifest(loc: str) -> bool:
    """True if ``loc`` names a manifest (``.json``) rather than an SSTable."""
    return loc.rstrip("/").endswith(".json")


def open_manifest(loc: str) -> tuple[ObjectStore, str, Manifest]:
    """Opens a manifest from its store root (see the module docstring).

    Returns:
        ``(store rooted at the store root, manifest key, manifest)``.

    Raises:
        ValueError: ``loc`` does not end with ``<prefix>/manifests/<name>`` of the
            manifest's own prefix (it was moved out of its store).
        ObjectNotFoundError / CorruptionError: the manifest is missing or corrupt.
    """
    store, name = open_location(loc)
    m = load_manifest(store, name)
    tail = f"{m.prefix}/manifests/{name}"
    path = loc.rstrip("/")
    if not path.endswith("/" + tail) and path != tail:
        raise ValueError(f"{loc}: a manifest of prefix {m.prefix!r} must lie at <store root>/{tail}")
    root = path[: len(path) - len(tail)].rstrip("/") or "."
    if root.endswith(":/"):  # a URI whose root is the bucket: keep its "//"
        root += "/"
    return open_existing_store(root), tail, m


def scan(loc: str, start: bytes = b"", end: bytes | None = None) -> Iterator[dict]:
    """Entries of an SSTable or a manifest's state with ``start <= key < end``.

    Args:
        loc: path or URI of an SSTable, or of a manifest (``.json``).
        start: inclusive lower key bound.
        end: exclusive upper key bound (None: none).

    Yields:
        SSTable: ``{"key": bytes, "seq": int, "value": bytes | None}`` for every entry,
        tombstones included. Manifest: ``{"key": bytes, "value": bytes}`` for every live
        key, in key order.

    Raises:
        CorruptionError / ObjectNotFoundError: a file read is corrupt or missing.
    """
    if not is_manifest(loc):
        store, key = open_location(loc)
        for k, seq, v in SSTableReader(store, key).iter_from(start, end):
            yield {"key": k, "seq": seq, "value": v}
        return
    store, key, m = open_manifest(loc)
    db = DKV.open(store, m.prefix, key)
    try:
        for k, v in db.scan_range(start, end):
            yield {"key": k, "value": v}
    finally:
        db.close()


def verify(loc: str) -> VerifyReport:
    """Verifies an SSTable (every block) or a manifest and every file it names.

    Returns:
        The ``VerifyReport``; ``ok`` is False when a file is missing or corrupt.

    Raises:
        ValueError: a manifest moved out of its store (see ``open_manifest``).
    """
    report = VerifyReport()
    try:
        if is_manifest(loc):
            store, key, _ = open_manifest(loc)
            return verify_manifest(store, key)
        store, key = open_location(loc)
        blocks, entries, size = verify_sstable(store, key)
    except (StorageError, OSError) as e:  # a missing directory or file, a corrupt one
        report.errors.append(str(e))
        return report
    report.tables, report.blocks, report.entries, report.table_bytes = 1, blocks, entries, size
    return report


def dump_sstable(loc: str, entries: int, out: TextIO) -> None:
    """Prints one SSTable; see the module docstring."""
    store, key = open_location(loc)
    r = SSTableReader(store, key)
    raw = sum(b[3] for b in r.block_index)
    disk = sum(b[2] for b in r.block_index)
    w = out.write
    w(f"file: {r.uri}\n")
    w(f"size: {r.size} bytes, format version {r.format_version}\n")
    w(f"entries: {r.entries}\n")
    w(f"key range: {fmt_key(r.min_key)} .. {fmt_key(r.max_key)}\n")
    w(f"seq range: {r.min_seq} .. {r.max_seq}\n")
    w(f"bloom: {r.bloom_bits} bits ({r.bloom_bits // 8} bytes), k={r._bloom_k}, "
      f"{r.bloom_bits / max(1, r.entries):.2f} bits/key\n")
    w(f"blocks: {r.num_blocks}, raw {raw} bytes, compressed {disk} bytes, "
      f"ratio {raw / max(1, disk):.2f}\n")
    if entries:
        w(f"first {min(entries, r.entries)} entries:\n")
        for n, (k, seq, v) in enumerate(r.iter_from(b"")):
            if n >= entries:
                break
            what = "tombstone" if v is None else f"value_len={len(v)}"
            w(f"  key={fmt_key(k)} seq={seq} {what}\n")


def dump_manifest(loc: str, out: TextIO) -> None:
    """Prints one manifest; see the module docstring."""
    store, key = open_location(loc)
    m = load_manifest(store, key)
    check_manifest(m, store.uri(key))
    w = out.write
    w(f"manifest: {store.uri(key)}\n")
    w(f"name: {m.name}  prefix: {m.prefix}  format version {m.format_version}\n")
    w(f"last_seq: {m.last_seq}  flushed_seq: {m.flushed_seq}\n")
    if m.key_range is not None:
        w(f"key range: {fmt_key(m.key_range[0])} .. {fmt_key(m.key_range[1])}\n")
    w(f"handled compactions: {len(m.handled_compactions)}\n")
    if m.compaction_filter is not None:
        f = m.compaction_filter
        w(f"compaction filter: expiry, marker at key byte {f.marker_offset}, clocks "
          + ", ".join(f"0x{marker:02x} <= {clock}" for marker, clock in f.clocks) + "\n")
    w(f"wal objects: {len(m.wal)}, {sum(x.size for x in m.wal)} bytes, "
      f"{sum(x.records for x in m.wal)} records\n")
    for x in m.wal:
        w(f"  {x.key} seq {x.first_seq}..{x.last_seq} records={x.records} size={x.size}\n")
    for i, lvl in enumerate(m.levels.levels):
        w(f"L{i}: {len(lvl)} tables, {sum(t.size for t in lvl)} bytes, "
          f"{sum(t.entries for t in lvl)} entries\n")
        for t in lvl:
            clip = "" if t.clip is None else f" clip=[{fmt_key(t.clip[0])}, {fmt_key(t.clip[1])})"
            w(f"  {t.key} keys {fmt_key(t.min_key)}..{fmt_key(t.max_key)} seq "
              f"{t.min_seq}..{t.max_seq} entries={t.entries} size={t.size}{clip}\n")


def print_scan(loc: str, start: str | None, end: str | None, hex: bool, limit: int | None,
               out: TextIO) -> int:
    """Prints ``scan`` as JSON lines; returns the number of entries printed."""
    lo = b"" if start is None else parse_bytes(start, hex)
    hi = None if end is None else parse_bytes(end, hex)
    n = 0
    for entry in scan(loc, lo, hi):
        if limit is not None and n >= limit:
            break
        out.write(json.dumps({k: render_bytes(v, hex) if k != "seq" else v for k, v in entry.items()})
                  + "\n")
        n += 1
    return n


def print_verify(locs: Sequence[str], out: TextIO) -> bool:
    """Prints ``verify`` of each location, one line each; True when all are intact."""
    ok = True
    for loc in locs:
        r = verify(loc)
        if r.ok:
            wal = f", {r.wal_objects} WAL objects ({r.wal_records} records)" if r.manifests else ""
            out.write(f"{loc}: ok, {r.tables} tables, {r.blocks} blocks, {r.entries} entries, "
                      f"{r.table_bytes} bytes{wal}\n")
            continue
        ok = False
        for error in r.errors:
            out.write(f"{loc}: FAILED: {error}\n")
    return ok


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI; returns the exit status (0 ok, 1 corrupt or missing file, 2 usage)."""
    out = out or sys.stdout
    ap = argparse.ArgumentParser(
        prog="python -m dkvstream.storage.dkv.dump", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="kind", required=True)
    sp = sub.add_parser("sstable", help="print an SSTable")
    sp.add_argument("location", help="file path or URI")
    sp.add_argument("--entries", type=int, default=20, help="entries to print (default 20)")
    mp = sub.add_parser("manifest", help="print a manifest")
    mp.add_argument("location", help="file path or URI")
    sc = sub.add_parser("scan", help="print entries in a key range as JSON lines")
    sc.add_argument("location", help="path or URI of an SSTable, or of a manifest (.json)")
    sc.add_argument("--from", dest="start", help="first key (inclusive)")
    sc.add_argument("--to", dest="end", help="end key (exclusive)")
    sc.add_argument("--hex", action="store_true", help="keys in and out, and values, as hex")
    sc.add_argument("--limit", type=int, help="entries to print at most")
    vp = sub.add_parser("verify", help="read and check every block; exit 1 on damage")
    vp.add_argument("locations", nargs="+", help="paths or URIs of SSTables or manifests (.json)")
    args = ap.parse_args(argv)

    def command() -> int | None:
        if args.kind == "sstable":
            dump_sstable(args.location, args.entries, out)
        elif args.kind == "manifest":
            dump_manifest(args.location, out)
        elif args.kind == "scan":
            print_scan(args.location, args.start, args.end, args.hex, args.limit, out)
        else:
            return 0 if print_verify(args.locations, out) else 1
        return 0

    return run_command(command)

if __name__ == "__main__":
    sys.exit(main())
