"""The compiled read-path loops (``storage/dkv/_native.c``) agree with their pure-Python
references on random and corrupted inputs, and both agree with plain oracles (a set of
added keys, the entries a block was built from, a dict of newest versions)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.dkv import native
from dkvstream.storage.dkv.bloom import (
    build_bloom,
    build_bloom_py,
    first_candidate_py,
    key_hash,
    may_contain_hash_py,
)
from dkvstream.storage.dkv.memtable import columns_py
from dkvstream.storage.dkv.merge import merge_live_py, merge_spans_columns_py, merge_spans_live_py
from dkvstream.storage.dkv.sstable import block_get_py, decode_block_py, entry_ends_py


@pytest.fixture(scope="module")
def c():
    """The compiled module. Its absence fails the tests: setup.sh builds it with the
    machine's gcc, and a silent fallback would hide a 2-3x slowdown of DKV reads. Only
    ``DKVSTREAM_DKV_NATIVE=0`` (a deliberate pure-Python run) skips them."""
    if native.DISABLED:
        pytest.skip("DKVSTREAM_DKV_NATIVE=0: pure-Python paths forced")
    if native.NATIVE is None:
        pytest.fail("dkvstream.storage.dkv._native is not built: run platform/setup.sh (needs gcc)")
    return native.NATIVE


keys_st = st.lists(st.binary(min_size=0, max_size=12), max_size=60)


def encode_block(entries: list[tuple[bytes, int, bytes | None]]) -> bytes:
    """The ``raw_block`` layout of sstable.py, written from its spec (not the builder)."""
    n = len(entries)
    out = [struct.pack("<I", n)]
    out += [struct.pack("<I", len(k)) for k, _s, _v in entries]
    out += [struct.pack("<I", 0 if v is None else len(v)) for _k, _s, v in entries]
    out += [struct.pack("<Q", s) for _k, s, _v in entries]
    out.append(bytes(1 if v is None else 0 for _k, _s, v in entries))
    out += [k for k, _s, _v in entries]
    out += [v for _k, _s, v in entries if v is not None]
    return b"".join(out)


entries_st = st.dictionaries(
    st.binary(min_size=1, max_size=10),
    st.tuples(st.integers(0, 2**64 - 1), st.none() | st.binary(max_size=20)),
    min_size=1, max_size=40,
).map(lambda d: [(k, *d[k]) for k in sorted(d)])
fixed_entries_st = st.dictionaries(
    st.binary(min_size=8, max_size=8),
    st.tuples(st.integers(0, 2**40), st.binary(min_size=5, max_size=5)),
    min_size=1, max_size=40,
).map(lambda d: [(k, *d[k]) for k in sorted(d)])


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ValueError:
        return ("ValueError", None)


def test_native_module_is_built(c) -> None:
    assert {
        "bloom_first", "bloom_may_contain", "decode_block", "block_get", "block_range",
        "merge_live", "merge_spans_live", "merge_spans_columns", "entry_ends", "key_hashes", "seq_bounds",
        "concat_rows", "memtable_get_many", "pack_int_rows", "unpack_int_rows",
    } <= set(dir(c))


@settings(max_examples=150)
@given(added=keys_st, probes=keys_st, bits_per_key=st.integers(1, 16))
def test_bloom_probe_matches_reference_and_has_no_false_negatives(c, added, probes, bits_per_key):
    k, bits = build_bloom(added, bits_per_key)
    m = len(bits) * 8
    for key in added + probes:
        h = key_hash(key)
        got = c.bloom_may_contain(bits, m, k, h)
        assert got == may_contain_hash_py(bits, m, k, h)
        if key in added:
            assert got, key


@settings(max_examples=150)
@given(
    tables=st.lists(st.tuples(keys_st.filter(bool), st.integers(1, 12)), max_size=6),
    probes=keys_st, start=st.integers(-1, 7),
)
def test_bloom_first_matches_reference(c, tables, probes, start):
    rows = []
    for keys, bpk in tables:
        k, bits = build_bloom(keys, bpk)
        rows.append((min(keys), max(keys), bits, len(bits) * 8, k, "payload"))
    for key in probes + [kk for keys, _ in tables for kk in keys]:
        h = key_hash(key)
        got = c.bloom_first(rows, start, key, h)
        assert got == first_candidate_py(rows, start, key, h)
        # Oracle: a table holding the key is never skipped.
        holders = [i for i, (keys, _) in enumerate(tables) if key in keys and i >= max(start, 0)]
        if holders:
            assert 0 <= got <= holders[0]


@settings(max_examples=200)
@given(entries=entries_st | fixed_entries_st, absent=keys_st)
def test_decode_and_get_match_the_entries_a_block_holds(c, entries, absent):
    raw = encode_block(entries)
    want = ([k for k, _s, _v in entries], [s for _k, s, _v in entries], [v for *_x, v in entries])
    assert c.decode_block(raw, len(entries)) == want == decode_block_py(raw, len(entries))
    oracle = {k: (s, v) for k, s, v in entries}
    for key in list(oracle) + absent:
        got = c.block_get(raw, len(entries), key)
        assert got == block_get_py(raw, len(entries), key) == oracle.get(key)


@settings(max_examples=300)
@given(
    entries=entries_st | fixed_entries_st, data=st.data(),
    expect_delta=st.sampled_from([0, 0, 0, 1, -1]),
)
def test_corrupt_blocks_fail_alike(c, entries, data, expect_delta):
    raw = bytearray(encode_block(entries))
    edit = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if edit == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif edit == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    else:
        raw += b"\x00"
    raw = bytes(raw)
    n = len(entries) + expect_delta
    if n < 0:
        return
    assert _outcome(c.decode_block, raw, n) == _outcome(decode_block_py, raw, n)
    for key, _s, _v in entries:
        native_get = _outcome(c.block_get, raw, n, key)
        py_get = _outcome(block_get_py, raw, n, key)
        if _outcome(decode_block_py, raw, n)[0] == "ok":
            # A well-formed block: both lookups agree with the decoded lists.
            assert native_get == py_get
        else:
            # A malformed block: a lookup either raises or, where the damage is outside
            # the header (order, another entry's flags), may still answer; it never
            # crashes the process.
            assert native_get[0] in ("ok", "ValueError")


@settings(max_examples=200)
@given(
    sources=st.lists(
        st.dictionaries(st.binary(min_size=1, max_size=4), st.none() | st.binary(max_size=4),
                        max_size=20),
        max_size=5,
    ),
    data=st.data(),
)
def test_merge_live_matches_reference_and_newest_wins(c, sources, data):
    parts, oracle, seq = [], {}, 0
    for src in sources:  # later sources are newer: higher sequence numbers
        keys = sorted(src)
        seqs = []
        for k in keys:
            seq += 1
            seqs.append(seq)
            oracle[k] = src[k]
        lo = data.draw(st.integers(0, len(keys)))
        hi = data.draw(st.integers(lo, len(keys)))
        parts.append((keys, seqs, [src[k] for k in keys], lo, hi))
    got = c.merge_live(parts)
    assert got == merge_live_py(parts)
    if all(p[3] == 0 and p[4] == len(p[0]) for p in parts):
        assert got == sorted((k, v) for k, v in oracle.items() if v is not None)


def test_merge_newest_version_wins_whatever_the_source_order(c) -> None:
    old = ([b"a", b"b"], [1, 2], [b"old", b"x"])
    new = ([b"a"], [3], [b"new"])
    tomb = ([b"b"], [4], [None])
    assert c.merge_live([old, new]) == c.merge_live([new, old]) == [(b"a", b"new"), (b"b", b"x")]
    assert c.merge_live([tomb, old, new]) == [(b"a", b"new")]
    block = (
        [encode_block([(b"a", 5, b"block"), (b"b", 1, b"y")])], [2], b"", None
    )  # newer than the parts for a, older for b
    assert c.merge_spans_live([old, new], [block]) == [(b"a", b"block"), (b"b", b"x")]
    assert c.merge_spans_live([tomb], [block]) == [(b"a", b"block")]


def test_merge_live_rejects_bad_parts(c) -> None:
    with pytest.raises(ValueError, match="bounds"):
        c.merge_live([([b"a"], [1], [b"x"], 0, 2)])
    with pytest.raises(TypeError, match="not bytes"):
        c.merge_live([(["a"], [1], [b"x"], 0, 1)])


bound_st = st.none() | st.binary(max_size=3)


@st.composite
def spans_st(draw):
    """Sources of a short scan and their oracle: tables (sorted entries with unique
    sequence numbers, split into raw blocks at random points) read in ``[start, end)``
    each, and memtable-like column batches."""
    n_tables = draw(st.integers(0, 4))
    n_parts = draw(st.integers(0, 2))
    seqs = iter(draw(st.permutations(range(1, 400))))
    spans, parts, versions = [], [], []
    for _ in range(n_tables):
        d = draw(st.dictionaries(st.binary(min_size=1, max_size=3),
                                 st.none() | st.binary(max_size=6), max_size=30))
        entries = [(k, next(seqs), d[k]) for k in sorted(d)]
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(entries) - 1)), max_size=4)))
        blocks = [entries[a:b] for a, b in zip([0, *cuts], [*cuts, len(entries)]) if entries[a:b]]
        start = draw(st.binary(max_size=3))
        end = draw(bound_st)
        spans.append(([encode_block(b) for b in blocks], [len(b) for b in blocks], start, end))
        versions += [e for e in entries if e[0] >= start and (end is None or e[0] < end)]
    for _ in range(n_parts):
        d = draw(st.dictionaries(st.binary(min_size=1, max_size=3),
                                 st.none() | st.binary(max_size=6), max_size=20))
        keys = sorted(d)
        pseqs = [next(seqs) for _ in keys]
        parts.append((keys, pseqs, [d[k] for k in keys]))
        versions += list(zip(keys, pseqs, (d[k] for k in keys)))
    newest = {}
    for k, seq, v in sorted(versions, key=lambda e: e[1]):
        newest[k] = (seq, v)
    return parts, spans, dict(sorted(newest.items()))


@settings(max_examples=300)
@given(case=spans_st())
def test_merge_spans_live_matches_reference_and_newest_wins(c, case):
    parts, spans, newest = case
    got = c.merge_spans_live(parts, spans)
    oracle = [(k, v) for k, (_seq, v) in newest.items() if v is not None]
    assert got == merge_spans_live_py(parts, spans) == oracle


@settings(max_examples=300)
@given(case=spans_st(), drop=st.booleans())
def test_merge_spans_columns_matches_reference_and_newest_wins(c, case, drop):
    """A compaction's merge: overwrites across tables, tombstones shadowing older values
    and dropped only when asked; the oracle is the newest version per key (a dict)."""
    parts, spans, newest = case
    rows = [(k, seq, v) for k, (seq, v) in newest.items() if not (drop and v is None)]
    oracle = ([k for k, _s, _v in rows], [s for _k, s, _v in rows], [v for *_x, v in rows])
    got = c.merge_spans_columns(parts, spans, drop)
    assert got == merge_spans_columns_py(parts, spans, drop) == oracle


@settings(max_examples=300)
@given(case=spans_st(), data=st.data())
def test_merge_spans_live_corrupt_blocks_fail_alike(c, case, data):
    parts, spans, _oracle = case
    if not any(raws for raws, *_ in spans):
        return
    i = data.draw(st.sampled_from([i for i, (raws, *_x) in enumerate(spans) if raws]))
    raws, counts, start, end = spans[i]
    j = data.draw(st.integers(0, len(raws) - 1))
    raw = bytearray(raws[j])
    edit = data.draw(st.sampled_from(["flip", "truncate", "extend", "count", "swap", "unsorted"]))
    if edit == "flip":
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif edit == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    elif edit == "extend":
        raw += b"\x00"
    elif edit == "unsorted":  # well-formed but for key order: only the order check sees it
        entries = decode_block_py(raws[j], counts[j])
        raw = bytearray(encode_block(list(zip(*entries))[::-1]))
    raws = [*raws[:j], bytes(raw), *raws[j + 1 :]]
    if edit == "count":
        counts = [*counts[:j], counts[j] + 1, *counts[j + 1 :]]
    if edit == "swap" and len(raws) > 1:  # blocks out of order: keys no longer ascend
        raws = raws[::-1]
        counts = counts[::-1]
    spans = [*spans[:i], (raws, counts, start, end), *spans[i + 1 :]]
    native = _outcome(c.merge_spans_live, parts, spans)
    assert native == _outcome(merge_spans_live_py, parts, spans)
    columns = _outcome(c.merge_spans_columns, parts, spans, False)
    assert columns == _outcome(merge_spans_columns_py, parts, spans, False)
    assert (columns[0] == "ok") == (native[0] == "ok")


def test_merge_spans_live_rejects_bad_spans(c) -> None:
    block = encode_block([(b"a", 1, b"x")])
    with pytest.raises(TypeError, match="span 0"):
        c.merge_spans_live([], [([block], [], b"", None)])  # counts disagree with blocks
    with pytest.raises(TypeError, match="not bytes"):
        c.merge_spans_live([], [(["a"], [1], b"", None)])
    with pytest.raises(ValueError, match="across blocks"):
        c.merge_spans_live([], [([block, block], [1, 1], b"", None)])
    assert c.merge_spans_live([], [([block], [1], b"", None)]) == [(b"a", b"x")]


@settings(max_examples=200)
@given(rows=st.lists(st.tuples(st.binary(max_size=20), st.none() | st.binary(max_size=30)), max_size=50))
def test_entry_ends_are_the_running_row_sizes(c, rows) -> None:
    keys, values = [k for k, _v in rows], [v for _k, v in rows]
    want, acc = [], 0
    for k, v in rows:
        acc += 17 + len(k) + (0 if v is None else len(v))
        want.append(acc)
    got = np.frombuffer(c.entry_ends(keys, values), np.int64).tolist()
    assert got == entry_ends_py(keys, values).tolist() == want


@settings(max_examples=200)
@given(seqs=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50))
def test_seq_bounds_are_min_and_max(c, seqs) -> None:
    assert c.seq_bounds(seqs) == (min(seqs), max(seqs))


def test_seq_bounds_rejects_bad_rows(c) -> None:
    with pytest.raises(ValueError, match="no sequence"):
        c.seq_bounds([])
    with pytest.raises(TypeError, match="row 1"):
        c.seq_bounds([1, "2"])
    with pytest.raises(OverflowError, match="row 0"):
        c.seq_bounds([-1])


def test_entry_ends_rejects_bad_rows(c) -> None:
    with pytest.raises(TypeError, match="row 1"):
        c.entry_ends([b"a", "b"], [b"x", b"y"])
    with pytest.raises(ValueError, match="length"):
        c.entry_ends([b"a"], [])


@settings(max_examples=300, deadline=None)
@given(st.sets(st.binary(max_size=24) | st.sampled_from([b"", b"\x00", b"a\x00", b"a", b"a\x00\x00"]), max_size=60))
def test_sort_bytes_is_bytes_order(c, keys) -> None:
    """``sort_bytes`` orders like ``sorted`` on bytes: keys that differ only past 16
    bytes, or by trailing zero bytes (the padding of its 16-byte words), included."""
    keys = list(keys) + [b"p" * 16 + k for k in keys]
    got = list(keys)
    c.sort_bytes(got)
    assert got == sorted(keys)
    with pytest.raises(TypeError):
        c.sort_bytes([b"a", "b"])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.binary(max_size=12), st.tuples(st.integers(0, 2**63), st.none() | st.binary(max_size=8)),
                       max_size=50), st.data())
def test_memtable_columns_matches_reference(c, d, data) -> None:
    """``memtable_columns`` gives ``columns_py``'s (seqs, values) for any subset and order
    of present keys, and the dict's own entries (the oracle); a missing key is KeyError
    in both, a malformed entry TypeError."""
    keys = data.draw(st.lists(st.sampled_from(sorted(d)), max_size=60)) if d else []
    assert c.memtable_columns(d, keys) == columns_py(d, keys) == ([d[k][0] for k in keys], [d[k][1] for k in keys])
    absent = b"absent-" + b"".join(sorted(d))
    for f in (c.memtable_columns, columns_py):
        with pytest.raises(KeyError):
            f(d, keys + [absent])
    with pytest.raises(TypeError):
        c.memtable_columns({b"k": (1, b"v", 2)}, [b"k"])


@settings(max_examples=300)
@given(keys=st.lists(st.binary(max_size=100), max_size=30))
def test_key_hashes_are_xxh64(c, keys) -> None:
    """The Bloom policy's hash in C equals the xxhash library's xxh64 (seed 0) at every
    length: under 4, 8 and 32 bytes and over (each takes its own path in XXH64)."""
    got = np.frombuffer(c.key_hashes(keys), np.uint64).tolist()
    assert got == [key_hash(k) for k in keys]
    with pytest.raises(TypeError, match="row 1"):
        c.key_hashes([b"a", "b"])


@settings(max_examples=150, deadline=None)
@given(added=st.lists(st.binary(max_size=12), min_size=1, max_size=200), probes=keys_st,
       bits_per_key=st.integers(1, 16))
def test_bloom_bits_matches_reference_build(c, added, probes, bits_per_key) -> None:
    """``build_bloom`` with ``_native.bloom_bits`` is byte-identical to the numpy
    reference ``build_bloom_py`` (same policy, so old tables probe the same), and has no
    false negatives (the set of added keys is the oracle)."""
    k, bits = build_bloom(added, bits_per_key)
    assert (k, bits) == build_bloom_py(added, bits_per_key)
    m = len(bits) << 3
    for key in added:
        assert may_contain_hash_py(bits, m, k, key_hash(key))
    for key in probes:
        if not may_contain_hash_py(bits, m, k, key_hash(key)):
            assert key not in added
    with pytest.raises(ValueError):
        c.bloom_bits(b"\x00" * 8, 12, 3)  # m not a multiple of 8
