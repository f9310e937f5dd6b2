"""Compaction: the pure planner, installation rules, and content preservation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from storage.dkv import DKV, DKVOptions
from storage.dkv.compaction import CompactionResult, plan_compaction, run_compaction
from storage.dkv.levels import LevelList
from storage.dkv.sstable import TableInfo
from storage.objectstore.local import LocalObjectStore


def t(key: str, lo: bytes, hi: bytes, s0: int = 1, s1: int = 1) -> TableInfo:
    return TableInfo(key=key, size=10, entries=1, min_key=lo, max_key=hi, min_seq=s0, max_seq=s1)


def test_planner_below_trigger_does_nothing() -> None:
    opts = DKVOptions(l0_compaction_trigger=3)
    assert plan_compaction(LevelList(), opts) is None
    levels = LevelList(((t("b", b"a", b"z"), t("a", b"a", b"z")),))
    assert plan_compaction(levels, opts) is None


def test_planner_merges_all_l0_and_l1() -> None:
    opts = DKVOptions(l0_compaction_trigger=2)
    l0 = (t("n2", b"c", b"d", 5, 6), t("n1", b"a", b"z", 3, 4))
    l1 = (t("r1", b"a", b"b"), t("r2", b"x", b"y"))
    plan = plan_compaction(LevelList((l0, l1)), opts)
    assert plan is not None
    assert [x.key for x in plan.inputs] == ["n2", "n1", "r1", "r2"]  # newest first
    assert plan.output_level == 1
    assert plan.drop_tombstones


def test_planner_keeps_tombstones_if_deeper_levels_exist() -> None:
    opts = DKVOptions(l0_compaction_trigger=1)
    levels = LevelList(((t("n", b"a", b"b"),), (), (t("old", b"a", b"b"),)))
    plan = plan_compaction(levels, opts)
    assert plan is not None and not plan.drop_tombstones


def test_install_requires_live_inputs() -> None:
    levels = LevelList(((t("n", b"a", b"b"),), (t("r", b"c", b"d"),)))
    out = t("new", b"a", b"d")
    installed = levels.with_compaction(["n", "r"], 1, [out])
    assert installed.levels == ((), (out,))
    with pytest.raises(ValueError, match="no longer live"):
        installed.with_compaction(["n"], 1, [out])


def test_install_rejects_overlapping_outputs() -> None:
    levels = LevelList(((t("n", b"a", b"b"),), (t("r", b"c", b"d"),)))
    with pytest.raises(ValueError, match="overlaps"):
        levels.with_compaction(["n"], 1, [t("new", b"a", b"c")])


def test_compaction_preserves_contents_and_drops_tombstones(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    opts = DKVOptions(
        memtable_bytes=1 << 20, block_bytes=256, l0_compaction_trigger=100, target_file_bytes=4096
    )
    db = DKV.open(store, "p/c", options=opts)
    rng = random.Random(11)
    model: dict[bytes, bytes] = {}
    for _round in range(4):
        for _ in range(600):
            k = b"k%03d" % rng.randrange(400)
            if rng.random() < 0.3:
                db.delete(k)
                model.pop(k, None)
            else:
                v = rng.randbytes(rng.randint(1, 30))
                db.put(k, v)
                model[k] = v
        db.flush()
    assert db.stats()["tables_per_level"][0] == 4
    before = list(db.scan_range(b"", None))
    assert before == sorted(model.items())

    plan = plan_compaction(db.levels, DKVOptions(l0_compaction_trigger=4))
    result = run_compaction(plan, db._tables, opts.target_file_bytes)
    assert isinstance(result, CompactionResult) and len(result.outputs) > 1
    # The outputs hold exactly the live keys: tombstones and shadowed versions are gone.
    assert sum(o.entries for o in result.outputs) == len(model)
    old_files = set(store.list("p/c/sst/"))
    db.install_compaction(result)
    assert db.stats()["tables_per_level"] == [0, len(result.outputs)]
    assert list(db.scan_range(b"", None)) == sorted(model.items())
    for k in (b"k%03d" % i for i in range(400)):
        assert db.get(k) == model.get(k)
    # Compaction never changes an existing file: the inputs are still there, untouched.
    assert old_files <= set(store.list("p/c/sst/"))
    mkey = db.checkpoint("after-compaction")
    assert list(DKV.open(store, "p/c", mkey, opts).scan_range(b"", None)) == sorted(model.items())
