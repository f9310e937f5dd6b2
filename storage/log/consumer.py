"""Reading the log: fetch from an offset, ``offsets_for_times``, and a consumer with
group offsets committed to the compacted ``__consumer_offsets`` topic (as Kafka does).

A fetch walks the partition's entries from the requested offset. Per entry it reads the
chunk's indexes with one ranged GET (skipped when the fetch starts at the chunk's first
record), finds the batch to start from with the offset index's warm/cold search, and
reads the chunk from there with a second ranged GET. Offsets in a gap (removed by
compaction) move on to the next present record: the chunk's present-offset bitmap says
which one without reading the batches, and offsets with no entry at all are skipped
using the entry ranges.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import xxhash

from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.log.config import COMPACT, TopicConfig
from dkvstream.storage.log.errors import OffsetOutOfRangeError
from dkvstream.storage.log.metadata import Entry, LogMetadata
from dkvstream.storage.log.records import Record
from dkvstream.storage.log.segment import chunk_batches, read_indexes

GROUP_OFFSETS_TOPIC = "__consumer_offsets"
GROUP_OFFSETS_PARTITIONS = 4
T = TypeVar("T")


@dataclass
class FetchResult:
    """The answer to a fetch.

    Attributes:
        records: records in offset order (offsets may have gaps).
        next_offset: where the next fetch continues (past any gap already skipped).
        high_watermark: the partition's next offset when fetched (end of the log).
    """

    records: list[Record]
    next_offset: int
    high_watermark: int


def _start_position(log, e: Entry, rel: int) -> tuple[int, int] | None:
    """(relative offset to start at, byte position in the chunk), or None if the
    chunk has no record at or after ``rel``."""
    if rel <= e.chunk.first_delta:
        return e.chunk.first_delta, 0
    idx = read_indexes(log.store, e.file, e.chunk)
    if idx.present is not None:
        nxt = idx.next_present(rel)
        if nxt is None:
            return None
        rel = nxt
    return rel, idx.offsets.lookup(rel)[1]


def _scan(log, e: Entry, start_pos: int):
    """Batches of entry ``e`` from chunk position ``start_pos`` (one ranged GET)."""
    c = e.chunk
    data = log.store.get_range(e.file, c.position + start_pos, c.length - start_pos)
    return chunk_batches(data, c, c.position + start_pos, log.store.uri(e.file), start_pos)


def with_fresh_metadata(log, read: Callable[[LogMetadata], T]) -> T:
    """``read(newest metadata version)``, run once more on a re-read version if a file
    the first version names is gone: a cleaning committed in between and deleted the
    files it replaced, which the new version no longer names.

    Raises:
        ObjectNotFoundError: a file is missing from the re-read version too.
        Whatever ``read`` raises otherwise.
    """
    try:
        return read(log.metadata())
    except ObjectNotFoundError:
        return read(log.metadata())


def fetch(log, topic: str, partition: int, offset: int, max_records: int | None = None,
          md: LogMetadata | None = None) -> FetchResult:
    """Records of ``topic``/``partition`` from ``offset`` on.

    Args:
        log: the ``Log``.
        offset: first offset wanted; an offset in a gap starts at the next record.
        max_records: stop after this many (None: to the end of the log).
        md: metadata version to read (default: the newest, re-read once if a file it
            names was deleted meanwhile by a cleaning).

    Raises:
        UnknownTopicError: no such topic/partition.
        OffsetOutOfRangeError: ``offset`` outside ``[log start, next offset]``.
        CorruptionError: a batch or index fails its checksum (names file and byte).
    """
    if md is not None:
        return _fetch(log, md, topic, partition, offset, max_records)
    return with_fresh_metadata(log, lambda m: _fetch(log, m, topic, partition, offset, max_records))


def _fetch(log, md: LogMetadata, topic: str, partition: int, offset: int, max_records: int | None) -> FetchResult:
    p = md.partition(topic, partition)
    if not p.log_start <= offset <= p.next_offset:
        raise OffsetOutOfRangeError(f"{topic}/{partition}: offset {offset} outside "
                                    f"[{p.log_start}, {p.next_offset}]")
    out: list[Record] = []
    pos = offset
    for e in p.entries_from(offset):
        pos = max(pos, e.start)
        start = _start_position(log, e, pos - e.base)
        if start is not None:
            rel, byte_pos = start
            lo = e.base + rel
            for _, b in _scan(log, e, byte_pos):
                if b.header.last_delta < rel:
                    continue
                for r in b.records(e.base):
                    if r.offset >= lo:
                        out.append(r)
                        if max_records is not None and len(out) >= max_records:
                            return FetchResult(out, r.offset + 1, p.next_offset)
        pos = e.end
    return FetchResult(out, p.next_offset, p.next_offset)


def read_range(log, topic: str, partition: int, start: int, end: int | None = None) -> list[Record]:
    """Every record with offset in ``[start, end)`` (``end`` None: to the end)."""
    records = fetch(log, topic, partition, start).records
    return records if end is None else [r for r in records if r.offset < end]


def offsets_for_times(log, topic: str, timestamps: dict[int, int]) -> dict[int, tuple[int, int] | None]:
    """Kafka's ``offsetsForTimes``: per partition, the earliest record whose timestamp is
    >= the target.

    Args:
        timestamps: ``{partition: target ms}``.

    Returns:
        ``{partition: (offset, timestamp) or None}`` (None: no such record).

    Raises:
        UnknownTopicError: no such topic/partition.
        CorruptionError: a batch or index fails its checksum (names file and byte).
    """
    return with_fresh_metadata(log, lambda md: _offsets_for_times(log, md, topic, timestamps))


def _offsets_for_times(log, md: LogMetadata, topic: str,
                       timestamps: dict[int, int]) -> dict[int, tuple[int, int] | None]:
    result: dict[int, tuple[int, int] | None] = {}
    for part, target in timestamps.items():
        result[part] = None
        for e in md.partition(topic, part).entries:
            if e.chunk.max_ts < target:
                continue  # every record of this entry is older
            byte_pos = 0
            if e.chunk.index[2]:
                idx = read_indexes(log.store, e.file, e.chunk)
                byte_pos = idx.offsets.lookup(idx.times.lookup(target))[1]
            hit = None
            for _, b in _scan(log, e, byte_pos):
                if b.header.max_ts < target:
                    continue
                i = int((b.timestamps >= target).argmax())
                hit = (e.base + int(b.deltas[i]), int(b.timestamps[i]))
                break
            if hit is not None:
                result[part] = hit
                break
    return result


def _group_key(group: str, topic: str, partition: int) -> bytes:
    return json.dumps([group, topic, partition], separators=(",", ":")).encode()


def _group_partition(group: str) -> int:
    return xxhash.xxh3_64_intdigest(group.encode()) % GROUP_OFFSETS_PARTITIONS


def ensure_group_topic(log) -> None:
    """Creates ``__consumer_offsets`` (compacted) if missing."""
    if GROUP_OFFSETS_TOPIC not in log.metadata().topics:
        log.create_topic(GROUP_OFFSETS_TOPIC, TopicConfig(partitions=GROUP_OFFSETS_PARTITIONS,
                                                          cleanup_policy=COMPACT, delete_retention_ms=0))


def commit_group_offsets(log, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commits a consumer group's positions: one record per partition, keyed by
    ``[group, topic, partition]``, all in the group's partition of ``__consumer_offsets``."""
    ensure_group_topic(log)
    prod = log.producer()
    for (topic, part), off in sorted(offsets.items()):
        prod.send(GROUP_OFFSETS_TOPIC, _group_key(group, topic, part), str(int(off)).encode(),
                  partition=_group_partition(group))
    prod.flush()


