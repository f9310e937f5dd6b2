"""Memtable: the three lookup results, ordering, snapshots and size accounting."""

from __future__ import annotations

import random

from storage.dkv.memtable import Memtable


def test_three_results() -> None:
    m = Memtable()
    m.put(b"a", 1, b"x")
    m.put(b"b", 2, None)
    assert m.get(b"a") == (1, b"x")  # value
    assert m.get(b"b") == (2, None)  # deleted
    assert m.get(b"c") is None  # absent


def test_range_and_entries_sorted_after_random_inserts() -> None:
    rng = random.Random(3)
    m = Memtable()
    model = {}
    for seq in range(1, 3000):
        k = rng.randbytes(rng.randint(0, 3))
        v = None if rng.random() < 0.2 else rng.randbytes(3)
        m.put(k, seq, v)
        model[k] = (seq, v)
        if seq % 97 == 0:  # interleave scans so both merge paths (insort, resort) run
            lo = rng.randbytes(1)
            assert m.range(lo, None) == [(k, *model[k]) for k in sorted(model) if k >= lo]
    assert list(m.entries()) == [(k, *model[k]) for k in sorted(model)]
    lo, hi = b"\x10", b"\x20"
    assert m.range(lo, hi) == [(k, *model[k]) for k in sorted(model) if lo <= k < hi]
    assert len(m) == len(model)


def test_range_is_a_snapshot() -> None:
    m = Memtable()
    m.put(b"a", 1, b"1")
    snap = m.range(b"", None)
    m.put(b"a", 2, b"2")
    m.put(b"b", 3, b"3")
    assert snap == [(b"a", 1, b"1")]


def test_size_accounting_tracks_overwrites() -> None:
    m = Memtable()
    m.put(b"k", 1, b"x" * 100)
    first = m.approx_bytes
    m.put(b"k", 2, b"x" * 10)
    assert m.approx_bytes == first - 90
    m.put(b"k", 3, None)
    assert m.approx_bytes == first - 100
    assert (m.min_seq, m.max_seq) == (1, 3)
