"""The read path below the active memtable: point lookups and scans over the table tree.

``DKV.get`` answers from the active memtable itself (one dict lookup) and hands every
other key to ``PointReader.get``: sealed memtables newest first, then the L0 tables
whose key range covers the key, newest first, then at most one table per sorted-run
level. The key is hashed once (``bloom.key_hash``) and each candidate table's Bloom
filter is probed with that hash before any block is read: the L0 rows go through
``bloom.first_candidate`` in one call; sorted-run filters are memoised per table. The
probe data belongs to one ``LevelList`` and is rebuilt when the owner's list changes.

``scan_range`` merges memtable slices and tables lazily; the newest version of a key
wins and tombstones hide older versions. A scan reading at most ``SMALL_SCAN_BLOCKS``
blocks in all is merged at once in one C call (``merge.merge_spans_live``); a longer
one a block at a time, in bounded memory; a scan with a single sorted source skips the
merge. Tables shared after a rescale carry a clip and serve only the keys inside it
(``table_bounds``).

Source: storage/RFC-0002 (the read-path rounds after "Read-path changes made with this
work"). Single-threaded, like the owning ``DKV``.
"""

from __future__ import annotations

from bisect import bisect_left as _bisect_left
from collections.abc import Iterator, Sequence

from dkvstream.storage.dkv.bloom import first_candidate as _first_candidate
from dkvstream.storage.dkv.bloom import key_hash as _key_hash
from dkvstream.storage.dkv.bloom import may_contain_hash as _may_contain_hash
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.memtable import Memtable
from dkvstream.storage.dkv.merge import (
    BlockSpan,
    ColumnBatch,
    merge_batches_live,
    merge_live,
    merge_spans_live,
)
from dkvstream.storage.dkv.sstable import SSTableReader, TableInfo
from dkvstream.storage.dkv.tablestore import TableStore

# Scans reading at most this many data blocks in all (~4 KiB each decompressed) are merged
# eagerly in one call; longer ones lazily, a block at a time, in bounded memory.
SMALL_SCAN_BLOCKS = 16


def prefix_successor(prefix: bytes) -> bytes | None:
    """Returns the smallest key greater than every key starting with ``prefix``.

    Returns:
        The exclusive upper bound of a prefix scan, or None if there is none (the
        prefix is empty or all ``0xff``).
    """
    p = prefix.rstrip(b"\xff")
    if not p:
        return None
    return p[:-1] + bytes([p[-1] + 1])


def bloom_row(r: SSTableReader) -> tuple[bytes, int, int]:
    """``(bits, m, k)`` of ``r``'s Bloom filter for the inlined probe in ``PointReader.get``;
    an empty filter (m = 0, which ``may_contain`` treats as "may contain") becomes one set
    byte, which the probe also always passes."""
    bits, k = r.bloom
    if not bits or k < 1:
        return b"\xff", 8, 1
    return bits, len(bits) << 3, k


def table_bounds(
    t: TableInfo, start: bytes, end: bytes | None
) -> tuple[bytes, bytes | None] | None:
    """``[start, end)`` narrowed to what a clipped (shared, after a rescale) table may
    serve, or None if nothing; unclipped tables serve the whole range."""
    if t.clip is None:
        return start, end
    s = max(start, t.min_key)
    hi = t.max_key + b"\x00"
    e = hi if end is None or end > hi else end
    return (s, e) if s < e else None


class PointReader:
    """Point lookups in sealed memtables and tables, with probe data for one level list.

    Args:
        tables: The owner's table store (readers and their Bloom filters).
    """

    def __init__(self, tables: TableStore) -> None:
        self._tables = tables
        self._levels: LevelList | None = None  # the LevelList self._plan describes
        self._plan: tuple[list, list, dict] = ([], [], {})

    def _plan_for(self, levels: LevelList) -> tuple[list, list, dict]:
        """Per-LevelList probe data: L0 filter rows ``(min, max, bits, m, k, table)``,
        newest first (``bloom.first_candidate``'s layout); the non-empty sorted runs as
        ``LevelList.sorted_run_probes`` gives them; and a lazily filled
        ``table key -> (bits, m, k)`` map for sorted runs."""
        if self._levels is not levels:
            reader = self._tables.reader
            l0 = []
            for t in levels.l0:
                bits, m, k = bloom_row(reader(t))
                l0.append((t.min_key, t.max_key, bits, m, k, t))
            self._plan = (l0, levels.sorted_run_probes(), {})
            self._levels = levels
        return self._plan

    def get(self, sealed: Sequence[Memtable], levels: LevelList, key: bytes) -> bytes | None:
        """Returns the value of ``key`` in ``sealed`` (newest first) or the tables of
        ``levels``, or None if the newest version found is a tombstone or there is none.

        Raises:
            CorruptionError: A table block needed for the answer fails verification.
        """
        for mt in sealed:
            e = mt.get(key)
            if e is not None:
                return e[1]
        l0, runs, run_filters = self._plan if self._levels is levels else self._plan_for(levels)
        tables = self._tables
        h = _key_hash(key)  # once per get, not per table probed
        if l0:
            i = _first_candidate(l0, 0, key, h)
            while i >= 0:
                e = tables.reader(l0[i][5]).get_unfiltered(key)
                if e is not None:
                    return e[1]
                i = _first_candidate(l0, i + 1, key, h)
        # ``LevelList.sorted_run_candidate`` inlined over the precomputed probes: this
        # runs for every sorted-run level on every get that reaches the tables.
        for max_keys, run in runs:
            j = _bisect_left(max_keys, key)
            if j == len(run):
                continue
            t = run[j]
            if t.min_key > key:
                continue
            f = run_filters.get(t.key)
            if f is None:
                f = run_filters[t.key] = bloom_row(tables.reader(t))
            if _may_contain_hash(*f, h):
                # The cached reader without a method call (as ``_short_scan_spans``).
                r = tables._readers.get(t.key) or tables.reader(t)
                e = r.get_unfiltered(key)
                if e is not None:
                    return e[1]
        return None


    def get_many(self, sealed: Sequence[Memtable], levels: LevelList, keys: Sequence[bytes],
                 rows: Sequence[int], out: list[bytes | None]) -> None:
        """``out[i] = get(sealed, levels, keys[i])`` for every ``i`` of ``rows``: the keys
        the active memtable did not answer (``DKV.get_many``). With no sealed memtable
        and no table (state that has never been flushed) there is nothing to look up.

        Raises:
            CorruptionError: A table block needed for the answer fails verification.
        """
        if not sealed and not levels.l0 and not any(levels.levels[1:]):
            for i in rows:
                out[i] = None
            return
        get = self.get
        for i in rows:
            out[i] = get(sealed, levels, keys[i])