def _read_group_offsets(log, partition: int, groups: dict[str, dict[tuple[str, int], int]],
                        group: str | None = None) -> None:
    """Replays partition ``partition`` of ``__consumer_offsets`` into ``groups``
    (``{group: {(topic, partition): offset}}``), only ``group``'s records if given."""
    start = log.metadata().partition(GROUP_OFFSETS_TOPIC, partition).log_start
    for r in fetch(log, GROUP_OFFSETS_TOPIC, partition, start).records:
        g, topic, part = json.loads(r.key)
        if group is not None and g != group:
            continue
        if r.value is None:
            groups.get(g, {}).pop((topic, part), None)
        else:
            groups.setdefault(g, {})[(topic, part)] = int(r.value)


def committed_offsets(log, group: str) -> dict[tuple[str, int], int]:
    """The newest committed position of every partition of ``group``."""
    if GROUP_OFFSETS_TOPIC not in log.metadata().topics:
        return {}
    groups: dict[str, dict[tuple[str, int], int]] = {}
    _read_group_offsets(log, _group_partition(group), groups, group)
    return groups.get(group, {})


def all_committed_offsets(log) -> dict[str, dict[tuple[str, int], int]]:
    """Every consumer group's committed positions, ``{group: {(topic, partition):
    offset}}``; a group whose every position was deleted is left out. Reads every
    partition of ``__consumer_offsets`` (the listing of ``kafka-consumer-groups --list``)."""
    if GROUP_OFFSETS_TOPIC not in log.metadata().topics:
        return {}
    groups: dict[str, dict[tuple[str, int], int]] = {}
    for p in range(GROUP_OFFSETS_PARTITIONS):
        _read_group_offsets(log, p, groups)
    return {g: offsets for g, offsets in sorted(groups.items()) if offsets}


