"""Compaction: the pure planner, installation rules, and content preservation."""

from __future__ import annotations

import bisect
import random
from dataclasses import replace
from functools import partial
from itertools import chain
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dkvstream.storage.dkv import DKV, DKVOptions, compaction
from dkvstream.storage.dkv.compaction import (
    CompactionPlan,
    CompactionResult,
    level_target_bytes,
    plan_compaction,
    plan_full,
    run_compaction,
    size_amplification,
)
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.merge import merge_spans_columns_py
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.dkv.tablestore import TableStore
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.heap_merge import merge_newest
from tests.storage.random_writes import random_writes


def t(key: str, lo: bytes, hi: bytes, s0: int = 1, s1: int = 1, size: int = 10) -> TableInfo:
    return TableInfo(
        key=key, size=size, entries=1, min_key=lo, max_key=hi, min_seq=s0, max_seq=s1
    )


NO_AMP = dict(size_amp_threshold=1e9)
RANGE_BLOCKS_DEFAULT = compaction.MERGE_RANGE_BLOCKS


def test_planner_l0_trigger_at_threshold_and_just_below() -> None:
    opts = DKVOptions(l0_compaction_trigger=3, **NO_AMP)
    two = (t("b", b"a", b"c", 3, 3), t("a", b"a", b"c", 2, 2))
    assert plan_compaction(LevelList((two,)), opts) is None
    plan = plan_compaction(LevelList(((t("c", b"a", b"c", 4, 4), *two),)), opts)
    assert plan is not None and plan.reason == "l0" and plan.output_level == 1
    assert plan.input_levels == (0, 0, 0)


def test_planner_l0_takes_only_overlapping_l1_tables() -> None:
    opts = DKVOptions(l0_compaction_trigger=1, **NO_AMP)
    l1 = (t("r1", b"a", b"b"), t("r2", b"d", b"f"), t("r3", b"x", b"y"))
    plan = plan_compaction(LevelList(((t("n", b"c", b"e", 5, 5),), l1)), opts)
    assert [x.key for x in plan.inputs] == ["n", "r2"]
    assert plan.input_levels == (0, 1)


def test_planner_level_size_trigger_at_target_and_above() -> None:
    base = 100
    opts = DKVOptions(level_base_bytes=base, level_multiplier=10, num_levels=4, **NO_AMP)
    l1 = (t("a", b"a", b"c", size=50), t("b", b"d", b"f", size=50))
    l2 = (t("x", b"a", b"b", size=300), t("y", b"e", b"z", size=5))
    assert plan_compaction(LevelList(((), l1, l2)), opts) is None  # exactly at target
    l1big = (t("a", b"a", b"c", size=50), t("b", b"d", b"f", size=51))
    plan = plan_compaction(LevelList(((), l1big, l2)), opts)
    # Min overlapping ratio: "b" overlaps 5 bytes in L2, "a" overlaps 300.
    assert plan is not None and plan.reason == "level" and plan.output_level == 2
    assert [x.key for x in plan.inputs] == ["b", "y"]
    assert plan.input_levels == (1, 2)
    assert plan.drop_tombstones  # nothing below L2
    assert level_target_bytes(2, opts) == 1000


def test_planner_last_level_is_never_pushed() -> None:
    opts = DKVOptions(level_base_bytes=1, num_levels=3, **NO_AMP)
    levels = LevelList(((), (), (t("a", b"a", b"c", size=10**9),)))
    assert plan_compaction(levels, opts) is None


def test_planner_push_keeps_tombstones_above_deeper_overlap() -> None:
    opts = DKVOptions(level_base_bytes=10, num_levels=5, **NO_AMP)
    levels = LevelList(((), (t("a", b"a", b"c", size=11),), (), (t("old", b"b", b"b"),)))
    plan = plan_compaction(levels, opts)
    assert plan.output_level == 2 and [x.key for x in plan.inputs] == ["a"]
    assert not plan.drop_tombstones and plan.deeper == ("old",)


def test_planner_size_amp_at_threshold_and_just_above() -> None:
    opts = DKVOptions(size_amp_threshold=0.5, l0_compaction_trigger=100)
    last = (t("z", b"a", b"z", size=100),)
    at = LevelList(((t("n", b"a", b"b", 2, 2, size=50),), (), last))
    assert size_amplification(at) == 0.5
    assert plan_compaction(at, opts) is None
    above = LevelList(((t("n", b"a", b"b", 2, 2, size=51),), (), last))
    plan = plan_compaction(above, opts)
    assert plan.reason == "size_amp" and plan.output_level == 2
    assert {x.key for x in plan.inputs} == {"n", "z"} and plan.drop_tombstones


