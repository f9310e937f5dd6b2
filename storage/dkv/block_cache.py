"""A byte-budget LRU cache of decompressed SSTable data blocks.

Keys are ``(table_key, block_number)``; the charge of an entry is its uncompressed size in
bytes. Tables are immutable and uniquely named, so entries never go stale. Not thread-safe
(one cache per DKV instance).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class BlockCache:
    """LRU over a byte budget.

    Args:
        capacity_bytes: Total charge to keep; 0 disables caching.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._d: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: Any) -> Any | None:
        """Returns the cached value (marking it recently used) or None."""
        hit = self._d.get(key)
        if hit is None:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return hit[0]

    def get_run(self, table_key: str, blocks: range) -> list[Any | None]:
        """``[get((table_key, i)) for i in blocks]`` in one call (a scan's blocks of one
        table)."""
        d = self._d
        out = []
        for i in blocks:
            k = (table_key, i)
            hit = d.get(k)
            if hit is None:
                self.misses += 1
                out.append(None)
            else:
                d.move_to_end(k)
                self.hits += 1
                out.append(hit[0])
        return out

    def put(self, key: Any, value: Any, charge: int) -> None:
        """Inserts ``value`` with ``charge`` bytes, evicting least recently used entries."""
        if charge > self.capacity_bytes:
            return
        old = self._d.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]
        self._d[key] = (value, charge)
        self.used_bytes += charge
        while self.used_bytes > self.capacity_bytes:
            _, (_, c) = self._d.popitem(last=False)
            self.used_bytes -= c

    def drop_tables(self, table_keys: set[str]) -> None:
        """Drops every block of the given tables (keys ``(table_key, ...)``), e.g. tables
        a compaction replaced: their blocks would otherwise hold the budget until evicted."""
        d = self._d
        for ck in [ck for ck in d if ck[0] in table_keys]:
            self.used_bytes -= d.pop(ck)[1]
