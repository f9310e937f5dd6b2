"""Rescaling: the start state of a key-group range opened from the ranges it replaces.

When a keyed operator is rescaled, a range split in two opens each half from the one
parent manifest, and two adjacent ranges merged open one instance from both
(``DKV.open_from_parents``). Nothing is copied up front:

* Parent tables are referenced in place. A table straddling the new key interval
  ``[lo, hi)`` gets a ``clip`` (recorded in the manifest) and visible bounds
  ``min_key``/``max_key`` = its first and last key inside (``clip_table``, at most two
  block reads), so reads and compaction inputs see only those keys; compaction later
  rewrites such tables into tables holding only in-range keys.
* Two references to one file (a split, then a merge) are joined when the file has no
  key between them; otherwise the earlier one is copied (``join_shared``).
* Parent WAL records inside ``[lo, hi)`` are replayed as new writes, numbered above the
  largest parent ``last_seq`` (``wal_in_range``).

ASSUMES: the parents hold keys from disjoint key intervals (they were different
key-group ranges), so a key exists in at most one parent and their sequence numbers need
no reconciling beyond starting above their maximum. A sorted-run level whose clipped
tables from different parents overlap raises ``ValueError``.

Source: storage/RFC-0002, "Rescaling". Cost: one GET per parent manifest, up to two
block reads per straddling table, one GET per parent WAL object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from dkvstream.storage.dkv.checkpoint import load_checked
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import Manifest
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.dkv.tablestore import TableStore


def clip_table(tables: TableStore, t: TableInfo, lo: bytes, hi: bytes | None) -> TableInfo | None:
    """Restricts the table reference ``t`` to ``[lo, hi)``.

    Returns ``t`` itself if all its visible keys are inside, None if none is, else a
    clipped reference whose bounds are the first and last visible key inside (found with
    at most two block reads).
    """
    if t.max_key < lo or (hi is not None and t.min_key >= hi):
        return None
    old_lo, old_hi = t.clip if t.clip is not None else (b"", None)
    clip = (max(lo, old_lo), hi if old_hi is None else (old_hi if hi is None else min(hi, old_hi)))
    if t.min_key >= lo and (hi is None or t.max_key < hi):
        return t if t.clip is None else replace(t, clip=clip)
    end = t.max_key + b"\x00" if hi is None or hi > t.max_key else hi
    first = next(iter(tables.iter_table(t, lo, end)), None)
    last = tables.reader(t).last_key_before(end)
    if first is None or last is None or last < first[0]:
        return None
    entries = min(t.entries, tables.reader(t).entries_between(first[0], last + b"\x00"))
    return replace(t, min_key=first[0], max_key=last, entries=entries, clip=clip)


def join_shared(tables: TableStore, per_level: list[list[TableInfo]]) -> list[list[TableInfo]]:
    """Joins references to one table that several parents share (a split, then a merge).

    Two references of one file become one whose bounds span both when the file has no
    key between them. Otherwise the keys between are not visible to any parent (they
    belong to a range not being merged, or a parent already compacted that part of the
    file away and rewrote it with newer data), so joining would resurrect stale
    versions; the earlier reference is then materialised instead: its visible entries
    (tombstones and sequence numbers included) are copied into a new table under this
    instance's prefix, and the file keeps a single reference, as ``tables_are_unique``
    requires. A table referenced from two levels is a ``ValueError``.
    """
    seen: dict[str, int] = {}
    out: list[list[TableInfo]] = []
    for i, lvl in enumerate(per_level):
        by_key: dict[str, list[TableInfo]] = {}
        for t in lvl:
            if seen.setdefault(t.key, i) != i:
                raise ValueError(f"table {t.key} is referenced from L{seen[t.key]} and L{i}")
            by_key.setdefault(t.key, []).append(t)
        joined = []
        for refs in by_key.values():
            refs.sort(key=lambda t: t.min_key)
            cur = refs[0]
            for nxt in refs[1:]:
                if cur.max_key >= nxt.min_key:
                    raise ValueError(f"table {cur.key} is shared by overlapping parents")
                gap_keys = tables.reader(cur).iter_from(cur.max_key + b"\x00", nxt.min_key)
                if next(iter(gap_keys), None) is not None:
                    copy = tables.write_table(tables.iter_table(cur))
                    if copy is not None:
                        joined.append(copy)
                    cur = nxt
                    continue
                lo = cur.clip[0] if cur.clip else b""
                hi = nxt.clip[1] if nxt.clip else None
                cur = replace(cur, max_key=nxt.max_key, entries=cur.entries + nxt.entries,
                              clip=(lo, hi))
            r = tables.reader(cur)
            if cur.clip is not None and cur.min_key == r.min_key and cur.max_key == r.max_key:
                cur = replace(cur, clip=None, entries=r.entries)
            joined.append(cur)
        out.append(joined)
    return out


def start_manifest(
    tables: TableStore, parents: Sequence[str], key_range: tuple[bytes, bytes | None]
) -> tuple[Manifest, list[Manifest]]:
    """Builds the state a range opened from ``parents`` starts from, WAL records aside.

    Args:
        tables: The new instance's table store: parent tables are read through it, and
            the copies ``join_shared`` makes are written under its prefix.
        parents: Parent manifest keys.
        key_range: ``(lo, hi)``, inclusive lower and exclusive upper bound (None = none).
            REQUIRES: not empty (``hi`` is None or above ``lo``).

    Returns:
        ``(start, parent manifests)``: ``start`` has no name and no WAL; it lists the
        clipped, joined parent tables per level, the new key range, and ``last_seq`` =
        ``flushed_seq`` = the largest parent ``last_seq``.

    Raises:
        ObjectNotFoundError: A parent manifest is missing.
        CorruptionError: A parent manifest, or a table block read to clip, fails
            verification.
        ValueError: The parents overlap in a sorted-run level, or share a table across
            levels or with overlapping references.
    """
    lo, hi = key_range
    store = tables.store
    manifests = [load_checked(store, key) for key in parents]
    per_level: list[list[TableInfo]] = []
    for m in manifests:
        for i, lvl in enumerate(m.levels.levels):
            while len(per_level) <= i:
                per_level.append([])
            for t in lvl:
                c = clip_table(tables, t, lo, hi)
                if c is not None:
                    per_level[i].append(c)
    if not per_level:
        per_level = [[]]
    per_level = join_shared(tables, per_level)
    per_level[0].sort(key=lambda t: -t.max_seq)
    for i in range(1, len(per_level)):
        run = per_level[i] = sorted(per_level[i], key=lambda t: t.min_key)
        for a, b in zip(run, run[1:]):
            if a.max_key >= b.min_key:
                raise ValueError(
                    f"parents overlap in L{i}: {a.key} and {b.key} (key intervals must be"
                    " disjoint)"
                )
    while len(per_level) > 1 and not per_level[-1]:
        per_level.pop()
    base = max((m.last_seq for m in manifests), default=0)
    start = Manifest(
        name="", prefix=tables.paths.prefix, last_seq=base, flushed_seq=base,
        levels=LevelList(tuple(tuple(lvl) for lvl in per_level)), key_range=(lo, hi),
    )
    return start, manifests


def wal_in_range(
    tables: TableStore, manifests: Sequence[Manifest], key_range: tuple[bytes, bytes | None]
) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    """Yields ``(keys, values)`` of the records inside ``key_range`` of every WAL object
    the ``manifests`` list, one pair per object, in order (None values are deletes).

    Raises:
        ObjectNotFoundError: A WAL object is missing.
        CorruptionError: A WAL object fails verification.
    """
    lo, hi = key_range
    for m in manifests:
        for ref in m.wal:
            _seqs, keys, values = tables.read_wal_columns(ref)
            inside = [i for i, k in enumerate(keys) if k >= lo and (hi is None or k < hi)]
            yield [keys[i] for i in inside], [values[i] for i in inside]
