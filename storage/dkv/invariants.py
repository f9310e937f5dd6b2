"""Manifest invariants as small predicates, checked before publishing and after loading.

Each returns True when the invariant holds. ``check_manifest`` raises on the first
violation, naming it, so a bug never reaches (or is never trusted from) the bucket.
"""

from __future__ import annotations

from dkvstream.storage.dkv.manifest import Manifest
from dkvstream.storage.errors import CorruptionError


def sorted_runs_are_disjoint(m: Manifest) -> bool:
    """Levels >= 1 are sorted by key and non-overlapping.

    Why: ``get`` probes at most one table per such level, found by bisection; an overlap
    would hide a newer version behind an older one.
    """
    for lvl in m.levels.levels[1:]:
        for a, b in zip(lvl, lvl[1:]):
            if not a.max_key < b.min_key:
                return False
    return True


def tables_have_valid_ranges(m: Manifest) -> bool:
    """Every table has min_key <= max_key, 1 <= min_seq <= max_seq <= flushed_seq, entries >= 1.

    Why: key ranges are used to skip tables, and ``flushed_seq`` decides which WAL
    records replay; a table newer than ``flushed_seq`` would be shadowed by replay.
    """
    for t in m.levels.all_tables():
        if not (t.min_key <= t.max_key and 1 <= t.min_seq <= t.max_seq <= m.flushed_seq):
            return False
        if t.entries < 1 or t.size <= 0:
            return False
    return True


def seqs_are_consistent(m: Manifest) -> bool:
    """0 <= flushed_seq <= last_seq.

    Why: a reopened DB continues numbering at ``last_seq + 1``; going backwards would let
    old records shadow new ones.
    """
    return 0 <= m.flushed_seq <= m.last_seq


def wal_is_above_tables(m: Manifest) -> bool:
    """WAL objects are in order, disjoint, above flushed_seq and at most last_seq.

    Why: replay applies WAL records on top of the tables; a record already in a table
    must not be replayed (the memtable would shadow a newer table version), and records
    replay in order.
    """
    prev = m.flushed_seq
    for w in m.wal:
        if not (prev < w.first_seq <= w.last_seq <= m.last_seq and w.records >= 1):
            return False
        prev = w.last_seq
    return True


def l0_is_newest_first(m: Manifest) -> bool:
    """Of two L0 tables with overlapping key ranges, the earlier one holds newer seqs.

    Why: ``get`` stops at the first L0 table that knows a key. Tables with disjoint key
    ranges may come in any seq order: after a rescale, L0 joins the L0s of parents whose
    sequence numbers are independent (their key intervals are disjoint).
    """
    l0 = m.levels.l0
    for i, a in enumerate(l0):
        for b in l0[i + 1 :]:
            if a.max_key >= b.min_key and b.max_key >= a.min_key and not a.min_seq > b.max_seq:
                return False
    return True


def clips_contain_bounds(m: Manifest) -> bool:
    """A clipped table's visible bounds lie inside its clip ``[lo, hi)``.

    Why: reads of a shared table filter by ``[min_key, max_key]`` only; bounds reaching
    outside the clip would expose another range's keys.
    """
    for t in m.levels.all_tables():
        if t.clip is not None:
            lo, hi = t.clip
            if t.min_key < lo or (hi is not None and t.max_key >= hi):
                return False
    return True


def tables_are_unique(m: Manifest) -> bool:
    """No table key appears twice. Why: a duplicate would double-count entries and bytes."""
    keys = [t.key for t in m.levels.all_tables()]
    return len(keys) == len(set(keys))


ALL_INVARIANTS = (
    sorted_runs_are_disjoint,
    tables_have_valid_ranges,
    seqs_are_consistent,
    wal_is_above_tables,
    l0_is_newest_first,
    tables_are_unique,
    clips_contain_bounds,
)


def check_manifest(m: Manifest, uri: str) -> None:
    """Raises ``CorruptionError`` naming ``uri`` and the first invariant ``m`` violates."""
    for inv in ALL_INVARIANTS:
        if not inv(m):
            raise CorruptionError(f"{uri}: manifest violates invariant {inv.__name__}")
