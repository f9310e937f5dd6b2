"""The log metadata: which file byte ranges hold which offsets of which partition.

The state (``LogMetadata``): per partition, the entries ``[start, end) -> file, chunk``,
the log start offset, the next offset and the cleaner checkpoint, plus the idempotent
producers' sequences. It is stored as a chain of small versions, a snapshot every
``SNAPSHOT_INTERVAL`` versions and deltas in between, so that a commit writes what it
changed and not the whole state (RocksDB's MANIFEST, Delta Lake's log and checkpoints).
A snapshot does not repeat every entry either: runs of entries are sealed into
immutable *entry pages* that later snapshots reference (Iceberg's manifests), merged
by size tiers so a partition references a logarithmic number of pages. Per commit, a
producer's flush writes one version of a few hundred bytes per partition it appended
to, whatever the number of flushes before it.

**Commit** (like DKV manifests and slatedb's manifest): read the newest version v,
apply a mutation, write version v+1 with ``put_if_absent``; if another writer took v+1
first, reload and retry. A version object is written once and never changed; versions
are gapless (1, 2, 3, ...). Nothing a commit writes is visible before its version
object exists: entry pages are written before the snapshot that names them, and a page
of a snapshot that lost its race is deleted (or, after a crash, collected by
``Log.collect_garbage``).

**Reading**: LIST the versions, GET the newest; a delta names its chain's snapshot
(``base``): GET that snapshot, its pages and the deltas after it (at most
``SNAPSHOT_INTERVAL`` versions), and apply them in order. A ``MetadataStore`` keeps the
state it last read or wrote and only GETs the versions after it (no page: every
version, snapshots included, carries its changes as a delta). A reader whose GET finds
a version or page deleted by trimming lists again.

**Trimming**: the commit that writes snapshot S deletes the versions older than the
previous snapshot P (so at most ``2 * SNAPSHOT_INTERVAL`` versions exist) and the pages
P retired (those only the snapshot before P named).

On-bucket format, every object two lines of UTF-8, the same framing as DKV manifests::

    <body>\\n
    {"crc32c":"<8 lowercase hex digits>"}\\n

``<body>`` is compact JSON with sorted keys. Versions, ``<prefix>/metadata/<v:020d>.json``::

    delta    := {"format_version": 2, "kind": "delta", "version": v, "base": s, changes...}
    snapshot := {"format_version": 2, "kind": "snapshot", "version": v, "base": v, changes...,
                 "state": {"topics": {name: {"config": topic_config,
                                             "partitions": [{"log_start": int, "next_offset": int,
                                                             "cleaned_to": int, "runs": [run, ...]}]}},
                           "producers": {producer_id: sequence},
                           "retired": [page key, ...]}}
    changes  := "topics": {name: topic},            topics created (entries inline)
                "drop_topics": [name, ...],
                "partitions": [{"topic": str, "partition": int, "log_start": int,
                                "next_offset": int, "cleaned_to": int,
                                "cut": [a, b], "entries": [entry, ...]}, ...],
                                                    entries[a:b] replaced by these
                "producers": {producer_id: sequence}, "drop_producers": [producer_id, ...]
    topic    := {"config": topic_config, "partitions": [{"log_start", "next_offset",
                 "cleaned_to", "entries": [entry, ...]}, ...]}
    run      := {"entries": [entry, ...]}                                 inline
              | {"page": key, "level": int, "skip": int, "count": int, "size": int}
                                                    entries [skip, skip + count) of a page of size entries

Entry pages, ``<prefix>/pages/<ms:013d>-<id>.json`` (ms: creation time, for garbage
collection's grace period)::

    {"format_version": 2, "kind": "page", "topic": str, "partition": int, "level": int,
     "entries": [entry, ...]}

    entry := {"file": key, "chunk": chunk_info, "base": int, "start": int, "end": int,
              "cleaned_at": int | null, "appended_at": int | null}

An entry covers offsets ``[start, end)`` of its partition; the chunk's records have
offsets ``base + delta``. Entries of a partition are sorted and do not overlap; offsets
with no entry (wholly removed by compaction) are gaps. ``next_offset`` is the offset
the next produced record gets. ``cleaned_to`` is the cleaner checkpoint: offsets below
it are the *clean* section (written by the cleaner, each key at most once), the rest
is *dirty*. ``cleaned_at`` (ms) is when the cleaner wrote the entry; tombstones in it
are dropped by a cleaning at or after ``cleaned_at + delete.retention.ms``.
``appended_at`` (ms) is when the commit that appended a produced entry was made (its
records' append time, Kafka's LogAppendTime); null for the cleaner's entries.
``producers`` maps an idempotent producer to the newest sequence it committed, so a
retried commit (a sink's publish redone after a crash) is applied once.

Pages: a snapshot seals the trailing inline run of a partition into a level-0 page
once it holds ``SEAL_ENTRIES`` entries; ``FANOUT`` whole pages of one level at the end
of a partition's runs are merged into one page of the next level (the size-tiered
merging of an LSM tree: each entry is rewritten once per level, and a partition holds
at most ``FANOUT`` pages per level). The cleaner replacing entries leaves slices of
pages (``skip``/``count``), which the next snapshots keep referencing.

Format version 1 (every version a full state with all entries inline, keys
``"format_version", "version", "topics" (partitions with "entries"), "producers"``)
is still read: such a version is a snapshot without pages. The first snapshot written
after it is in format 2, and trimming deletes the format-1 versions.
"""
from __future__ import annotations

