"""SSTable builder and reader: round trip, lookups, scans, ranged reads, format checks."""

from __future__ import annotations

import random
from pathlib import Path
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import dkvstream.storage.dkv.sstable as sstable_module
from dkvstream.storage.dkv.block_cache import BlockCache
from dkvstream.storage.dkv.sstable import FOOTER_SIZE, SSTableBuilder, SSTableReader
from dkvstream.storage.objectstore.local import LocalObjectStore


def build(entries, block_bytes=256, store=None, key="t.sst"):
    b = SSTableBuilder(block_bytes, 10, 3)
    for k, seq, v in entries:
        b.add(k, seq, v)
    data, meta = b.finish()
    store.put(key, data)
    return data, meta


def sample_entries(n: int, seed: int = 1):
    rng = random.Random(seed)
    keys = sorted({rng.randbytes(rng.randint(1, 12)) for _ in range(n)})
    out = []
    for i, k in enumerate(keys):
        v = None if i % 7 == 3 else rng.randbytes(rng.randint(0, 60))
        out.append((k, 1000 + i, v))
    return out


def test_roundtrip_get_and_scan(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    entries = sample_entries(2000)
    data, meta = build(entries, store=store)
    r = SSTableReader(store, "t.sst", len(data), BlockCache(1 << 20))
    assert r.num_blocks > 10
    assert r.entries == len(entries) == meta["entries"]
    assert (r.min_key, r.max_key) == (entries[0][0], entries[-1][0])
    assert (r.min_seq, r.max_seq) == (1000, 1000 + len(entries) - 1)
    assert list(r.iter_from(b"")) == entries
    for k, seq, v in entries:
        assert r.get(k) == (seq, v)
    present = {e[0] for e in entries}
    rng = random.Random(2)
    for _ in range(2000):
        probe = rng.randbytes(rng.randint(1, 12))
        if probe not in present:
            assert r.get(probe) is None


def test_iter_from_bounds(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    entries = [(b"k%04d" % i, i + 1, b"v%d" % i) for i in range(500)]
    data, _ = build(entries, store=store, block_bytes=100)
    r = SSTableReader(store, "t.sst")
    assert list(r.iter_from(b"k0100", b"k0200")) == entries[100:200]
    assert list(r.iter_from(b"k0100x", b"k0101x")) == entries[101:102]
    assert list(r.iter_from(b"a", b"b")) == []
    assert list(r.iter_from(b"z")) == []
    assert list(r.iter_from(b"k0499")) == entries[499:]


def test_large_table_reads_blocks_on_demand(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    rng = random.Random(5)
    entries = [(b"key%08d" % i, i + 1, rng.randbytes(100)) for i in range(3000)]
    data, _ = build(entries, store=store, block_bytes=4096)
    assert len(data) > 64 << 10  # bigger than the first tail read
    store.stats.reset()
    r = SSTableReader(store, "t.sst", len(data), BlockCache(1 << 20))
    assert store.stats.snapshot()["GET"] == 1  # footer + meta in one ranged GET
    assert r.get(b"key00001234") == (1235, entries[1234][2])
    assert store.stats.snapshot()["GET"] == 2  # one block
    assert r.get(b"key00001235") == (1236, entries[1235][2])
    assert store.stats.snapshot()["GET"] == 2  # same block, from cache
    assert store.stats.snapshot()["bytes_read"] < len(data) // 2


def test_builder_requires_increasing_keys() -> None:
    b = SSTableBuilder(128, 10, 1)
    b.add(b"b", 1, b"x")
    with pytest.raises(ValueError):
        b.add(b"b", 2, b"y")
    with pytest.raises(ValueError):
        b.add(b"a", 3, b"y")
    with pytest.raises(ValueError):
        SSTableBuilder(128, 10, 1).finish()


def test_footer_size_is_fixed(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    data, _ = build([(b"a", 1, b"1")], store=store)
    assert FOOTER_SIZE == 32
    assert data[-8:] == b"DKVSST\x00\x01"


def test_meta_larger_than_first_tail_read(tmp_path: Path) -> None:
    # Tiny blocks make the sparse index (meta block) exceed TAIL_READ_BYTES, so the
    # reader needs a second ranged GET for the meta block.
    from dkvstream.storage.dkv.sstable import TAIL_READ_BYTES

    store = LocalObjectStore(tmp_path)
    entries = [(b"key-%06d" % i, i + 1, b"v") for i in range(8000)]
    data, meta = build(entries, store=store, block_bytes=1)
    assert len(meta["blocks"]) == 8000
    store.stats.reset()
    r = SSTableReader(store, "t.sst", len(data))
    assert len(data) - meta["blocks"][-1][1] > TAIL_READ_BYTES
    assert store.stats.snapshot()["GET"] == 2
    assert r.get(b"key-004321") == (4322, b"v")
    assert list(r.iter_from(b"key-007998")) == entries[7998:]


def test_decode_block_rejects_malformed_blocks() -> None:
    # Blocks that pass their crc but are malformed (a writer bug) are still rejected.
    import struct

    from dkvstream.storage.dkv.sstable import _decode_block
    from dkvstream.storage.errors import CorruptionError

    def block(flags: bytes, vlen: int, extra: bytes = b"") -> bytes:
        return struct.pack("<IIIQ", 1, 1, vlen, 9) + flags + b"k" + b"v" * vlen + extra

    assert _decode_block(block(b"\x00", 1), "u", 0, 0, 1) == ([b"k"], [9], [b"v"])
    assert _decode_block(block(b"\x01", 0), "u", 0, 0, 1) == ([b"k"], [9], [None])
    for bad, match in (
        (block(b"\x02", 1), "flags"),
        (block(b"\x01", 1), "tombstone"),
        (block(b"\x00", 1, b"junk"), "add up"),
        (block(b"\x00", 1)[:-3], "block"),
    ):
        with pytest.raises(CorruptionError, match=match):
            _decode_block(bad, "file:///t.sst", 3, 77, 1)
    with pytest.raises(CorruptionError, match="index says 2"):
        _decode_block(block(b"\x00", 1), "u", 0, 0, 2)


def test_fixed_width_lookup_in_raw_block(tmp_path: Path) -> None:
    # Tables held whole are searched in the raw block; fixed-width keys use a substring
    # search, so probes that occur across two adjacent keys must not match.
    store = LocalObjectStore(tmp_path)
    keys = [bytes([a, b]) for a in range(97, 123, 2) for b in range(97, 123, 3)]
    entries = [(k, i + 1, None if i % 5 == 2 else k * 3) for i, k in enumerate(keys)]
    data, _ = build(entries, store=store, block_bytes=64)
    r = SSTableReader(store, "t.sst", len(data), None, data)
    for k, seq, v in entries:
        assert r.get_unfiltered(k) == (seq, v)
    present = set(keys)
    concat = b"".join(keys)
    for i in range(len(concat) - 1):
        probe = concat[i : i + 2]
        if probe not in present:
            assert r.get_unfiltered(probe) is None
    for probe in (b"a", b"aaa", b"", b"zz", b"a\x00"):
        assert r.get_unfiltered(probe) is None


_entries = st.dictionaries(st.binary(max_size=12), st.binary(max_size=200) | st.none(), max_size=120)


@pytest.mark.parametrize("native", [
    pytest.param(True, id="native",
                 marks=pytest.mark.skipif(sstable_module.NATIVE is None, reason="C module not built")),
    pytest.param(False, id="python")])
@settings(max_examples=150, deadline=None)
@given(entries=_entries, block_bytes=st.integers(1, 600), cuts=st.lists(st.integers(0, 120), max_size=4))
def test_add_columns_builds_the_same_bytes_as_add(native, entries, block_bytes, cuts) -> None:
    """Reference: ``add`` per entry. ``add_columns`` in one or several calls must give
    byte-identical tables (same block boundaries, index, filter and footer), on the C
    path (``encode_blocks``) and on the Python one."""
    with mock.patch.object(sstable_module, "NATIVE", sstable_module.NATIVE if native else None):
        _check_add_columns(entries, block_bytes, cuts)


def _check_add_columns(entries, block_bytes, cuts) -> None:
    if not entries:
        return
    keys = sorted(entries)
    seqs = [(i * 7919) % 1000 + 1 for i in range(len(keys))]
    values = [entries[k] for k in keys]
    ref = SSTableBuilder(block_bytes, 10, 1)
    for k, q, v in zip(keys, seqs, values):
        ref.add(k, q, v)
    got = SSTableBuilder(block_bytes, 10, 1)
    bounds = sorted({0, len(keys), *(c % (len(keys) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:]):
        got.add_columns(keys[a:b], seqs[a:b], values[a:b])
    assert got.raw_bytes == ref.raw_bytes
    assert got.finish() == ref.finish()


@pytest.mark.skipif(sstable_module.NATIVE is None, reason="C module not built")
def test_add_columns_after_an_open_block_cuts_the_whole_blocks_in_c() -> None:
    """A compaction adds its run in slices, each leaving a block open for the next: the
    next slice finishes that block in Python and its whole blocks go to the C encoder
    (not all its rows through Python), with the same bytes as ``add`` per row."""
    keys = [b"k%05d" % i for i in range(400)]
    seqs = list(range(1, 401))
    values = [b"v" * 40] * 400
    encoded: list[int] = []
    native = sstable_module.NATIVE

    class Counting:
        def __getattr__(self, name):
            return getattr(native, name)

        def encode_blocks(self, k, q, v, block_bytes):
            raws, used = native.encode_blocks(k, q, v, block_bytes)
            encoded.append(used)
            return raws, used

    with mock.patch.object(sstable_module, "NATIVE", Counting()):
        got = SSTableBuilder(512, 10, 1)
        got.add_columns(keys[:3], seqs[:3], values[:3])  # leaves a block open
        got.add_columns(keys[3:], seqs[3:], values[3:])
    # 512-byte blocks of 40-byte values: ~8 rows per block; all but the rows finishing
    # the open block and those of the last, open one were encoded in C.
    assert sum(encoded) >= 400 - 3 - 2 * 16
    ref = SSTableBuilder(512, 10, 1)
    for k, q, v in zip(keys, seqs, values):
        ref.add(k, q, v)
    assert got.finish() == ref.finish()


def test_add_columns_requires_increasing_keys() -> None:
    b = SSTableBuilder(64, 10, 1)
    b.add_columns([b"a", b"c"], [1, 2], [b"", b""])
    with pytest.raises(ValueError, match="increasing"):
        b.add_columns([b"b"], [3], [b""])
    with pytest.raises(ValueError, match="increasing"):
        b.add_columns([b"d", b"d"], [3, 4], [b"", b""])


@pytest.mark.skipif(sstable_module.NATIVE is None, reason="C module not built")
def test_encode_blocks_names_the_bad_row_and_type() -> None:
    enc = sstable_module.NATIVE.encode_blocks
    with pytest.raises(TypeError, match="row 1: value must be bytes or None, got bytearray"):
        enc([b"a", b"b"], [1, 2], [b"", bytearray(b"x")], 1)
    with pytest.raises(TypeError, match="row 0: key must be bytes, got Sub"):
        enc([type("Sub", (bytes,), {})(b"a")], [1], [b""], 1)
    with pytest.raises(TypeError, match="item 1 must be bytes, got str"):
        sstable_module.NATIVE.sort_bytes([b"a", "b"])
