"""Block cache: byte-budget LRU eviction."""

from __future__ import annotations

import gc

from dkvstream.storage.dkv.block_cache import BlockCache


def test_lru_eviction_by_bytes() -> None:
    c = BlockCache(100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.get("a") == 1  # a is now most recent
    c.put("c", 3, 40)  # evicts b
    assert c.get("b") is None
    assert c.get("a") == 1 and c.get("c") == 3
    assert c.used_bytes == 80


def test_oversized_entries_are_not_cached() -> None:
    c = BlockCache(10)
    c.put("big", 1, 11)
    assert c.get("big") is None and c.used_bytes == 0


def test_replace_same_key_recharges() -> None:
    c = BlockCache(100)
    c.put("a", 1, 60)
    c.put("a", 2, 30)
    assert c.used_bytes == 30 and c.get("a") == 2


def test_tables_blocks_are_keyed_apart_and_dropped_per_table() -> None:
    c = BlockCache(1000)
    a, b = c.table_base("sst/a"), c.table_base("sst/b")
    assert a != b and c.table_base("sst/a") == a
    for i in range(3):
        c.put(a + i, f"a{i}", 10)
        c.put(b + i, f"b{i}", 10)
    assert c.get_run(a, range(1, 4)) == ["a1", "a2", None]
    assert (c.hits, c.misses) == (2, 1)
    c.drop_tables({"sst/a", "sst/never-cached"})
    assert c.get_run(b, range(3)) == ["b0", "b1", "b2"] and c.used_bytes == 30
    assert c.table_base("sst/a") not in (a, b)  # a dropped table's blocks never resurface
    assert c.get_run(c.table_base("sst/a"), range(3)) == [None, None, None]


def test_cached_blocks_leave_nothing_for_the_cyclic_collector() -> None:
    """A cache churning through blocks must not leave containers behind for the cyclic
    collector: tracked tuples per entry pile up in its youngest generation (the collector's
    allocation count stays flat as old ones are evicted) until one collection traverses
    them all, inside whichever call happens to allocate next."""
    c = BlockCache(10_000)
    base = c.table_base("sst/t")
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(5_000):
            c.put(base + i, b"x" * 100, 100)  # keeps the last 100, evicts the rest
        assert c.get_run(base, range(4_900, 5_000))[0] == b"x" * 100
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert grown < 20