import bisect
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crc32c import crc32c

from dkvstream.storage.errors import CorruptionError, ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.log.config import TopicConfig
from dkvstream.storage.log.errors import MetadataConflictError, UnknownTopicError
from dkvstream.storage.log.segment import ChunkInfo
from dkvstream.storage.objectstore import ObjectStore

FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
SNAPSHOT_INTERVAL = 16  # versions: a cold reader GETs at most this many
SEAL_ENTRIES = 64  # inline entries of a partition sealed into a page by a snapshot
FANOUT = 8  # pages of one level merged into one page of the next
MAX_COMMIT_ATTEMPTS = 100
MAX_LOAD_ATTEMPTS = 10
_TRAILER_RE = re.compile(rb'^\{"crc32c":"([0-9a-f]{8})"\}$')
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """A partition's offsets ``[start, end)`` stored in one chunk of ``file``.

    ``cleaned_at`` (ms): when the cleaner wrote it (None: produced). ``appended_at``
    (ms): when the commit that appended it was made, i.e. when its records became
    readable (None: written by the cleaner, whose output mixes records of many
    appends, or read from format-1 metadata, which did not record it).
    """

    file: str
    chunk: ChunkInfo
    base: int
    start: int
    end: int
    cleaned_at: int | None = None
    appended_at: int | None = None

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
                "end": self.end, "cleaned_at": self.cleaned_at, "appended_at": self.appended_at}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        """Inverse of ``to_json`` (format 1 has no ``appended_at``)."""
        return cls(d["file"], ChunkInfo.from_json(d["chunk"]), d["base"], d["start"], d["end"], d["cleaned_at"],
                   d.get("appended_at"))


@dataclass(frozen=True)
class Run:
    """How a snapshot stores ``count`` consecutive entries of a partition: inline
    (``page`` None) or as entries ``[skip, skip + count)`` of a page of ``size`` entries
    and merge level ``level``."""

    count: int
    page: str | None = None
    level: int = 0
    skip: int = 0
    size: int = 0

    @property
    def whole_page(self) -> bool:
        """True for a run that is a whole page."""
        return self.page is not None and self.skip == 0 and self.count == self.size

    def slice(self, offset: int, count: int) -> Run:
        """The run of ``count`` entries from the run's ``offset``-th one."""
        if self.page is None:
            return Run(count)
        return Run(count, self.page, self.level, self.skip + offset, self.size)

    def to_json(self, entries: list[Entry]) -> dict:
        """The run's JSON; ``entries``: its entries (written out for an inline run)."""
        if self.page is None:
            return {"entries": [e.to_json() for e in entries]}
        return {"page": self.page, "level": self.level, "skip": self.skip, "count": self.count, "size": self.size}


