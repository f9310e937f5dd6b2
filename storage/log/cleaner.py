"""Log compaction for ``cleanup.policy=compact`` topics: the two-pass cleaner.

For every compacted partition whose dirty ratio reaches ``min.cleanable.dirty.ratio``
(dirty bytes / (clean + dirty bytes); entries whose newest record is younger than
``min.compaction.lag.ms`` are not cleanable yet, nor is anything after them), the
cleaner rewrites the range ``[log start, dirty end)``, clean and dirty sections
together, so that it keeps exactly the latest record of every key:

1. **Map pass** (stream A of every input file): for each record, ``OffsetMap.put``
   (key hash -> latest offset, ``offset_map.py``). When the partition's keys do not fit
   the fixed ``dedupe.buffer.size``, the key-hash space is split: the pass is redone for
   hash ranges ``[lo, hi)`` of 32 hash bits, each small enough to fit (a range that
   overflows after seeing a fraction f of the records is split into
   ceil(1.25 * keys estimate / map capacity) parts:
   the number of distinct keys is a concave function of records read, so all records
   hold at most (keys so far) / f keys). The latest offsets of each range go into a
   roaring bitmap of survivors; the map is reused for the next range. Kafka instead
   cleans only up to where its map filled, leaving the rest dirty; here every
   cleaning removes every duplicate.
2. **Copy pass** (stream B of every input file): keep a record iff its offset is a
   survivor, except tombstones whose batch's ``delete_horizon`` has passed. Output
   batches get ``delete_horizon = now + delete.retention.ms`` unless their records
   already had one (KIP-534), so a tombstone lives ``delete.retention.ms`` after the
   cleaning that first saw it.

**Reads.** A file holding chunks of several partitions of the cleaning is read with
**two GETs per cleaning** (WarpStream, seed ``warpstream-compacted-topics.txt``):
stream A and stream B are one ranged GET each over the span of the file's chunks taking
part, held until the file's last partition is done with it, partition by partition in
(topic, partition) order, the order of chunks in every file. Such files are held while
their spans, counted twice (both streams), fit ``io_buffer_size`` (64 MiB; smallest
spans first); the others are read one chunk per GET. A file with one chunk taking part
is one GET per pass either way. Extra map passes re-read and re-decode the chunks of
the partition (from the held span, or with a GET per chunk). ``CleaningReport`` counts
GETs, bytes fetched, bytes decoded and map passes.

**Output.** New segment files hold only compacted data, offsets unchanged (deltas from
the first record of the chunk, gaps in a roaring bitmap, ``segment.py``). A file is
stored as soon as it reaches ``max_file_bytes`` (64 MiB), between batches, so a
partition's cleaned records may span several files, one entry each, as Kafka's cleaner
writes several segments when the cleaned log exceeds ``segment.bytes``. One metadata
commit replaces each partition's cleaned entries, provided they are unchanged since
planning (producers only append after them; a concurrent cleaning of the same partition
makes this one skip it). Input files no entry names any more are deleted after the
commit.

**Erasure** (``erase_key``, a GDPR request): removes every record of some keys from a
topic, compacted or not, with the same machinery and no map pass: each partition of the
topic is rewritten without the keys' records (offsets unchanged, gaps where they were),
and so is every other partition with an entry in a file holding the topic's records, up
to its last such entry (its records are copied unchanged), so that every input file
ends unnamed and is deleted; a file's bytes outside the entries rewritten would
otherwise keep the key. A compacted topic first gets a tombstone of each key (consumers
reading it live drop the key), which the rewrite then removes with the older records:
neither the key's records nor a tombstone, which holds the key too, remain.

**Memory** is bounded whatever the size of the log, as in Kafka's cleaner (a map, an
I/O buffer, one segment being written):

* the map, ``dedupe.buffer.size`` (it uses only 4 slots per record of the partition when
  that is below the budget, so a small partition neither clears nor probes the whole
  128 MiB);
* the held input spans, at most ``io_buffer_size``;
* one chunk of a file that is not held (at most the size of that input file) and one
  decoded batch;
* the keys being inserted: the map is hashed and filled ``GROUP_RECORDS`` = 16,384
  records at a time (vectorized numpy), about 2 MiB of arrays;
* the output file being built, up to ``max_file_bytes`` plus a batch (twice while it is
  joined and stored);
* the survivors bitmap of one partition, the only part that grows with the log: at most
  2 bytes per distinct key of the partition (1 bit per offset when dense), against the
  map's 15 bytes per key.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap

from dkvstream.storage.log.config import CleanerConfig
from dkvstream.storage.log.metadata import NO_CHANGE, Entry, LogMetadata
from dkvstream.storage.log.offset_map import OffsetMap, hash_keys, partition_bits
from dkvstream.storage.log.producer import now_ms
from dkvstream.storage.log.records import Columns
from dkvstream.storage.log.segment import ChunkInfo, SegmentWriter, chunk_batches, read_directory
from dkvstream.storage.objectstore import map_requests

HASH_SPACE = 2**32
MAX_RANGE_OFFSETS = 2**32 - 1
GROUP_RECORDS = 16_384  # records hashed and inserted per vectorized step (~2 MiB of temporaries)


@dataclass
class PartitionPlan:
    """What a cleaning does to one partition: rewrite ``entries`` (offsets
    ``[start, dirty_end)``)."""

    topic: str
    partition: int
    entries: list[Entry]
    dirty_end: int
    dirty_ratio: float


@dataclass
class CleaningReport:
    """What one cleaning did (every count is over all partitions of the cleaning).

    Attributes:
        partitions: ``[(topic, partition), ...]`` cleaned.
        input_files / output_files: segment file keys read / written.
        gets: GET requests to input files (2 per input file).
        bytes_fetched: bytes those GETs returned.
        bytes_decoded: batch bytes decoded over all passes (map passes + copy pass).
        map_passes: map-building passes over all partitions (1 per partition when its
            keys fit, more when the hash space was split; failed attempts count).
        hash_ranges: hash ranges that produced survivors.
        records_in / records_out, bytes_in / bytes_out: batch records and bytes.
        duplicates_removed / tombstones_removed: records dropped, by reason.
        max_map_keys: most keys the map held in one pass.
        collision_bound: largest per-pass bound on the probability of a key-hash
            confusion (``OffsetMap.collision_bound``).
        seconds: wall time.
        files_deleted: input files deleted after the commit.
        records_erased: records an erasure removed (``erase_key``).
        erased_files: input files that held such a record.
        skipped: partitions planned but not committed (another cleaning changed them).
    """

    partitions: list[tuple[str, int]] = field(default_factory=list)
    input_files: list[str] = field(default_factory=list)
    output_files: list[str] = field(default_factory=list)
    gets: int = 0
    bytes_fetched: int = 0
    bytes_decoded: int = 0
    map_passes: int = 0
    hash_ranges: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    duplicates_removed: int = 0
    tombstones_removed: int = 0
    max_map_keys: int = 0
    collision_bound: float = 0.0
    seconds: float = 0.0
    files_deleted: list[str] = field(default_factory=list)
    records_erased: int = 0
    erased_files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)


def dirty_stats(md: LogMetadata, topic: str, partition: int, now: int) -> tuple[int, int, int]:
    """``(clean bytes, cleanable dirty bytes, dirty end offset)`` of a partition."""
    cfg = md.topic(topic).config
    p = md.partition(topic, partition)
    clean = sum(e.chunk.length for e in p.entries if e.end <= p.cleaned_to)
    dirty, end = 0, p.cleaned_to
    for e in p.entries:
        if e.end <= p.cleaned_to:
            continue
        if e.chunk.max_ts > now - cfg.min_compaction_lag_ms:
            break  # too young, and so is everything after it as far as cleaning goes
        dirty += e.chunk.length
        end = e.end
    return clean, dirty, end


def dirty_ratio(md: LogMetadata, topic: str, partition: int, now: int) -> float:
    """Cleanable dirty bytes / (clean + cleanable dirty bytes); 0 for an empty partition."""
    clean, dirty, _ = dirty_stats(md, topic, partition, now)
    return dirty / (clean + dirty) if clean + dirty else 0.0


def plan_cleaning(md: LogMetadata, now: int, topics: list[str] | None = None,
                  force: bool = False) -> list[PartitionPlan]:
    """Partitions of compacted topics due for cleaning, in (topic, partition) order.

    Args:
        md: metadata version.
        now: ms.
        topics: only these topics (default: every compacted topic).
        force: ignore ``min.cleanable.dirty.ratio`` (still needs some dirty bytes).

    A partition is due when its cleanable dirty ratio reaches ``min.cleanable.dirty.ratio``
    or when a clean entry holds tombstones whose delete horizon has passed.
    """
    plans = []
    for name in sorted(md.topics if topics is None else topics):
        t = md.topic(name)
        if not t.config.compacted:
            continue
        for i, p in enumerate(t.partitions):
            clean, dirty, end = dirty_stats(md, name, i, now)
            ratio = dirty / (clean + dirty) if clean + dirty else 0.0
            due = dirty > 0 and (force or ratio >= t.config.min_cleanable_dirty_ratio)
            # Tombstones in an entry carry horizons <= its cleaned_at + delete.retention.ms,
            # so past that point the clean section alone is worth a cleaning (KIP-534).
            due = due or any(e.chunk.tombstones and e.cleaned_at is not None
                             and now >= e.cleaned_at + t.config.delete_retention_ms
                             for e in p.entries if e.end <= p.cleaned_to)
            if not due:
                continue
            entries = [e for e in p.entries if e.start < end]
            if not entries:
                continue
            if end - entries[0].start > MAX_RANGE_OFFSETS:
                # offsets in the map are u32 relative to the range start
                end = max(e.end for e in entries if e.end - entries[0].start <= MAX_RANGE_OFFSETS)
                entries = [e for e in entries if e.start < end]
            plans.append(PartitionPlan(name, i, entries, end, ratio))
    return plans


def plan_erasure(md: LogMetadata, topic: str, store) -> list[PartitionPlan]:
    """What an erasure from ``topic`` rewrites (module docstring, "Erasure"): each of its
    partitions with entries, whole, and each other partition with an entry in a file
    holding a chunk of the topic, up to its last such entry; in (topic, partition) order.
    A file keeps the bytes of a chunk no entry names any more (a cleaning rewrote it)
    while another partition's entry names the file, so the files of other partitions
    are found by their chunk directories (``read_directory``, up to 3 requests each).

    Raises:
        UnknownTopicError: no such topic.
    """
    files = {e.file for p in md.topic(topic).partitions for e in p.entries}
    others = sorted({e.file for name, t in md.topics.items() if name != topic
                     for p in t.partitions for e in p.entries} - files)
    files |= {f for f, chunks in zip(others, map_requests(lambda f: read_directory(store, f), others))
              if any(c.topic == topic for c in chunks)}
    plans = []
    for name in sorted(md.topics):
        for i, p in enumerate(md.topics[name].partitions):
            last = len(p.entries) if name == topic else \
                max((j + 1 for j, e in enumerate(p.entries) if e.file in files), default=0)
            if last == 0:
                continue
            entries = p.entries[:last]
            if entries[-1].end - entries[0].start > MAX_RANGE_OFFSETS:
                raise ValueError(f"{name}/{i}: more than {MAX_RANGE_OFFSETS} offsets to rewrite at once; "
                                 f"an erasure cannot rewrite this partition")
            plans.append(PartitionPlan(name, i, entries, entries[-1].end, 0.0))
    return plans


def erase_key(log, topic: str, key: bytes, clock=now_ms, config: CleanerConfig | None = None,
              attempts: int = 3) -> list[str]:
    """``erase_keys`` of one key."""
    return erase_keys(log, topic, [key], clock, config, attempts)


def erase_keys(log, topic: str, keys: list[bytes], clock=now_ms, config: CleanerConfig | None = None,
               attempts: int = 3) -> list[str]:
    """Erasure (a GDPR request): removes every record of each of ``keys`` from ``topic``,
    so that no segment file of the log holds one (module docstring, "Erasure"); the
    keys of a batch of requests together cost one rewrite.

    A compacted topic first gets a tombstone of each key (one commit), then every
    partition of the topic is rewritten without the keys' records, the tombstones
    included, whatever ``delete.retention.ms`` and ``min.compaction.lag.ms`` say; a
    ``delete`` topic is rewritten the same way, without a tombstone. Offsets do not
    change. Records of a key appended after the rewrite planned stay: stop producing
    the key first. A rewrite that lost a race with a cleaning is redone, ``attempts``
    times at most. Idempotent: a second call finds nothing, appends a tombstone again
    for a compacted topic and erases it, and returns ``[]``.

    Cost: the chunk directory of every segment file of the log's other topics (up to 3
    requests each, ``plan_erasure``); every file holding a chunk of the topic is read
    once (one or two GETs, ``Cleaner``), and the topic's records and those of the other
    partitions sharing those files are written again (PUTs of ``max_file_bytes``
    files); one metadata commit (plus one for the tombstone); a DELETE per input file.

    Args:
        log: the ``Log``.
        topic: the topic.
        keys: the record keys to erase.
        clock: ms clock (tests pass a fake one).
        config: the cleaner's settings.
        attempts: rewrites to try before giving up.

    Returns:
        The keys of the segment files that held a record of a key (deleted now),
        sorted; not the file of the tombstones this call appended.

    Raises:
        UnknownTopicError: no such topic.
        RuntimeError: a concurrent cleaning came first ``attempts`` times (names the
            partitions left; run it again).
    """
    keys = set(keys)
    tombstone_file = None
    if keys and log.metadata().topic(topic).config.compacted:
        producer = log.producer(clock=clock)
        for key in sorted(keys):
            producer.send(topic, key, None)
        (_, p), (offset, _) = next(iter(producer.flush().items()))  # one flush: one file
        tombstone_file = next(e.file for e in log.metadata().partition(topic, p).entries
                              if e.start <= offset < e.end)
    cleaner = Cleaner(log, config, clock)
    erased: set[str] = set()
    for _ in range(attempts):
        report = cleaner.erase(topic, keys)
        if report is None:
            break
        erased.update(report.erased_files)
        if not report.skipped:
            break
    else:
        raise RuntimeError(f"erasure of keys from topic {topic!r}: a concurrent cleaning rewrote partitions "
                           f"{report.skipped} first, {attempts} times; run the erasure again")
    return sorted(erased - {tombstone_file})


def _members(bitmap: BitMap, lo: int, hi: int) -> np.ndarray:
    """Values of ``bitmap`` in ``[lo, hi]`` as an int64 array."""
    i = bitmap.rank(lo - 1) if lo > 0 else 0
    j = bitmap.rank(hi)
    if i >= j:
        return np.empty(0, np.int64)
    return np.frombuffer(bitmap[i:j].to_array(), dtype=np.uint32).astype(np.int64)


class _Stream:
    """One pass's reads of one input file.

    ``held``: one ranged GET over the span of its chunks taking part, fetched on first
    use and dropped after its last chunk (``uses`` of them): a file with one chunk taking
    part, or one whose span fits ``io_buffer_size`` (``Cleaner._streams``). Otherwise
    each chunk is fetched when read, so at most one chunk of the file is in memory.
    """

    def __init__(self, log, key: str, start: int, end: int, uses: int, held: bool,
                 report: CleaningReport) -> None:
        self.log, self.key, self.start, self.end, self.uses, self.held = log, key, start, end, uses, held
        self.report = report
        self.data: bytes | None = None

    def _get(self, start: int, length: int) -> bytes:
        data = self.log.store.get_range(self.key, start, length)
        self.report.gets += 1
        self.report.bytes_fetched += len(data)
        return data

    def batches(self, e: Entry):
        """``(position in file, Batch)`` of entry ``e``'s chunk (may be called again for
        another map pass until ``done_with_chunk``)."""
        where = self.log.store.uri(self.key)
        if not self.held:
            return chunk_batches(self._get(e.chunk.position, e.chunk.length), e.chunk, e.chunk.position, where)
        if self.data is None:
            self.data = self._get(self.start, self.end - self.start)
        return chunk_batches(self.data, e.chunk, self.start, where)

    def done_with_chunk(self) -> None:
        self.uses -= 1
        if self.uses == 0:
            self.data = None


class _Output:
    """The cleaning's output files, built one at a time: a file is stored once it
    reaches ``max_file_bytes`` (it exceeds it by at most one batch), so at most one is in
    memory. A partition whose cleaned records straddle a cut gets one entry per file."""

    def __init__(self, log, max_file_bytes: int, now: int) -> None:
        self.log, self.max_file_bytes, self.now = log, max_file_bytes, now
        self.writer = SegmentWriter()
        self.files: list[tuple[str, list[ChunkInfo]]] = []
        self.entries: dict[tuple[str, int], list[Entry]] = {}
        self._pieces: list[tuple[PartitionPlan, int, int, int]] = []  # in the writer: (plan, base, start, end)
        self._plan: PartitionPlan | None = None
        self._start = self._base = self._last = self._interval = 0
        self._open = False  # a chunk of the partition is open in the writer

    def begin(self, plan: PartitionPlan, index_interval_bytes: int) -> None:
        """Starts the output of ``plan``'s partition (its offsets from its first entry's start)."""
        self._plan, self._start, self._open = plan, plan.entries[0].start, False
        self._interval = index_interval_bytes
        self.entries[(plan.topic, plan.partition)] = []

    def append(self, cols: Columns, delete_horizon: int) -> None:
        """Appends one batch; ``cols.deltas`` are absolute offsets (changed in place)."""
        if self.writer.size >= self.max_file_bytes:
            if self._open:
                self._end_piece(self._last + 1)
            self._store()
        if not self._open:
            self.writer.index_interval_bytes = self._interval
            self.writer.begin_chunk(self._plan.topic, self._plan.partition, compacted=True)
            self._base, self._open = int(cols.deltas[0]), True
        self._last = int(cols.deltas[-1])
        cols.deltas -= self._base
        self.writer.append_columns(cols, delete_horizon=delete_horizon)

    def end(self) -> None:
        """Ends the partition's output: its last entry runs to the plan's dirty end."""
        if self._open:
            self._end_piece(self._plan.dirty_end)

    def close(self) -> None:
        """Stores the last file."""
        self._store()

    def _end_piece(self, end: int) -> None:
        self.writer.end_chunk()
        self._pieces.append((self._plan, self._base, self._start, end))
        self._start, self._open = end, False

    def _store(self) -> None:
        if self.writer.chunks:
            data, infos = self.writer.finish()
            key = self.log.new_file_key("c")
            self.log.store.put(key, data)
            self.files.append((key, infos))
            by_part = {(c.topic, c.partition): c for c in infos}
            for plan, base, start, end in self._pieces:
                self.entries[(plan.topic, plan.partition)].append(
                    Entry(key, by_part[(plan.topic, plan.partition)], base, start, end, self.now))
        self.writer, self._pieces = SegmentWriter(), []


class Cleaner:
    """Cleans the compacted topics of a ``Log`` (see module docstring).

    Args:
        log: the ``Log``.
        config: ``CleanerConfig`` (``dedupe_buffer_size`` etc.).
        clock: ms clock (tests pass a fake one).
    """

    def __init__(self, log, config: CleanerConfig | None = None, clock=now_ms) -> None:
        self.log = log
        self.config = config or CleanerConfig()
        self.clock = clock
        self.map = OffsetMap(self.config.dedupe_buffer_size, self.config.max_load_factor)

    def clean(self, topics: list[str] | None = None, force: bool = False) -> CleaningReport | None:
        """Runs one cleaning over every partition due.

        Args:
            topics: only these topics.
            force: ignore ``min.cleanable.dirty.ratio``.

        Returns:
            The report, or None when nothing was due.

        Raises:
            CorruptionError: an input batch fails its checks (names file and byte).
        """
        now = self.clock()
        md = self.log.metadata()
        plans = plan_cleaning(md, now, topics, force)
        if not plans:
            return None
        return self._rewrite(md, plans, now)

    def erase(self, topic: str, keys: set[bytes]) -> CleaningReport | None:
        """Rewrites ``topic`` without the records of ``keys`` (module docstring,
        "Erasure"); ``erase_key`` appends the tombstones first and retries.

        Returns:
            The report (``records_erased``, ``erased_files``; ``partitions`` lists the
            partitions committed, fewer than planned if a cleaning raced), or None if
            the topic holds no record.

        Raises:
            UnknownTopicError: no such topic.
            CorruptionError: an input batch fails its checks.
        """
        now = self.clock()
        md = self.log.metadata()
        plans = plan_erasure(md, topic, self.log.store)
        if not plans:
            return None
        return self._rewrite(md, plans, now, (topic, frozenset(keys)))

    def _rewrite(self, md: LogMetadata, plans: list[PartitionPlan], now: int,
                 erase: tuple[str, frozenset[bytes]] | None = None) -> CleaningReport:
        """Cleans ``plans`` or, with ``erase`` = ``(topic, keys)``, copies them without
        the keys' records of that topic (no map pass, no new delete horizon)."""
        started = time.perf_counter()
        report = CleaningReport(partitions=[(p.topic, p.partition) for p in plans])
        streams_a, streams_b = self._streams(plans, report)
        output = _Output(self.log, self.config.max_file_bytes, now)
        for plan in plans:
            cfg = md.topic(plan.topic).config
            base = plan.entries[0].start
            output.begin(plan, cfg.index_interval_bytes)
            if erase is None:
                survivors = self._map_passes(plan, base, streams_a, report)
                self._copy_pass(plan, base, survivors, streams_b, output, now + cfg.delete_retention_ms, now, report)
            else:
                dropped = erase[1] if plan.topic == erase[0] else frozenset()
                self._copy_pass(plan, base, None, streams_b, output, 0, now, report, dropped)
            output.end()
        output.close()
        committed = self._commit(plans, output.entries, advance=erase is None)
        report.skipped = [pp for pp in report.partitions if pp not in committed]
        report.partitions = committed
        report.output_files = [k for k, _ in output.files]
        report.records_out = sum(c.records for _, infos in output.files for c in infos)
        report.bytes_out = sum(c.length for _, infos in output.files for c in infos)
        after = self.log.metadata()
        live = after.files()
        for k in report.input_files:
            if k not in live:
                self.log.store.delete(k)
                report.files_deleted.append(k)
        for k in report.output_files:  # an output whose partitions all lost a race
            if k not in live:
                self.log.store.delete(k)
        report.seconds = time.perf_counter() - started
        return report

    # ------------------------------------------------------------------ streams
    def _streams(self, plans: list[PartitionPlan], report: CleaningReport):
        spans: dict[str, list[int]] = {}
        for plan in plans:
            for e in plan.entries:
                s = spans.setdefault(e.file, [e.chunk.position, e.chunk.position + e.chunk.length, 0])
                s[0] = min(s[0], e.chunk.position)
                s[1] = max(s[1], e.chunk.position + e.chunk.length)
                s[2] += 1
        report.input_files = sorted(spans)
        # Hold the files read by several partitions, smallest spans first, while both
        # passes' copies fit the buffer; a file read by one partition is held anyway (it
        # is one chunk, dropped after use).
        held, room = set(), self.config.io_buffer_size
        for k, (lo, hi, uses) in sorted(spans.items(), key=lambda kv: (kv[1][1] - kv[1][0], kv[0])):
            if uses == 1 or 2 * (hi - lo) <= room:
                held.add(k)
                room -= 0 if uses == 1 else 2 * (hi - lo)
        a = {k: _Stream(self.log, k, s[0], s[1], s[2], k in held, report) for k, s in spans.items()}
        b = {k: _Stream(self.log, k, s[0], s[1], s[2], k in held, report) for k, s in spans.items()}
        return a, b

    # ---------------------------------------------------------------- map pass
    def _map_passes(self, plan: PartitionPlan, base: int, streams, report: CleaningReport) -> BitMap:
        total = sum(e.chunk.records for e in plan.entries)
        survivors = BitMap()
        ranges = [(0, HASH_SPACE, False)]
        while ranges:
            lo, hi, whole_buffer = ranges.pop()
            share = (hi - lo) / HASH_SPACE  # keys in the range <= its records, ~ share of all
            self.map.clear(None if whole_buffer else int(total * min(1.0, share * 1.2)) + 1024)
            report.map_passes += 1
            seen, full = 0, False
            for h, l, rel in self._key_groups(plan, base, streams, report):
                seen += len(h)
                if (lo, hi) != (0, HASH_SPACE):
                    bits = partition_bits(h)
                    sel = (bits >= lo) & (bits < hi)
                    h, l, rel = h[sel], l[sel], rel[sel]
                if not self.map.put(h, l, rel):
                    full = True
                    break
            if full:
                if self.map.active < self.map.slots:
                    ranges.append((lo, hi, True))  # the estimate was short; the budget is not
                    continue
                # Distinct keys grow concavely with records read: all of them are at most
                # (keys so far) / (fraction of records read).
                keys_estimate = self.map.size * total / max(1, seen)
                parts = max(2, math.ceil(1.25 * keys_estimate / self.map.capacity))
                if hi - lo < parts:
                    raise MemoryError(f"dedupe buffer of {self.config.dedupe_buffer_size} bytes cannot hold "
                                      f"the keys of one hash value in {plan.topic}/{plan.partition}")
                step = -(-(hi - lo) // parts)
                ranges += [(a, min(hi, a + step), False) for a in range(lo, hi, step)]
                continue
            report.hash_ranges += 1
            report.max_map_keys = max(report.max_map_keys, self.map.size)
            report.collision_bound = max(report.collision_bound, self.map.collision_bound)
            survivors.update(self.map.values())
        for e in plan.entries:
            streams[e.file].done_with_chunk()
        return survivors

    @staticmethod
    def _key_groups(plan: PartitionPlan, base: int, streams, report: CleaningReport):
        """Yields ``(h, l, relative offset)`` arrays (``hash_keys``; offsets uint32 from
        ``base``) of the partition's records in offset order, about ``GROUP_RECORDS`` at a
        time: the map is filled a group at a time, and only one batch is decoded at once."""
        hs: list[np.ndarray] = []
        ls: list[np.ndarray] = []
        rels: list[np.ndarray] = []
        n = 0
        for e in plan.entries:
            for _, b in streams[e.file].batches(e):
                report.bytes_decoded += b.header.size
                h, l = hash_keys([k or b"" for k in b.keys()])
                hs.append(h)
                ls.append(l)
                rels.append((b.deltas.astype(np.int64) + (e.base - base)).astype(np.uint32))
                n += len(b)
                if n >= GROUP_RECORDS:
                    yield np.concatenate(hs), np.concatenate(ls), np.concatenate(rels)
                    hs, ls, rels, n = [], [], [], 0
        if n:
            yield np.concatenate(hs), np.concatenate(ls), np.concatenate(rels)

    # --------------------------------------------------------------- copy pass
    def _copy_pass(self, plan: PartitionPlan, base: int, survivors: BitMap | None, streams, output: _Output,
                   new_horizon: int, now: int, report: CleaningReport,
                   erased: frozenset[bytes] = frozenset()) -> None:
        """Copies the survivors (None: every record) into ``output``, in batches of
        about ``batch_bytes``, without the records whose key is in ``erased``."""
        parts: list[Columns] = []
        state = {"horizon": 0, "bytes": 0}
        batch_bytes = output.writer.batch_bytes

        def flush() -> None:
            if parts:
                output.append(Columns.concat(parts), delete_horizon=state["horizon"])
            parts.clear()
            state["bytes"] = 0

        for e in plan.entries:
            for _, b in streams[e.file].batches(e):
                report.bytes_decoded += b.header.size
                report.records_in += len(b)
                report.bytes_in += b.header.size
                if survivors is None:
                    keep = np.ones(len(b), bool)
                else:
                    rel = b.deltas.astype(np.int64) + (e.base - base)
                    present = _members(survivors, int(rel[0]), int(rel[-1]))
                    keep = present[np.minimum(np.searchsorted(present, rel), max(0, len(present) - 1))] == rel \
                        if len(present) else np.zeros(len(rel), bool)
                    report.duplicates_removed += int(len(b) - keep.sum())
                if erased:
                    hit = np.fromiter((k in erased for k in b.keys()), bool, len(b))
                    if hit.any():
                        report.records_erased += int(hit.sum())
                        if e.file not in report.erased_files:
                            report.erased_files.append(e.file)
                        keep &= ~hit
                horizon = b.header.delete_horizon
                if horizon and now >= horizon and (b.value_lens < 0).any():
                    expired = keep & (b.value_lens < 0)
                    report.tombstones_removed += int(expired.sum())
                    keep &= ~expired
                if not keep.any():
                    continue
                horizon = horizon or new_horizon
                if parts and horizon != state["horizon"]:
                    flush()
                state["horizon"] = horizon
                cols = b.take(keep)
                cols.deltas += e.base  # absolute offsets: the output picks each file's base
                parts.append(cols)
                state["bytes"] += cols.raw_bytes
                if state["bytes"] >= batch_bytes:
                    flush()
            streams[e.file].done_with_chunk()
        flush()

    # ------------------------------------------------------------------ commit
    def _commit(self, plans: list[PartitionPlan], results, advance: bool = True) -> list[tuple[str, int]]:
        """Replaces each plan's entries by its results; ``advance``: the rewrite was a
        cleaning (deduplicated up to the plan's dirty end), not only an erasure."""
        def mutate(md: LogMetadata):
            done = []
            for plan in plans:
                p = md.partition(plan.topic, plan.partition)
                n = len(plan.entries)
                if p.entries[:n] != plan.entries:
                    continue  # changed since planning (another cleaner): skip this partition
                p.entries[:n] = results[(plan.topic, plan.partition)]
                if advance:
                    p.cleaned_to = max(p.cleaned_to, plan.dirty_end)
                done.append((plan.topic, plan.partition))
            return done if done else NO_CHANGE

        _, done = self.log.meta.commit(mutate)
        return [] if done is NO_CHANGE else done
