"""Topic, producer and cleaner settings, named after Kafka's where they exist.

All durations are ms, all sizes bytes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from dkvstream.storage.log.errors import InvalidConfigError

DELETE, COMPACT = "delete", "compact"


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings.

    Attributes:
        partitions: number of partitions (>= 1), fixed at creation.
        cleanup_policy: ``"delete"`` (keep everything; time/size retention is not
            implemented) or ``"compact"`` (keep at least the latest record per key).
        delete_retention_ms: ``delete.retention.ms``: how long a tombstone survives after
            the cleaning that first saw it in the clean section (Kafka's delete horizon).
        min_cleanable_dirty_ratio: ``min.cleanable.dirty.ratio``: clean a partition when
            dirty bytes / (clean + dirty bytes) reaches this.
        min_compaction_lag_ms: ``min.compaction.lag.ms``: a file entry whose newest
            record is younger than this stays dirty (uncleanable) for now.
        index_interval_bytes: ``index.interval.bytes``: bytes between index entries.
    """

    partitions: int = 1
    cleanup_policy: str = DELETE
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise InvalidConfigError(f"partitions must be >= 1, got {self.partitions}")
        if self.cleanup_policy not in (DELETE, COMPACT):
            raise InvalidConfigError(f"cleanup.policy must be 'delete' or 'compact', got {self.cleanup_policy!r}")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise InvalidConfigError(
                f"min.cleanable.dirty.ratio must be in [0, 1], got {self.min_cleanable_dirty_ratio}")
        if self.delete_retention_ms < 0 or self.min_compaction_lag_ms < 0:
            raise InvalidConfigError("delete.retention.ms and min.compaction.lag.ms must be >= 0")
        if self.index_interval_bytes < 1:
            raise InvalidConfigError(f"index.interval.bytes must be >= 1, got {self.index_interval_bytes}")

    @property
    def compacted(self) -> bool:
        """True for ``cleanup.policy=compact``."""
        return self.cleanup_policy == COMPACT

    def to_json(self) -> dict:
        """A JSON-able dict."""
        return asdict(self)


@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings (WarpStream's agent defaults: a file per 250 ms or 8 MiB).

    Attributes:
        linger_ms: flush once the oldest buffered record waited this long (checked on
            ``send`` and ``poll``).
        max_file_bytes: flush once the buffered records reach this many bytes.
        batch_bytes: target raw bytes per record batch.
    """

    linger_ms: int = 250
    max_file_bytes: int = 8 * 1024 * 1024
    batch_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if self.linger_ms < 0 or self.max_file_bytes < 1 or self.batch_bytes < 1:
            raise InvalidConfigError(f"bad producer config {self}")


@dataclass(frozen=True)
class CleanerConfig:
    """Cleaner settings.

    Attributes:
        dedupe_buffer_size: ``log.cleaner.dedupe.buffer.size``: bytes of the key-hash ->
            offset map (default 128 MiB).
        max_load_factor: fill the map to this fraction of its slots (see
            ``offset_map.py`` for why 0.8).
        max_file_bytes: cut compacted output files at this size (a file exceeds it
            by at most one batch); a partition's output is split across files if need be.
        io_buffer_size: bytes of input files held in memory between the cleaning's two
            passes (like Kafka's ``log.cleaner.io.buffer.size``, the cleaner's read
            memory): a file holding chunks of several partitions of the cleaning is
            fetched whole, once per pass, while its span counted twice fits; the
            others are fetched one chunk at a time (see ``cleaner.py``).
    """

    dedupe_buffer_size: int = 128 * 1024 * 1024
    max_load_factor: float = 0.8
    max_file_bytes: int = 64 * 1024 * 1024
    io_buffer_size: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.dedupe_buffer_size < 16 * 12 or not 0.1 <= self.max_load_factor <= 0.95:
            raise InvalidConfigError(f"bad cleaner config {self}")
        if self.max_file_bytes < 1 or self.io_buffer_size < 0:
            raise InvalidConfigError(f"bad cleaner config {self}: max_file_bytes must be >= 1 and "
                                     "io_buffer_size >= 0")
