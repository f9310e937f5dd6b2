"""The producer: buffers records and writes one segment file per flush.

A flush (WarpStream's agent) writes every buffered record, of every topic-partition,
into one segment file, then commits one metadata version that appends a chunk entry
per partition and assigns the offsets. Nothing is visible before that commit; a file
written by a flush whose commit never happened is garbage (``Log.collect_garbage``).

A flush happens when the buffer reaches ``max_file_bytes``, when the oldest buffered
record waited ``linger_ms`` (checked on ``send`` and ``poll``: there is no background
thread), or on ``flush()``. Partitioning: ``xxh3_64(key) mod partitions`` for keyed
records, round-robin for keyless ones.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from dkvstream.storage.log.config import ProducerConfig
from dkvstream.storage.log.errors import InvalidRecordError, UnknownTopicError
from dkvstream.storage.log.metadata import NO_CHANGE, Entry, LogMetadata
from dkvstream.storage.log.segment import ChunkInfo, SegmentWriter


def now_ms() -> int:
    """Wall-clock ms since the Unix epoch."""
    return time.time_ns() // 1_000_000


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: ``xxh3_64(key) mod partitions``."""
    return xxhash.xxh3_64_intdigest(key) % partitions


@dataclass
class _Buffer:
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[tuple] = field(default_factory=list)


def append_file(md: LogMetadata, file: str, chunks: Sequence[ChunkInfo],
                producer: tuple[str, int] | None = None) -> dict[tuple[str, int], tuple[int, int]] | object:
    """Metadata mutation: appends a freshly produced file's chunks and assigns offsets.

    Args:
        md: the metadata version to change.
        file: the segment file's key.
        chunks: its chunks (deltas 0..records-1).
        producer: ``(producer id, sequence)`` for an idempotent commit: skipped (returns
            ``NO_CHANGE``) when that producer already committed this sequence or a newer one.

    Returns:
        ``{(topic, partition): (first offset, last offset)}``, or ``NO_CHANGE``.

    The entries' ``appended_at`` is the wall clock now: the commit that makes the
    records readable follows at once.
    """
    if producer is not None:
        pid, seq = producer
        if md.producers.get(pid, -1) >= seq:
            return NO_CHANGE
        md.producers[pid] = seq
    assigned = {}
    appended_at = now_ms()
    for c in chunks:
        p = md.partition(c.topic, c.partition)
        base = p.next_offset
        p.entries.append(Entry(file, c, base, base, base + c.records, appended_at=appended_at))
        p.next_offset += c.records
        assigned[(c.topic, c.partition)] = (base, base + c.records - 1)
    return assigned


class Producer:
    """Buffers records for any topics of a ``Log`` and flushes them as segment files.

    Args:
        log: the ``dkvstream.storage.log.Log``.
        config: flush bounds (``ProducerConfig``).
        clock: returns ms; the default is the wall clock (tests pass a fake one).
    """

    def __init__(self, log, config: ProducerConfig | None = None, clock=now_ms) -> None:
        self.log = log
        self.config = config or ProducerConfig()
        self.clock = clock
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        self._bytes = 0
        self._oldest: int | None = None
        self._round_robin = 0
        self._topics: dict = {}
        self.files_written = 0

    def send(self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None,
             timestamp: int | None = None, headers: Sequence[tuple[str, bytes]] = ()) -> tuple[str, int]:
        """Buffers one record (it becomes visible at the next flush's commit).

        Args:
            topic: topic name.
            key: record key; None for keyless (rejected by compacted topics).
            value: record value; None is a tombstone.
            partition: explicit partition, else chosen from the key.
            timestamp: ms; default now.
            headers: ``(name, bytes)`` pairs.

        Returns:
            ``(topic, partition)`` the record went to.

        Raises:
            UnknownTopicError: no such topic or partition.
            InvalidRecordError: keyless record for a compacted topic, or non-bytes key/value.
        """
        cfg = self._config(topic)
        if key is None and cfg.compacted:
            raise InvalidRecordError(f"topic {topic!r} has cleanup.policy=compact: records need a key")
        if (key is not None and not isinstance(key, bytes)) or (value is not None and not isinstance(value, bytes)):
            raise InvalidRecordError(f"topic {topic!r}: key and value must be bytes or None, "
                                     f"got {type(key).__name__} / {type(value).__name__}")
        if partition is None:
            if key is None:
                partition, self._round_robin = self._round_robin % cfg.partitions, self._round_robin + 1
            else:
                partition = partition_for(key, cfg.partitions)
        elif not 0 <= partition < cfg.partitions:
            self._topics.pop(topic, None)
            cfg = self._config(topic)
            if not 0 <= partition < cfg.partitions:
                raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
        now = self.clock()
        b = self._buffers.setdefault((topic, partition), _Buffer())
        b.timestamps.append(now if timestamp is None else int(timestamp))
        b.keys.append(key)
        b.values.append(value)
        b.headers.append(tuple(headers))
        self._bytes += 24 + (len(key) if key else 0) + (len(value) if value else 0)
        if self._oldest is None:
            self._oldest = now
        if self._bytes >= self.config.max_file_bytes:
            self.flush()
        else:
            self.poll()
        return topic, partition

    def poll(self) -> dict[tuple[str, int], tuple[int, int]] | None:
        """Flushes if the oldest buffered record waited ``linger_ms``; returns what
        ``flush`` returns, or None when it did not flush."""
        if self._oldest is not None and self.clock() - self._oldest >= self.config.linger_ms:
            return self.flush()
        return None

    def flush(self, producer: tuple[str, int] | None = None) -> dict[tuple[str, int], tuple[int, int]]:
        """Writes the buffered records as one segment file and commits it.

        Args:
            producer: ``(producer id, sequence)`` for an idempotent commit.

        Returns:
            ``{(topic, partition): (first offset, last offset)}`` (empty if nothing was
            buffered or the idempotent commit was already applied).
        """
        if not self._buffers:
            return {}
        buffers, self._buffers, self._bytes, self._oldest = self._buffers, {}, 0, None
        w = SegmentWriter(batch_bytes=self.config.batch_bytes)
        for (topic, part) in sorted(buffers):
            b = buffers[(topic, part)]
            w.index_interval_bytes = self._config(topic).index_interval_bytes
            w.begin_chunk(topic, part)
            hs = b.headers if any(b.headers) else None
            w.append(range(len(b.keys)), b.timestamps, b.keys, b.values, hs)
            w.end_chunk()
        assigned = self.log.commit_segment(w, producer=producer)
        self.files_written += 1
        return {} if assigned is NO_CHANGE else assigned

    def _config(self, topic: str):
        cfg = self._topics.get(topic)
        if cfg is None:
            cfg = self._topics[topic] = self.log.metadata().topic(topic).config
        return cfg
