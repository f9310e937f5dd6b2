"""Rescaling: split one range into two and merge two back with ``DKV.open_from_parents``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.random_writes import random_writes

OPTS = DKVOptions(
    memtable_bytes=2500, block_bytes=200, l0_compaction_trigger=3, target_file_bytes=1200,
    num_levels=4, level_base_bytes=4000, level_multiplier=2, zstd_level=1,
    wal_flush_bytes=1 << 20,
)
MID = b"k0400"


def key(i: int) -> bytes:
    return b"k%04d" % i


def write(db: DKV, model: dict[bytes, bytes], rng: random.Random, n: int, lo: int, hi: int):
    random_writes(db, model, rng, n, keys=range(lo, hi), delete_share=0.25, value_bytes=(0, 20))


def in_range(model: dict[bytes, bytes], lo: bytes, hi: bytes | None) -> dict[bytes, bytes]:
    return {k: v for k, v in model.items() if k >= lo and (hi is None or k < hi)}


def check(db: DKV, model: dict[bytes, bytes]) -> None:
    assert list(db.scan_range(b"", None)) == sorted(model.items())
    for i in range(0, 800, 3):
        assert db.get(key(i)) == model.get(key(i))
    assert list(db.scan_prefix(b"k03")) == sorted(
        (k, v) for k, v in model.items() if k.startswith(b"k03")
    )


@pytest.mark.parametrize("seed", range(3))
def test_split_then_merge(tmp_path: Path, seed: int) -> None:
    store = LocalObjectStore(tmp_path)
    rng = random.Random(seed)
    parent = DKV.open(store, "op/r-all", options=OPTS)
    model: dict[bytes, bytes] = {}
    write(parent, model, rng, 3000, 0, 800)
    write(parent, model, rng, 100, 0, 800)  # some records stay in the WAL
    pkey = parent.checkpoint("e1")
    assert load_manifest(store, pkey).wal, "the test wants WAL records to replay"

    left = DKV.open_from_parents(store, "op/r-left", [pkey], (b"", MID), OPTS)
    right = DKV.open_from_parents(store, "op/r-right", [pkey], (MID, None), OPTS)
    ml, mr = in_range(model, b"", MID), in_range(model, MID, None)
    check(left, ml)
    check(right, mr)
    assert left.key_range == (b"", MID)
    # Shared tables are referenced in place: nothing new under the children's sst/ yet.
    assert not store.list("op/r-left/sst/")
    shared = {t.key for t in left.levels.all_tables()} & {t.key for t in right.levels.all_tables()}
    assert shared and all(k.startswith("op/r-all/") for k in shared)

    lkey = left.checkpoint("e2")
    rkey = right.checkpoint("e2")
    left = DKV.open(store, "op/r-left", lkey, OPTS)
    assert left.key_range == (b"", MID)  # the manifest remembers its clip
    check(left, ml)
    write(left, ml, rng, 800, 0, 400)
    write(right, mr, rng, 800, 400, 800)
    check(left, ml)
    check(right, mr)
    # Compaction rewrites shared tables; outputs hold only in-range keys.
    left.compact_all()
    assert all(t.clip is None for t in left.levels.all_tables())
    assert sum(left.stats()["entries_per_level"]) == len(ml)
    check(left, ml)
    lkey = left.checkpoint("e3")
    rkey = right.checkpoint("e3")
    if seed % 2:
        rres = compact_checkpoint(store, "op/r-right", rkey, OPTS, full=True)
        assert rres is not None
        right = DKV.open(store, "op/r-right", rkey, OPTS)
        assert right.install_pending_compactions()["installed"] == 1
        check(right, mr)
        rkey = right.checkpoint("e3b")

    merged = DKV.open_from_parents(store, "op/r-all2", [lkey, rkey], (b"", None), OPTS)
    model = {**ml, **mr}
    check(merged, model)
    write(merged, model, rng, 1000, 0, 800)
    check(merged, model)
    mkey = merged.checkpoint("e4")
    again = DKV.open(store, "op/r-all2", mkey, OPTS)
    check(again, model)
    again.compact_all()
    check(again, model)


def test_split_of_a_split_narrows_the_clip(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    rng = random.Random(4)
    db = DKV.open(store, "op/a", options=OPTS)
    model: dict[bytes, bytes] = {}
    write(db, model, rng, 2000, 0, 800)
    db.flush()
    k1 = db.checkpoint("e1")
    half = DKV.open_from_parents(store, "op/b", [k1], (b"k0100", None), OPTS)
    k2 = half.checkpoint("e1")
    quarter = DKV.open_from_parents(store, "op/c", [k2], (b"k0050", b"k0300"), OPTS)
    expect = in_range(model, b"k0100", b"k0300")
    check(quarter, expect)
    for t in quarter.levels.all_tables():
        assert b"k0100" <= t.min_key <= t.max_key < b"k0300"
        if t.clip is not None:
            assert t.clip[0] >= b"k0050" and t.clip[1] is not None and t.clip[1] <= b"k0300"


def test_overlapping_parents_are_rejected(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    keys = []
    for name in ("x", "y"):
        db = DKV.open(store, f"op/{name}", options=OPTS)
        for i in range(0, 800, 2):
            db.put(key(i), name.encode() * 10)
        db.compact_all()
        keys.append(db.checkpoint("e1"))
    with pytest.raises(ValueError, match="overlap"):
        DKV.open_from_parents(store, "op/z", keys, (b"", None), OPTS)


def test_empty_range_and_no_parents(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    with pytest.raises(ValueError, match="empty key range"):
        DKV.open_from_parents(store, "op/e", [], (b"b", b"a"), OPTS)
    db = DKV.open_from_parents(store, "op/e", [], (b"a", b"b"), OPTS)
    assert list(db.scan_range(b"", None)) == []
    db.put(b"a1", b"v")
    assert DKV.open(store, "op/e", db.checkpoint("e1"), OPTS).get(b"a1") == b"v"


def _one_table_range(store: LocalObjectStore) -> tuple[dict[bytes, bytes], str, TableInfo]:
    """Range ``op/p`` holding keys 0..19 in one compacted table: returns its model, the
    manifest key of its checkpoint ``e1``, and that table."""
    db = DKV.open(store, "op/p", options=OPTS)
    model = {key(i): b"v%d" % i for i in range(0, 20)}
    for k, v in model.items():
        db.put(k, v)
    db.compact_all()
    pkey = db.checkpoint("e1")
    (table,) = list(db.levels.all_tables())
    return model, pkey, table


def test_split_then_merge_without_compaction_joins_shared_tables(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    model, pkey, table = _one_table_range(store)
    kids = [
        DKV.open_from_parents(store, f"op/c{i}", [pkey], rng_, OPTS).checkpoint("e1")
        for i, rng_ in enumerate([(b"", key(5)), (key(5), key(12)), (key(12), None)])
    ]
    merged = DKV.open_from_parents(store, "op/m", kids[:2], (b"", key(12)), OPTS)
    (t,) = list(merged.levels.all_tables())
    assert t.key == table.key and t.clip == (b"", key(12)) and t.max_key == key(11)
    check(merged, {k: v for k, v in model.items() if k < key(12)})
    whole = DKV.open_from_parents(store, "op/w", kids, (b"", None), OPTS)
    (t,) = list(whole.levels.all_tables())
    assert t == table  # the clip is gone once the whole file is visible again
    # Clips with file keys between them are not joined (those keys are in no parent): the
    # earlier reference is copied into a table of the new range, the file keeps one.
    gap = DKV.open_from_parents(store, "op/x", [kids[0], kids[2]], (b"", None), OPTS)
    refs = list(gap.levels.all_tables())
    assert len(refs) == 2 and sum(t.key == table.key for t in refs) == 1
    check(gap, {k: v for k, v in model.items() if k < key(5) or k >= key(12)})


def test_merge_with_a_parent_that_compacted_its_part_of_a_shared_table(tmp_path: Path) -> None:
    """Split in three; the middle child compacts its part of the shared table away (with
    newer writes and deletes); merging middle + right, then left + that, must not join the
    left and right clips of the shared file (its middle keys are stale)."""
    store = LocalObjectStore(tmp_path)
    model, pkey, table = _one_table_range(store)
    bounds = [(b"", key(5)), (key(5), key(12)), (key(12), None)]
    kids = [DKV.open_from_parents(store, f"op/c{i}", [pkey], r, OPTS) for i, r in enumerate(bounds)]
    mid = kids[1]
    for i in range(5, 12):
        if i % 2:
            mid.delete(key(i))
            model.pop(key(i))
        else:
            mid.put(key(i), b"new%d" % i)
            model[key(i)] = b"new%d" % i
    mid.compact_all()
    assert table.key not in {t.key for t in mid.levels.all_tables()}
    ckeys = [k.checkpoint("e1") for k in kids]
    right = DKV.open_from_parents(store, "op/mr", ckeys[1:], (key(5), None), OPTS)
    rkey = right.checkpoint("e1")
    for parents in ([ckeys[0], rkey], ckeys):
        merged = DKV.open_from_parents(store, "op/all", parents, (b"", None), OPTS)
        check(merged, model)
        assert sum(t.key == table.key for t in merged.levels.all_tables()) == 1
        reopened = DKV.open(store, "op/all", merged.checkpoint(f"e{len(parents)}"), OPTS)
        check(reopened, model)