def test_plan_full_targets_last_level_or_l1() -> None:
    assert plan_full(LevelList()) is None
    only_l0 = LevelList(((t("n", b"a", b"b"),),))
    assert plan_full(only_l0).output_level == 1
    deep = LevelList(((t("n", b"a", b"b"),), (), (), (t("z", b"a", b"z"),)))
    p = plan_full(deep)
    assert p.output_level == 3 and p.drop_tombstones and p.input_levels == (0, 3)


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.lists(st.binary(min_size=1, max_size=3), max_size=8), min_size=1, max_size=4),
    probes=st.lists(st.binary(max_size=4), min_size=1, max_size=20),
)
def test_sorted_run_probes_pick_the_same_table_as_sorted_run_candidate(
    runs: list[list[bytes]], probes: list[bytes]
) -> None:
    # Each level: disjoint tables from its sorted bounds, pairing neighbours (empty levels
    # included); the probes' candidate must be sorted_run_candidate's, level by level.
    levels: list[tuple[TableInfo, ...]] = [()]
    for li, bounds in enumerate(runs):
        b = sorted(set(bounds))
        levels.append(tuple(t(f"{li}-{j}", b[j], b[j + 1]) for j in range(0, len(b) - 1, 2)))
    ll = LevelList(tuple(levels))
    probe_runs = ll.sorted_run_probes()
    non_empty = [i for i in range(1, len(levels)) if levels[i]]
    assert [run for _, run in probe_runs] == [levels[i] for i in non_empty]
    for key in probes:
        for (max_keys, run), i in zip(probe_runs, non_empty):
            j = bisect.bisect_left(max_keys, key)
            got = run[j] if j < len(run) and run[j].min_key <= key else None
            assert got == ll.sorted_run_candidate(i, key), (i, key)


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
    opts = DKVOptions(l0_compaction_trigger=1, size_amp_threshold=100)
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
        random_writes(db, model, rng, 600, keys=range(400), key_format=b"k%03d", delete_share=0.3,
                      value_bytes=(1, 30))
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


_fill = partial(random_writes, keys=range(3000), delete_share=0.2, value_bytes=(1, 40))


def test_levels_grow_and_compact_all_merges_into_last(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    opts = DKVOptions(
        memtable_bytes=4000, block_bytes=512, l0_compaction_trigger=3, target_file_bytes=2000,
        num_levels=4, level_base_bytes=6000, level_multiplier=3, size_amp_threshold=4.0,
    )
    db = DKV.open(store, "p/lv", options=opts)
    rng = random.Random(5)
    model: dict[bytes, bytes] = {}
    for _ in range(8):
        _fill(db, model, rng, 500)
        mkey = db.checkpoint(f"c{_}")
    stats = db.stats()
    assert len(stats["tables_per_level"]) >= 3, stats["tables_per_level"]
    assert stats["compactions"].get("level", 0) >= 1 and stats["compactions"]["l0"] >= 1
    assert list(db.scan_range(b"", None)) == sorted(model.items())
    db.compact_all()
    tpl = db.stats()["tables_per_level"]
    assert all(n == 0 for n in tpl[:-1]) and tpl[-1] >= 1
    # One sorted run, no tombstones: entries == live keys.
    assert sum(db.stats()["entries_per_level"]) == len(model)
    assert list(db.scan_range(b"", None)) == sorted(model.items())
    for k in list(model)[:200]:
        assert db.get(k) == model[k]
    reopened = DKV.open(store, "p/lv", mkey, opts)
    assert list(reopened.scan_range(b"", None)) == sorted(model.items())


def test_inline_compaction_budget_bounds_work_per_call(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    opts = DKVOptions(
        memtable_bytes=2000, l0_compaction_trigger=2, max_inline_compaction_bytes=0
    )
    db = DKV.open(store, "p/b", options=opts)
    model: dict[bytes, bytes] = {}
    _fill(db, model, random.Random(2), 1000)
    db.checkpoint("x")
    assert db.stats()["compactions"] == {}
    assert db.stats()["tables_per_level"][0] > 2
    assert list(db.scan_range(b"", None)) == sorted(model.items())


def compaction_by_heap_merge(plan: CompactionPlan, tables: TableStore, target_bytes: int) -> CompactionResult:
    """The oracle of ``run_compaction``: a lazy heap merge of entry iterators
    (``merge_newest``, one Python step per entry) written row by row (``write_run``)."""
    # Sorted-run inputs of one level are disjoint: concatenating them in key order is one
    # merge source (L0 tables stay one source each).
    by_level: dict[int, list[TableInfo]] = {}
    sources = []
    for lvl, tab in zip(plan.input_levels, plan.inputs, strict=True):
        if lvl == 0:
            sources.append(tables.iter_table(tab))
        else:
            by_level.setdefault(lvl, []).append(tab)
    for lvl in sorted(by_level):
        run = sorted(by_level[lvl], key=lambda x: x.min_key)
        sources.append(chain.from_iterable(tables.iter_table(tab) for tab in run))
    merged = merge_newest(sources)
    if plan.drop_tombstones:
        merged = (e for e in merged if e[2] is not None)
    outputs = tables.write_run(merged, target_bytes)
    return CompactionResult(tuple(x.key for x in plan.inputs), plan.output_level, tuple(outputs))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), drop=st.booleans(), target=st.integers(40, 3000),
       range_blocks=st.integers(1, 40), l0_trigger=st.integers(2, 5), level_base=st.integers(300, 3000))
