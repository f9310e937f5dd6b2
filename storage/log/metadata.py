"""The log metadata: which file byte ranges hold which offsets of which partition.

One small JSON object per version on the object store, written once with
``put_if_absent`` (like DKV manifests and slatedb's manifest): a commit reads the newest
version v, applies a mutation and writes v+1; if another writer took v+1 first the
commit reloads and retries. Readers take the newest version; old versions are
deleted a few commits later (``KEEP_VERSIONS``).

On-bucket format (``<prefix>/metadata/<version:020d>.json``), two lines of UTF-8, the
same framing as DKV manifests::

    <body>\\n
    {"crc32c":"<8 lowercase hex digits>"}\\n

``<body>`` is compact JSON with sorted keys::

    {"format_version": 1, "version": int,
     "topics": {name: {"config": topic_config,
                       "partitions": [{"log_start": int, "next_offset": int,
                                       "cleaned_to": int, "entries": [entry, ...]}, ...]}},
     "producers": {producer_id: sequence}}
    entry := {"file": key, "chunk": chunk_info, "base": int, "start": int, "end": int,
              "cleaned_at": int | null}

An entry covers offsets ``[start, end)`` of its partition; the chunk's records have
offsets ``base + delta``. Entries of a partition are sorted and do not overlap; offsets
with no entry (wholly removed by compaction) are gaps. ``next_offset`` is the offset
the next produced record gets. ``cleaned_to`` is the cleaner checkpoint: offsets below
it are the *clean* section (written by the cleaner, each key at most once), the rest
is *dirty*. ``cleaned_at`` (ms) is when the cleaner wrote the entry; tombstones in it
are dropped by a cleaning at or after ``cleaned_at + delete.retention.ms``.
``producers`` maps an idempotent producer to the newest sequence it committed, so a
retried commit (a sink's publish redone after a crash) is applied once.
"""
from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crc32c import crc32c

from storage.errors import CorruptionError, ObjectExistsError
from storage.log.config import TopicConfig
from storage.log.errors import MetadataConflictError, UnknownTopicError
from storage.log.segment import ChunkInfo
from storage.objectstore import ObjectStore

FORMAT_VERSION = 1
KEEP_VERSIONS = 10
MAX_COMMIT_ATTEMPTS = 100
_TRAILER_RE = re.compile(rb'^\{"crc32c":"([0-9a-f]{8})"\}$')
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """A partition's offsets ``[start, end)`` stored in one chunk of ``file``."""

    file: str
    chunk: ChunkInfo
    base: int
    start: int
    end: int
    cleaned_at: int | None = None

    @property
    def first_offset(self) -> int:
        """Offset of the entry's first record."""
        return self.base + self.chunk.first_delta

    @property
    def last_offset(self) -> int:
        """Offset of the entry's last record."""
        return self.base + self.chunk.last_delta

    def to_json(self) -> dict:
        """A JSON-able dict."""
        return {"file": self.file, "chunk": self.chunk.to_json(), "base": self.base, "start": self.start,
                "end": self.end, "cleaned_at": self.cleaned_at}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        """Inverse of ``to_json``."""
        return cls(d["file"], ChunkInfo.from_json(d["chunk"]), d["base"], d["start"], d["end"], d["cleaned_at"])


@dataclass
class PartitionState:
    """One partition's offsets and entries (see module docstring)."""

    log_start: int = 0
    next_offset: int = 0
    cleaned_to: int = 0
    entries: list[Entry] = field(default_factory=list)

    def entries_from(self, offset: int) -> list[Entry]:
        """Entries with ``end > offset``, in offset order."""
        i = bisect.bisect_right([e.end for e in self.entries], offset)
        return self.entries[i:]

    @property
    def bytes(self) -> int:
        """Bytes of batches over all entries."""
        return sum(e.chunk.length for e in self.entries)

    @property
    def records(self) -> int:
        """Records over all entries."""
        return sum(e.chunk.records for e in self.entries)


@dataclass
class TopicState:
    """A topic: its configuration and partitions."""

    config: TopicConfig
    partitions: list[PartitionState]


