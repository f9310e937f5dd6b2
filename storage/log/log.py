"""``Log``: topics on an object store. The facade that owns the metadata store and
file naming; producers, consumers and the cleaner work through it.

Bucket layout under ``prefix`` (default ``log``)::

    <prefix>/metadata/<version:020d>.json     metadata versions: snapshots and deltas (metadata.py)
    <prefix>/pages/<ms:013d>-<id>.json        entry pages the snapshots name (metadata.py)
    <prefix>/files/<ms:013d>-<id>.<p|c>.seg   segment files: p = produced, c = compacted

A file's or page's name starts with its creation time, so garbage collection can spare
the files of flushes still on their way to a commit (``collect_garbage``'s grace period).
"""
from __future__ import annotations

import uuid

from dkvstream.storage.log.cleaner import Cleaner, CleaningReport, dirty_ratio, dirty_stats, erase_key
from dkvstream.storage.log.config import CleanerConfig, ProducerConfig, TopicConfig
from dkvstream.storage.log.consumer import (
    Consumer,
    FetchResult,
    commit_group_offsets,
    committed_offsets,
    fetch,
    offsets_for_times,
    read_range,
)
from dkvstream.storage.log.errors import InvalidConfigError, TopicExistsError
from dkvstream.storage.log.metadata import NO_CHANGE, LogMetadata, MetadataStore, PartitionState, TopicState
from dkvstream.storage.log.producer import Producer, append_file, now_ms
from dkvstream.storage.log.records import Record
from dkvstream.storage.log.segment import SegmentWriter
from dkvstream.storage.objectstore import ObjectStore

GC_GRACE_MS = 10 * 60 * 1000


