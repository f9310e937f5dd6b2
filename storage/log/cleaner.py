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
   hold at most (keys seen) / f keys). The latest offsets of each range go into a
   roaring bitmap of survivors; the map is reused for the next range. Kafka instead
   cleans only up to where its map filled, leaving the rest dirty; here every
   cleaning removes every duplicate.
2. **Copy pass** (stream B of every input file): keep a record iff its offset is a
   survivor, except tombstones whose batch's ``delete_horizon`` has passed. Output
   batches get ``delete_horizon = now + delete.retention.ms`` unless their records
   already had one (KIP-534), so a tombstone lives ``delete.retention.ms`` after the
   cleaning that first saw it.

**Two GETs per input file per cleaning**, whatever the number of partitions in it
(WarpStream, seed ``warpstream-compacted-topics.txt``): stream A and stream B are one
ranged GET each over the span of the file's chunks taking part, advanced forward
only, partition by partition in (topic, partition) order, the order of chunks in every
file. Extra map passes re-decode stream A's bytes of the partition (no GET).
``CleaningReport`` counts GETs, bytes fetched, bytes decoded and map passes.

Output files hold only compacted data: one or more new segment files (cut at
``max_file_bytes`` between partitions) with the cleaned chunks of all partitions of
the cleaning, and their offsets unchanged (deltas from the chunk's first survivor,
gaps in a roaring bitmap, ``segment.py``). One metadata commit replaces each
partition's cleaned entries, provided they are unchanged since planning (producers
only append after them; a concurrent cleaning of the same partition makes this one
skip it). Input files no entry names any more are deleted after the commit.

Memory: the map (``dedupe.buffer.size``), the survivors bitmap of one partition
(roaring: at most 2 bytes per survivor or 1 bit per offset of the range), the two
streams' bytes (each input file's span, held until its last partition is done) and
the decoded batches of the partition being mapped (kept for extra hash ranges). The
map is hashed and filled 65,536 records at a time (vectorized numpy), and uses only
4 slots per record of the partition when that is below the budget, so a small
partition neither clears nor probes the whole 128 MiB.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap

from storage.log.config import CleanerConfig
from storage.log.metadata import NO_CHANGE, Entry, LogMetadata
from storage.log.offset_map import OffsetMap, hash_keys, partition_bits
from storage.log.producer import now_ms
from storage.log.records import Columns
from storage.log.segment import SegmentWriter, chunk_batches

HASH_SPACE = 2**32
MAX_RANGE_OFFSETS = 2**32 - 1
GROUP_RECORDS = 65_536  # records hashed and inserted per vectorized step


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


def _groups(batches, records: int):
    """Consecutive batches cut into groups of about ``records`` records."""
    group, n = [], 0
    for _, b in batches:
        group.append(b)
        n += len(b)
        if n >= records:
            yield group
            group, n = [], 0
    if group:
        yield group


def _members(bitmap: BitMap, lo: int, hi: int) -> np.ndarray:
    """Values of ``bitmap`` in ``[lo, hi]`` as an int64 array."""
    i = bitmap.rank(lo - 1) if lo > 0 else 0
    j = bitmap.rank(hi)
    if i >= j:
        return np.empty(0, np.int64)
    return np.frombuffer(bitmap[i:j].to_array(), dtype=np.uint32).astype(np.int64)


