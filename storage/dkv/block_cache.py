"""A byte-budget LRU cache of decompressed SSTable data blocks.

A table's blocks are cached under ints: ``table_base(table_key) + block_number``. Tables
are immutable and uniquely named, so entries never go stale. The charge of an entry is
its uncompressed size in bytes. Not thread-safe (one cache per DKV instance).

Why ints and not ``(table_key, block_number)`` tuples, with charges in a dict of their own
rather than ``(value, charge)`` tuples: a tuple is a container the cyclic collector
tracks. A cache churning through blocks creates two per miss and frees two per eviction,
so the collector's allocation count stays flat while its youngest generation grows by
tens of thousands of tuples, and the next collection (in whatever call allocates next,
e.g. a scan) traverses them all at once: 18 ms after 200,000 gets at 1,000,000 keys.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

_BLOCK_BITS = 32  # block numbers of one table stay below 2**32


class BlockCache:
    """LRU over a byte budget.

    Args:
        capacity_bytes: Total charge to keep; 0 disables caching.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._d: OrderedDict[Any, Any] = OrderedDict()  # key -> value, least recent first
        self._charges: dict[Any, int] = {}
        self._bases: dict[str, int] = {}  # table key -> key of its block 0
        self._next_base = 0
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def table_base(self, table_key: str) -> int:
        """Returns the int key of block 0 of table ``table_key``; block ``i`` is cached
        under ``table_base(table_key) + i`` (0 <= i < 2**32). Stable until
        ``drop_tables`` drops the table."""
        base = self._bases.get(table_key)
        if base is None:
            base = self._bases[table_key] = self._next_base
            self._next_base += 1 << _BLOCK_BITS
        return base

    def get(self, key: Any) -> Any | None:
        """Returns the cached value (marking it recently used) or None."""
        d = self._d
        hit = d.get(key)
        if hit is None:
            self.misses += 1
            return None
        d.move_to_end(key)
        self.hits += 1
        return hit

    def get_run(self, base: int, blocks: range) -> list[Any | None]:
        """``[get(base + i) for i in blocks]`` in one call (a scan's blocks of one
        table)."""
        d = self._d
        out = []
        for i in blocks:
            hit = d.get(base + i)
            if hit is None:
                self.misses += 1
            else:
                d.move_to_end(base + i)
                self.hits += 1
            out.append(hit)
        return out

    def put(self, key: Any, value: Any, charge: int) -> None:
        """Inserts ``value`` (not None) with ``charge`` bytes, evicting least recently used
        entries."""
        if charge > self.capacity_bytes:
            return
        d = self._d
        charges = self._charges
        old = charges.pop(key, None)
        if old is not None:
            self.used_bytes -= old
            del d[key]
        d[key] = value
        charges[key] = charge
        self.used_bytes += charge
        while self.used_bytes > self.capacity_bytes:
            k, _ = d.popitem(last=False)
            self.used_bytes -= charges.pop(k)

    def drop_tables(self, table_keys: set[str]) -> None:
        """Drops every block of the given tables, e.g. tables a compaction replaced: their
        blocks would otherwise hold the budget until evicted."""
        bases = {self._bases.pop(k) for k in table_keys if k in self._bases}
        if not bases:
            return
        mask = ~((1 << _BLOCK_BITS) - 1)
        d = self._d
        charges = self._charges
        for ck in [ck for ck in d if type(ck) is int and ck & mask in bases]:
            del d[ck]
            self.used_bytes -= charges.pop(ck)