class Consumer:
    """Reads assigned partitions from tracked positions; optional consumer group.

    Args:
        log: the ``Log``.
        group: consumer group id; positions start from its committed offsets.
    """

    def __init__(self, log, group: str | None = None) -> None:
        self.log = log
        self.group = group
        self.positions: dict[tuple[str, int], int] = {}

    def assign(self, topic: str, partitions: list[int] | None = None) -> None:
        """Starts reading ``topic`` (all partitions by default) from the group's committed
        offsets, else from each partition's log start offset."""
        md = self.log.metadata()
        t = md.topic(topic)
        committed = committed_offsets(self.log, self.group) if self.group else {}
        for p in range(len(t.partitions)) if partitions is None else partitions:
            self.positions[(topic, p)] = committed.get((topic, p), md.partition(topic, p).log_start)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Sets the next offset to read."""
        self.positions[(topic, partition)] = offset

    def poll(self, max_records: int = 500) -> list[tuple[str, int, Record]]:
        """Up to ``max_records`` records from the assigned partitions, advancing positions.

        Returns:
            ``[(topic, partition, Record), ...]``, partitions in (topic, partition) order.

        Raises:
            OffsetOutOfRangeError: a position outside its partition's offsets.
            CorruptionError: a batch or index fails its checksum (names file and byte).
        """
        out, positions = with_fresh_metadata(self.log, lambda md: self._poll(md, max_records))
        self.positions.update(positions)
        return out

    def _poll(self, md: LogMetadata,
              max_records: int) -> tuple[list[tuple[str, int, Record]], dict[tuple[str, int], int]]:
        """``poll`` on one metadata version: (records, new positions); positions are only
        advanced by ``poll`` once every fetch succeeded, so a retry starts over cleanly."""
        out: list[tuple[str, int, Record]] = []
        positions: dict[tuple[str, int], int] = {}
        for (topic, part), pos in sorted(self.positions.items()):
            if len(out) >= max_records:
                break
            res = fetch(self.log, topic, part, pos, max_records - len(out), md=md)
            out += [(topic, part, r) for r in res.records]
            positions[(topic, part)] = res.next_offset
        return out, positions

    def commit(self) -> None:
        """Commits the current positions for the group.

        Raises:
            ValueError: the consumer has no group.
        """
        if not self.group:
            raise ValueError("commit needs a consumer group")
        commit_group_offsets(self.log, self.group, self.positions)