class _Stream:
    """A forward-only view of one input file: one ranged GET over the span of its
    chunks taking part, fetched on first use, dropped after its last chunk."""

    def __init__(self, log, key: str, start: int, end: int, uses: int, report: CleaningReport) -> None:
        self.log, self.key, self.start, self.end, self.uses = log, key, start, end, uses
        self.report = report
        self.data: bytes | None = None
        self.cursor = start

    def batches(self, e: Entry):
        if self.data is None:
            self.data = self.log.store.get_range(self.key, self.start, self.end - self.start)
            self.report.gets += 1
            self.report.bytes_fetched += len(self.data)
        if e.chunk.position < self.cursor:
            raise AssertionError(f"stream over {self.key} moved backwards")
        self.cursor = e.chunk.position
        return chunk_batches(self.data, e.chunk, self.start, self.log.store.uri(self.key))

    def done_with_chunk(self) -> None:
        self.uses -= 1
        if self.uses == 0:
            self.data = None


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
        started = time.perf_counter()
        now = self.clock()
        md = self.log.metadata()
        plans = plan_cleaning(md, now, topics, force)
        if not plans:
            return None
        report = CleaningReport(partitions=[(p.topic, p.partition) for p in plans])
        streams_a, streams_b = self._streams(plans, report)
        writer = SegmentWriter()
        outputs: list[tuple[str, list]] = []
        results: dict[tuple[str, int], Entry | None] = {}
        pending: list[tuple[PartitionPlan, int]] = []
        for plan in plans:
            cfg = md.topic(plan.topic).config
            base = plan.entries[0].start
            survivors = self._map_passes(plan, base, streams_a, report)
            writer.index_interval_bytes = cfg.index_interval_bytes
            out_base = self._copy_pass(plan, base, survivors, streams_b, writer, now + cfg.delete_retention_ms,
                                       now, report)
            pending.append((plan, out_base))
            if writer.size >= self.config.max_file_bytes:
                self._write_output(writer, pending, outputs, results, now)
                writer, pending = SegmentWriter(), []
        self._write_output(writer, pending, outputs, results, now)
        committed = self._commit(plans, results)
        report.partitions = committed
        report.output_files = [k for k, _ in outputs]
        report.records_out = sum(c.records for _, infos in outputs for c in infos)
        report.bytes_out = sum(c.length for _, infos in outputs for c in infos)
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
        a = {k: _Stream(self.log, k, s[0], s[1], s[2], report) for k, s in spans.items()}
        b = {k: _Stream(self.log, k, s[0], s[1], s[2], report) for k, s in spans.items()}
        return a, b

    # ---------------------------------------------------------------- map pass
    def _map_passes(self, plan: PartitionPlan, base: int, streams, report: CleaningReport) -> BitMap:
        total = sum(e.chunk.records for e in plan.entries)
        # Decode stream A once per partition; extra hash ranges re-read these batches.
        chunks = [(e, list(streams[e.file].batches(e))) for e in plan.entries]
        for e in plan.entries:
            streams[e.file].done_with_chunk()
        survivors = BitMap()
        ranges = [(0, HASH_SPACE, False)]
        while ranges:
            lo, hi, whole_buffer = ranges.pop()
            share = (hi - lo) / HASH_SPACE  # keys in the range <= its records, ~ share of all
            self.map.clear(None if whole_buffer else int(total * min(1.0, share * 1.2)) + 1024)
            report.map_passes += 1
            seen, full = 0, False
            for e, batches in chunks:
                for group in _groups(batches, GROUP_RECORDS):
                    report.bytes_decoded += sum(b.header.size for b in group)
                    keys = [k or b"" for b in group for k in b.keys()]
                    h, l = hash_keys(keys)
                    rel = np.concatenate([b.deltas for b in group]).astype(np.int64) + (e.base - base)
                    rel = rel.astype(np.uint32)
                    seen += len(keys)
                    if (lo, hi) != (0, HASH_SPACE):
                        bits = partition_bits(h)
                        sel = (bits >= lo) & (bits < hi)
                        h, l, rel = h[sel], l[sel], rel[sel]
                    if not self.map.put(h, l, rel):
                        full = True
                        break
                if full:
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
        return survivors

    # --------------------------------------------------------------- copy pass
    def _copy_pass(self, plan: PartitionPlan, base: int, survivors: BitMap, streams, writer: SegmentWriter,
                   new_horizon: int, now: int, report: CleaningReport) -> int:
        """Copies survivors into ``writer``; returns the output chunk's base offset."""
        out_base = base + survivors.min() if survivors else base
        writer.begin_chunk(plan.topic, plan.partition, compacted=True)
        parts: list[Columns] = []
        state = {"horizon": 0, "bytes": 0}

        def flush() -> None:
            if parts:
                writer.append_columns(Columns.concat(parts), delete_horizon=state["horizon"])
            parts.clear()
            state["bytes"] = 0

        for e in plan.entries:
            for _, b in streams[e.file].batches(e):
                report.bytes_decoded += b.header.size
                report.records_in += len(b)
                report.bytes_in += b.header.size
                rel = b.deltas.astype(np.int64) + (e.base - base)
                present = _members(survivors, int(rel[0]), int(rel[-1]))
                keep = present[np.minimum(np.searchsorted(present, rel), max(0, len(present) - 1))] == rel \
                    if len(present) else np.zeros(len(rel), bool)
                report.duplicates_removed += int(len(b) - keep.sum())
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
                cols.deltas += e.base - out_base
                parts.append(cols)
                state["bytes"] += cols.raw_bytes
                if state["bytes"] >= writer.batch_bytes:
                    flush()
            streams[e.file].done_with_chunk()
        flush()
        writer.end_chunk()
        return out_base

    # ------------------------------------------------------------------ output
    def _write_output(self, writer: SegmentWriter, pending, outputs, results, now: int) -> None:
        data, infos = writer.finish()
        by_part = {(c.topic, c.partition): c for c in infos}
        key = None
        if infos:
            key = self.log.new_file_key("c")
            self.log.store.put(key, data)
            outputs.append((key, infos))
        for plan, out_base in pending:
            c = by_part.get((plan.topic, plan.partition))
            results[(plan.topic, plan.partition)] = None if c is None else Entry(
                key, c, out_base, plan.entries[0].start, plan.dirty_end, now)

    def _commit(self, plans: list[PartitionPlan], results) -> list[tuple[str, int]]:
        def mutate(md: LogMetadata):
            done = []
            for plan in plans:
                p = md.partition(plan.topic, plan.partition)
                n = len(plan.entries)
                if p.entries[:n] != plan.entries:
                    continue  # changed since planning (another cleaner): skip this partition
                new = results[(plan.topic, plan.partition)]
                p.entries[:n] = [] if new is None else [new]
                p.cleaned_to = max(p.cleaned_to, plan.dirty_end)
                done.append((plan.topic, plan.partition))
            return done if done else NO_CHANGE

        _, done = self.log.meta.commit(mutate)
        return [] if done is NO_CHANGE else done
