"""Segment files: one object per producer flush (or cleaning), holding chunks of many
topic-partitions, WarpStream style (seed ``warpstream-compacted-topics.txt``).

Layout::

    file        := chunk* chunk_index* directory trailer
    chunk       := batch+                 one topic-partition, offset deltas ascending
    chunk_index := offset_index time_index present_bitmap
    directory   := compact JSON {"format_version": 1, "chunks": [chunk_info, ...]}
    trailer     := dir_len u32 | dir_crc32c u32 | magic "DKVLOG01"      (16 bytes)

Chunks are sorted by (topic, partition) so a reader advancing one forward-only stream
through a file meets the partitions in a known order (the cleaner's two streams rely on
it). Batches are in ``records.py``; indexes in ``index.py``. ``present_bitmap`` is a
portable-format roaring bitmap (pyroaring) of the offset deltas present in the chunk,
written only when the chunk has offset gaps (compacted chunks); a reader asked for an
offset in a gap starts at the next present one.

``chunk_info`` (also copied into the log metadata, so a consumer never reads the
directory): ``topic``, ``partition``, ``position``/``length`` (bytes of the chunk's
batches), ``records``, ``batches``, ``first_delta``/``last_delta``, ``min_ts``/``max_ts``,
``index`` = ``[position, offset_index_len, time_index_len, bitmap_len, crc32c]`` (the
CRC covers the three index parts), ``compacted`` (true when written by the cleaner) and
``tombstones`` (count).

Offsets inside a file are deltas from the chunk's base offset, which only the metadata
knows: producer files are written before the metadata commit assigns their offsets.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from crc32c import crc32c
from pyroaring import BitMap

from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.log.index import IndexBuilder, OffsetIndex, TimeIndex
from dkvstream.storage.log.records import Batch, Columns, encode_batch, encode_columns, iter_batches
from dkvstream.storage.objectstore import ObjectStore

FORMAT_VERSION = 1
TRAILER = struct.Struct("<II8s")
TRAILER_MAGIC = b"DKVLOG01"
DEFAULT_BATCH_BYTES = 16 * 1024  # Kafka's batch.size


@dataclass(frozen=True)
class ChunkInfo:
    """Where one topic-partition's records sit in a segment file (module docstring)."""

    topic: str
    partition: int
    position: int
    length: int
    records: int
    batches: int
    first_delta: int
    last_delta: int
    min_ts: int
    max_ts: int
    index: tuple[int, int, int, int, int]
    compacted: bool = False
    tombstones: int = 0

    def to_json(self) -> dict:
        """A JSON-able dict (``from_json`` inverts it)."""
        d = dict(self.__dict__)  # every field is a scalar but index; asdict would deep-copy
        d["index"] = list(self.index)
        return d

    @classmethod
    def from_json(cls, d: dict) -> ChunkInfo:
        """Inverse of ``to_json``."""
        return cls(**{**d, "index": tuple(d["index"])})

    @property
    def has_gaps(self) -> bool:
        """True when some offsets in ``[first_delta, last_delta]`` hold no record."""
        return self.last_delta - self.first_delta + 1 != self.records


@dataclass
class ChunkIndexes:
    """The decoded indexes of one chunk; ``present`` is None when the chunk has no gaps."""

    offsets: OffsetIndex
    times: TimeIndex
    present: BitMap | None

    def next_present(self, delta: int) -> int | None:
        """Smallest present delta >= ``delta`` (None past the chunk's last record)."""
        if self.present is None:
            return delta
        rank = self.present.rank(delta - 1) if delta > 0 else 0
        return self.present[rank] if rank < len(self.present) else None