class Log:
    """A set of topics stored under ``prefix`` of ``store``.

    Args:
        store: the object store (local directory or S3).
        prefix: key prefix of the log's metadata and files.
    """

    def __init__(self, store: ObjectStore, prefix: str = "log") -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.meta = MetadataStore(store, self.prefix)

    # ------------------------------------------------------------------ topics
    def metadata(self) -> LogMetadata:
        """The newest metadata version."""
        return self.meta.latest()

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Creates a topic; a no-op if it exists with the same configuration.

        Raises:
            TopicExistsError: it exists with another configuration.
            InvalidConfigError: bad name or configuration.
        """
        config = config or TopicConfig()
        if not name or "/" in name or len(name) > 249:
            raise InvalidConfigError(f"bad topic name {name!r}")

        def mutate(md: LogMetadata):
            t = md.topics.get(name)
            if t is not None:
                if t.config != config:
                    raise TopicExistsError(f"topic {name!r} exists with {t.config}, not {config}")
                return NO_CHANGE
            md.topics[name] = TopicState(config, [PartitionState() for _ in range(config.partitions)])
            return config

        self.meta.commit(mutate)
        return config

    def end_offsets(self, topic: str) -> list[int]:
        """Next offset of every partition of ``topic``."""
        return [p.next_offset for p in self.metadata().topic(topic).partitions]

    def start_offsets(self, topic: str) -> list[int]:
        """Log start offset of every partition of ``topic``."""
        return [p.log_start for p in self.metadata().topic(topic).partitions]

    # ----------------------------------------------------------------- writing
    def new_file_key(self, kind: str = "p") -> str:
        """A fresh segment file key (``kind``: ``p`` produced, ``c`` compacted)."""
        return f"{self.prefix}/files/{now_ms():013d}-{uuid.uuid4().hex[:16]}.{kind}.seg"

    def producer(self, config: ProducerConfig | None = None, clock=now_ms) -> Producer:
        """A new ``Producer`` for this log."""
        return Producer(self, config, clock)

    def commit_segment(self, writer: SegmentWriter, producer: tuple[str, int] | None = None):
        """Writes a finished segment and appends its chunks to their partitions.

        Args:
            writer: the segment (chunks with deltas 0..n-1).
            producer: ``(producer id, sequence)`` for an idempotent commit.

        Returns:
            ``{(topic, partition): (first, last offset)}``, or ``NO_CHANGE`` when the
            idempotent commit was already applied (the file is then deleted).
        """
        data, chunks = writer.finish()
        return self.commit_file(self.put_segment(data), chunks, producer)

    def put_segment(self, data: bytes) -> str:
        """Stores segment bytes under a fresh key; returns the key."""
        key = self.new_file_key("p")
        self.store.put(key, data)
        return key

    def commit_file(self, key: str, chunks, producer: tuple[str, int] | None = None):
        """Appends the chunks of the stored segment ``key`` (see ``commit_segment``)."""
        _, assigned = self.meta.commit(lambda md: append_file(md, key, chunks, producer))
        if assigned is NO_CHANGE:
            self.store.delete(key)
        return assigned

    # ----------------------------------------------------------------- reading
    def fetch(self, topic: str, partition: int, offset: int, max_records: int | None = None) -> FetchResult:
        """See ``consumer.fetch``."""
        return fetch(self, topic, partition, offset, max_records)

    def read(self, topic: str, partition: int, start: int = 0, end: int | None = None) -> list[Record]:
        """Records with offsets in ``[start, end)``."""
        return read_range(self, topic, partition, start, end)

    def offsets_for_times(self, topic: str, timestamps: dict[int, int]) -> dict[int, tuple[int, int] | None]:
        """See ``consumer.offsets_for_times``."""
        return offsets_for_times(self, topic, timestamps)

    def consumer(self, group: str | None = None) -> Consumer:
        """A new ``Consumer``."""
        return Consumer(self, group)

    def commit_group_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """See ``consumer.commit_group_offsets``."""
        commit_group_offsets(self, group, offsets)

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """See ``consumer.committed_offsets``."""
        return committed_offsets(self, group)

    # ------------------------------------------------------------- compaction
    def clean(self, config: CleanerConfig | None = None, topics: list[str] | None = None,
              force: bool = False, clock=now_ms) -> CleaningReport | None:
        """Runs one cleaning (``Cleaner.clean``)."""
        return Cleaner(self, config, clock).clean(topics, force)

    def erase_key(self, topic: str, key: bytes, clock=now_ms) -> list[str]:
        """Removes every record of ``key`` from ``topic`` (``cleaner.erase_key``);
        returns the segment files that held one."""
        return erase_key(self, topic, key, clock)

    def describe(self, now: int | None = None) -> list[dict]:
        """One row per partition: topic, partition, policy, log start, next offset,
        cleaner checkpoint, entries, records, bytes, clean/dirty bytes, dirty ratio."""
        now = now_ms() if now is None else now
        md = self.metadata()
        rows = []
        for name in sorted(md.topics):
            t = md.topics[name]
            for i, p in enumerate(t.partitions):
                clean, dirty, _ = dirty_stats(md, name, i, now)
                rows.append({"topic": name, "partition": i, "policy": t.config.cleanup_policy,
                             "log_start": p.log_start, "next_offset": p.next_offset,
                             "cleaned_to": p.cleaned_to, "entries": len(p.entries), "records": p.records,
                             "bytes": p.bytes, "clean_bytes": clean, "dirty_bytes": dirty,
                             "dirty_ratio": round(dirty_ratio(md, name, i, now), 4)})
        return rows

    def collect_garbage(self, grace_ms: int = GC_GRACE_MS, now: int | None = None) -> list[str]:
        """Deletes segment files no metadata entry names and entry pages neither the
        newest version nor its snapshot names, older than ``grace_ms`` (a younger one may
        belong to a flush or snapshot about to commit). Returns the deleted keys."""
        now = now_ms() if now is None else now
        md = self.metadata()
        live = md.files() | md.pages() | md.base_pages
        deleted = []
        for k in self.store.list(f"{self.prefix}/files/") + self.store.list(self.meta.pages_prefix()):
            name = k.rsplit("/", 1)[1]
            if k in live or not name[:13].isdigit() or int(name[:13]) > now - grace_ms:
                continue
            self.store.delete(k)
            deleted.append(k)
        return deleted
