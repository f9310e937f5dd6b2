"""Tuning knobs of a DKV instance."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DKVOptions:
    """Options for ``DKV.open``. All sizes are in bytes.

    Attributes:
        memtable_bytes: Approximate payload bytes (keys + values + per-entry overhead) of
            the active memtable before a put seals it and writes it as an L0 SSTable.
        block_bytes: Target uncompressed size of an SSTable data block.
        bloom_bits_per_key: Bloom filter bits per key; 10 gives about 1% false positives.
        l0_compaction_trigger: Number of L0 tables that triggers a compaction (checked
            after every flush and at every checkpoint).
        wal_flush_bytes: If the WAL objects a checkpoint would list exceed this many
            bytes, the checkpoint flushes the memtable instead, bounding replay on open.
        zstd_level: zstandard compression level for data blocks.
        block_cache_bytes: Budget of the decoded-block LRU cache (0 disables it).
        target_file_bytes: Approximate uncompressed size at which compaction splits its
            output into a new table.
    """

    memtable_bytes: int = 64 << 20
    block_bytes: int = 4096
    bloom_bits_per_key: int = 10
    l0_compaction_trigger: int = 4
    wal_flush_bytes: int = 8 << 20
    zstd_level: int = 3
    block_cache_bytes: int = 64 << 20
    target_file_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if self.memtable_bytes <= 0 or self.block_bytes <= 0 or self.target_file_bytes <= 0:
            raise ValueError("memtable_bytes, block_bytes and target_file_bytes must be > 0")
        if self.bloom_bits_per_key < 1:
            raise ValueError("bloom_bits_per_key must be >= 1")
        if self.l0_compaction_trigger < 1:
            raise ValueError("l0_compaction_trigger must be >= 1")
