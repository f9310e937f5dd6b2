"""Print the contents of DKV files, in the spirit of Kafka's ``DumpLogSegments``.

Usage::

    python -m storage.dkv.dump sstable <path-or-uri> [--entries N]
    python -m storage.dkv.dump manifest <path-or-uri>

``sstable`` prints the key and sequence ranges, entry count, Bloom filter size and bits
per key, block statistics (count, raw and compressed bytes, ratio) and the first N entries
(key as UTF-8 if printable else hex, seq, tombstone or value length). ``manifest`` prints
the header fields, WAL objects, and per level the table count, bytes and entries, then
each table. Everything read is verified; a corrupt file exits with status 1 and the error.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections.abc import Sequence
from typing import TextIO

from storage.dkv.invariants import check_manifest
from storage.dkv.manifest import load_manifest
from storage.dkv.sstable import SSTableReader
from storage.errors import StorageError
from storage.objectstore import ObjectStore, open_object_store


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
    """Splits a file path or URI into (store rooted at its directory, object key)."""
    loc = loc.rstrip("/")
    if "://" in loc:
        scheme, rest = loc.split("://", 1)
        parent, name = posixpath.split(rest)
        return open_object_store(f"{scheme}://{parent}"), name
    parent, name = posixpath.split(loc)
    return open_object_store(parent or "."), name


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


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    out = out or sys.stdout
    ap = argparse.ArgumentParser(
        prog="python -m storage.dkv.dump", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="kind", required=True)
    sp = sub.add_parser("sstable", help="print an SSTable")
    sp.add_argument("location", help="file path or URI")
    sp.add_argument("--entries", type=int, default=20, help="entries to print (default 20)")
    mp = sub.add_parser("manifest", help="print a manifest")
    mp.add_argument("location", help="file path or URI")
    args = ap.parse_args(argv)
    try:
        if args.kind == "sstable":
            dump_sstable(args.location, args.entries, out)
        else:
            dump_manifest(args.location, out)
    except (StorageError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