@dataclass
class LogMetadata:
    """One metadata version (see module docstring)."""

    version: int = 0
    topics: dict[str, TopicState] = field(default_factory=dict)
    producers: dict[str, int] = field(default_factory=dict)

    def topic(self, name: str) -> TopicState:
        """The topic ``name``.

        Raises:
            UnknownTopicError: no such topic.
        """
        t = self.topics.get(name)
        if t is None:
            raise UnknownTopicError(f"unknown topic {name!r} (topics: {sorted(self.topics)})")
        return t

    def partition(self, topic: str, partition: int) -> PartitionState:
        """Partition ``partition`` of ``topic``.

        Raises:
            UnknownTopicError: no such topic or partition.
        """
        t = self.topic(topic)
        if not 0 <= partition < len(t.partitions):
            raise UnknownTopicError(f"topic {topic!r} has no partition {partition} "
                                    f"(it has {len(t.partitions)})")
        return t.partitions[partition]

    def files(self) -> set[str]:
        """Every file some entry names."""
        return {e.file for t in self.topics.values() for p in t.partitions for e in p.entries}

    def encode(self) -> bytes:
        """The two-line on-bucket encoding."""
        body = json.dumps({
            "format_version": FORMAT_VERSION, "version": self.version, "producers": self.producers,
            "topics": {n: {"config": t.config.to_json(),
                           "partitions": [{"log_start": p.log_start, "next_offset": p.next_offset,
                                           "cleaned_to": p.cleaned_to,
                                           "entries": [e.to_json() for e in p.entries]}
                                          for p in t.partitions]}
                       for n, t in self.topics.items()},
        }, sort_keys=True, separators=(",", ":")).encode()
        return body + b"\n" + b'{"crc32c":"%08x"}' % crc32c(body) + b"\n"

    @classmethod
    def decode(cls, data: bytes, where: str) -> LogMetadata:
        """Parses and verifies an encoded version.

        Raises:
            CorruptionError: bad framing, checksum or format version (names ``where``).
        """
        lines = data.split(b"\n")
        if len(lines) != 3 or lines[2] != b"":
            raise CorruptionError(f"{where}: metadata is not two lines (truncated?)")
        m = _TRAILER_RE.match(lines[1])
        if not m:
            raise CorruptionError(f"{where}: bad metadata trailer at byte {len(lines[0]) + 1}")
        if crc32c(lines[0]) != int(m.group(1), 16):
            raise CorruptionError(f"{where}: metadata CRC32C mismatch")
        d = json.loads(lines[0])
        if d.get("format_version") != FORMAT_VERSION:
            raise CorruptionError(f"{where}: unknown metadata format version {d.get('format_version')}")
        topics = {n: TopicState(TopicConfig(**t["config"]),
                                [PartitionState(p["log_start"], p["next_offset"], p["cleaned_to"],
                                                [Entry.from_json(e) for e in p["entries"]])
                                 for p in t["partitions"]])
                  for n, t in d["topics"].items()}
        return cls(d["version"], topics, dict(d["producers"]))


class MetadataStore:
    """Reads and commits metadata versions under ``<prefix>/metadata/``.

    Args:
        store: the object store.
        prefix: the log's prefix.
    """

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self._cached: tuple[str, bytes] | None = None

    def key(self, version: int) -> str:
        """Object key of ``version``."""
        return f"{self.prefix}/metadata/{version:020d}.json"

    def _versions(self) -> list[str]:
        return [k for k in self.store.list(f"{self.prefix}/metadata/") if k.endswith(".json")]

    def latest(self) -> LogMetadata:
        """The newest version (an empty version 0 before the first commit); one LIST,
        plus one GET when it changed since the last call."""
        keys = self._versions()
        if not keys:
            return LogMetadata()
        key = keys[-1]
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self.store.get(key))
        return LogMetadata.decode(self._cached[1], self.store.uri(key))

    def commit(self, mutate: Callable[[LogMetadata], T]) -> tuple[LogMetadata, T]:
        """Applies ``mutate`` to the newest version and writes the next one.

        ``mutate`` may run several times (once per attempt) on a fresh copy; it must
        derive everything from its argument. If it returns ``NO_CHANGE`` nothing is
        written.

        Returns:
            ``(committed metadata, mutate's result)``.

        Raises:
            MetadataConflictError: lost the race ``MAX_COMMIT_ATTEMPTS`` times.
            Whatever ``mutate`` raises (nothing is written).
        """
        for _ in range(MAX_COMMIT_ATTEMPTS):
            md = self.latest()
            result = mutate(md)
            if result is NO_CHANGE:
                return md, result
            md.version += 1
            data = md.encode()
            try:
                self.store.put_if_absent(self.key(md.version), data)
            except ObjectExistsError:
                continue
            self._cached = (self.key(md.version), data)
            self._trim(md.version)
            return md, result
        raise MetadataConflictError(f"{self.store.uri(self.prefix)}: metadata commit lost "
                                    f"{MAX_COMMIT_ATTEMPTS} races in a row")

    def _trim(self, version: int) -> None:
        if version % KEEP_VERSIONS:
            return
        for k in self._versions():
            if int(k.rsplit("/", 1)[1].split(".")[0]) <= version - KEEP_VERSIONS:
                self.store.delete(k)


class _NoChange:
    def __repr__(self) -> str:
        return "NO_CHANGE"


NO_CHANGE = _NoChange()
