"""The level list: an immutable value naming the live SSTables of one DKV instance.

``levels[0]`` (L0) holds freshly flushed tables, newest first; their key ranges may overlap,
so a read must consult every one whose range covers the key, newest first. ``levels[i]``
for i >= 1 is a sorted run: tables in ascending key order with disjoint key ranges, so at
most one table per level covers a key.

A ``LevelList`` is never mutated; flush and compaction build a new one. That makes it safe
to hold a reference (a checkpoint, a running scan) while the owner moves on. The owner (one
``DKV``) is single-threaded, so no locking happens here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from dkvstream.storage.dkv.sstable import TableInfo


@dataclass(frozen=True)
class LevelList:
    """Tables per level; see the module docstring for ordering rules."""

    levels: tuple[tuple[TableInfo, ...], ...] = ((),)

    @property
    def l0(self) -> tuple[TableInfo, ...]:
        """L0 tables, newest first."""
        return self.levels[0]

    def level(self, i: int) -> tuple[TableInfo, ...]:
        """Tables of level ``i`` (empty if the level does not exist)."""
        return self.levels[i] if i < len(self.levels) else ()

    def all_tables(self) -> Iterable[TableInfo]:
        """Every live table, L0 newest first, then L1, L2, ... in key order."""
        for lvl in self.levels:
            yield from lvl

    def max_seq(self) -> int:
        """Largest sequence number in any table (0 if there are none)."""
        return max((t.max_seq for t in self.all_tables()), default=0)

    def with_flushed(self, table: TableInfo) -> LevelList:
        """Returns a copy with ``table`` added as the newest L0 table."""
        return LevelList(((table, *self.levels[0]), *self.levels[1:]))

    def with_compaction(
        self, inputs: Iterable[str], output_level: int, outputs: Iterable[TableInfo]
    ) -> LevelList:
        """Returns a copy with the ``inputs`` tables replaced by ``outputs`` in ``output_level``.

        Args:
            inputs: Object keys of the compacted tables.
            output_level: Level that receives the outputs (>= 1).
            outputs: New tables, in ascending key order, disjoint.

        Raises:
            ValueError: An input is no longer live (the result must be discarded; see
                docs/design.md, "DKV files"), or the outputs would overlap a remaining table.
        """
        inputs = set(inputs)
        live = {t.key for t in self.all_tables()}
        missing = inputs - live
        if missing:
            raise ValueError(f"compaction inputs no longer live: {sorted(missing)}")
        levels = [tuple(t for t in lvl if t.key not in inputs) for lvl in self.levels]
        while len(levels) <= output_level:
            levels.append(())
        merged = sorted((*levels[output_level], *outputs), key=lambda t: t.min_key)
        for a, b in zip(merged, merged[1:]):
            if a.max_key >= b.min_key:
                raise ValueError(f"compaction output {b.key} overlaps {a.key}")
        levels[output_level] = tuple(merged)
        while len(levels) > 1 and not levels[-1]:
            levels.pop()
        return LevelList(tuple(levels))

    def with_replaced(self, replaced: dict[str, TableInfo | None]) -> LevelList:
        """Returns a copy with each table ``replaced`` names swapped in place for its new
        table (its level and position kept), or removed where the new one is None.

        REQUIRES: each new table's key range lies within its old one's (a purge,
        ``purge.py``: a table rewritten without some entries), so runs stay sorted and
        disjoint.
        """
        levels = [tuple(n for n in (replaced.get(t.key, t) for t in lvl) if n is not None)
                  for lvl in self.levels]
        while len(levels) > 1 and not levels[-1]:
            levels.pop()
        return LevelList(tuple(levels))

    @cached_property
    def _max_keys(self) -> list[list[bytes]]:
        # Computed once per (immutable) LevelList; cached_property writes __dict__ directly.
        return [[t.max_key for t in lvl] for lvl in self.levels]

    def sorted_run_candidate(self, i: int, key: bytes) -> TableInfo | None:
        """Returns the one table of sorted-run level ``i`` whose range may hold ``key``."""
        run = self.level(i)
        j = bisect_left(self._max_keys[i], key)
        if j < len(run) and run[j].min_key <= key:
            return run[j]
        return None

    def sorted_run_probes(self) -> list[tuple[list[bytes], tuple[TableInfo, ...]]]:
        """``(max keys, tables)`` of each non-empty sorted-run level (L1 and below), top
        down: what ``sorted_run_candidate`` bisects, for a caller probing every level per
        key (``read.PointReader``). The candidate for ``key`` in a level is
        ``tables[j]`` with ``j = bisect_left(max_keys, key)``, if ``j < len(tables)`` and
        ``tables[j].min_key <= key``."""
        return [(self._max_keys[i], lvl) for i, lvl in enumerate(self.levels) if i and lvl]

    def sorted_run_overlapping(self, i: int, start: bytes, end: bytes | None) -> tuple[TableInfo, ...]:
        """Returns the tables of sorted-run level ``i`` that may hold keys in
        ``[start, end)`` (``end`` None: no bound), in key order (two bisections)."""
        run = self.level(i)
        j = bisect_left(self._max_keys[i], start)
        k = len(run) if end is None else bisect_left(self._min_keys[i], end, j)
        return run[j:k]

    @cached_property
    def _min_keys(self) -> list[list[bytes]]:
        return [[t.min_key for t in lvl] for lvl in self.levels]
