"""Block cache: byte-budget LRU eviction."""

from __future__ import annotations

from storage.dkv.block_cache import BlockCache


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
