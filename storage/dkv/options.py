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
        block_cache_bytes: Budget of the LRU cache of decompressed data blocks (0 disables it).
        table_cache_bytes: Budget of whole table objects kept in memory (compressed bytes).
            A table of at most a quarter of it is read with one GET on first use and its
            blocks are then sliced from memory; larger tables use one ranged GET per block.
            0 disables it.
        target_file_bytes: Approximate uncompressed size at which compaction splits its
            output into a new table.
        num_levels: Number of levels, L0 included. L1 .. L(num_levels-1) are sorted runs;
            the last one has no size target (data only leaves it by full compaction).
        level_base_bytes: Target size of L1 (bytes of its tables on the bucket). Level n
            (1 <= n < num_levels - 1) targets ``level_base_bytes * level_multiplier**(n-1)``;
            a level above its target pushes a table into the next level.
        level_multiplier: Growth factor of level targets.
        size_amp_threshold: Size-amplification trigger. The estimate is RocksDB universal
            style: (bytes of all levels above the last non-empty level) / (bytes of that
            level). Above the threshold, everything is compacted into the last level.
            0.5 lets upper levels hold up to half the bottom before one rewrite; a leveled
            tree with multiplier 10 sits near 0.11 when full, so the trigger mostly fires
            while the tree grows or after bursts of updates and deletes.
        max_inline_compaction_bytes: Input bytes a single flush/checkpoint call may compact
            inline. Plans run while they fit in what is left; a plan that does not fit
            waits (for a later call with budget, or for remote compaction).
    """

    memtable_bytes: int = 64 << 20
    block_bytes: int = 4096
    bloom_bits_per_key: int = 10
    l0_compaction_trigger: int = 4
    wal_flush_bytes: int = 8 << 20
    zstd_level: int = 3
    block_cache_bytes: int = 64 << 20
    table_cache_bytes: int = 256 << 20
    target_file_bytes: int = 8 << 20
    num_levels: int = 5
    level_base_bytes: int = 256 << 20
    level_multiplier: int = 10
    size_amp_threshold: float = 0.5
    max_inline_compaction_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        if self.memtable_bytes <= 0 or self.block_bytes <= 0 or self.target_file_bytes <= 0:
            raise ValueError("memtable_bytes, block_bytes and target_file_bytes must be > 0")
        if self.bloom_bits_per_key < 1:
            raise ValueError("bloom_bits_per_key must be >= 1")
        if self.l0_compaction_trigger < 1:
            raise ValueError("l0_compaction_trigger must be >= 1")
        if self.num_levels < 2:
            raise ValueError("num_levels must be >= 2 (L0 and at least one sorted run)")
        if self.level_base_bytes <= 0 or self.level_multiplier < 1:
            raise ValueError("level_base_bytes must be > 0 and level_multiplier >= 1")
        if self.size_amp_threshold <= 0 or self.max_inline_compaction_bytes < 0:
            raise ValueError("size_amp_threshold must be > 0, max_inline_compaction_bytes >= 0")