@dataclass
class PartitionState:
    """One partition's offsets and entries (see module docstring). ``runs`` (not
    compared) says how the snapshots store ``entries``; the commit maintains it."""

    log_start: int = 0
    next_offset: int = 0
    cleaned_to: int = 0
    entries: list[Entry] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list, compare=False, repr=False)

    def entries_from(self, offset: int) -> list[Entry]:
        """Entries with ``end > offset``, in offset order (a binary search)."""
        i = bisect.bisect_right(self.entries, offset, key=lambda e: e.end)
        return self.entries[i:]

    @property
    def bytes(self) -> int:
        """Bytes of batches over all entries."""
        return sum(e.chunk.length for e in self.entries)

    @property
    def records(self) -> int:
        """Records over all entries."""
        return sum(e.chunk.records for e in self.entries)

    def copy(self) -> PartitionState:
        """A copy whose lists can be changed without changing this one (entries are frozen)."""
        return PartitionState(self.log_start, self.next_offset, self.cleaned_to, list(self.entries), list(self.runs))

    def scalars(self) -> tuple[int, int, int]:
        """``(log_start, next_offset, cleaned_to)``."""
        return self.log_start, self.next_offset, self.cleaned_to


@dataclass
class TopicState:
    """A topic: its configuration and partitions."""

    config: TopicConfig
    partitions: list[PartitionState]


@dataclass
class LogMetadata:
    """One metadata version (see module docstring).

    ``base`` (the version of the snapshot this version's chain starts from),
    ``base_pages`` (the pages that snapshot names) and ``retired`` (pages it stopped
    naming, deleted once it is trimmed) are bookkeeping of the storage, not state.
    """

    version: int = 0
    topics: dict[str, TopicState] = field(default_factory=dict)
    producers: dict[str, int] = field(default_factory=dict)
    base: int = field(default=0, compare=False)
    base_pages: frozenset[str] = field(default_factory=frozenset, compare=False, repr=False)
    retired: tuple[str, ...] = field(default=(), compare=False, repr=False)

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

    def pages(self) -> set[str]:
        """Every entry page the runs name."""
        return {r.page for t in self.topics.values() for p in t.partitions for r in p.runs if r.page}

    def copy(self) -> LogMetadata:
        """A copy a mutation can change without changing this one; costs a pointer per entry."""
        return LogMetadata(self.version,
                           {n: TopicState(t.config, [p.copy() for p in t.partitions]) for n, t in self.topics.items()},
                           dict(self.producers), self.base, self.base_pages, self.retired)


def _topic_from_json(t: dict) -> TopicState:
    parts = []
    for p in t["partitions"]:
        entries = [Entry.from_json(e) for e in p["entries"]]
        parts.append(PartitionState(p["log_start"], p["next_offset"], p["cleaned_to"], entries,
                                    [Run(len(entries))] if entries else []))
    return TopicState(TopicConfig(**t["config"]), parts)


def _topic_to_json(t: TopicState) -> dict:
    return {"config": t.config.to_json(),
            "partitions": [{"log_start": p.log_start, "next_offset": p.next_offset, "cleaned_to": p.cleaned_to,
                            "entries": [e.to_json() for e in p.entries]} for p in t.partitions]}


def _from_v1(d: dict) -> LogMetadata:
    topics = {n: _topic_from_json(t) for n, t in d["topics"].items()}
    return LogMetadata(d["version"], topics, dict(d["producers"]), base=d["version"])


def _frame(body: dict) -> bytes:
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return raw + b"\n" + b'{"crc32c":"%08x"}' % crc32c(raw) + b"\n"


