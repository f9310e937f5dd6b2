"""Memtable: the three lookup results, ordering, snapshots and size accounting."""

from __future__ import annotations

import random
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import dkvstream.storage.dkv.memtable as memtable_module
from dkvstream.storage.dkv.memtable import Memtable
from dkvstream.storage.dkv.native import NATIVE

# The C loop (when built) and the pure-Python reference an install without a compiler runs.
PATHS = [pytest.param(True, id="native", marks=pytest.mark.skipif(NATIVE is None, reason="C module not built")),
         pytest.param(False, id="python")]


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


@pytest.mark.parametrize("native", PATHS)
@settings(max_examples=150, deadline=None)
@given(before=st.lists(st.tuples(st.binary(max_size=3), st.binary(max_size=9) | st.none()), max_size=20),
       rows=st.lists(st.tuples(st.binary(max_size=3), st.binary(max_size=9) | st.none()), max_size=40))
def test_put_batch_equals_put_per_row(native, before, rows) -> None:
    """Reference: ``put`` per row; ``put_batch`` must leave the same entries (duplicates
    in a batch included), the same sorted order and seq bounds, on the C path and on the
    Python one."""
    with mock.patch.object(memtable_module, "NATIVE", memtable_module.NATIVE if native else None):
        _check_put_batch(native, before, rows)


def _check_put_batch(native, before, rows) -> None:
    ref, got = Memtable(), Memtable()
    for seq, (k, v) in enumerate(before, 1):
        ref.put(k, seq, v)
        got.put(k, seq, v)
    first = len(before) + 1
    for seq, (k, v) in enumerate(rows, first):
        ref.put(k, seq, v)
    got.put_batch([k for k, _ in rows], range(first, first + len(rows)), [v for _, v in rows])
    assert list(got.entries()) == list(ref.entries())
    assert got.columns() == tuple(map(list, zip(*ref.entries()))) or not len(ref)
    assert len(got) == len(ref)
    assert (got.min_seq, got.max_seq) == (ref.min_seq, ref.max_seq)
    if native or len({k for k, _ in rows}) == len(rows):
        # The C loop accounts a key written twice in one batch as put does; the Python
        # path counts a batch's size from one lookup before it.
        assert got.approx_bytes == ref.approx_bytes


@pytest.mark.skipif(NATIVE is None, reason="C module not built (the Python path leaves checks to DKV.write_batch)")
@pytest.mark.parametrize("bad", [bytearray(b"3"), "3", 3], ids=["bytearray", "str", "int"])
def test_put_batch_with_a_bad_row_changes_nothing(bad) -> None:
    """A batch whose last value is not bytes raises a TypeError naming the row and type,
    and leaves the memtable exactly as before (oracle: a dict of the writes before it):
    get, range and the flush's columns agree with it."""
    mem, model = Memtable(), {}
    for seq, (k, v) in enumerate([(b"b", b"old"), (b"d", None), (b"x", b"y")], 1):
        mem.put(k, seq, v)
        model[k] = (seq, v)
    size = mem.approx_bytes
    with pytest.raises(TypeError, match=f"row 2: value must be bytes or None, got {type(bad).__name__}"):
        mem.put_batch([b"a", b"b", b"c"], range(4, 7), [b"1", b"2", bad])
    for k in (b"a", b"b", b"c", b"d", b"x"):
        assert mem.get(k) == model.get(k)
    assert mem.range(b"", None) == [(k, *model[k]) for k in sorted(model)]
    assert mem.columns() == tuple(map(list, zip(*[(k, *model[k]) for k in sorted(model)])))
    assert (len(mem), mem.approx_bytes, mem.max_seq) == (3, size, 3)
