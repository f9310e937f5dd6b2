"""Record batches: the unit of storage and checksumming in the log.

A record is ``(offset, timestamp, key, value, headers)``. A batch holds consecutive
records of one topic-partition. Offsets are stored as *deltas* relative to the base
offset of the chunk the batch belongs to (``segment.py``): a producer writes a file
before the metadata commit assigns its offsets (WarpStream style), and a compacted
chunk keeps the original offsets, so its deltas have gaps.

On-disk layout (little-endian)::

    batch   := header payload
    header  := magic "DLB1" (4) | codec u8 | flags u8 | reserved u16 | count u32
               | first_delta u32 | last_delta u32 | min_ts i64 | max_ts i64
               | delete_horizon i64 | raw_len u32 | stored_len u32 | crc32c u32   (56 bytes)
    payload := deltas u32[count] | timestamps i64[count] | key_lens i32[count]
               | value_lens i32[count] | header_lens i32[count]
               | keys bytes | values bytes | headers bytes

``delete_horizon`` (ms, 0 = unset) is set by the cleaner when it first writes a batch
into the clean section, as Kafka does since KIP-534: tombstones in the batch are removed
by the first cleaning at or after that time (``delete.retention.ms`` after the cleaning
that first saw them). ``codec`` is 0 (none) or 1 (zstd, level 1); ``stored_len`` is the payload's size on
disk, ``raw_len`` after decompression. ``crc32c`` covers the first 52 header bytes and
the stored payload, so a flipped bit anywhere in a batch is detected before decoding.
A key length of -1 is a null key; a value length of -1 is a null value, i.e. a
*tombstone*. Headers are one msgpack array of ``[str, bytes]`` pairs per record (length
0 = no headers). The columnar payload decodes with ``numpy.frombuffer`` without a
Python loop per record.

Flags: bit 0 set when the batch holds at least one tombstone.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import numpy as np
import zstandard
from crc32c import crc32c

from dkvstream.storage.errors import CorruptionError

MAGIC = b"DLB1"
HEADER = struct.Struct("<4sBBHIIIqqqIII")
HEADER_SIZE = HEADER.size  # 56
CODEC_NONE, CODEC_ZSTD = 0, 1
FLAG_TOMBSTONES = 1
COMPRESS_MIN_BYTES = 512  # below this zstd's frame overhead rarely pays off

# zstd contexts are not thread-safe: two threads in one context at once (readers of a
# topic, a producer and the cleaner) corrupt its output or crash the process. Each thread
# gets its own, created on first use and then reused: creating one per call costs more
# than compressing a small batch.
_contexts = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's zstd compressor (level 1)."""
    try:
        return _contexts.compressor
    except AttributeError:
        _contexts.compressor = zstandard.ZstdCompressor(level=1)
        return _contexts.compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor."""
    try:
        return _contexts.decompressor
    except AttributeError:
        _contexts.decompressor = zstandard.ZstdDecompressor()
        return _contexts.decompressor


@dataclass(frozen=True, slots=True)
class Record:
    """One log record.

    Attributes:
        offset: position in its partition (>= 0); never changes, even after compaction.
        timestamp: ms since the Unix epoch, UTC.
        key: bytes or None (keyless; not allowed in compacted topics).
        value: bytes, or None for a tombstone.
        headers: ``((name, value bytes), ...)``.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class BatchHeader:
    """The decoded fixed header of a batch (see the module docstring)."""

    codec: int
    flags: int
    count: int
    first_delta: int
    last_delta: int
    min_ts: int
    max_ts: int
    delete_horizon: int
    raw_len: int
    stored_len: int
    crc: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch on disk (header + stored payload)."""
        return HEADER_SIZE + self.stored_len


def _lens(items: Sequence[bytes | None]) -> np.ndarray:
    return np.fromiter((-1 if x is None else len(x) for x in items), dtype=np.int32, count=len(items))


def encode_batch(deltas: Sequence[int] | np.ndarray, timestamps: Sequence[int] | np.ndarray,
                 keys: Sequence[bytes | None], values: Sequence[bytes | None],
                 headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
                 compress: bool = True, delete_horizon: int = 0) -> bytes:
    """Encodes one batch.

    Args:
        deltas: offset deltas (relative to the chunk's base offset), strictly increasing,
            each < 2**32.
        timestamps: ms, one per record.
        keys / values: one per record; None key = keyless, None value = tombstone.
        headers: per record a sequence of ``(name, bytes)``; None = no headers at all.
        compress: zstd-compress the payload when it is big enough and shrinks.
        delete_horizon: ms after which tombstones of this batch may be removed (0 = unset).

    Returns:
        The batch bytes (header + payload).

    Raises:
        ValueError: empty batch, mismatched lengths or non-increasing deltas.
    """
    n = len(keys)
    if n == 0 or not (len(deltas) == len(timestamps) == len(values) == n):
        raise ValueError(f"batch needs equal, non-zero column lengths, got {len(deltas)} deltas, "
                         f"{len(timestamps)} timestamps, {n} keys, {len(values)} values")
    if headers is None:
        hblobs: list[bytes] = []
        hlens = np.zeros(n, np.int32)
    else:
        hblobs = [msgpack.packb([list(h) for h in hs], use_bin_type=True) if hs else b"" for hs in headers]
        hlens = _lens(hblobs)
    return encode_columns(Columns(
        np.asarray(deltas, dtype=np.int64), np.asarray(timestamps, dtype=np.int64), _lens(keys), _lens(values),
        hlens, b"".join(k for k in keys if k), b"".join(v for v in values if v), b"".join(hblobs),
    ), compress, delete_horizon)


@dataclass
class Columns:
    """A batch's records as columns: what ``encode_columns`` writes and ``Batch.take``
    returns. Byte columns hold the non-null keys / values / headers end to end."""

    deltas: np.ndarray
    timestamps: np.ndarray
    key_lens: np.ndarray
    value_lens: np.ndarray
    header_lens: np.ndarray
    keys: bytes | np.ndarray
    values: bytes | np.ndarray
    headers: bytes | np.ndarray

    def __len__(self) -> int:
        return len(self.deltas)

    @property
    def raw_bytes(self) -> int:
        """Payload bytes before compression."""
        return 24 * len(self.deltas) + len(self.keys) + len(self.values) + len(self.headers)

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """The columns of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        return Columns(*(np.concatenate([np.frombuffer(getattr(p, f), np.uint8) if isinstance(getattr(p, f), bytes)
                                         else getattr(p, f) for p in parts])
                         for f in ("deltas", "timestamps", "key_lens", "value_lens", "header_lens",
                                   "keys", "values", "headers")))


def encode_columns(c: Columns, compress: bool = True, delete_horizon: int = 0) -> bytes:
    """Encodes a batch from columns (``encode_batch`` without per-record Python objects).

    Raises:
        ValueError: empty, or deltas not strictly increasing.
    """
    n = len(c.deltas)
    if n == 0:
        raise ValueError("batch needs equal, non-zero column lengths")
    d = np.asarray(c.deltas)
    if n > 1 and not (np.diff(d) > 0).all():
        raise ValueError("batch offset deltas must be strictly increasing")
    ts = np.asarray(c.timestamps, dtype=np.int64)
    vlens = np.asarray(c.value_lens, dtype=np.int32)
    raw = b"".join([d.astype(np.uint32).tobytes(), ts.tobytes(), np.asarray(c.key_lens, np.int32).tobytes(),
                    vlens.tobytes(), np.asarray(c.header_lens, np.int32).tobytes(),
                    bytes(c.keys), bytes(c.values), bytes(c.headers)])
    codec, stored = CODEC_NONE, raw
    if compress and len(raw) >= COMPRESS_MIN_BYTES:
        z = _compressor().compress(raw)
        if len(z) < len(raw):
            codec, stored = CODEC_ZSTD, z
    flags = FLAG_TOMBSTONES if (vlens < 0).any() else 0
    head = HEADER.pack(MAGIC, codec, flags, 0, n, int(d[0]), int(d[-1]), int(ts.min()), int(ts.max()),
                       delete_horizon, len(raw), len(stored), 0)[:HEADER_SIZE - 4]
    return b"".join([head, struct.pack("<I", crc32c(stored, crc32c(head))), stored])


def _gather(raw: np.ndarray, offsets: np.ndarray, lens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The byte ranges ``[offsets[i], offsets[i] + lens[i])`` for ``mask[i]``, end to end."""
    starts, ls = offsets[:-1][mask], lens[mask]
    total = int(ls.sum())
    if total == 0:
        return np.empty(0, np.uint8)
    shift = starts - np.concatenate(([0], np.cumsum(ls)[:-1]))
    return raw[np.repeat(shift, ls) + np.arange(total)]


def read_header(buf: bytes | memoryview, pos: int, where: str, base: int = 0) -> BatchHeader:
    """Decodes and sanity-checks the batch header at ``buf[pos:]`` (no CRC check yet).

    Args:
        buf: bytes holding the batch.
        pos: byte position of the header in ``buf``.
        where: the file URI, for errors.
        base: file position of ``buf[0]``; errors name file positions ``base + pos``.

    Raises:
        CorruptionError: truncated header, bad magic or a payload running past ``buf``.
    """
    if pos + HEADER_SIZE > len(buf):
        raise CorruptionError(f"{where}: truncated batch header at byte {base + pos}")
    magic, codec, flags, _, count, first, last, min_ts, max_ts, horizon, raw_len, stored_len, crc = \
        HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        raise CorruptionError(f"{where}: bad batch magic {bytes(magic)!r} at byte {base + pos}")
    if codec not in (CODEC_NONE, CODEC_ZSTD) or count == 0:
        raise CorruptionError(f"{where}: bad batch header at byte {base + pos} (codec {codec}, count {count})")
    if pos + HEADER_SIZE + stored_len > len(buf):
        raise CorruptionError(f"{where}: truncated batch at byte {base + pos}: needs {HEADER_SIZE + stored_len} "
                              f"bytes, {len(buf) - pos} left")
    return BatchHeader(codec, flags, count, first, last, min_ts, max_ts, horizon, raw_len, stored_len, crc)


class Batch:
    """A decoded, CRC-verified batch: numpy columns over the raw payload.

    Attributes:
        header: the ``BatchHeader``.
        deltas: uint32 offset deltas; ``timestamps``: int64 ms; ``key_lens``,
            ``value_lens``, ``header_lens``: int32 (-1 = null).
    """

    __slots__ = ("header", "deltas", "timestamps", "key_lens", "value_lens", "header_lens",
                 "_raw", "_koff", "_voff", "_hoff")

    def __init__(self, buf: bytes | memoryview, pos: int, where: str, base: int = 0) -> None:
        h = read_header(buf, pos, where, base)
        stored = memoryview(buf)[pos + HEADER_SIZE: pos + HEADER_SIZE + h.stored_len]
        if crc32c(stored, crc32c(memoryview(buf)[pos: pos + HEADER_SIZE - 4])) != h.crc:
            raise CorruptionError(f"{where}: batch CRC32C mismatch at byte {base + pos}")
        try:
            raw = _decompressor().decompress(stored, max_output_size=h.raw_len) if h.codec == CODEC_ZSTD else stored
        except zstandard.ZstdError as e:
            raise CorruptionError(f"{where}: batch at byte {base + pos} does not decompress: {e}") from None
        n = h.count
        if len(raw) != h.raw_len or h.raw_len < 24 * n:
            raise CorruptionError(f"{where}: batch at byte {base + pos} has {len(raw)} raw bytes, "
                                  f"header says {h.raw_len}")
        self.header = h
        self._raw = raw
        self.deltas = np.frombuffer(raw, np.uint32, n, 0)
        self.timestamps = np.frombuffer(raw, np.int64, n, 4 * n)
        self.key_lens = np.frombuffer(raw, np.int32, n, 12 * n)
        self.value_lens = np.frombuffer(raw, np.int32, n, 16 * n)
        self.header_lens = np.frombuffer(raw, np.int32, n, 20 * n)
        start = 24 * n
        kl = np.maximum(self.key_lens, 0).astype(np.int64)
        vl = np.maximum(self.value_lens, 0).astype(np.int64)
        hl = np.maximum(self.header_lens, 0).astype(np.int64)
        self._koff = start + np.concatenate(([0], np.cumsum(kl)))
        self._voff = self._koff[-1] + np.concatenate(([0], np.cumsum(vl)))
        self._hoff = self._voff[-1] + np.concatenate(([0], np.cumsum(hl)))
        if self._hoff[-1] != len(raw):
            raise CorruptionError(f"{where}: batch at byte {base + pos}: lengths add up to {int(self._hoff[-1])} "
                                  f"bytes, payload has {len(raw)}")

    def __len__(self) -> int:
        return self.header.count

    def keys(self) -> list[bytes | None]:
        """Keys in record order (None for keyless records)."""
        raw, ko, kl = self._raw, self._koff.tolist(), self.key_lens.tolist()
        return [None if kl[i] < 0 else bytes(raw[ko[i]:ko[i + 1]]) for i in range(len(kl))]

    def values(self) -> list[bytes | None]:
        """Values in record order (None for tombstones)."""
        raw, vo, vl = self._raw, self._voff.tolist(), self.value_lens.tolist()
        return [None if vl[i] < 0 else bytes(raw[vo[i]:vo[i + 1]]) for i in range(len(vl))]

    def headers(self) -> list[tuple[tuple[str, bytes], ...]]:
        """Headers in record order."""
        raw, ho, hl = self._raw, self._hoff.tolist(), self.header_lens.tolist()
        return [tuple((str(a), bytes(b)) for a, b in msgpack.unpackb(raw[ho[i]:ho[i + 1]], raw=False))
                if hl[i] > 0 else () for i in range(len(hl))]

    def records(self, base_offset: int) -> list[Record]:
        """Records with absolute offsets ``base_offset + delta``."""
        offs = (self.deltas.astype(np.int64) + base_offset).tolist()
        ts = self.timestamps.tolist()
        hs = self.headers() if (self.header_lens > 0).any() else [()] * len(offs)
        return [Record(o, t, k, v, h) for o, t, k, v, h in zip(offs, ts, self.keys(), self.values(), hs)]

    def take(self, mask: np.ndarray) -> Columns:
        """The records where ``mask`` is True as ``Columns`` (deltas as int64), copied
        with numpy (no per-record Python objects)."""
        raw = np.frombuffer(self._raw, np.uint8)
        kl, vl, hl = self.key_lens, self.value_lens, self.header_lens
        return Columns(self.deltas[mask].astype(np.int64), self.timestamps[mask], kl[mask], vl[mask], hl[mask],
                       _gather(raw, self._koff, np.maximum(kl, 0), mask),
                       _gather(raw, self._voff, np.maximum(vl, 0), mask),
                       _gather(raw, self._hoff, np.maximum(hl, 0), mask))


def iter_batches(buf: bytes | memoryview, start: int, end: int, where: str, base: int = 0):
    """Yields ``(position in buf, Batch)`` for the batches laid end to end in ``buf[start:end]``.

    Args:
        base: file position of ``buf[0]`` (errors name ``base + position``).

    Raises:
        CorruptionError: a batch fails its checks or runs past ``end``.
    """
    pos = start
    view = memoryview(buf)[:end]
    while pos < end:
        b = Batch(view, pos, where, base)
        yield pos, b
        pos += b.header.size
