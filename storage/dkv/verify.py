"""Full verification of one DKV checkpoint: every file a manifest names exists and checks out.

Reads, with the same decoders the engine uses (so it checks exactly what a restore
would): the manifest (framing crc32c and ``invariants.check_manifest``), every table it
names (footer and meta crc32c through ``SSTableReader``, then every data block's crc32c,
zstd frame and key order, plus the entry count, key bounds and size against the manifest)
and every WAL object (record crc32c, sequence range and record count, as
``TableStore.read_wal`` checks them). Nothing is written. Cost: one GET per manifest and
WAL object, and for each table the whole object once (tail and blocks).

Used by the Dagster asset check on a job's checkpoint asset (``assets/checkpoints.py``)
and by ``python -m dkvstream.storage.dkv.dump verify``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dkvstream.storage.dkv.invariants import check_manifest
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.sstable import SSTableReader, TableInfo
from dkvstream.storage.dkv.wal import decode_wal
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore


@dataclass
class VerifyReport:
    """What ``verify_manifest`` read.

    Attributes:
        manifests: manifests verified.
        tables / table_bytes / blocks / entries: SSTables verified, their bytes, data
            blocks and entries.
        wal_objects / wal_records: WAL objects and records verified.
        errors: one message per failed file (URI and reason); empty when all is well.
    """

    manifests: int = 0
    tables: int = 0
    table_bytes: int = 0
    blocks: int = 0
    entries: int = 0
    wal_objects: int = 0
    wal_records: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no file failed."""
        return not self.errors

    def add(self, other: VerifyReport) -> None:
        """Adds ``other``'s counts and errors to this report."""
        for name in ("manifests", "tables", "table_bytes", "blocks", "entries", "wal_objects",
                     "wal_records"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors += other.errors


def read_blocks(r: SSTableReader) -> int:
    """Reads every data block of ``r`` (crc32c, zstd frame, key order) and checks the
    entry count against the meta block.

    Returns:
        The number of entries read.

    Raises:
        CorruptionError: a block fails its checks, blocks are out of key order, or the
            count differs from the meta block's (the message names the URI).
    """
    entries = 0
    prev = None
    for keys, _values in r.scan_batches(b""):
        if prev is not None and keys and keys[0] <= prev:
            raise CorruptionError(f"{r.uri}: blocks out of key order at key {keys[0]!r}")
        entries += len(keys)
        prev = keys[-1] if keys else prev
    if entries != r.entries:
        raise CorruptionError(f"{r.uri}: {entries} entries in blocks, meta block says {r.entries}")
    return entries


def verify_sstable(store: ObjectStore, key: str) -> tuple[int, int, int]:
    """Reads one SSTable whole (footer, meta block, every data block) and checks it.

    Returns:
        ``(blocks, entries, bytes)`` read.

    Raises:
        ObjectNotFoundError: the table is missing.
        CorruptionError: see ``read_blocks``; also a bad footer or meta block.
    """
    whole = store.get(key)
    r = SSTableReader(store, key, size=len(whole), whole=whole)
    return r.num_blocks, read_blocks(r), len(whole)


def verify_table(store: ObjectStore, t: TableInfo) -> tuple[int, int]:
    """Reads every block of table ``t`` and checks it against its manifest entry.

    Args:
        store: the object store.
        t: the table as the manifest lists it.

    Returns:
        ``(blocks, entries)`` read.

    Raises:
        ObjectNotFoundError: the table is missing.
        CorruptionError: a checksum, the format, or the manifest's size, entry count or
            key bounds disagree with the file (the message names the URI and offset).
    """
    whole = store.get(t.key)
    r = SSTableReader(store, t.key, size=t.size, whole=whole)
    entries = read_blocks(r)
    if t.clip is None:
        if (r.min_key, r.max_key) != (t.min_key, t.max_key) or entries != t.entries:
            raise CorruptionError(
                f"{r.uri}: key bounds or entry count differ from the manifest "
                f"({entries} entries, manifest {t.entries})")
    elif t.min_key < r.min_key or t.max_key > r.max_key:
        raise CorruptionError(f"{r.uri}: clipped bounds of the manifest lie outside the file")
    return r.num_blocks, entries


def verify_manifest(store: ObjectStore, manifest_key: str) -> VerifyReport:
    """Verifies a manifest and every table and WAL object it names (see module docstring).

    Files are checked one by one and every failure is recorded, so one report names all
    broken files of the checkpoint.

    Args:
        store: the object store.
        manifest_key: key of the DKV manifest (e.g. a range manifest of a job checkpoint).

    Returns:
        A ``VerifyReport``; ``report.ok`` is False if any file is missing or corrupt. A
        missing or corrupt manifest is one error (its files are then not read).
    """
    report = VerifyReport()
    try:
        m = load_manifest(store, manifest_key)
        check_manifest(m, store.uri(manifest_key))
    except (ObjectNotFoundError, CorruptionError) as e:
        report.errors.append(str(e))
        return report
    report.manifests = 1
    for t in m.levels.all_tables():
        try:
            blocks, entries = verify_table(store, t)
        except (ObjectNotFoundError, CorruptionError) as e:
            report.errors.append(str(e))
            continue
        report.tables += 1
        report.table_bytes += t.size
        report.blocks += blocks
        report.entries += entries
    for w in m.wal:
        uri = store.uri(w.key)
        try:
            data = store.get(w.key)
            if len(data) != w.size:
                raise CorruptionError(f"{uri}: WAL object has {len(data)} bytes, manifest says {w.size}")
            records = decode_wal(data, uri, w.first_seq, w.last_seq)
            if len(records) != w.records:
                raise CorruptionError(f"{uri}: WAL has {len(records)} records, manifest says {w.records}")
        except (ObjectNotFoundError, CorruptionError) as e:
            report.errors.append(str(e))
            continue
        report.wal_objects += 1
        report.wal_records += len(records)
    return report
