"""Offset-index lookups: pages touched per tail lookup as the index grows.

Usage: ``.venv/bin/python bench/log_index.py [--lookups 1000] [--plot PATH]``

For indexes of 10^3 .. 10^7 entries (8-byte offset entries, 4 KiB pages), looks up
the ``--lookups`` newest offsets (a consumer at the tail) with Kafka's warm/cold
search (``dkvstream.storage.log.index``) and, as the baseline measured in the same run, with a
plain binary search over the whole index. Prints the distinct pages touched by all
tail lookups, the pages per lookup, and microseconds per lookup. The warm section
(the last 8 KiB) keeps the tail's page set constant whatever the index size; the plain
search walks a new path of pages from the middle of the index as it grows, which on
a real page cache means page faults on cold pages.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tabulate import tabulate

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from bench.plot import load_average
from dkvstream.storage.log.index import OFFSET_ENTRY, PAGE_BYTES, OffsetIndex


def plain_search(keys: np.ndarray, target: int, pages: set[int]) -> int:
    """Largest slot with key <= target by plain bisection, counting pages (baseline)."""
    lo, hi = 0, len(keys) - 1
    pages.add(0)
    if int(keys[0]) > target:
        return -1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        pages.add(mid * 8 // PAGE_BYTES)
        if int(keys[mid]) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def run(lookups: int) -> list[list]:
    rows = []
    for exp in range(3, 8):
        n = 10**exp
        offs = (np.arange(n, dtype=np.uint32) * 5)
        entries = np.empty(n, OFFSET_ENTRY)
        entries["offset"], entries["position"] = offs, offs
        idx = OffsetIndex(entries)
        targets = [int(x) + 2 for x in offs[-lookups:]]
        warm_all: set[int] = set()
        per_lookup = []
        t = time.perf_counter()
        for tg in targets:
            p: set[int] = set()
            idx.lookup(tg, p)
            warm_all |= p
            per_lookup.append(len(p))
        warm_us = (time.perf_counter() - t) / len(targets) * 1e6
        plain_all: set[int] = set()
        plain_per = []
        t = time.perf_counter()
        for tg in targets:
            p = set()
            plain_search(entries["offset"], tg, p)
            plain_all |= p
            plain_per.append(len(p))
        plain_us = (time.perf_counter() - t) / len(targets) * 1e6
        rows.append([f"{n:,}", f"{n * 8 / 1024 / 1024:.2f}", len(warm_all), f"{np.mean(per_lookup):.1f}",
                     f"{warm_us:.1f}", len(plain_all), f"{np.mean(plain_per):.1f}", f"{plain_us:.1f}",
                     f"{len(plain_all) / len(warm_all):.1f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lookups", type=int, default=1000, help="tail lookups per index size (default 1000)")
    ap.add_argument("--plot", metavar="PATH", help="write pages per lookup as a PNG")
    args = ap.parse_args()
    load_before = load_average()
    rows = run(args.lookups)
    print(tabulate(rows, headers=["entries", "index MiB", "warm/cold: pages touched", "pages/lookup", "us/lookup",
                                  "plain: pages touched", "pages/lookup", "us/lookup", "plain/warm pages"],
                   tablefmt="github"))
    load = f"{load_before} before, {load_average()} after"
    print(f"\nus/lookup: wall clock (time.perf_counter); load average (1 / 5 / 15 min) {load}; "
          f"{os.cpu_count()} cores, shared")
    if args.plot:
        from bench.plot import bar_panels

        labels = [f"{r[0]} entries" for r in rows]
        bar_panels(args.plot, f"Offset index: {args.lookups:,} tail lookups per index size", [
            {"title": "warm/cold search (dkvstream.storage.log.index)", "labels": labels, "fmt": "{:.1f}",
             "xlabel": "index pages touched per lookup", "values": [float(r[3]) for r in rows]},
            {"title": "plain bisection (baseline)", "labels": labels, "fmt": "{:.1f}",
             "xlabel": "index pages touched per lookup", "values": [float(r[6]) for r in rows]}],
            caption=f"Pages are counted, not timed. Load average {load}; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
