"""DKV: the facade that wires memtables, WAL, SSTables, levels, compaction and manifests.

Write path: ``put``/``delete`` assign the next sequence number, append the record to the
in-memory WAL buffer and write it through to the active memtable. ``write_batch`` does the
same for many writes at once (consecutive sequence numbers, list extends and one
``dict.update`` per chunk); at checkpoint the buffer becomes batch records of the WAL. No object-store request
happens per key. When the memtable reaches ``memtable_bytes`` it is sealed and written as
an L0 SSTable synchronously (one PUT).

Read path: ``get`` consults the active memtable, sealed memtables, L0 tables newest first
(skipping by key range and Bloom filter), then one table per sorted-run level. Scans merge
all sources lazily; the newest version of a key wins and tombstones hide older versions.
A scan sees the state at the moment it was started; writing while iterating is allowed.

Checkpoint: writes the WAL records appended since the previous checkpoint as one WAL
object (or flushes the memtable instead when the listed WAL would exceed
``wal_flush_bytes``), compacts if L0 reached its trigger, and publishes a manifest with
``put_if_absent``. Writes after the last checkpoint are not durable: ``close`` (or a crash)
discards them, and reopening a manifest restores exactly the checkpointed state.

Threading: a DKV instance is single-threaded. Call it from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from storage.dkv.bloom import first_candidate as _first_candidate
from storage.dkv.bloom import key_hash as _key_hash
from storage.dkv.bloom import may_contain_hash as _may_contain_hash
from storage.dkv.compaction import (
    CompactionPlan,
    CompactionResult,
    plan_compaction,
    plan_full,
    run_compaction,
)
from storage.dkv.gc_pause import gc_paused
from storage.dkv.invariants import check_manifest
from storage.dkv.levels import LevelList
from storage.dkv.manifest import Manifest, WalRef, load_manifest, publish_manifest
from storage.dkv.memtable import ENTRY_OVERHEAD, Memtable
from storage.dkv.merge import (
    BlockSpan,
    ColumnBatch,
    Entry,
    merge_batches_live,
    merge_live,
    merge_spans_live,
)
from storage.dkv.options import DKVOptions
from storage.dkv.paths import PathResolver, compactions_dir, parse_result_key, validate_name
from storage.dkv.remote_compaction import can_install, load_result
from storage.dkv.sstable import SSTableReader, TableInfo
from storage.dkv.tablestore import TableStore
from storage.dkv.wal import encoded_batches_size
from storage.errors import ClosedError, ManifestConflictError
from storage.faults import fault_point
from storage.objectstore import ObjectStore


# Scans reading at most this many data blocks in all (~4 KiB each decompressed) are merged
# eagerly in one call; longer ones lazily, a block at a time, in bounded memory.
SMALL_SCAN_BLOCKS = 16
_BYTES = frozenset({bytes})
_BYTES_OR_NONE = frozenset({bytes, type(None)})


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


def _join_shared(tables: TableStore, per_level: list[list[TableInfo]]) -> list[list[TableInfo]]:
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


def _filter(r: SSTableReader) -> tuple[bytes, int, int]:
    """``(bits, m, k)`` of ``r``'s Bloom filter for the inlined probe in ``DKV.get``; an
    empty filter (m = 0, which ``may_contain`` treats as "may contain") becomes one set
    byte, which the probe also always passes."""
    bits, k = r.bloom
    if not bits or k < 1:
        return b"\xff", 8, 1
    return bits, len(bits) << 3, k


def _table_bounds(t: TableInfo, start: bytes, end: bytes | None) -> tuple[bytes, bytes | None] | None:
    """``[start, end)`` narrowed to what a clipped (shared, after a rescale) table may
    serve, or None if nothing; unclipped tables serve the whole range."""
    if t.clip is None:
        return start, end
    s = max(start, t.min_key)
    hi = t.max_key + b"\x00"
    e = hi if end is None or end > hi else end
    return (s, e) if s < e else None


class DKV:
    """An LSM key-value store over an ``ObjectStore``. Keys and values are ``bytes``.

    Create with ``DKV.open``. Single-threaded.
    """

    def __init__(
        self, store: ObjectStore, paths: PathResolver, options: DKVOptions,
        manifest: Manifest | None,
    ) -> None:
        self._store = store
        self._paths = paths
        self._options = options
        self._tables = TableStore(store, paths, options)
        self._memtable_bytes = options.memtable_bytes
        self._mem = Memtable()
        self._sealed: list[Memtable] = []  # newest first
        # The WAL buffer: writes since the last checkpoint or flush, as parallel lists;
        # their sequence numbers are always self._seq - len + 1 .. self._seq.
        self._wal_keys: list[bytes] = []
        self._wal_values: list[bytes | None] = []
        self._closed = False
        self._compactions: dict[str, int] = {}
        self._plan_levels: LevelList | None = None  # the LevelList self._plan describes
        self._plan: tuple[list, dict] = ([], {})
        if manifest is None:
            self._seq = 0
            self._flushed_seq = 0
            self._levels = LevelList()
            self._wal_refs: list[WalRef] = []
            self._key_range = None
            self._handled: set[str] = set()
        else:
            self._key_range = manifest.key_range
            self._handled = set(manifest.handled_compactions)
            self._seq = manifest.last_seq
            self._flushed_seq = manifest.flushed_seq
            self._levels = manifest.levels
            self._wal_refs = list(manifest.wal)
            self._replay(self._wal_refs)

    def _replay(self, refs: Sequence[WalRef]) -> None:
        """Writes the records of WAL objects ``refs`` (in order) into the memtable."""
        for ref in refs:
            seqs, keys, values = self._tables.read_wal_columns(ref)
            self._mem.put_batch(keys, seqs, values)

    @classmethod
    def open(
        cls, store: ObjectStore, prefix: str, manifest_key: str | None = None,
        options: DKVOptions | None = None,
    ) -> DKV:
        """Opens a DKV instance.

        Args:
            store: Where tables, WAL objects and manifests live.
            prefix: Key prefix of this instance's files, e.g.
                ``jobs/flights/state/route_daily_delays/kg-0000-0127``.
            manifest_key: None for an empty DB, else a key returned by ``checkpoint``;
                the DB then holds exactly the state of that checkpoint.
            options: Tuning; defaults to ``DKVOptions()``.

        Returns:
            The open instance.

        Raises:
            ObjectNotFoundError: The manifest or a WAL object it names is missing.
            CorruptionError: The manifest or a WAL object fails verification.
        """
        options = options or DKVOptions()
        paths = PathResolver(prefix)
        manifest = None
        if manifest_key is not None:
            manifest = load_manifest(store, manifest_key)
            check_manifest(manifest, store.uri(manifest_key))
        return cls(store, paths, options, manifest)

    @classmethod
    def open_from_parents(
        cls, store: ObjectStore, prefix: str, parents: list[str],
        key_range: tuple[bytes, bytes | None], options: DKVOptions | None = None,
    ) -> DKV:
        """Opens a new instance holding the union of ``parents`` restricted to ``key_range``.

        Used when rescaling: a range split in two opens each half from the one parent
        manifest; two ranges merged open one instance from both. Parent tables are
        referenced in place (never copied) with a clip recorded in the manifest, so reads
        and compaction inputs see only keys in ``[lo, hi)``; compaction later rewrites them
        into tables holding only in-range keys. Parent WAL records in the range are
        replayed as new writes (fresh sequence numbers above every parent's ``last_seq``)
        and land in this instance's first WAL object or table.

        ASSUMES: the parents hold keys from disjoint key intervals (they were different
        key-group ranges), so a key exists in at most one parent and the parents' sequence
        numbers never need reconciling beyond starting above their maximum. A sorted-run
        level whose clipped tables from different parents overlap raises ``ValueError``.

        Args:
            store: The object store (parents may live under other prefixes of it).
            prefix: This instance's prefix (where its new files go).
            parents: Parent manifest keys.
            key_range: ``(lo, hi)``: inclusive lower, exclusive upper bound (None = none).
                Recorded in the manifest; ``DKV.open`` of a later checkpoint keeps it.
            options: Tuning; defaults to ``DKVOptions()``.

        Returns:
            The open instance; nothing is written until its first flush or checkpoint.
        """
        options = options or DKVOptions()
        lo, hi = key_range
        if hi is not None and hi <= lo:
            raise ValueError(f"empty key range [{lo!r}, {hi!r})")
        paths = PathResolver(prefix)
        tables = TableStore(store, paths, options)
        manifests = []
        for key in parents:
            m = load_manifest(store, key)
            check_manifest(m, store.uri(key))
            manifests.append(m)
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
        per_level = _join_shared(tables, per_level)
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
            name="", prefix=paths.prefix, last_seq=base, flushed_seq=base,
            levels=LevelList(tuple(tuple(lvl) for lvl in per_level)), key_range=(lo, hi),
        )
        db = cls(store, paths, options, start)
        for m in manifests:
            for ref in m.wal:
                _seqs, keys, values = tables.read_wal_columns(ref)
                inside = [i for i, k in enumerate(keys) if k >= lo and (hi is None or k < hi)]
                db.write_batch([keys[i] for i in inside], [values[i] for i in inside])
        return db

    def advance_to(self, manifest_key: str) -> bool:
        """Advances this instance, open at a checkpoint with nothing written since, to a
        later checkpoint of the same lineage that only lists more WAL objects (no flush,
        compaction or rescale in between): replays just those objects into the memtable,
        as ``DKV.open(manifest_key)`` would have replayed them after the ones held.

        Used to keep an instance open across epochs when the next epoch's task may run
        somewhere that missed some of them (``operators.open_state``); Flink's task-local
        recovery plays the same role.

        Args:
            manifest_key: A key returned by ``checkpoint``.

        Returns:
            True if the instance now holds exactly the state of ``manifest_key``; False
            (the instance unchanged) if the manifest changed tables, key range or flushed
            sequence number, does not extend the WAL list held, or the instance has
            unflushed memtables or writes since its last checkpoint.

        Raises:
            ObjectNotFoundError: The manifest or a WAL object it names is missing.
            CorruptionError: The manifest or a WAL object fails verification.
        """
        if self._closed or self._wal_keys or self._sealed:
            return False
        m = load_manifest(self._store, manifest_key)
        check_manifest(m, self._store.uri(manifest_key))
        held = tuple(self._wal_refs)
        if (m.prefix != self._paths.prefix or m.levels != self._levels or m.key_range != self._key_range
                or m.flushed_seq != self._flushed_seq or m.last_seq < self._seq
                or tuple(m.wal[:len(held)]) != held):
            return False
        new = m.wal[len(held):]
        if new and new[0].first_seq != self._seq + 1:
            return False
        self._replay(new)
        self._wal_refs = list(m.wal)
        self._seq = m.last_seq
        self._handled = set(m.handled_compactions)
        return True

    @property
    def key_range(self) -> tuple[bytes, bytes | None] | None:
        """The key range this instance owns if it came from a rescale, else None."""
        return self._key_range

    # -- writes ---------------------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> None:
        """Sets ``key`` to ``value``.

        Raises:
            TypeError: ``key`` or ``value`` is not ``bytes``.
            ClosedError: The instance is closed.
        """
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError("DKV keys and values must be bytes")
        if self._closed:
            raise ClosedError("DKV is closed")
        self._seq = seq = self._seq + 1
        self._wal_keys.append(key)
        self._wal_values.append(value)
        mem = self._mem
        mem.put(key, seq, value)
        if mem.approx_bytes >= self._memtable_bytes:
            self.flush()

    def delete(self, key: bytes) -> None:
        """Deletes ``key`` (writes a tombstone; deleting a missing key is fine).

        Raises:
            TypeError: ``key`` is not ``bytes``.
            ClosedError: The instance is closed.
        """
        if type(key) is not bytes:
            raise TypeError("DKV keys must be bytes")
        if self._closed:
            raise ClosedError("DKV is closed")
        self._seq = seq = self._seq + 1
        self._wal_keys.append(key)
        self._wal_values.append(None)
        mem = self._mem
        mem.put(key, seq, None)
        if mem.approx_bytes >= self._memtable_bytes:
            self.flush()

    def write_batch(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Writes ``keys[i] -> values[i]`` for every i, in order (None deletes the key).

        The same result as ``put``/``delete`` per row (a key written twice keeps its
        later value; consecutive sequence numbers), at a fraction of the per-write cost:
        RocksDB's ``WriteBatch``. The memtable may still flush between rows when it fills.

        Args:
            keys: The keys (``bytes``).
            values: One per key: ``bytes``, or None for a delete.

        Raises:
            TypeError: A key is not ``bytes``, or a value neither ``bytes`` nor None.
            ValueError: ``keys`` and ``values`` differ in length.
            ClosedError: The instance is closed.
        """
        n = len(keys)
        if len(values) != n:
            raise ValueError(f"write_batch: {n} keys but {len(values)} values")
        if not set(map(type, keys)) <= _BYTES or not set(map(type, values)) <= _BYTES_OR_NONE:
            raise TypeError("DKV keys must be bytes and values bytes or None (a delete)")
        if self._closed:
            raise ClosedError("DKV is closed")
        i = 0
        while i < n:
            # Chunks of about half the memtable's free space (sized by the chunk's first
            # row), so a flush happens near where a put per row would have flushed and
            # the memtable overshoots its budget by at most a few rows.
            mem = self._mem
            v = values[i]
            row = ENTRY_OVERHEAD + len(keys[i]) + (0 if v is None else len(v))
            room = max(16, (self._memtable_bytes - mem.approx_bytes) // (2 * row))
            j = min(n, i + room)
            ks, vs = keys[i:j], values[i:j]
            first = self._seq + 1
            self._seq += j - i
            self._wal_keys += ks
            self._wal_values += vs
            mem.put_batch(ks, range(first, self._seq + 1), vs)
            if mem.approx_bytes >= self._memtable_bytes:
                self.flush()
            i = j

    # -- reads ----------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """Returns the value of ``key``, or None if it is absent or deleted.

        Raises:
            CorruptionError: A table block needed for the answer fails verification.
            ClosedError: The instance is closed.
        """
        e = self._mem._d.get(key)  # the hot path: one dict lookup
        if e is not None:
            return e[1]
        if self._closed:
            raise ClosedError("DKV is closed")
        return self._get_older(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``get`` of every key, in order (RocksDB's ``MultiGet``): one C-level pass of
        memtable lookups, then the older sources for the keys it did not answer.

        Args:
            keys: The keys (``bytes``), in any order, repeats allowed.

        Returns:
            One value per key, in the order of ``keys``: the value, or None where the
            key is absent or deleted.

        Raises:
            CorruptionError: A table block needed for the answer fails verification.
            ClosedError: The instance is closed (as ``get`` raises).
        """
        if self._closed:
            raise ClosedError("DKV is closed")
        found = self._mem.get_many(keys)
        out = [None if e is None else e[1] for e in found]
        if None in found:
            older = self._get_older
            for i, e in enumerate(found):
                if e is None:
                    out[i] = older(keys[i])
        return out

    def _read_plan(self) -> tuple[list, dict]:
        """Per-LevelList probe data: L0 filter rows ``(min, max, bits, m, k, table)``,
        newest first (``bloom.first_candidate``'s layout), and a lazily filled
        ``table key -> (bits, m, k)`` map for sorted runs."""
        levels = self._levels
        if self._plan_levels is not levels:
            reader = self._tables.reader
            l0 = []
            for t in levels.l0:
                bits, m, k = _filter(reader(t))
                l0.append((t.min_key, t.max_key, bits, m, k, t))
            self._plan = (l0, {})
            self._plan_levels = levels
        return self._plan

    def _get_older(self, key: bytes) -> bytes | None:
        for mt in self._sealed:
            e = mt.get(key)
            if e is not None:
                return e[1]
        l0, run_filters = (
            self._plan if self._plan_levels is self._levels else self._read_plan()
        )
        tables = self._tables
        h = _key_hash(key)  # once per get, not per table probed
        if l0:
            i = _first_candidate(l0, 0, key, h)
            while i >= 0:
                e = tables.reader(l0[i][5]).get_unfiltered(key)
                if e is not None:
                    return e[1]
                i = _first_candidate(l0, i + 1, key, h)
        levels = self._levels
        for lvl in range(1, len(levels.levels)):
            t = levels.sorted_run_candidate(lvl, key)
            if t is None:
                continue
            f = run_filters.get(t.key)
            if f is None:
                f = run_filters[t.key] = _filter(tables.reader(t))
            if _may_contain_hash(*f, h):
                e = tables.reader(t).get_unfiltered(key)
                if e is not None:
                    return e[1]
        return None

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Yields ``(key, value)`` for live keys starting with ``prefix``, ascending.

        Lazy heap merge over memtables and tables; the newest version wins and tombstones
        hide older versions.
        """
        return self.scan_range(prefix, prefix_successor(prefix))

    def scan_range(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Yields ``(key, value)`` for live keys with ``start <= key < end``, ascending.

        Args:
            start: Inclusive lower bound.
            end: Exclusive upper bound, or None for no bound.
        """
        if self._closed:
            raise ClosedError("DKV is closed")
        # Plain loops, not comprehensions: each of those costs a function object per scan.
        mem_parts = []
        for m in (self._mem, *self._sealed):
            if m._d:  # an empty memtable (just flushed) has nothing to slice
                part = m.range_columns(start, end)
                if part[0]:
                    mem_parts.append(part)
        levels = self._levels
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
        short = self._short_scan_spans(runs, start, end)
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
            return self._scan_run(runs[0], start, end)
        sources = [[p] for p in mem_parts]
        sources += [self._run_batches(run, start, end) for run in runs]
        return merge_batches_live(sources)

    def _short_scan_spans(
        self, runs: list[tuple[TableInfo, ...]], start: bytes, end: bytes | None
    ) -> tuple[list[SSTableReader], list[BlockSpan]] | None:
        """Each table's reader and blocks for ``[start, end)`` (``SSTableReader.read_span``),
        or None if the blocks are more than ``SMALL_SCAN_BLOCKS`` in all."""
        tables = self._tables
        readers = tables._readers  # the cached reader, without a method call per table
        readers_used = []
        spans = []
        budget = SMALL_SCAN_BLOCKS
        for run in runs:
            for t in run:
                if t.clip is None:
                    s, e = start, end
                else:
                    bounds = _table_bounds(t, start, end)
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
        self, run: tuple[TableInfo, ...], start: bytes, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        for batch in self._run_batches(run, start, end):
            yield from merge_live([batch])

    def _run_batches(
        self, run: tuple[TableInfo, ...], start: bytes, end: bytes | None
    ) -> Iterator[ColumnBatch]:
        # Tables of a sorted run are disjoint and ordered: concatenate, opening lazily.
        reader = self._tables.reader
        for t in run:
            bounds = _table_bounds(t, start, end)
            if bounds is not None:
                yield from reader(t).scan_column_batches(*bounds)

    def _run_iter(self, run: list[TableInfo], start: bytes, end: bytes | None) -> Iterator[Entry]:
        # Tables of a sorted run are disjoint and ordered: concatenate, opening lazily.
        iter_table = self._tables.iter_table
        for t in run:
            yield from iter_table(t, start, end)

    # -- flush, compaction, checkpoint --------------------------------------------------

    def flush_memtable(self) -> None:
        """Like ``flush`` but never compacts."""
        if self._closed:
            raise ClosedError("DKV is closed")
        if len(self._mem):
            self._sealed.insert(0, self._mem)
            self._mem = Memtable()
        levels = self._levels
        for m in reversed(self._sealed):  # oldest first, so L0 ends up newest first
            with gc_paused():
                t = self._tables.write_table_columns(*m.columns())
            fault_point("dkv_table_written")
            if t is not None:
                levels = levels.with_flushed(t)
        self._levels = levels
        self._sealed = []
        self._flushed_seq = self._seq
        self._wal_keys = []
        self._wal_values = []
        self._wal_refs = []

    def flush(self) -> None:
        """Seals the memtable and writes it as an L0 SSTable now; then compacts if due.

        All WAL records are then covered by tables, so the buffered WAL and the listed WAL
        objects are dropped (WAL truncation up to the table's max sequence number).
        """
        self.flush_memtable()
        self._maybe_compact()

    def _maybe_compact(self) -> int:
        """Runs planned compactions while their input fits the inline budget.

        Returns:
            Input bytes compacted.
        """
        budget = self._options.max_inline_compaction_bytes
        spent = 0
        while True:
            plan = plan_compaction(self._levels, self._options)
            if plan is None or spent + plan.input_bytes > budget:
                return spent
            self._run_plan(plan)
            spent += plan.input_bytes

    def _run_plan(self, plan: CompactionPlan) -> None:
        with gc_paused():
            result = run_compaction(plan, self._tables, self._options.target_file_bytes)
        fault_point("dkv_compaction_written")
        self.install_compaction(result)
        self._compactions[plan.reason] = self._compactions.get(plan.reason, 0) + 1

    def compact_all(self) -> None:
        """Flushes the memtable, then merges every table into the last non-empty level.

        Afterwards the tree is one sorted run without tombstones (unless a level outside
        this instance's tables could hold older versions, which cannot happen here). Not
        bounded by ``max_inline_compaction_bytes``.
        """
        self.flush_memtable()
        plan = plan_full(self._levels)
        if plan is not None and not (
            len(plan.inputs) == 1 and plan.input_levels[0] >= 1 and plan.inputs[0].clip is None
        ):
            self._run_plan(plan)

    def install_compaction(self, result: CompactionResult) -> None:
        """Installs a compaction result if all its inputs are still live.

        Raises:
            ValueError: Some input left the level list; the result must be discarded.
        """
        self._levels = self._levels.with_compaction(
            result.inputs, result.output_level, result.outputs
        )
        self._tables.forget(result.inputs)

    def install_pending_compactions(self) -> dict:
        """Installs or discards every published remote compaction result not yet handled.

        Lists ``<prefix>/compactions/``; each unhandled result is installed iff
        ``remote_compaction.can_install`` holds for the current level list (all inputs
        still live in their levels, ...), else discarded. Handled ids go into the next
        manifest; ids whose result object is gone (deleted by GC) are forgotten.

        Returns:
            ``{"installed": int, "discarded": int}``.

        Raises:
            CorruptionError: A result object fails verification.
        """
        if self._closed:
            raise ClosedError("DKV is closed")
        prefix = self._paths.prefix
        listed: dict[str, str] = {}
        for key in self._store.list(compactions_dir(prefix)):
            cid = parse_result_key(prefix, key)
            if cid is not None:
                listed[cid] = key
        installed = discarded = 0
        for cid in sorted(listed):
            if cid in self._handled:
                continue
            r = load_result(self._store, listed[cid])
            ok = r.prefix == prefix and can_install(self._levels, r)
            if ok:
                try:
                    self.install_compaction(CompactionResult(
                        tuple(t.key for _, t in r.inputs), r.output_level, r.outputs
                    ))
                except ValueError:
                    ok = False
            if ok:
                installed += 1
            else:
                discarded += 1
            self._handled.add(cid)
        self._handled &= set(listed)
        return {"installed": installed, "discarded": discarded}

    def checkpoint(self, name: str) -> str:
        """Makes the current state durable and publishes a manifest for it.

        Args:
            name: Unique per (epoch, task attempt), e.g. ``e00000007-a3f9c1``;
                ``[A-Za-z0-9._-]`` only.

        Returns:
            The manifest key, to pass to ``DKV.open`` later.

        Raises:
            ManifestConflictError: A manifest with this name already exists.
            ValueError: ``name`` has invalid characters.
        """
        if self._closed:
            raise ClosedError("DKV is closed")
        mkey = self._paths.manifest_key(validate_name(name))
        if self._store.exists(mkey):  # fail before writing anything; publish re-checks
            raise ManifestConflictError(f"manifest already exists: {self._store.uri(mkey)}")
        if self._wal_keys:
            n = len(self._wal_keys)
            first = self._seq - n + 1
            # Sized before encoding: when the WAL would pass its limit, the memtable is
            # flushed instead and the buffer never needs encoding.
            size = encoded_batches_size(self._wal_keys, self._wal_values)
            listed = sum(w.size for w in self._wal_refs) + size
            if listed > self._options.wal_flush_bytes:
                self.flush()
            else:
                data = self._tables.encode_wal(first, self._wal_keys, self._wal_values)
                self._wal_refs.append(self._tables.write_wal(name, data, first, self._seq, n))
                self._wal_keys = []
                self._wal_values = []
        self._maybe_compact()
        m = Manifest(
            name=name, prefix=self._paths.prefix, last_seq=self._seq,
            flushed_seq=self._flushed_seq, levels=self._levels, wal=tuple(self._wal_refs),
            key_range=self._key_range, handled_compactions=tuple(sorted(self._handled)),
        )
        check_manifest(m, self._store.uri(mkey))
        fault_point("dkv_before_manifest")
        publish_manifest(self._store, mkey, m)
        return mkey

    # -- introspection and lifecycle ----------------------------------------------------

    @property
    def levels(self) -> LevelList:
        """The current (immutable) level list."""
        return self._levels

    def stats(self) -> dict:
        """Returns counters as a plain dict.

        Keys: ``tables_per_level`` and ``bytes_per_level`` (lists, index = level),
        ``memtable_bytes`` (approximate), ``memtable_entries``, ``sealed_memtables``,
        ``approx_live_keys`` (entries in memtables and tables; an upper bound, since
        versions and tombstones count), ``last_seq``, ``flushed_seq``, ``wal_objects``,
        ``wal_bytes``, ``wal_buffered_records``, ``compactions`` (runs per plan reason),
        ``block_cache`` and ``object_store``.
        """
        lv = self._levels.levels
        cache = self._tables.cache
        mem_entries = len(self._mem) + sum(len(m) for m in self._sealed)
        return {
            "tables_per_level": [len(lvl) for lvl in lv],
            "bytes_per_level": [sum(t.size for t in lvl) for lvl in lv],
            "entries_per_level": [sum(t.entries for t in lvl) for lvl in lv],
            "memtable_bytes": self._mem.approx_bytes + sum(m.approx_bytes for m in self._sealed),
            "memtable_entries": mem_entries,
            "sealed_memtables": len(self._sealed),
            "approx_live_keys": mem_entries + sum(t.entries for t in self._levels.all_tables()),
            "last_seq": self._seq,
            "flushed_seq": self._flushed_seq,
            "wal_objects": len(self._wal_refs),
            "wal_bytes": sum(w.size for w in self._wal_refs),
            "wal_buffered_records": len(self._wal_keys),
            "compactions": dict(self._compactions),
            "block_cache": {
                "bytes": cache.used_bytes if cache else 0,
                "hits": cache.hits if cache else 0,
                "misses": cache.misses if cache else 0,
            },
            "object_store": self._store.stats.snapshot(),
        }

    def close(self) -> None:
        """Releases memory. Writes since the last checkpoint are discarded."""
        self._closed = True
        self._mem = Memtable()
        self._sealed = []
        self._wal_keys = []
        self._wal_values = []
        self._tables.forget(list(self._tables._readers))

    def __enter__(self) -> DKV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
