"""Print log segment files and describe topics, like Kafka's ``DumpLogSegments`` and
``kafka-topics --describe``.

Usage::

    python -m dkvstream.storage.log.dump segment <path-or-uri> [--records N] [--no-indexes]
    python -m dkvstream.storage.log.dump describe <store root path-or-uri> [--prefix log] [--entries]

``segment`` verifies and prints every chunk of a segment file (topic, partition,
position, bytes, records, offset deltas, timestamps, tombstones, gaps), each batch
(position, records, deltas, codec, stored/raw bytes, delete horizon), the offset and
time index entries, and the first N records of each chunk (relative offsets: the
metadata holds each chunk's base offset). ``describe`` prints one row per partition:
policy, log start and next offset, cleaner checkpoint, entries, records, bytes, clean
and dirty bytes and the dirty ratio; ``--entries`` adds each entry's offset range,
file, byte range, cleaning time and append time. Anything corrupt exits with status 1 and the error, which names
the file and byte offset.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from dkvstream.storage.cli import run_command
from dkvstream.storage.dkv.dump import fmt_key, open_location
from dkvstream.storage.log.log import Log
from dkvstream.storage.log.segment import chunk_batches, decode_indexes, read_directory
from dkvstream.storage.objectstore import open_object_store


def dump_segment(loc: str, records: int, indexes: bool, out: TextIO) -> None:
    """Prints one segment file; see the module docstring."""
    store, key = open_location(loc)
    data = store.get(key)
    where = store.uri(key)
    chunks = read_directory(store, key, data)
    w = out.write
    w(f"file: {where}\nsize: {len(data)} bytes, chunks: {len(chunks)}\n")
    for c in chunks:
        gaps = "" if not c.has_gaps else f" gaps={c.last_delta - c.first_delta + 1 - c.records}"
        w(f"chunk {c.topic}/{c.partition}: position={c.position} bytes={c.length} records={c.records} "
          f"batches={c.batches} deltas={c.first_delta}..{c.last_delta} ts={c.min_ts}..{c.max_ts} "
          f"compacted={c.compacted} tombstones={c.tombstones}{gaps}\n")
        idx = decode_indexes(memoryview(data)[c.index[0]:c.index[0] + sum(c.index[1:4])], c, where)
        shown = 0
        for pos, b in chunk_batches(data, c, 0, where):
            h = b.header
            w(f"  batch position={pos} records={h.count} deltas={h.first_delta}..{h.last_delta} "
              f"ts={h.min_ts}..{h.max_ts} codec={'zstd' if h.codec else 'none'} stored={h.stored_len} "
              f"raw={h.raw_len} delete_horizon={h.delete_horizon or '-'} crc=ok\n")
            for r in b.records(0):
                if shown >= records:
                    break
                what = "tombstone" if r.value is None else f"value_len={len(r.value)}"
                w(f"    offset_delta={r.offset} ts={r.timestamp} key={fmt_key(r.key)} {what}"
                  f"{' headers=' + str(len(r.headers)) if r.headers else ''}\n")
                shown += 1
        if indexes:
            w(f"  offset index: {len(idx.offsets)} entries\n")
            for e in idx.offsets.entries:
                w(f"    offset_delta={int(e['offset'])} position={int(e['position'])}\n")
            w(f"  time index: {len(idx.times)} entries\n")
            for e in idx.times.entries:
                w(f"    timestamp={int(e['timestamp'])} offset_delta={int(e['offset'])}\n")
            if idx.present is not None:
                w(f"  present offsets bitmap: {len(idx.present)} of "
                  f"{c.last_delta - c.first_delta + 1} offsets\n")


def describe(root: str, prefix: str, entries: bool, out: TextIO) -> None:
    """Prints the topics of the log at ``root``/``prefix``; see the module docstring."""
    log = Log(open_object_store(root), prefix)
    rows = log.describe()
    if not rows:
        out.write("no topics\n")
        return
    try:
        from tabulate import tabulate  # an optional extra: only this listing uses it
    except ImportError:
        sys.exit("dkvstream.storage.log.dump: listing topics needs tabulate: pip install 'dkvstream[examples]'")
    out.write(tabulate(rows, headers="keys", tablefmt="simple") + "\n")
    if entries:
        md = log.metadata()
        for name in sorted(md.topics):
            for i, p in enumerate(md.topics[name].partitions):
                for e in p.entries:
                    out.write(f"{name}/{i} [{e.start}, {e.end}) base={e.base} records={e.chunk.records} "
                              f"file={e.file} bytes=[{e.chunk.position}, {e.chunk.position + e.chunk.length}) "
                              f"cleaned_at={e.cleaned_at if e.cleaned_at is not None else '-'} "
                              f"appended_at={e.appended_at if e.appended_at is not None else '-'}\n")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    out = out or sys.stdout
    ap = argparse.ArgumentParser(prog="python -m dkvstream.storage.log.dump", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    sp = sub.add_parser("segment", help="print a segment file and its indexes")
    sp.add_argument("location", help="file path or URI")
    sp.add_argument("--records", type=int, default=10, help="records to print per chunk (default 10)")
    sp.add_argument("--no-indexes", action="store_true", help="skip the index entries")
    dp = sub.add_parser("describe", help="describe topics, partitions, offsets and dirty ratios")
    dp.add_argument("root", help="object-store root path or URI")
    dp.add_argument("--prefix", default="log", help="the log's prefix in the store (default log)")
    dp.add_argument("--entries", action="store_true", help="list every entry")
    args = ap.parse_args(argv)

    def command() -> None:
        if args.kind == "segment":
            dump_segment(args.location, args.records, not args.no_indexes, out)
        else:
            describe(args.root, args.prefix, args.entries, out)

    return run_command(command, ())

if __name__ == "__main__":
    sys.exit(main())
