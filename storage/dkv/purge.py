"""Purge: entries removed physically, every version of them, with no tombstone left.

A ``delete`` writes a tombstone: the key's older versions stay in the tables below until
a compaction reaches the bottommost level, and the tombstone itself holds the key's
bytes. An erasure (a GDPR request, ``dkvstream.operators.runtime.erasure``) needs the bytes
gone. RocksDB does it with ``DeleteRange`` followed by ``CompactRange`` with a forced
bottommost rewrite; here the same result comes in one step, without a range tombstone:

1. the memtables drop the matching entries (``Memtable.discard``);
2. the memtables are flushed (``DKV.flush_memtable``): the WAL buffer and the WAL
   objects listed so far are then covered by tables and no longer named (the WAL
   objects still hold the old records until retention deletes them: they are in the
   previous manifests only);
3. every table holding a matching entry, in any level, is rewritten without it, in its
   place in its level (``LevelList.with_replaced``); a table left empty leaves the level.
   A shared table of a rescale (``clip``) is tested as the file it is, keys outside
   the clip included: the file holds the bytes of every range it was split among, so a
   sibling range whose clip hides the key still names a file holding it. Such a table is
   rewritten as this instance's own table, holding only the keys the clip shows (the
   erasure sends its subjects to every range naming such a file,
   ``dkvstream.operators.runtime.erasure.erasure_targets``).

Entries match when their key starts with one of ``prefixes`` and, if given, ``where(key)``
holds (a timer key holds its subject key after its timestamp, not as a prefix). Every
version of a matching key goes, so no older version can surface: nothing above or below
it in the tree still names it. The next manifest stops naming the old tables and WAL
objects (``DKV.dropped_at_checkpoint``); they are garbage once no retained checkpoint
names the manifests before it (``dkvstream.operators.runtime.cleanup``).

Cost: one GET per table overlapping a prefix (its blocks of the prefix's key interval are
read to find a match; a clipped table's visible bounds say nothing of the file's other
keys, so its index is read too), and for each table holding a match, one GET of it whole and one
PUT of its rewrite; plus the flush's one PUT per non-empty memtable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.memtable import Memtable
from dkvstream.storage.dkv.read import prefix_successor
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.dkv.tablestore import TableStore


@dataclass
class PurgeResult:
    """What ``DKV.erase_prefixes`` did.

    Attributes:
        entries: entries dropped (memtable entries and table entries; a key with a
            version in several places counts once per place).
        tables_rewritten: ``{old table key: new table key or None}`` (None: the table held
            only matching entries and left its level).
        wal_dropped: WAL objects the instance named before and no longer names (they
            may hold matching records; garbage once no retained checkpoint names them).
    """

    entries: int = 0
    tables_rewritten: dict[str, str | None] = field(default_factory=dict)
    wal_dropped: list[str] = field(default_factory=list)


def _intervals(prefixes: Sequence[bytes]) -> list[tuple[bytes, bytes | None]]:
    """``[prefix, successor)`` of each prefix; an empty prefix is refused (it would
    match every key: that is dropping the instance, not erasing a subject)."""
    out = []
    for p in prefixes:
        if type(p) is not bytes or not p:
            raise ValueError(f"erase_prefixes: each prefix must be non-empty bytes, got {p!r}")
        out.append((p, prefix_successor(p)))
    return out


def discard_from_memtables(memtables: Iterable[Memtable], prefixes: Sequence[bytes],
                           where: Callable[[bytes], bool] | None) -> int:
    """Drops the matching entries from each memtable; returns how many."""
    n = 0
    intervals = _intervals(prefixes)
    for m in memtables:
        keys = [k for lo, hi in intervals for k, _seq, _v in m.range(lo, hi) if where is None or where(k)]
        n += m.discard(keys)
    return n


def _matches(tables: TableStore, t: TableInfo, intervals: list[tuple[bytes, bytes | None]],
             where: Callable[[bytes], bool] | None) -> bool:
    """Whether the FILE of ``t`` holds a matching entry: a clipped table's keys outside
    its clip count (module docstring, step 3); its bounds are then only the visible ones."""
    for lo, hi in intervals:
        if t.clip is None and (t.max_key < lo or (hi is not None and t.min_key >= hi)):
            continue
        for k, _seq, _v in tables.reader(t).iter_from(lo, hi):  # the file, unclipped
            if where is None or where(k):
                return True
    return False


def purge_tables(tables: TableStore, levels: LevelList, prefixes: Sequence[bytes],
                 where: Callable[[bytes], bool] | None, result: PurgeResult) -> LevelList:
    """Rewrites every table of ``levels`` holding a matching entry without it (module
    docstring, step 3); returns the new level list and records the work in ``result``.

    Raises:
        CorruptionError: a table block read fails verification (nothing is replaced).
    """
    intervals = _intervals(prefixes)

    def keep(key: bytes) -> bool:
        return not any(key >= lo and (hi is None or key < hi) for lo, hi in intervals) or (
            where is not None and not where(key))

    replaced: dict[str, TableInfo | None] = {}
    for t in levels.all_tables():
        if t.key in replaced or not _matches(tables, t, intervals, where):
            continue
        entries = list(tables.iter_table(t))
        kept = [e for e in entries if keep(e[0])]
        result.entries += len(entries) - len(kept)
        new = tables.write_table(kept)
        replaced[t.key] = new
        result.tables_rewritten[t.key] = None if new is None else new.key
    if replaced:
        tables.forget(replaced)
        levels = levels.with_replaced(replaced)
    return levels