class SegmentWriter:
    """Builds one segment file in memory.

    REQUIRES: chunks are added in ascending (topic, partition) order, each partition at
    most once; deltas within a chunk strictly increase.

    Args:
        index_interval_bytes: ``index.interval.bytes`` for the chunk indexes.
        batch_bytes: target raw bytes per batch (records are cut into batches of about
            this size so the index can point inside a chunk).
    """

    def __init__(self, index_interval_bytes: int = 4096, batch_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        self.index_interval_bytes = index_interval_bytes
        self.batch_bytes = batch_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._chunks: list[tuple[ChunkInfo, bytes]] = []
        self._last: tuple[str, int] | None = None
        self._open: dict | None = None

    @property
    def size(self) -> int:
        """Bytes of batches written so far."""
        return self._size

    @property
    def chunks(self) -> int:
        """Chunks finished so far."""
        return len(self._chunks)

    def begin_chunk(self, topic: str, partition: int, compacted: bool = False) -> None:
        """Starts the chunk of ``(topic, partition)``.

        Raises:
            ValueError: out of order, or a chunk is still open.
        """
        if self._open is not None:
            raise ValueError("previous chunk not ended")
        if self._last is not None and (topic, partition) <= self._last:
            raise ValueError(f"chunk {topic}/{partition} out of order after {self._last[0]}/{self._last[1]}")
        self._last = (topic, partition)
        self._open = {"topic": topic, "partition": partition, "compacted": compacted, "start": self._size,
                      "index": IndexBuilder(self.index_interval_bytes), "deltas": [], "records": 0,
                      "batches": 0, "min_ts": None, "max_ts": None, "tombstones": 0}

    def append(self, deltas: Sequence[int] | np.ndarray, timestamps: Sequence[int] | np.ndarray,
               keys: Sequence[bytes | None], values: Sequence[bytes | None],
               headers: Sequence[Sequence[tuple[str, bytes]]] | None = None, delete_horizon: int = 0) -> None:
        """Appends records to the open chunk, cut into batches of about ``batch_bytes``
        (``delete_horizon``: see ``records.py``)."""
        n = len(keys)
        if n == 0:
            return
        deltas = np.asarray(deltas, dtype=np.int64)
        timestamps = np.asarray(timestamps, dtype=np.int64)
        sizes = np.fromiter(((len(k) if k else 0) + (len(v) if v else 0) + 24 for k, v in zip(keys, values)),
                            np.int64, n)
        cuts = np.searchsorted(np.cumsum(sizes), np.arange(self.batch_bytes, int(sizes.sum()), self.batch_bytes),
                               side="right")
        bounds = [0, *sorted(set(int(x) for x in cuts if 0 < x < n)), n]
        for a, b in zip(bounds, bounds[1:]):
            data = encode_batch(deltas[a:b], timestamps[a:b], keys[a:b], values[a:b],
                                None if headers is None else headers[a:b], delete_horizon=delete_horizon)
            self._add(data, deltas[a:b], timestamps[a:b], sum(1 for v in values[a:b] if v is None))

    def append_columns(self, cols: Columns, delete_horizon: int = 0) -> None:
        """Appends the records of ``cols`` to the open chunk as one batch."""
        if len(cols):
            self._add(encode_columns(cols, delete_horizon=delete_horizon), cols.deltas, cols.timestamps,
                      int((np.asarray(cols.value_lens) < 0).sum()))

    def _add(self, data: bytes, deltas: np.ndarray, timestamps: np.ndarray, tombstones: int) -> None:
        c = self._open
        if c is None:
            raise ValueError("no open chunk")
        if c["deltas"] and deltas[0] <= c["deltas"][-1][-1]:
            raise ValueError(f"chunk {c['topic']}/{c['partition']}: deltas must increase across batches")
        mn, mx = int(timestamps.min()), int(timestamps.max())
        c["index"].add_batch(int(deltas[0]), self._size - c["start"], len(data), mx)
        self._parts.append(data)
        self._size += len(data)
        c["batches"] += 1
        c["deltas"].append(np.asarray(deltas, np.int64))
        c["records"] += len(deltas)
        c["tombstones"] += tombstones
        c["min_ts"] = mn if c["min_ts"] is None else min(c["min_ts"], mn)
        c["max_ts"] = mx if c["max_ts"] is None else max(c["max_ts"], mx)

    def end_chunk(self) -> ChunkInfo | None:
        """Finishes the open chunk; returns its info (None if it got no records)."""
        c, self._open = self._open, None
        if c is None or c["records"] == 0:
            return None
        deltas = np.concatenate(c["deltas"])
        first, last = int(deltas[0]), int(deltas[-1])
        oi, ti = c["index"].offset_index_bytes(), c["index"].time_index_bytes()
        bm = b"" if last - first + 1 == len(deltas) else BitMap(deltas.astype(np.uint32)).serialize()
        idx = oi + ti + bm
        info = ChunkInfo(c["topic"], c["partition"], c["start"], self._size - c["start"], c["records"],
                         c["batches"], first, last, c["min_ts"], c["max_ts"],
                         (0, len(oi), len(ti), len(bm), crc32c(idx)), c["compacted"], c["tombstones"])
        self._chunks.append((info, idx))
        return info

    def finish(self) -> tuple[bytes, list[ChunkInfo]]:
        """Lays out the indexes, directory and trailer.

        Returns:
            ``(file bytes, chunk infos with their final index positions)``.
        """
        if self._open is not None:
            self.end_chunk()
        parts, pos, infos = list(self._parts), self._size, []
        for info, idx in self._chunks:
            infos.append(ChunkInfo(**{**asdict(info), "index": (pos, *info.index[1:])}))
            parts.append(idx)
            pos += len(idx)
        directory = json.dumps({"format_version": FORMAT_VERSION, "chunks": [i.to_json() for i in infos]},
                               sort_keys=True, separators=(",", ":")).encode()
        parts += [directory, TRAILER.pack(len(directory), crc32c(directory), TRAILER_MAGIC)]
        return b"".join(parts), infos


def read_directory(store: ObjectStore, key: str, data: bytes | None = None) -> list[ChunkInfo]:
    """Reads a segment file's chunk directory (3 requests, or none given ``data``).

    Raises:
        CorruptionError: bad trailer, magic or directory checksum (names the file).
        ObjectNotFoundError: no such file.
    """
    where = store.uri(key)
    size = len(data) if data is not None else store.size(key)
    if size < TRAILER.size:
        raise CorruptionError(f"{where}: {size} bytes is too short for a segment file trailer")
    tail = data[size - TRAILER.size:] if data is not None else store.get_range(key, size - TRAILER.size, TRAILER.size)
    dir_len, dir_crc, magic = TRAILER.unpack(tail)
    if magic != TRAILER_MAGIC or dir_len > size - TRAILER.size:
        raise CorruptionError(f"{where}: bad segment trailer at byte {size - TRAILER.size} (truncated file?)")
    start = size - TRAILER.size - dir_len
    raw = data[start:start + dir_len] if data is not None else store.get_range(key, start, dir_len)
    if crc32c(raw) != dir_crc:
        raise CorruptionError(f"{where}: directory CRC32C mismatch at byte {start}")
    d = json.loads(raw)
    if d.get("format_version") != FORMAT_VERSION:
        raise CorruptionError(f"{where}: unknown segment format version {d.get('format_version')}")
    return [ChunkInfo.from_json(c) for c in d["chunks"]]


def decode_indexes(raw: bytes | memoryview, chunk: ChunkInfo, where: str) -> ChunkIndexes:
    """Decodes a chunk's index block (``raw`` = bytes at ``chunk.index[0]``).

    Raises:
        CorruptionError: CRC mismatch or malformed parts (names file and byte offset).
    """
    pos, ol, tl, bl, crc = chunk.index
    if len(raw) != ol + tl + bl:
        raise CorruptionError(f"{where}: index of {chunk.topic}/{chunk.partition} at byte {pos} truncated")
    if crc32c(raw) != crc:
        raise CorruptionError(f"{where}: index CRC32C mismatch for {chunk.topic}/{chunk.partition} at byte {pos}")
    view = memoryview(raw)
    present = BitMap.deserialize(bytes(view[ol + tl:])) if bl else None
    return ChunkIndexes(OffsetIndex.from_bytes(view[:ol], where), TimeIndex.from_bytes(view[ol:ol + tl], where),
                        present)


def read_indexes(store: ObjectStore, key: str, chunk: ChunkInfo) -> ChunkIndexes:
    """Reads and decodes a chunk's indexes with one ranged GET."""
    pos, ol, tl, bl, _ = chunk.index
    return decode_indexes(store.get_range(key, pos, ol + tl + bl), chunk, store.uri(key))


def chunk_batches(buf: bytes | memoryview, chunk: ChunkInfo, buf_start: int, where: str,
                  from_position: int = 0) -> Iterator[tuple[int, Batch]]:
    """Yields ``(position in file, Batch)`` of a chunk whose bytes are in ``buf``.

    Args:
        buf: bytes of the file starting at file position ``buf_start``.
        chunk: the chunk.
        buf_start: file position of ``buf[0]``.
        where: file URI for errors.
        from_position: start at this position relative to the chunk (an index hit).

    Raises:
        CorruptionError: a batch fails its checks; the message names the file and the
            batch's byte offset in the file.
    """
    start = chunk.position + from_position - buf_start
    end = chunk.position + chunk.length - buf_start
    if start < 0 or end > len(buf):
        raise CorruptionError(f"{where}: chunk {chunk.topic}/{chunk.partition} bytes "
                              f"[{chunk.position}, {chunk.position + chunk.length}) not in the read range "
                              "(truncated file?)")
    for pos, b in iter_batches(buf, start, end, where, buf_start):
        yield pos + buf_start, b