def test_range_merge_writes_the_same_tables_as_the_heap_merge(
    tmp_path_factory: pytest.TempPathFactory, seed: int, drop: bool, target: int, range_blocks: int,
    l0_trigger: int, level_base: int,
) -> None:
    """Oracles: the lazy heap merge (``compaction_by_heap_merge``), whose output tables the
    range-by-range merge must write byte-identical whatever the range size, and a dict of
    the live keys, which a full compaction dropping tombstones must hold exactly. Inputs:
    L0 tables and the levels automatic compactions pushed them into (overwrites and
    deletes across levels)."""
    store = LocalObjectStore(tmp_path_factory.mktemp("c"))
    opts = DKVOptions(memtable_bytes=1 << 20, block_bytes=128, l0_compaction_trigger=l0_trigger,
                      num_levels=4, level_base_bytes=level_base, level_multiplier=2,
                      target_file_bytes=600, **NO_AMP)
    db = DKV.open(store, "p/c", options=opts)
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    for _round in range(rng.randint(1, 9)):
        _fill(db, model, rng, rng.randint(0, 150))
        db.flush()
    plan = plan_full(db.levels)
    if plan is None:
        return
    plan = replace(plan, drop_tombstones=drop)
    expected = compaction_by_heap_merge(plan, db._tables, target)
    compaction.MERGE_RANGE_BLOCKS = range_blocks
    try:
        got = run_compaction(plan, db._tables, target)
    finally:
        compaction.MERGE_RANGE_BLOCKS = RANGE_BLOCKS_DEFAULT
    assert [(o.entries, o.min_key, o.max_key, store.get(o.key)) for o in got.outputs] == \
        [(o.entries, o.min_key, o.max_key, store.get(o.key)) for o in expected.outputs]
    if drop:
        written = [(k, v) for o in got.outputs for k, _seq, v in db._tables.iter_table(o)]
        assert written == sorted(model.items())


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_compaction_of_a_malformed_block_names_its_table_and_block(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block whose checksum holds but whose entries do not add up (here: its entry
    count) stops the compaction with CorruptionError naming the table, block and offset,
    on the C merge and on its pure-Python reference."""
    if native and compaction.merge_spans_columns is merge_spans_columns_py:
        pytest.skip("C module not built")
    if not native:
        monkeypatch.setattr(compaction, "merge_spans_columns", merge_spans_columns_py)
    store = LocalObjectStore(tmp_path)
    opts = DKVOptions(memtable_bytes=1 << 20, block_bytes=128, l0_compaction_trigger=100)
    db = DKV.open(store, "p/c", options=opts)
    rng = random.Random(3)
    for _round in range(2):
        _fill(db, {}, rng, 100)
        db.flush()
    plan = plan_full(db.levels)
    table = plan.inputs[1]
    reader = db._tables.reader(table)
    raw = reader._raw_block(2)
    bad = (int.from_bytes(raw[:4], "little") + 1).to_bytes(4, "little") + raw[4:]
    db._tables.cache.put(reader._cache_base + 2, bad, len(bad))  # as if read from the bucket
    offset = reader.block_bounds()[2][0]
    with pytest.raises(CorruptionError, match=rf"{table.key}: malformed data block 2 at offset {offset}"):
        run_compaction(plan, db._tables, opts.target_file_bytes)
