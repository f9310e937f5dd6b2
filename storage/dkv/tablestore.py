"""TableStore: the one gateway between a DKV instance and the bucket for tables and WAL.

It owns the SSTable builder/reader wiring, the path resolver, the block cache and a cache
of open readers (footer + meta + Bloom filter parsed once per table). Manifests are
published by ``manifest.py`` directly with ``put_if_absent``.

Single-threaded, like its owning ``DKV``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from dkvstream.storage.dkv.block_cache import BlockCache
from dkvstream.storage.dkv.manifest import WalRef
from dkvstream.storage.dkv.options import DKVOptions
from dkvstream.storage.dkv.paths import PathResolver
from dkvstream.storage.dkv.sstable import SSTableBuilder, SSTableReader, TableInfo, entry_ends
from dkvstream.storage.dkv.wal import WalRecord, decode_wal_columns, encode_wal_batches
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

Entry = tuple[bytes, int, "bytes | None"]


class TableStore:
    """Reads and writes SSTables and WAL objects for one DKV instance.

    Args:
        store: The object store.
        paths: Naming of this instance's objects.
        options: Block size, Bloom bits, compression level, cache budget.
    """

    def __init__(self, store: ObjectStore, paths: PathResolver, options: DKVOptions) -> None:
        self.store = store
        self.paths = paths
        self.options = options
        self.cache = BlockCache(options.block_cache_bytes) if options.block_cache_bytes else None
        self._readers: dict[str, SSTableReader] = {}
        # Whole-object cache: tables up to a quarter of the budget are fetched with one GET
        # on first use and served from memory (LRU by reader creation and use).
        self._whole_budget = options.table_cache_bytes
        self._whole: OrderedDict[str, int] = OrderedDict()
        self._whole_bytes = 0
        # Tables evicted from the whole-object cache are read block by block from then on:
        # when the live tables outgrow the budget, fetching a whole table again for each
        # get would read megabytes per 4 KiB block (a 64 MiB-capped run read 160 GB).
        self._demoted: set[str] = set()
        # Every object this instance wrote since ``DKV`` last took the record (key ->
        # bytes): the tables and WAL objects of a checkpoint that its manifest may not
        # name (an L0 table compacted away before the checkpoint), for retention.
        self.written: dict[str, int] = {}

    def _builder(self) -> SSTableBuilder:
        o = self.options
        return SSTableBuilder(o.block_bytes, o.bloom_bits_per_key, o.zstd_level)

    def _write(self, builder: SSTableBuilder) -> TableInfo:
        data, meta = builder.finish()
        key = self.paths.next_sst_key()
        self.store.put(key, data)
        self.written[key] = len(data)
        return TableInfo(
            key=key, size=len(data), entries=meta["entries"], min_key=meta["min_key"],
            max_key=meta["max_key"], min_seq=meta["min_seq"], max_seq=meta["max_seq"],
        )

    def write_table(self, entries: Iterable[Entry]) -> TableInfo | None:
        """Writes one SSTable holding ``entries`` (ascending, one per key).

        Returns:
            The table's description, or None if ``entries`` was empty (nothing written).
        """
        b = self._builder()
        for k, seq, v in entries:
            b.add(k, seq, v)
        return self._write(b) if len(b) else None

    def write_table_columns(self, keys: Sequence[bytes], seqs: Sequence[int],
                            values: Sequence[bytes | None]) -> TableInfo | None:
        """Like ``write_table`` for entries given as parallel lists (a memtable flush).

        REQUIRES: ``keys`` strictly increasing (not checked: memtables guarantee it).

        Returns:
            The table's description, or None if ``keys`` is empty (nothing written).
        """
        if not keys:
            return None
        b = self._builder()
        b.add_columns(keys, seqs, values, sorted_unique=True)
        return self._write(b)

    def write_run(self, entries: Iterable[Entry], target_bytes: int) -> list[TableInfo]:
        """Writes ``entries`` as a sorted run split at ~``target_bytes`` uncompressed bytes.

        Returns:
            The new tables in key order (empty if ``entries`` was empty).
        """
        out: list[TableInfo] = []
        b = self._builder()
        for k, seq, v in entries:
            b.add(k, seq, v)
            if b.raw_bytes >= target_bytes:
                out.append(self._write(b))
                b = self._builder()
        if len(b):
            out.append(self._write(b))
        return out

    def write_run_chunks(
        self, chunks: Iterable[tuple[Sequence[bytes], Sequence[int], Sequence[bytes | None]]], target_bytes: int,
        *, sorted_unique: bool = False,
    ) -> list[TableInfo]:
        """``write_run`` for entries given as parallel-list chunks ``(keys, seqs, values)``
        (ascending across chunks): the same tables (a table ends at the entry that brings
        it to ``target_bytes``), built with ``SSTableBuilder.add_columns``.

        Args:
            chunks: The run, in key order.
            target_bytes: Split size of the tables (uncompressed bytes).
            sorted_unique: The caller guarantees each chunk's keys strictly increasing (a
                merge's output): only the order across chunks is checked.

        Raises:
            ValueError: Keys are not strictly increasing (checked by the builder).
        """
        out: list[TableInfo] = []
        b = self._builder()
        for keys, seqs, values in chunks:
            n = len(keys)
            if not n:
                continue
            cum = entry_ends(keys, values)
            i = base = 0
            while i < n:
                # The first row bringing the open table to target_bytes ends it.
                j = int(np.searchsorted(cum, base + target_bytes - b.raw_bytes, side="left"))
                end = min(j + 1, n)
                if i == 0 and end == n:  # the whole chunk: no copy
                    b.add_columns(keys, seqs, values, sorted_unique=sorted_unique)
                else:
                    b.add_columns(keys[i:end], seqs[i:end], values[i:end], sorted_unique=sorted_unique)
                if b.raw_bytes >= target_bytes:
                    out.append(self._write(b))
                    b = self._builder()
                i, base = end, int(cum[end - 1])
        if len(b):
            out.append(self._write(b))
        return out

    def reader(self, t: TableInfo) -> SSTableReader:
        """Returns the (cached) reader for table ``t``.

        Opening costs one GET of the whole object if it fits the table cache (then blocks
        are served from memory), else one ranged GET of the tail; a table once evicted
        from the table cache is reopened the second way (read by blocks).
        """
        r = self._readers.get(t.key)
        if r is None:
            try:
                r = self._open_reader(t)
            except ObjectNotFoundError:
                raise ObjectNotFoundError(f"{self.store.uri(t.key)}: SSTable named by the manifest is "
                                          f"missing (manifest says {t.size} bytes)") from None
            self._readers[t.key] = r
        return r

    def _open_reader(self, t: TableInfo) -> SSTableReader:
        if t.size * 4 > self._whole_budget or t.key in self._demoted:
            return SSTableReader(self.store, t.key, t.size, self.cache)
        r = SSTableReader(self.store, t.key, t.size, self.cache, self.store.get(t.key))
        self._whole[t.key] = t.size
        self._whole_bytes += t.size
        while self._whole_bytes > self._whole_budget:
            old, n = self._whole.popitem(last=False)
            self._whole_bytes -= n
            self._readers.pop(old, None)
            self._demoted.add(old)
        return r

    def iter_table(
        self, t: TableInfo, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[Entry]:
        """Yields the visible entries of ``t`` with ``start <= key < end``.

        A clipped table (``t.clip``) yields only keys within ``[t.min_key, t.max_key]``.
        """
        if t.clip is not None:
            if start < t.min_key:
                start = t.min_key
            hi = t.max_key + b"\x00"  # smallest key above max_key
            if end is None or end > hi:
                end = hi
            if start >= end:
                return iter(())
        return self.reader(t).iter_from(start, end)

    def forget(self, keys: Iterable[str]) -> None:
        """Drops cached readers and blocks of tables that left the level list (files stay)."""
        keys = set(keys)
        if self.cache is not None and keys:
            self.cache.drop_tables(keys)
        for k in keys:
            self._readers.pop(k, None)
            n = self._whole.pop(k, None)
            if n is not None:
                self._whole_bytes -= n
            self._demoted.discard(k)

    @staticmethod
    def encode_wal(first_seq: int, keys: list[bytes], values: list[bytes | None]) -> bytes:
        """Encodes consecutive writes as WAL object bytes of batch records (see ``wal.py``)."""
        return encode_wal_batches(first_seq, keys, values)

    def write_wal(self, checkpoint: str, data: bytes, first_seq: int, last_seq: int, records: int) -> WalRef:
        """Writes ``data`` (an encoded WAL object holding ``records`` writes with sequence
        numbers ``first_seq..last_seq``) as this checkpoint's WAL object.

        REQUIRES: ``records >= 1``.
        """
        key = self.paths.wal_key(checkpoint)
        self.store.put(key, data)
        self.written[key] = len(data)
        return WalRef(key, first_seq, last_seq, len(data), records)

    def read_wal(self, ref: WalRef) -> list[WalRecord]:
        """Reads and verifies a WAL object against its manifest entry: ``(seq, key, value)``
        per write."""
        return list(zip(*self.read_wal_columns(ref)))

    def read_wal_columns(self, ref: WalRef) -> tuple[list[int], list[bytes], list[bytes | None]]:
        """Like ``read_wal`` but as parallel lists ``(seqs, keys, values)``.

        Raises:
            ObjectNotFoundError: The object is missing.
            CorruptionError: It fails verification or disagrees with ``ref``.
        """
        uri = self.store.uri(ref.key)
        try:
            data = self.store.get(ref.key)
        except ObjectNotFoundError:
            raise ObjectNotFoundError(f"{uri}: WAL object named by the manifest is missing "
                                      f"(seqs {ref.first_seq}..{ref.last_seq})") from None
        if len(data) != ref.size:  # a torn tail cut at a record boundary shows here first
            raise CorruptionError(f"{uri}: WAL object has {len(data)} bytes, manifest says {ref.size}"
                                  f" (torn or extended at offset {min(len(data), ref.size)})")
        cols = decode_wal_columns(data, uri, ref.first_seq, ref.last_seq)
        if len(cols[0]) != ref.records:
            raise CorruptionError(
                f"{uri}: WAL has {len(cols[0])} records, manifest says {ref.records}"
            )
        return cols
