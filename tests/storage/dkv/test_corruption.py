"""Corruption: a flipped byte anywhere in an SSTable, WAL object or manifest raises
CorruptionError naming the file; nothing is ever returned silently wrong."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.sstable import FOOTER_SIZE, SSTableBuilder, SSTableReader
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore.local import LocalObjectStore

OPTS = DKVOptions(memtable_bytes=1 << 20, block_bytes=200, l0_compaction_trigger=10)
ENTRIES = [(b"k%04d" % i, i + 1, None if i % 5 == 0 else b"value-%d" % i) for i in range(300)]


def flip(store: LocalObjectStore, key: str, offset: int) -> None:
    path = Path(store.uri(key).removeprefix("file://"))
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def small_table(tmp_path: Path) -> tuple[LocalObjectStore, bytes, SSTableReader]:
    store = LocalObjectStore(tmp_path)
    b = SSTableBuilder(200, 10, 3)
    for e in ENTRIES:
        b.add(*e)
    data, _ = b.finish()
    store.put("x/table-1.sst", data)
    return store, data, SSTableReader(store, "x/table-1.sst", len(data))


def read_everything(store: LocalObjectStore, size: int) -> None:
    r = SSTableReader(store, "x/table-1.sst", size)  # no cache: every read verifies
    assert list(r.iter_from(b"")) == ENTRIES  # if no error, the data must be exact
    for k, seq, v in ENTRIES[::17]:
        assert r.get(k) == (seq, v)


def regions(reader: SSTableReader, size: int) -> dict[str, range]:
    bounds = reader.block_bounds()
    meta_off = bounds[-1][0] + bounds[-1][1]
    return {
        "first_block": range(bounds[0][0], bounds[0][0] + bounds[0][1]),
        "middle_block": range(bounds[len(bounds) // 2][0], sum(bounds[len(bounds) // 2])),
        "block_crc": range(bounds[1][0] + bounds[1][1] - 4, bounds[1][0] + bounds[1][1]),
        "meta": range(meta_off, size - FOOTER_SIZE),
        "footer": range(size - FOOTER_SIZE, size),
    }


@pytest.mark.parametrize("region", ["first_block", "middle_block", "block_crc", "meta", "footer"])
def test_sstable_byte_flip_detected(tmp_path: Path, region: str) -> None:
    store, data, reader = small_table(tmp_path)
    assert reader.num_blocks >= 5
    offsets = list(regions(reader, len(data))[region])
    rng = random.Random(region)
    sample = offsets if len(offsets) <= 40 else sorted(rng.sample(offsets, 40))
    for off in sample:
        store.put("x/table-1.sst", data)
        flip(store, "x/table-1.sst", off)
        with pytest.raises(CorruptionError, match="table-1.sst"):
            read_everything(store, len(data))


def test_truncated_or_extended_table_detected(tmp_path: Path) -> None:
    store, data, _ = small_table(tmp_path)
    store.put("x/table-1.sst", data[:-1])
    with pytest.raises(CorruptionError, match="table-1.sst"):
        read_everything(store, len(data))
    store.put("x/table-1.sst", data + b"\x00")
    with pytest.raises(CorruptionError, match="table-1.sst"):
        read_everything(store, len(data) + 1)


def make_db(tmp_path: Path) -> tuple[LocalObjectStore, str]:
    """Range ``p/r`` checkpointed as ``e00000001-a1``: ENTRIES[:200] in one SSTable, then in
    one WAL object a delete of k0001 and ENTRIES[200:] set to b"late". Returns the store
    and the manifest key."""
    store = LocalObjectStore(tmp_path)
    db = DKV.open(store, "p/r", options=OPTS)
    for k, _, v in ENTRIES[:200]:
        db.put(k, v or b"")
    db.flush()  # one table
    db.delete(b"k0001")
    for k, _, _ in ENTRIES[200:]:
        db.put(k, b"late")  # the last record of the WAL object: k0299 -> b"late"
    mkey = db.checkpoint("e00000001-a1")  # WAL object holds the delete and the late writes
    db.close()
    return store, mkey


def test_dkv_sstable_flip_detected_on_read(tmp_path: Path) -> None:
    store, mkey = make_db(tmp_path)
    (sst,) = store.list("p/r/sst/")
    size = store.size(sst)
    for off in (3, size // 2, size - 40, size - 10, size - 1):
        data = store.get(sst)
        flip(store, sst, off)
        db = DKV.open(store, "p/r", mkey, OPTS)
        with pytest.raises(CorruptionError, match=sst.rsplit("/", 1)[1]):
            list(db.scan_range(b"", None))
        store.put(sst, data)


def test_dkv_wal_flip_detected_on_open(tmp_path: Path) -> None:
    store, mkey = make_db(tmp_path)
    (wal,) = store.list("p/r/wal/")
    data = store.get(wal)
    for off in random.Random(1).sample(range(len(data)), 30):
        store.put(wal, data)
        flip(store, wal, off)
        with pytest.raises(CorruptionError, match=wal.rsplit("/", 1)[1]):
            DKV.open(store, "p/r", mkey, OPTS)


def test_dkv_manifest_flip_detected_on_open(tmp_path: Path) -> None:
    store, mkey = make_db(tmp_path)
    data = store.get(mkey)
    for off in [*random.Random(2).sample(range(len(data)), 40), len(data) - 1, len(data) - 5]:
        store.put(mkey, data)
        flip(store, mkey, off)
        with pytest.raises(CorruptionError, match="e00000001-a1.json"):
            DKV.open(store, "p/r", mkey, OPTS)
    store.put(mkey, data)
    db = DKV.open(store, "p/r", mkey, OPTS)  # intact again: opens and reads fine
    assert db.get(b"k0250") == b"late" and db.get(b"k0001") is None


def test_dkv_short_scan_names_a_malformed_block(tmp_path: Path) -> None:
    """A block whose crc32c holds but whose structure does not (here: planted in the block
    cache, as a decompressor bug would leave it) fails the short-scan merge; the error names
    the table and block instead of a bare ValueError."""
    store, mkey = make_db(tmp_path)
    db = DKV.open(store, "p/r", mkey, OPTS)
    want = [(k, v or b"") for k, _s, v in ENTRIES[:10] if k != b"k0001"]
    assert list(db.scan_prefix(b"k000")) == want  # a short scan: its blocks are cached now
    (t,) = db.levels.l0
    span = db._tables.reader(t).block_span(b"k000", b"k001")
    assert 1 < len(span) <= 16
    cache = db._tables.cache
    i = span[-1]
    key = cache.table_base(t.key) + i
    raw = cache.get(key)
    cache.put(key, raw[:-1], len(raw))  # lengths no longer add up
    name = t.key.rsplit("/", 1)[1]
    with pytest.raises(CorruptionError, match=rf"{name}: malformed data block {i} at offset"):
        list(db.scan_prefix(b"k000"))