def scan_range(
    tables: TableStore, levels: LevelList, mems: Sequence[Memtable], start: bytes,
    end: bytes | None,
) -> Iterator[tuple[bytes, bytes]]:
    """Yields ``(key, value)`` for live keys with ``start <= key < end``, ascending.

    Args:
        tables: The table store the tables of ``levels`` are read through.
        levels: The level list to read, as of the scan's start.
        mems: The memtables, newest first (the active one, then the sealed ones).
        start: Inclusive lower bound.
        end: Exclusive upper bound, or None for no bound.

    Raises:
        CorruptionError: A table block the scan reads fails verification (raised when
            the block is reached, or at once for a short scan).
    """
    # Plain loops, not comprehensions: each of those costs a function object per scan.
    mem_parts = []
    for m in mems:
        if m._d:  # an empty memtable (just flushed) has nothing to slice
            part = m.range_columns(start, end)
            if part[0]:
                mem_parts.append(part)
    runs: list[tuple[TableInfo, ...]] = []
    for t in levels.l0:
        if t.max_key >= start and (end is None or t.min_key < end):
            runs.append((t,))
    for lvl in range(1, len(levels.levels)):
        run = levels.sorted_run_overlapping(lvl, start, end)
        if run:
            runs.append(run)
    # A short scan (operator state of one subject, a prefix of ~100 keys) reads every
    # table's blocks now and merges them in place in one C call; generators, per-block
    # lists and the chunked merge cost more than the scan itself at that size.
    short = _short_scan_spans(tables, runs, start, end)
    if short is not None:
        readers, spans = short
        try:
            return iter(merge_spans_live(mem_parts, spans))
        except ValueError:
            for r, (_raws, _counts, s, e) in zip(readers, spans):
                r.check_blocks(r.block_span(s, e))  # raises CorruptionError naming the block
            raise
    if not mem_parts and len(runs) == 1:
        # One sorted source: nothing to merge; a block at a time, tombstones dropped.
        return _scan_run(tables, runs[0], start, end)
    sources = [[p] for p in mem_parts]
    sources += [_run_batches(tables, run, start, end) for run in runs]
    return merge_batches_live(sources)


def _short_scan_spans(
    tables: TableStore, runs: list[tuple[TableInfo, ...]], start: bytes, end: bytes | None
) -> tuple[list[SSTableReader], list[BlockSpan]] | None:
    """Each table's reader and blocks for ``[start, end)`` (``SSTableReader.read_span``),
    or None if the blocks are more than ``SMALL_SCAN_BLOCKS`` in all."""
    readers = tables._readers  # the cached reader, without a method call per table
    readers_used = []
    spans = []
    budget = SMALL_SCAN_BLOCKS
    for run in runs:
        for t in run:
            if t.clip is None:
                s, e = start, end
            else:
                bounds = table_bounds(t, start, end)
                if bounds is None:
                    continue
                s, e = bounds
            r = readers.get(t.key) or tables.reader(t)
            span = r.read_span(s, e, budget)
            if span is None:
                return None
            budget -= len(span[0])
            readers_used.append(r)
            spans.append(span)
    return readers_used, spans


def _scan_run(
    tables: TableStore, run: tuple[TableInfo, ...], start: bytes, end: bytes | None
) -> Iterator[tuple[bytes, bytes]]:
    for batch in _run_batches(tables, run, start, end):
        yield from merge_live([batch])


def _run_batches(
    tables: TableStore, run: tuple[TableInfo, ...], start: bytes, end: bytes | None
) -> Iterator[ColumnBatch]:
    # Tables of a sorted run are disjoint and ordered: concatenate, opening lazily.
    reader = tables.reader
    for t in run:
        bounds = table_bounds(t, start, end)
        if bounds is not None:
            yield from reader(t).scan_column_batches(*bounds)
