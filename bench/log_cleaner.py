"""The log cleaner: keys per dedupe buffer against Kafka, throughput against reading.

Usage: ``.venv/bin/python bench/log_cleaner.py [--mib 32] [--keys 200000] [--fill-full]
[--plot PATH]``

Prints three tables:

1. **Keys per 128 MiB** of ``dedupe.buffer.size``: ours (12-byte slots, load 0.8) against
   Kafka's 24 bytes per key, at Kafka's load factor 0.9 and without one, with the
   collision bound measured on a map filled to capacity (``--fill-full`` fills the real
   128 MiB map, ~9 M keys; by default a 16 MiB map is filled and the bound, which is
   per-key displacement times keys, is scaled).
2. **Throughput**: a compacted topic of ``--mib`` MiB of batches (values of 100 bytes,
   ``--keys`` distinct keys, several producer files) cleaned once, against the time to
   only GET the same files and against GET + decode (CRC32C, zstd, columns) of every
   batch, measured in the same run. MB/s are of batch bytes in.
3. **Keys beyond the buffer**: the same topic cleaned with a buffer that holds a
   quarter of its keys: map passes, hash ranges, GETs per input file, bytes fetched and
   decoded, and whether every duplicate went.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from bench.plot import load_average
from dkvstream.storage.log import COMPACT, CleanerConfig, Log, ProducerConfig, TopicConfig
from dkvstream.storage.log.offset_map import SLOT_BYTES, OffsetMap, hash_keys
from dkvstream.storage.log.records import iter_batches
from dkvstream.storage.log.segment import read_directory
from dkvstream.storage.objectstore.local import LocalObjectStore

MIB = 1024 * 1024
KAFKA_SLOT = 24
KAFKA_LOAD = 0.9


def fill(buffer: int) -> tuple[OffsetMap, float]:
    """Fills a map of ``buffer`` bytes to capacity; returns it and seconds taken."""
    m = OffsetMap(buffer)
    t = time.perf_counter()
    step = 1 << 16
    for a in range(0, m.capacity, step):
        n = min(step, m.capacity - a)
        h, lo = hash_keys([b"user-%012d" % i for i in range(a, a + n)])
        assert m.put(h, lo, np.arange(a, a + n, dtype=np.uint32))
    return m, time.perf_counter() - t


def keys_table(fill_full: bool) -> str:
    budget = 128 * MIB
    slots = budget // SLOT_BYTES
    cap = int(slots * 0.8)
    m, secs = fill(budget if fill_full else 16 * MIB)
    disp_per_key = m.displacement / m.size
    bound = cap * disp_per_key * 2.0**-64
    kafka_raw = budget // KAFKA_SLOT
    kafka_eff = int(kafka_raw * KAFKA_LOAD)
    rows = [
        ["Kafka SkimpyOffsetMap, 24 B slots, load 0.9", f"{budget / kafka_eff:.1f}", f"{kafka_eff:,}", "1.00", "-"],
        ["Kafka, 24 B per key (no load factor)", "24.0", f"{kafka_raw:,}", f"{kafka_raw / kafka_eff:.2f}", "-"],
        ["dkvstream OffsetMap, 12 B slots, load 0.8", f"{budget / cap:.1f}", f"{cap:,}", f"{cap / kafka_eff:.2f}",
         f"{bound:.2e}"],
    ]
    out = tabulate(rows, headers=["map", "bytes/key", "keys per 128 MiB", "x Kafka (load 0.9)",
                                  "P(collision) at capacity"], tablefmt="github")
    out += (f"\nours vs 24 B/key: {cap / kafka_raw:.2f}x; measured mean displacement {disp_per_key:.3f} "
            f"(Knuth: 2.0) over {m.size:,} keys filled in {secs:.1f} s "
            f"({m.size / secs / 1e6:.2f} M keys/s)")
    return out


def build_topic(root: str, mib: int, keys: int) -> Log:
    log = Log(LocalObjectStore(root))
    log.create_topic("c", TopicConfig(partitions=4, cleanup_policy=COMPACT))
    prod = log.producer(ProducerConfig(max_file_bytes=8 * MIB, linger_ms=10**9))
    rng = np.random.default_rng(1)
    n = mib * MIB // 140
    ids = rng.integers(0, keys, n)
    names = [b"key-%010d" % i for i in range(keys)]
    noise = rng.bytes(n * 100)  # incompressible values, so MiB of batches ~ MiB of records
    for j, i in enumerate(ids.tolist()):
        prod.send("c", names[i], noise[j * 100:(j + 1) * 100], timestamp=0)
    prod.flush()
    return log


def read_only(log: Log, files: list[str]) -> tuple[float, float, int]:
    """(seconds to GET, seconds to GET + decode every batch, bytes)."""
    t = time.perf_counter()
    blobs = [log.store.get(k) for k in files]
    t_get = time.perf_counter() - t
    t = time.perf_counter()
    size = 0
    for k, data in zip(files, blobs):
        for c in read_directory(log.store, k, data):
            for _, b in iter_batches(data, c.position, c.position + c.length, k):
                b.keys()
                size += b.header.size
    return t_get, t_get + time.perf_counter() - t, size


def run(mib: int, keys: int) -> tuple[str, str, list[tuple[str, float]]]:
    """The throughput and beyond-the-buffer tables (Markdown), and ``[(row, MB/s)]`` of
    the throughput table (wall clock, ``time.perf_counter``)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = build_topic(tmp, mib, keys)
        files = sorted(log.metadata().files())
        t_get, t_dec, size = read_only(log, files)
        rep = log.clean(CleanerConfig(), force=True)
        rows = [["GET every input file", f"{t_get:.2f}", f"{size / t_get / 1e6:.0f}", "-"],
                ["GET + decode every batch", f"{t_dec:.2f}", f"{size / t_dec / 1e6:.0f}", "-"],
                ["clean (2 passes, 128 MiB map)", f"{rep.seconds:.2f}", f"{rep.bytes_in / rep.seconds / 1e6:.0f}",
                 f"{rep.seconds / t_dec:.1f}x decode, {rep.seconds / t_get:.0f}x GET"]]
        rates = [(r[0], float(r[2])) for r in rows]
        t1 = tabulate(rows, headers=["", "s", "MB/s", "cleaner cost"], tablefmt="github")
        t1 += (f"\n{size / MIB:.1f} MiB of batches, {rep.records_in:,} records, {rep.records_out:,} kept, "
               f"{len(rep.input_files)} input files, {rep.gets} GETs, collision bound {rep.collision_bound:.1e}")
    with tempfile.TemporaryDirectory() as tmp:
        log = build_topic(tmp, mib, keys)
        per_partition = keys // 4
        small = CleanerConfig(dedupe_buffer_size=int(per_partition / 4 / 0.8 * SLOT_BYTES))
        rep = log.clean(small, force=True)
        md = log.metadata()
        kept = sum(p.records for p in md.topic("c").partitions)
        distinct = len({r.key for p in range(4) for r in log.read("c", p)})
        rows = [[f"{small.dedupe_buffer_size / MIB:.2f}", f"{int(small.dedupe_buffer_size / SLOT_BYTES * 0.8):,}",
                 f"{distinct:,}", rep.map_passes, rep.hash_ranges, len(rep.input_files),
                 f"{rep.gets / len(rep.input_files):.0f}", f"{rep.bytes_fetched / MIB:.1f}",
                 f"{rep.bytes_decoded / MIB:.1f}", f"{rep.seconds:.2f}",
                 "yes" if kept == distinct == rep.records_out else "NO"]]
        t2 = tabulate(rows, headers=["buffer MiB", "map keys", "distinct keys", "map passes", "hash ranges",
                                     "input files", "GETs/file", "MiB fetched", "MiB decoded", "s",
                                     "every duplicate removed"], tablefmt="github")
    return t1, t2, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=32, help="MiB of batches in the topic (default 32)")
    ap.add_argument("--keys", type=int, default=200_000, help="distinct keys (default 200000)")
    ap.add_argument("--fill-full", action="store_true", help="fill the real 128 MiB map (~9 M keys)")
    ap.add_argument("--plot", metavar="PATH", help="write the throughput table as a PNG")
    args = ap.parse_args()
    load_before = load_average()
    print("## Keys per 128 MiB dedupe buffer\n")
    print(keys_table(args.fill_full))
    t1, t2, rates = run(args.mib, args.keys)
    print("\n## Cleaner throughput vs reading the same bytes\n")
    print(t1)
    print("\n## Keys beyond the buffer (a quarter of each partition's keys fit)\n")
    print(t2)
    load = f"{load_before} before, {load_average()} after"
    print(f"\nwall clock (time.perf_counter); load average (1 / 5 / 15 min) {load}; "
          f"{os.cpu_count()} cores, shared")
    if args.plot:
        from bench.plot import bar_panels

        bar_panels(args.plot, f"Log cleaner on {args.mib} MiB of batches, {args.keys:,} keys", [
            {"labels": [r for r, _ in rates], "values": [v for _, v in rates],
             "xlabel": "MB/s of batch bytes in (log; higher is faster)", "log": True}],
            caption="Wall clock; baselines: GET, GET + decode of the same files. "
                    f"Load average {load}; {os.cpu_count()} cores, shared.")
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
