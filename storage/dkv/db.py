"""DKV: the facade that wires memtables, WAL, SSTables, levels, compaction and manifests.

Write path: ``put``/``delete`` assign the next sequence number, append the record to the
in-memory WAL buffer and write it through to the active memtable. ``write_batch`` does the
same for many writes at once (consecutive sequence numbers, list extends and one
``dict.update`` per chunk); at checkpoint the buffer becomes batch records of the WAL. No
object-store request happens per key. When the memtable reaches ``memtable_bytes`` it is sealed and written as
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

``DKV`` owns the instance's state and its lifecycle; the work is in the modules beside it:

    read.py               gets below the active memtable, scans over memtables and tables
    flush.py              memtables to L0 tables, the WAL buffer to a WAL object
    checkpoint.py         manifests loaded and published with their invariants checked;
                          the rule of ``advance_to``
    rescale.py            the start state of a range opened from its parents' manifests
    compaction.py         planning and merging (the inline loop is ``DKV._maybe_compact``)
    remote_compaction.py  results computed outside the task, installed or discarded here
    tablestore.py         the one gateway to the bucket for tables and WAL objects

Threading: a DKV instance is single-threaded. Call it from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from dkvstream.storage.dkv.checkpoint import extends, load_checked, publish
from dkvstream.storage.dkv.compaction import (
    CompactionPlan,
    CompactionResult,
    plan_compaction,
    plan_full,
    run_compaction,
)
from dkvstream.storage.dkv.expiry import ExpiryFilter
from dkvstream.storage.dkv.flush import wal_fits, write_l0, write_wal_object
from dkvstream.storage.dkv.gc_pause import gc_paused
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import Manifest, WalRef, dropped_files, unkept_files
from dkvstream.storage.dkv.memtable import ENTRY_OVERHEAD, Memtable
from dkvstream.storage.dkv.options import DKVOptions
from dkvstream.storage.dkv.paths import PathResolver, validate_name
from dkvstream.storage.dkv.purge import PurgeResult, discard_from_memtables, purge_tables
from dkvstream.storage.dkv.read import PointReader, prefix_successor, scan_range
from dkvstream.storage.dkv.remote_compaction import can_install, list_results, load_result
from dkvstream.storage.dkv.rescale import start_manifest, wal_in_range
from dkvstream.storage.dkv.tablestore import TableStore
from dkvstream.storage.errors import ClosedError, ManifestConflictError
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import ObjectStore

_BYTES = frozenset({bytes})
_BYTES_OR_NONE = frozenset({bytes, type(None)})


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
        # The manifest this instance was opened at or last checkpointed (key, manifest),
        # what ``dropped_at_checkpoint`` compares the next one with; None for an empty
        # instance; ``_base_known`` is False for one opened from parents (a rescale).
        self._base: tuple[str, Manifest] | None = None
        self._base_known = True
        self._dropped: dict[str, int] | None = None
        self._unkept: dict[str, int] = {}
        self._compactions: dict[str, int] = {}
        self._point = PointReader(self._tables)
        self._filter: ExpiryFilter | None = None if manifest is None else manifest.compaction_filter
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
        manifest = None if manifest_key is None else load_checked(store, manifest_key)
        db = cls(store, paths, options, manifest)
        if manifest_key is not None:
            db._base = (manifest_key, manifest)
        return db

    @classmethod
    def open_from_parents(
        cls, store: ObjectStore, prefix: str, parents: list[str],
        key_range: tuple[bytes, bytes | None], options: DKVOptions | None = None,
    ) -> DKV:
        """Opens a new instance holding the union of ``parents`` restricted to ``key_range``.

        Used when rescaling: a range split in two opens each half from the one parent
        manifest; two ranges merged open one instance from both (``rescale.py``). Parent
        tables are referenced in place (never copied) with a clip recorded in the
        manifest, so reads and compaction inputs see only keys in ``[lo, hi)``. Parent WAL
        records in the range are replayed as new writes (fresh sequence numbers above
        every parent's ``last_seq``) and land in this instance's first WAL object or table.

        ASSUMES: the parents hold keys from disjoint key intervals (they were different
        key-group ranges).

        Args:
            store: The object store (parents may live under other prefixes of it).
            prefix: This instance's prefix (where its new files go).
            parents: Parent manifest keys.
            key_range: ``(lo, hi)``: inclusive lower, exclusive upper bound (None = none).
                Recorded in the manifest; ``DKV.open`` of a later checkpoint keeps it.
            options: Tuning; defaults to ``DKVOptions()``.

        Returns:
            The open instance. Its first manifest is published by its first checkpoint;
            before that, only table files may have been written (copies of tables two
            parents share, ``rescale.join_shared``, or a flush while replaying WAL records).

        Raises:
            ValueError: ``key_range`` is empty, or the parents overlap in a sorted-run
                level.
            ObjectNotFoundError: A parent manifest or WAL object is missing.
            CorruptionError: A parent manifest, WAL object or table block read fails
                verification.
        """
        options = options or DKVOptions()
        lo, hi = key_range
        if hi is not None and hi <= lo:
            raise ValueError(f"empty key range [{lo!r}, {hi!r})")
        paths = PathResolver(prefix)
        tables = TableStore(store, paths, options)
        start, manifests = start_manifest(tables, parents, key_range)
        db = cls(store, paths, options, start)
        db._base_known = False  # the parents' files may be shared: dropped_at_checkpoint is None
        for keys, values in wal_in_range(tables, manifests, key_range):
            db.write_batch(keys, values)
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
        m = load_checked(self._store, manifest_key)
        if not extends(self._manifest(""), m):
            return False
        self._replay(m.wal[len(self._wal_refs):])
        self._base, self._base_known = (manifest_key, m), True
        self._wal_refs = list(m.wal)
        self._seq = m.last_seq
        self._handled = set(m.handled_compactions)
        self._filter = m.compaction_filter
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
        return self._point.get(self._sealed, self._levels, key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``get`` of every key, in order (RocksDB's ``MultiGet``): one C loop of
        memtable lookups (``Memtable.get_values``), then the older sources for the keys
        it did not answer, skipped when there are none (``PointReader.get_many``).

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
        out, missing = self._mem.get_values(keys)
        if missing:
            self._point.get_many(self._sealed, self._levels, keys, missing, out)
        return out

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
        return scan_range(self._tables, self._levels, (self._mem, *self._sealed), start, end)

    # -- flush, compaction, checkpoint --------------------------------------------------

    def flush_memtable(self) -> None:
        """Like ``flush`` but never compacts."""
        if self._closed:
            raise ClosedError("DKV is closed")
        if len(self._mem):
            self._sealed.insert(0, self._mem)
            self._mem = Memtable()
        self._levels = write_l0(self._tables, self._sealed, self._levels)
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
            result = run_compaction(plan, self._tables, self._options.target_file_bytes, self._filter)
        fault_point("dkv_compaction_written")
        self.install_compaction(result)
        self._compactions[plan.reason] = self._compactions.get(plan.reason, 0) + 1

    def compact_all(self) -> None:
        """Flushes the memtable, then merges every table into the last non-empty level.

        Afterwards the tree is one sorted run without tombstones (unless a level outside
        this instance's tables could hold older versions, which cannot happen here), and
        without entries the compaction filter finds expired (a lone table is rewritten
        then too). Not bounded by ``max_inline_compaction_bytes``.
        """
        self.flush_memtable()
        plan = plan_full(self._levels)
        if plan is not None and (self._filter is not None or not (
            len(plan.inputs) == 1 and plan.input_levels[0] >= 1 and plan.inputs[0].clip is None
        )):
            self._run_plan(plan)

    def erase_prefixes(self, prefixes: Sequence[bytes],
                       where: Callable[[bytes], bool] | None = None) -> PurgeResult:
        """Removes physically every entry whose key starts with one of ``prefixes`` (and,
        if given, satisfies ``where(key)``): every version, tombstones included, from the
        memtables and every table, with no tombstone left holding the key (``purge.py``).
        The memtable is flushed, so the next ``checkpoint`` names no WAL object; its
        manifest no longer names the tables rewritten or the WAL objects listed before
        (``dropped_at_checkpoint`` lists them).

        Args:
            prefixes: Non-empty key prefixes.
            where: A further test of a key under a prefix, or None (all of them).

        Returns:
            A ``PurgeResult``.

        Raises:
            ValueError: A prefix is empty or not ``bytes``.
            ClosedError: The instance is closed.
            CorruptionError: A table block read fails verification.
        """
        if self._closed:
            raise ClosedError("DKV is closed")
        result = PurgeResult()
        result.entries = discard_from_memtables((self._mem, *self._sealed), prefixes, where)
        result.wal_dropped = [w.key for w in self._wal_refs]
        self.flush_memtable()
        self._levels = purge_tables(self._tables, self._levels, prefixes, where, result)
        return result

    def set_compaction_filter(self, compaction_filter: ExpiryFilter | None) -> None:
        """Sets the filter later compactions of this instance apply and its next
        manifests record (``expiry.py``); None: none. Kept by ``DKV.open`` of those
        manifests.

        Its clocks must never go back: an entry is invisible to the DKV user from the time
        it expires, and compaction may drop it from then on.
        """
        self._filter = compaction_filter

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
        listed = list_results(self._store, prefix)
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
            # When the WAL would pass its limit, the memtable is flushed instead.
            if not wal_fits(self._wal_refs, self._wal_keys, self._wal_values,
                            self._options.wal_flush_bytes):
                self.flush()
            else:
                self._wal_refs.append(write_wal_object(
                    self._tables, name, self._seq, self._wal_keys, self._wal_values
                ))
                self._wal_keys = []
                self._wal_values = []
        self._maybe_compact()
        manifest = self._manifest(name)
        publish(self._store, mkey, manifest)
        written, self._tables.written = self._tables.written, {}
        self._unkept = unkept_files(manifest, written)
        if not self._base_known:
            self._dropped = None
        elif self._base is None:
            self._dropped = {}
        else:
            self._dropped = dropped_files(*self._base, manifest)
        self._base, self._base_known = (mkey, manifest), True
        return mkey

    def dropped_at_checkpoint(self) -> dict[str, int] | None:
        """What the manifest of the last ``checkpoint`` stopped naming compared with the
        one before it (the manifest opened, advanced to or checkpointed last):
        ``{object key: bytes}`` (``manifest.dropped_files``), the previous manifest
        itself included; garbage once no retained checkpoint names that one.

        Returns:
            that dict; None if unknown: no checkpoint yet, the instance was opened from
            parents (a rescale), or a table shared with other ranges was dropped.
        """
        return self._dropped

    def unkept_at_checkpoint(self) -> dict[str, int]:
        """The objects this instance wrote for the last ``checkpoint`` that its manifest
        does not name (``manifest.unkept_files``): ``{object key: bytes}``, garbage once
        that checkpoint is committed. ``{}`` before the first checkpoint."""
        return self._unkept

    def _manifest(self, name: str) -> Manifest:
        """The current state as a manifest named ``name`` (the WAL buffer not included)."""
        return Manifest(
            name=name, prefix=self._paths.prefix, last_seq=self._seq,
            flushed_seq=self._flushed_seq, levels=self._levels, wal=tuple(self._wal_refs),
            key_range=self._key_range, handled_compactions=tuple(sorted(self._handled)),
            compaction_filter=self._filter,
        )

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
