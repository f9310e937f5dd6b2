"""DKV point and scan operations against in-memory Python maps, measured in the same run.

Usage: ``.venv/bin/python bench/dkv_ops.py [--keys 200000] [--repeat 3] [--plot PATH]``

Prints a table of operations per second (median of ``--repeat`` runs; the clock is the
process's CPU time, ``time.process_time``, as the benchmark runs in one thread: on a
shared machine it leaves out the time spent waiting for a core) and the ratio DKV /
baseline. Each row
names its baseline, the floor any in-process store pays for the same operation with the
same result:

- put and get: a plain ``dict``;
- prefix scans: a ``sortedcontainers.SortedDict`` (an in-memory ordered map, as DKV's
  memtable and tables are ordered), ``irange`` over the prefix building the same sorted
  ``(key, value)`` list DKV's ``scan_prefix`` returns. Both scan the same ``--scans``
  prefixes (``user-NNN``: ~``keys / 1,000`` keys each) and must return equal lists.
  Ordering is paid inside the same row on both sides: DKV's memtable sorts its keys
  at the first scan after the puts, so the memtable row's baseline builds its
  ``SortedDict`` from the dict inside its clock; before the SSTable rows DKV's flush
  has sorted and the baseline's ``SortedDict`` is built, both outside the clock.

So the ratio is the cost of the LSM (memtable order, WAL buffering, SSTable blocks,
Bloom filters, checksums). "(SSTables)" rows run after a flush and a reopen from the
checkpoint, with DKV's default caches; the baselines stay in memory.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortedcontainers import SortedDict  # noqa: E402

from bench.plot import load_average  # noqa: E402
from dkvstream.storage.dkv import DKV, DKVOptions  # noqa: E402
from dkvstream.storage.objectstore.local import LocalObjectStore  # noqa: E402

SCANS = 200


def _timed(fn) -> tuple[float, object]:
    """``(CPU seconds of this process, fn's result)``."""
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def run(keys: int, repeat: int, scans: int = SCANS) -> list[tuple[str, str, int, float, float]]:
    """Returns ``[(operation, baseline, ops per run, DKV ops/s, baseline ops/s)]``, medians
    over ``repeat`` runs.

    Raises:
        AssertionError: a DKV result differs from the baseline's.
    """
    rng = random.Random(1)
    ks = [f"user-{rng.randrange(10**9):09d}".encode() for _ in range(keys)]
    vals = [rng.randbytes(24) for _ in range(keys)]
    probe = ks[:]
    rng.shuffle(probe)
    prefixes = [f"user-{rng.randrange(1000):03d}".encode() for _ in range(scans)]
    rows: dict[tuple[str, str, int], list[tuple[float, float]]] = {}

    def measure(op: str, baseline: str, n: int, dkv_fn, base_fn) -> None:
        dkv_s, got = _timed(dkv_fn)
        base_s, want = _timed(base_fn)
        assert got == want, f"{op}: DKV's result differs from the {baseline}'s"
        rows.setdefault((op, baseline, n), []).append((dkv_s, base_s))

    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            db = DKV.open(LocalObjectStore(tmp), "bench", None, DKVOptions())
            d: dict[bytes, bytes] = {}
            measure("put", "dict", keys, lambda db=db: [db.put(k, v) for k, v in zip(ks, vals)],
                    lambda d=d: [d.__setitem__(k, v) for k, v in zip(ks, vals)])
            measure("get (memtable)", "dict", keys, lambda db=db: [db.get(k) for k in probe],
                    lambda d=d: [d.get(k) for k in probe])
            def sorted_scans(ordered: SortedDict):
                return [[(k, ordered[k])
                         for k in ordered.irange(p, _prefix_end(p), inclusive=(True, False))]
                        for p in prefixes]

            # DKV's memtable sorts its keys at the first scan after writes, inside this
            # row's clock; the baseline builds its SortedDict inside the clock too.
            measure("scan_prefix (memtable)", "SortedDict", scans,
                    lambda db=db: [list(db.scan_prefix(p)) for p in prefixes],
                    lambda d=d: sorted_scans(SortedDict(d)))
            ordered = SortedDict(d)  # the SSTable rows: both sides ordered before the clock
            db.flush()
            db = DKV.open(LocalObjectStore(tmp), "bench", db.checkpoint("bench"), DKVOptions())
            measure("get (SSTables)", "dict", keys, lambda db=db: [db.get(k) for k in probe],
                    lambda d=d: [d.get(k) for k in probe])
            measure("scan_prefix (SSTables)", "SortedDict", scans,
                    lambda db=db: [list(db.scan_prefix(p)) for p in prefixes],
                    lambda ordered=ordered: sorted_scans(ordered))
            db.close()
    return [(op, base, n, n / statistics.median(s[0] for s in samples),
             n / statistics.median(s[1] for s in samples))
            for (op, base, n), samples in rows.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scans", type=int, default=SCANS, help="prefix scans per scan row")
    parser.add_argument("--plot", metavar="PATH", help="write the DKV / baseline ratios as a PNG")
    args = parser.parse_args(argv)
    load_before = load_average()
    results = run(args.keys, args.repeat, args.scans)
    load = f"{load_before} before, {load_average()} after"
    print(f"{args.keys:,} keys (13 B keys, 24 B values), {args.scans} prefix scans of "
          f"~{args.keys // 1000:,} keys each; median of {args.repeat} runs; CPU time "
          f"(time.process_time), one thread; load average (1 / 5 / 15 min) {load}; "
          f"{os.cpu_count()} cores, shared")
    print(f"{'operation':26} {'baseline':11} {'DKV ops/s':>14} {'baseline ops/s':>15} "
          f"{'DKV / baseline':>15}")
    for op, base, _n, dkv, ref in results:
        print(f"{op:26} {base:11} {dkv:14,.0f} {ref:15,.0f} {dkv / ref:15.3f}")
    if args.plot:
        from bench.plot import bar_panels

        bar_panels(args.plot, f"DKV / in-memory baseline, {args.keys:,} keys", [{
            "labels": [f"{op} vs {base}" for op, base, *_ in results], "ref": 1.0, "log": True,
            "values": [dkv / ref for *_, dkv, ref in results], "fmt": "{:.3f}x",
            "xlabel": "DKV ops/s / baseline ops/s (log)"}],
            caption=f"CPU time (process_time), median of {args.repeat} runs. Load average {load}; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
