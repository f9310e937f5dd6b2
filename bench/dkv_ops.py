"""DKV point and scan operations against a plain Python dict, measured in the same run.

Usage: ``.venv/bin/python bench/dkv_ops.py [--keys 200000] [--repeat 3]``

Prints a table of operations per second (median of ``--repeat`` runs) and the ratio
DKV / dict: the dict is the floor any in-process store pays, so the ratio is the cost
of the LSM (memtable order, WAL buffering, SSTable blocks, Bloom filters, checksums).
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

from storage.dkv import DKV, DKVOptions
from storage.objectstore.local import LocalObjectStore


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(keys: int, repeat: int) -> list[tuple[str, float, float]]:
    """Returns ``[(operation, dkv ops/s, dict ops/s)]``, medians over ``repeat`` runs."""
    rng = random.Random(1)
    ks = [f"user-{rng.randrange(10**9):09d}".encode() for _ in range(keys)]
    vals = [rng.randbytes(24) for _ in range(keys)]
    probe = ks[:]
    rng.shuffle(probe)
    rows: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            db = DKV.open(LocalObjectStore(tmp), "bench", None, DKVOptions())
            d: dict[bytes, bytes] = {}
            rows.setdefault("put", []).append((
                _timed(lambda: [db.put(k, v) for k, v in zip(ks, vals)]),
                _timed(lambda: [d.__setitem__(k, v) for k, v in zip(ks, vals)])))
            rows.setdefault("get (memtable)", []).append((
                _timed(lambda: [db.get(k) for k in probe]), _timed(lambda: [d.get(k) for k in probe])))
            rows.setdefault("scan_prefix 'user-1' (memtable)", []).append((
                _timed(lambda: list(db.scan_prefix(b"user-1"))),
                _timed(lambda: sorted(kv for kv in d.items() if kv[0].startswith(b"user-1")))))
            db.flush()
            db = DKV.open(LocalObjectStore(tmp), "bench", db.checkpoint("bench"), DKVOptions())
            rows.setdefault("get (SSTables)", []).append((
                _timed(lambda: [db.get(k) for k in probe]), _timed(lambda: [d.get(k) for k in probe])))
    out = []
    for op, samples in rows.items():
        n = keys if not op.startswith("scan") else 1
        dkv_s = statistics.median(s[0] for s in samples)
        dict_s = statistics.median(s[1] for s in samples)
        out.append((op, n / dkv_s, n / dict_s))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.keys:,} keys, median of {args.repeat} runs (scan rows: scans/s)")
    print(f"{'operation':36} {'DKV ops/s':>14} {'dict ops/s':>14} {'DKV / dict':>11}")
    for op, dkv, base in run(args.keys, args.repeat):
        print(f"{op:36} {dkv:14,.0f} {base:14,.0f} {dkv / base:11.3f}")


if __name__ == "__main__":
    main()