def _unframe(data: bytes, where: str) -> dict:
    """The verified body of a metadata object.

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
    if d.get("format_version") not in READABLE_FORMAT_VERSIONS:
        raise CorruptionError(f"{where}: unknown metadata format version {d.get('format_version')}")
    return d


def _splice_of(old: list[Entry], new: list[Entry]) -> tuple[int, int, list[Entry]]:
    """``(a, b, mid)`` with ``old[:a] + mid + old[b:] == new``, ``mid`` as short as the
    common prefix and suffix allow. An append (``old`` a prefix of ``new``, the
    producer's case) is one list comparison, identity-first, in C."""
    n, m = len(old), len(new)
    if n <= m and old == new[:n]:
        return n, n, new[n:]
    a, lim = 0, min(n, m)
    while a < lim and old[a] == new[a]:
        a += 1
    s = 0
    while s < lim - a and old[n - 1 - s] == new[m - 1 - s]:
        s += 1
    return a, n - s, new[a:m - s]


def _splice_runs(runs: list[Run], a: int, b: int, inserted: int) -> list[Run]:
    """The runs after entries ``[a, b)`` were replaced by ``inserted`` new (inline) ones;
    O(runs)."""
    left, right, pos = [], [], 0
    for r in runs:
        lo, hi = pos, pos + r.count
        pos = hi
        if lo < a:
            left.append(r.slice(0, min(hi, a) - lo))
        if hi > b:
            cut = max(lo, b)
            right.append(r.slice(cut - lo, hi - cut))
    out: list[Run] = []
    for r in left + ([Run(inserted)] if inserted else []) + right:
        if out and r.page is None and out[-1].page is None:
            out[-1] = Run(out[-1].count + r.count)  # adjacent inline runs are one
        else:
            out.append(r)
    return out


def _diff(before: LogMetadata, md: LogMetadata) -> dict:
    """The changes from ``before`` to ``md`` (module docstring's ``changes``); sets the
    runs of ``md``'s partitions from ``before``'s."""
    changes: dict = {}
    parts = []
    for name, t in md.topics.items():
        b = before.topics.get(name)
        if b is None or b.config != t.config or len(b.partitions) != len(t.partitions):
            changes.setdefault("topics", {})[name] = _topic_to_json(t)
            for p in t.partitions:
                p.runs = [Run(len(p.entries))] if p.entries else []
            continue
        for i, (pb, p) in enumerate(zip(b.partitions, t.partitions)):
            a, z, mid = _splice_of(pb.entries, p.entries)
            if a == z and not mid:
                if pb.scalars() == p.scalars():
                    continue
            else:
                p.runs = _splice_runs(pb.runs, a, z, len(mid))
            parts.append({"topic": name, "partition": i, "log_start": p.log_start, "next_offset": p.next_offset,
                          "cleaned_to": p.cleaned_to, "cut": [a, z], "entries": [e.to_json() for e in mid]})
    if parts:
        changes["partitions"] = parts
    dropped = sorted(set(before.topics) - set(md.topics))
    if dropped:
        changes["drop_topics"] = dropped
    producers = {k: v for k, v in md.producers.items() if before.producers.get(k) != v}
    if producers:
        changes["producers"] = producers
    gone = sorted(set(before.producers) - set(md.producers))
    if gone:
        changes["drop_producers"] = gone
    return changes


def _apply_changes(md: LogMetadata, changes: dict, where: str) -> None:
    """Applies a version's changes to ``md`` (a copy of the previous version) in place.

    Raises:
        CorruptionError: a change does not fit the previous version (names ``where``).
    """
    for name in changes.get("drop_topics", []):
        md.topics.pop(name, None)
    for name, t in changes.get("topics", {}).items():
        md.topics[name] = _topic_from_json(t)
    for c in changes.get("partitions", []):
        t = md.topics.get(c["topic"])
        if t is None or not 0 <= c["partition"] < len(t.partitions):
            raise CorruptionError(f"{where}: change to unknown partition {c['topic']}/{c['partition']}")
        p = t.partitions[c["partition"]]
        a, z = c["cut"]
        if not 0 <= a <= z <= len(p.entries):
            raise CorruptionError(f"{where}: cut [{a}, {z}) of {c['topic']}/{c['partition']} outside its "
                                  f"{len(p.entries)} entries")
        mid = [Entry.from_json(e) for e in c["entries"]]
        p.entries[a:z] = mid
        p.runs = _splice_runs(p.runs, a, z, len(mid))
        p.log_start, p.next_offset, p.cleaned_to = c["log_start"], c["next_offset"], c["cleaned_to"]
    for pid in changes.get("drop_producers", []):
        md.producers.pop(pid, None)
    md.producers.update(changes.get("producers", {}))


def _runs_from_json(runs: list[dict], entries: list[Entry], where: str) -> list[Run]:
    """A snapshot's runs of a partition, checked against its ``entries``."""
    out = [Run(len(r["entries"])) if "page" not in r else Run(r["count"], r["page"], r["level"], r["skip"], r["size"])
           for r in runs]
    if sum(r.count for r in out) != len(entries):
        raise CorruptionError(f"{where}: snapshot runs cover {sum(r.count for r in out)} entries, "
                              f"the chain has {len(entries)}")
    return out


class MetadataStore:
    """Reads and commits metadata versions under ``<prefix>/metadata/``, and entry pages
    under ``<prefix>/pages/`` (module docstring).

    Keeps the newest state it read or wrote, so a reader or writer that keeps its
    ``MetadataStore`` only GETs the versions committed since.

    Args:
        store: the object store.
        prefix: the log's prefix.
        snapshot_interval, seal_entries, fanout: see the module constants (tests make
            them small to reach pages and merges with a few records).
    """

    def __init__(self, store: ObjectStore, prefix: str, snapshot_interval: int = SNAPSHOT_INTERVAL,
                 seal_entries: int = SEAL_ENTRIES, fanout: int = FANOUT) -> None:
        if snapshot_interval < 1 or seal_entries < 1 or fanout < 2:
            raise ValueError(f"bad metadata store settings {snapshot_interval}, {seal_entries}, {fanout}")
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.snapshot_interval, self.seal_entries, self.fanout = snapshot_interval, seal_entries, fanout
        self._state: LogMetadata | None = None
        self._listed: list[str] = []

    def key(self, version: int) -> str:
        """Object key of ``version``."""
        return f"{self.prefix}/metadata/{version:020d}.json"

    def pages_prefix(self) -> str:
        """Key prefix of the entry pages."""
        return f"{self.prefix}/pages/"

    def _versions(self) -> list[str]:
        return [k for k in self.store.list(f"{self.prefix}/metadata/") if k.endswith(".json")]

    @staticmethod
    def _version_of(key: str) -> int:
        return int(key.rsplit("/", 1)[1].split(".")[0])

    # ------------------------------------------------------------------ reading
    def latest(self) -> LogMetadata:
        """The newest version (an empty version 0 before the first commit), as a copy
        the caller may change. One LIST, plus a GET per version committed since this
        store's last read or write (a cold read: the chain from its snapshot, and the
        snapshot's pages).

        Raises:
            CorruptionError: a version or page fails its checks (names the object).
            ObjectNotFoundError: versions kept disappearing while being read
                (``MAX_LOAD_ATTEMPTS`` LISTs in a row).
        """
        return self._load().copy()

    def _load(self) -> LogMetadata:
        """The newest state, shared: never change it."""
        for attempt in range(MAX_LOAD_ATTEMPTS):
            self._listed = keys = self._versions()
            if not keys:
                return LogMetadata()
            newest = self._version_of(keys[-1])
            try:
                state = self._advance(newest)
            except ObjectNotFoundError:
                # Trimmed by a commit between our LIST and GETs: the newer chain is listed now.
                if attempt == MAX_LOAD_ATTEMPTS - 1:
                    raise
                continue
            self._state = state
            return state
        raise AssertionError("unreachable")

    def _get_body(self, version: int) -> dict:
        key = self.key(version)
        d = _unframe(self.store.get(key), self.store.uri(key))
        if d["version"] != version:
            raise CorruptionError(f"{self.store.uri(key)}: holds version {d['version']}, not {version}")
        return d

    def _advance(self, newest: int) -> LogMetadata:
        state = self._state
        if state is not None and state.version == newest:
            return state
        if state is not None and state.version < newest <= state.version + self.snapshot_interval:
            try:
                for v in range(state.version + 1, newest + 1):
                    state = self._apply(state, self._get_body(v))
                return state
            except ObjectNotFoundError:
                pass  # our version was trimmed: read the newest chain from its snapshot
        top = self._get_body(newest)
        if top["format_version"] == 1:
            return _from_v1(top)
        if top["kind"] == "snapshot":
            return self._from_snapshot(top)
        base = top["base"]
        state = LogMetadata() if base == 0 else self._start(self._get_body(base))
        for v in range(base + 1, newest):
            state = self._apply(state, self._get_body(v))
        return self._apply(state, top)

    def _start(self, body: dict) -> LogMetadata:
        """The state of a chain's first version (a snapshot, or format 1)."""
        if body["format_version"] == 1:
            return _from_v1(body)
        if body["kind"] != "snapshot":
            raise CorruptionError(f"{self.store.uri(self.key(body['version']))}: a chain's base is not a snapshot")
        return self._from_snapshot(body)

    def _apply(self, state: LogMetadata, body: dict) -> LogMetadata:
        """The version after ``state`` from its body (a delta, or a snapshot whose
        changes are applied and whose runs are adopted: no page is read)."""
        where = self.store.uri(self.key(body["version"]))
        if body["version"] != state.version + 1:
            raise CorruptionError(f"{where}: version {body['version']} does not follow {state.version}")
        if body["format_version"] == 1:
            return _from_v1(body)
        md = state.copy()
        md.version = body["version"]
        _apply_changes(md, body, where)
        if body["kind"] == "snapshot":
            self._adopt(md, body, where)
        return md

    def _adopt(self, md: LogMetadata, body: dict, where: str) -> None:
        """Takes a snapshot's runs and bookkeeping into ``md`` (its entries already set)."""
        snap = body["state"]
        for name, t in snap["topics"].items():
            parts = md.topic(name).partitions
            if len(parts) != len(t["partitions"]):
                raise CorruptionError(f"{where}: snapshot of {name} has {len(t['partitions'])} partitions, "
                                      f"the chain {len(parts)}")
            for p, pj in zip(parts, t["partitions"]):
                p.runs = _runs_from_json(pj["runs"], p.entries, where)
        md.base, md.base_pages, md.retired = md.version, frozenset(md.pages()), tuple(snap["retired"])

    def _from_snapshot(self, body: dict) -> LogMetadata:
        """A snapshot's state, reading its pages (one GET per page)."""
        where = self.store.uri(self.key(body["version"]))
        snap = body["state"]
        pages: dict[str, list[dict]] = {}
        topics = {}
        for name, t in snap["topics"].items():
            parts = []
            for pj in t["partitions"]:
                entries: list[Entry] = []
                for r in pj["runs"]:
                    if "page" not in r:
                        entries += [Entry.from_json(e) for e in r["entries"]]
                        continue
                    if r["page"] not in pages:
                        pages[r["page"]] = self._read_page(r["page"], r["size"])
                    entries += [Entry.from_json(e) for e in pages[r["page"]][r["skip"]:r["skip"] + r["count"]]]
                p = PartitionState(pj["log_start"], pj["next_offset"], pj["cleaned_to"], entries)
                p.runs = _runs_from_json(pj["runs"], entries, where)
                parts.append(p)
            topics[name] = TopicState(TopicConfig(**t["config"]), parts)
        md = LogMetadata(body["version"], topics, dict(snap["producers"]))
        md.base, md.base_pages, md.retired = md.version, frozenset(pages), tuple(snap["retired"])
        return md

    def _read_page(self, key: str, size: int) -> list[dict]:
        where = self.store.uri(key)
        d = _unframe(self.store.get(key), where)
        if d.get("kind") != "page" or len(d["entries"]) != size:
            raise CorruptionError(f"{where}: not an entry page of {size} entries")
        return d["entries"]

    # ------------------------------------------------------------------ writing
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
            before = self._load()
            md = before.copy()
            result = mutate(md)
            if result is NO_CHANGE:
                return md, result
            md.version = before.version + 1
            body = {"format_version": FORMAT_VERSION, "version": md.version, **_diff(before, md)}
            written: list[str] = []
            if md.version % self.snapshot_interval == 0:
                written = self._snapshot(before, md, body)
            else:
                body.update(kind="delta", base=before.base)
            try:
                self.store.put_if_absent(self.key(md.version), _frame(body))
            except ObjectExistsError:
                for k in written:  # pages of a snapshot that never was
                    self.store.delete(k)
                continue
            self._state = md.copy()
            if body["kind"] == "snapshot":
                self._trim(before)
            return md, result
        raise MetadataConflictError(f"{self.store.uri(self.prefix)}: metadata commit lost "
                                    f"{MAX_COMMIT_ATTEMPTS} races in a row")

    def _snapshot(self, before: LogMetadata, md: LogMetadata, body: dict) -> list[str]:
        """Makes ``body`` the snapshot of ``md``: seals and merges pages (PUTs them) and
        adds the state. Returns the pages written."""
        written: list[str] = []
        topics = {}
        for name, t in md.topics.items():
            parts = []
            for i, p in enumerate(t.partitions):
                runs = p.runs
                if runs and runs[-1].page is None and runs[-1].count >= self.seal_entries:
                    # The new page ("" until written) may carry into merges at once: decide
                    # the final tail first, so no page is written only to be merged away.
                    runs[-1] = Run(runs[-1].count, "", 0, 0, runs[-1].count)
                    while len(runs) >= self.fanout and all(
                            r.whole_page and r.level == runs[-1].level for r in runs[-self.fanout:]):
                        n = sum(r.count for r in runs[-self.fanout:])
                        runs[-self.fanout:] = [Run(n, "", runs[-1].level + 1, 0, n)]
                    n = runs[-1].count
                    runs[-1] = self._put_page(name, i, runs[-1].level, p.entries[len(p.entries) - n:], written)
                jruns, pos = [], 0
                for r in runs:
                    jruns.append(r.to_json(p.entries[pos:pos + r.count] if r.page is None else []))
                    pos += r.count
                parts.append({"log_start": p.log_start, "next_offset": p.next_offset, "cleaned_to": p.cleaned_to,
                              "runs": jruns})
            topics[name] = {"config": t.config.to_json(), "partitions": parts}
        pages = frozenset(md.pages())
        retired = tuple(sorted(before.base_pages - pages))
        body.update(kind="snapshot", base=md.version,
                    state={"topics": topics, "producers": md.producers, "retired": list(retired)})
        md.base, md.base_pages, md.retired = md.version, pages, retired
        return written

    def _put_page(self, topic: str, partition: int, level: int, entries: list[Entry], written: list[str]) -> Run:
        key = f"{self.pages_prefix()}{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:16]}.json"
        self.store.put(key, _frame({"format_version": FORMAT_VERSION, "kind": "page", "topic": topic,
                                    "partition": partition, "level": level,
                                    "entries": [e.to_json() for e in entries]}))
        written.append(key)
        return Run(len(entries), key, level, 0, len(entries))

    def _trim(self, before: LogMetadata) -> None:
        """After a snapshot: deletes the versions older than the previous snapshot and the
        pages it retired (nothing kept names them)."""
        for k in before.retired:
            self.store.delete(k)
        for k in self._listed:
            if self._version_of(k) < before.base:
                self.store.delete(k)


class _NoChange:
    def __repr__(self) -> str:
        return "NO_CHANGE"


NO_CHANGE = _NoChange()
