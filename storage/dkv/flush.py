"""Flush: the write buffer leaves the process as L0 tables or as a WAL object.

A DKV instance holds each write since the last flush twice: in the memtable (sorted, for
reads) and in the WAL buffer (in write order, for checkpoints). Two things write them out
(storage/RFC-0001, "Lifecycle"):

* A flush writes every sealed memtable as one L0 SSTable, oldest first, so L0 ends up
  newest first (``write_l0``: one PUT per non-empty memtable). Every record is then in a
  table, so the owner drops its WAL buffer and the WAL objects listed so far (WAL
  truncation) and sets ``flushed_seq`` to its last sequence number. Memtables reaching
  ``memtable_bytes`` are flushed at once, and so is the memtable at a checkpoint whose
  WAL would grow too long.
* A checkpoint writes the WAL buffer as one WAL object (``write_wal_object``: one PUT)
  when the WAL objects listed stay within ``wal_flush_bytes`` with it (``wal_fits``);
  otherwise it flushes instead, and the buffer never needs encoding.

Tables are built with Python's cyclic garbage collector paused (``gc_pause.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dkvstream.storage.dkv.gc_pause import gc_paused
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import WalRef
from dkvstream.storage.dkv.memtable import Memtable
from dkvstream.storage.dkv.tablestore import TableStore
from dkvstream.storage.dkv.wal import encoded_batches_size
from dkvstream.storage.faults import fault_point


def write_l0(tables: TableStore, sealed: Sequence[Memtable], levels: LevelList) -> LevelList:
    """Writes the ``sealed`` memtables (newest first) as L0 tables, oldest first.

    Returns:
        ``levels`` with the new tables in L0 (an empty memtable writes nothing).

    Raises:
        Whatever the object store raises for a failed PUT. The tables written before it
        are then in no level list, so the caller keeps its memtables and state as they
        were and may flush them again.
    """
    for m in reversed(sealed):  # oldest first, so L0 ends up newest first
        with gc_paused():
            t = tables.write_table_columns(*m.columns())
        fault_point("dkv_table_written")
        if t is not None:
            levels = levels.with_flushed(t)
    return levels


def wal_fits(
    refs: Sequence[WalRef], keys: Sequence[bytes], values: Sequence[bytes | None], limit: int
) -> bool:
    """Whether the WAL objects ``refs`` plus one holding ``keys``/``values`` stay within
    ``limit`` bytes (``wal_flush_bytes``). Sized without encoding the buffer."""
    return sum(w.size for w in refs) + encoded_batches_size(keys, values) <= limit


def write_wal_object(
    tables: TableStore, name: str, last_seq: int, keys: Sequence[bytes],
    values: Sequence[bytes | None],
) -> WalRef:
    """Writes the WAL buffer as the WAL object of checkpoint ``name``.

    REQUIRES: ``keys`` is not empty.

    Args:
        tables: The instance's table store (it names the object, ``paths.wal_key``).
        name: The checkpoint name.
        last_seq: Sequence number of the last record; the records are numbered
            ``last_seq - len(keys) + 1 .. last_seq``.
        keys: The buffered keys, in write order.
        values: One per key: ``bytes``, or None for a delete.

    Returns:
        The reference to list in the checkpoint's manifest.
    """
    n = len(keys)
    first = last_seq - n + 1
    data = tables.encode_wal(first, keys, values)
    return tables.write_wal(name, data, first, last_seq, n)
