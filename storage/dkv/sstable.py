"""SSTable: the immutable sorted file. Format, builder and reader.

An SSTable holds entries ``(key, seq, tombstone, value)`` sorted by key, exactly one entry
per key (memtables and compaction outputs both keep only a key's newest version).

File layout::

    sstable    := data_block* meta_block footer
    data_block := zstd_frame(raw_block) | crc32c u32      (crc over the compressed frame)
    raw_block  := count u32 | key_len u32 * count | value_len u32 * count | seq u64 * count
                  | flags u8 * count | key bytes (concatenated) | value bytes (concatenated)
    flags      := 0 = value, 1 = tombstone (value_len is then 0)

Entry i of a block is ``(key_i, seq_i, flags_i, value_i)``; ``raw_block`` is ~block_bytes
uncompressed. The block is columnar rather than a sequence of records so that a reader
decodes it with a handful of C-level ``struct`` calls and slices instead of a Python loop
per field.
    meta_block := msgpack map (uncompressed), see below
    footer     := meta_offset u64 | meta_len u32 | meta_crc32c u32 | format_version u32
                  | footer_crc32c u32 | magic u64                     (32 bytes, fixed)

Integers are little-endian. ``footer_crc32c`` covers the 20 bytes before it. ``magic`` is
``b"DKVSST\\x00\\x01"`` read as a little-endian u64: printable in a hex dump, and a file cut
short or concatenated ends in something else. ``format_version`` is 1.

The meta block (msgpack map, keys are strings)::

    "entries": int           number of entries (tombstones included)
    "min_key", "max_key": bytes
    "min_seq", "max_seq": int
    "blocks": [[first_key bytes, offset int, disk_len int, raw_len int, entries int], ...]
              the sparse index: one row per data block, in file order; disk_len includes
              the 4-byte crc
    "bloom": {"name": str, "k": int, "bits": bytes}    see ``bloom.py``

Readers fetch the tail of the object (footer + meta) with one ranged GET (the whole object
if it is small) and data blocks on demand with ranged GETs through the block cache. Every
checksum, bound and ordering check that fails raises ``CorruptionError`` naming the URI and
the offset or block; nothing is returned silently wrong.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice

import msgpack
import numpy as np
import zstandard
from crc32c import crc32c

from dkvstream.storage.dkv.block_cache import BlockCache
from dkvstream.storage.dkv.bloom import POLICY_NAME, build_bloom, may_contain
from dkvstream.storage.dkv.native import NATIVE
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore import ObjectStore

FORMAT_VERSION = 1
MAGIC = int.from_bytes(b"DKVSST\x00\x01", "little")
FOOTER = struct.Struct("<QIIIIQ")
FOOTER_SIZE = FOOTER.size  # 32
FLAG_TOMBSTONE = 0x01
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U32S: dict[int, struct.Struct] = {}  # "<nI" per block entry count n
_ENTRY_FIXED = 17  # key_len + value_len + seq + flags, bytes
# First ranged read at open: footer + meta usually fit (bytes).
TAIL_READ_BYTES = 64 << 10

Entry = tuple[bytes, int, "bytes | None"]
# A decoded data block: parallel lists of keys, seqs and values (None = tombstone).
DecodedBlock = tuple[list[bytes], list[int], "list[bytes | None]"]


@dataclass(frozen=True)
class TableInfo:
    """A table as a level list (and manifest) references it.

    ``min_key``/``max_key`` are the *visible* bounds. For a table written by this instance
    they are the file's first and last key. For a table shared after a rescale, ``clip`` is
    the key range ``[lo, hi)`` (``hi`` None = unbounded) the referencing instance owns, and
    ``min_key``/``max_key`` are the first and last key of the file inside it: every key of
    the file between them is visible, every other key is not. ``entries`` is then an
    estimate (whole blocks) and ``min_seq``/``max_seq`` are the file's (bounds).
    """

    key: str
    size: int
    entries: int
    min_key: bytes
    max_key: bytes
    min_seq: int
    max_seq: int
    clip: tuple[bytes, bytes | None] | None = None


def entry_ends(keys: Sequence[bytes], values: Sequence[bytes | None]) -> np.ndarray:
    """Cumulative raw bytes of rows, where block and table cuts fall.

    Args:
        keys, values: Parallel lists; None values are tombstones (counted as 0 bytes).

    Returns:
        int64 array of ``len(keys)`` (read-only): element ``i`` is the sum over rows
        ``0..i`` of ``17 + len(key) + len(value)`` (the fixed bytes: lengths, seq, flags).

    Raises:
        TypeError: A key is not bytes or a value neither bytes nor None.
    """
    if NATIVE is not None and isinstance(keys, list) and isinstance(values, list):
        return np.frombuffer(NATIVE.entry_ends(keys, values), np.int64)
    return entry_ends_py(keys, values)


def entry_ends_py(keys: Sequence[bytes], values: Sequence[bytes | None]) -> np.ndarray:
    """Pure-Python reference of ``entry_ends`` (and of ``_native.entry_ends``)."""
    n = len(keys)
    sizes = np.fromiter(map(len, keys), np.int64, n)
    sizes += np.fromiter([0 if v is None else len(v) for v in values], np.int64, n)
    sizes += _ENTRY_FIXED
    return np.cumsum(sizes)


class SSTableBuilder:
    """Accumulates sorted entries and produces the bytes of one SSTable.

    REQUIRES: ``add`` is called with strictly increasing keys.
    """

    def __init__(self, block_bytes: int, bloom_bits_per_key: int, zstd_level: int) -> None:
        self._block_bytes = block_bytes
        self._bits_per_key = bloom_bits_per_key
        self._cctx = zstandard.ZstdCompressor(level=zstd_level)
        self._parts: list[bytes] = []
        self._offset = 0
        self._index: list[list] = []
        self._bkeys: list[bytes] = []
        self._bvals: list[bytes] = []
        self._bseqs: list[int] = []
        self._bflags = bytearray()
        self._block_raw = 0
        self._block_first: bytes | None = None
        self._block_entries = 0
        self._keys: list[bytes] = []
        self._last_key: bytes | None = None
        self._min_seq = 0
        self._max_seq = 0
        self.raw_bytes = 0  # uncompressed entry bytes so far

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Appends one entry (``value=None`` is a tombstone).

        Raises:
            ValueError: ``key`` is not greater than the previous key.
        """
        if self._last_key is not None and key <= self._last_key:
            raise ValueError("SSTable keys must be added in strictly increasing order")
        self._last_key = key
        if self._block_first is None:
            self._block_first = key
        self._bkeys.append(key)
        self._bseqs.append(seq)
        if value is None:
            self._bvals.append(b"")
            self._bflags.append(FLAG_TOMBSTONE)
            size = _ENTRY_FIXED + len(key)
        else:
            self._bvals.append(value)
            self._bflags.append(0)
            size = _ENTRY_FIXED + len(key) + len(value)
        self._block_raw += size
        self._block_entries += 1
        self.raw_bytes += size
        self._keys.append(key)
        if not self._min_seq or seq < self._min_seq:
            self._min_seq = seq
        if seq > self._max_seq:
            self._max_seq = seq
        if self._block_raw >= self._block_bytes:
            self._finish_block()

    def add_columns(self, keys: Sequence[bytes], seqs: Sequence[int], values: Sequence[bytes | None],
                    *, sorted_unique: bool = False) -> None:
        """Appends many entries: the same table bytes as ``add`` per row, with the block
        boundaries found by a cumulative sum over the rows (numpy) instead of a Python
        step per row.

        Args:
            keys, seqs, values: Parallel lists; None values are tombstones.
            sorted_unique: The caller guarantees ``keys`` strictly increasing (a
                memtable's sorted keys): the check within ``keys`` is skipped.

        Raises:
            ValueError: The keys are not strictly increasing (also across calls).
        """
        n = len(keys)
        if not n:
            return
        if (self._last_key is not None and keys[0] <= self._last_key) or not (
            sorted_unique or all(map(bytes.__lt__, keys, islice(keys, 1, None)))
        ):
            raise ValueError("SSTable keys must be added in strictly increasing order")
        if NATIVE is not None and type(seqs) is list:
            lo, hi = NATIVE.seq_bounds(seqs)
        else:
            lo, hi = min(seqs), max(seqs)
        if not self._min_seq or lo < self._min_seq:
            self._min_seq = lo
        self._max_seq = max(self._max_seq, hi)
        self._keys += keys
        self._last_key = keys[-1]
        if NATIVE is not None and self._block_entries:
            # A block left open by the previous call (a compaction adds a run in slices):
            # its rows up to the one filling it take the Python path, so that the whole
            # blocks after it are cut in C rather than all of this call's rows in Python.
            room = self._block_bytes - self._block_raw
            j = 0
            while j < n and room > 0:
                v = values[j]
                room -= _ENTRY_FIXED + len(keys[j]) + (0 if v is None else len(v))
                j += 1
            self._add_rows(keys[:j], seqs[:j], values[:j])
            keys, seqs, values = keys[j:], seqs[j:], values[j:]
            n -= j
            if not n:
                return
        if NATIVE is not None:
            # Whole blocks are cut and encoded in C; the rows of the last, open block
            # take the Python path below.
            # encode_blocks takes lists: copy only what is not one (a million-row copy
            # costs a reference-count write per row, each a likely cache miss).
            keys = keys if type(keys) is list else list(keys)
            values = values if type(values) is list else list(values)
            if type(seqs) is not list:
                seqs = seqs.tolist() if isinstance(seqs, np.ndarray) else list(seqs)
            raws, used = NATIVE.encode_blocks(keys, seqs, values, self._block_bytes)
            first = 0
            for raw in raws:
                entries = _U32.unpack_from(raw, 0)[0]
                self._write_block(raw, keys[first], entries)
                self.raw_bytes += len(raw) - 4
                first += entries
            keys, seqs, values = keys[used:], seqs[used:], values[used:]
            n = len(keys)
            if not n:
                return
        self._add_rows(keys, seqs, values)

    def _add_rows(self, keys: Sequence[bytes], seqs: Sequence[int], values: Sequence[bytes | None]) -> None:
        """Appends rows to the open block, finishing blocks as they fill (the cut found
        by a cumulative sum over the row sizes)."""
        n = len(keys)
        cum = entry_ends(keys, values)
        if None in values:
            flags = bytes([FLAG_TOMBSTONE if v is None else 0 for v in values])
            values = [b"" if v is None else v for v in values]
        else:
            flags = bytes(n)
        total = int(cum[-1])
        block_bytes = self._block_bytes
        i = 0
        base = 0  # cum[i - 1]
        while i < n:
            # The row that fills the open block ends it (as in ``add``).
            j = int(np.searchsorted(cum, base + block_bytes - self._block_raw, side="left"))
            end = min(j + 1, n)
            if self._block_first is None:
                self._block_first = keys[i]
            self._bkeys += keys[i:end]
            self._bvals += values[i:end]
            self._bseqs += seqs[i:end]
            self._bflags += flags[i:end]
            top = int(cum[end - 1])
            self._block_raw += top - base
            self._block_entries += end - i
            if self._block_raw >= block_bytes:
                self._finish_block()
            i, base = end, top
        self.raw_bytes += total

    def _finish_block(self) -> None:
        n = self._block_entries
        if not n:
            return
        raw = b"".join(
            (
                _U32.pack(n),
                struct.pack(f"<{n}I", *map(len, self._bkeys)),
                struct.pack(f"<{n}I", *map(len, self._bvals)),
                struct.pack(f"<{n}Q", *self._bseqs),
                bytes(self._bflags),
                *self._bkeys,
                *self._bvals,
            )
        )
        self._write_block(raw, self._block_first, n)
        self._bkeys = []
        self._bvals = []
        self._bseqs = []
        self._bflags = bytearray()
        self._block_raw = 0
        self._block_first = None
        self._block_entries = 0

    def _write_block(self, raw: bytes, first_key: bytes, entries: int) -> None:
        """Compresses one encoded block, appends it and its sparse-index row."""
        frame = self._cctx.compress(raw)
        disk = frame + crc32c(frame).to_bytes(4, "little")
        self._index.append([first_key, self._offset, len(disk), len(raw), entries])
        self._parts.append(disk)
        self._offset += len(disk)

    def finish(self) -> tuple[bytes, dict]:
        """Seals the table.

        Returns:
            ``(data, meta)``: the file bytes and the decoded meta map.

        Raises:
            ValueError: No entries were added (empty tables are never written).
        """
        if not self._keys:
            raise ValueError("refusing to build an empty SSTable")
        self._finish_block()
        k, bits = build_bloom(self._keys, self._bits_per_key)
        meta = {
            "entries": len(self._keys),
            "min_key": self._keys[0],
            "max_key": self._keys[-1],
            "min_seq": self._min_seq,
            "max_seq": self._max_seq,
            "blocks": self._index,
            "bloom": {"name": POLICY_NAME, "k": k, "bits": bits},
        }
        meta_bytes = msgpack.packb(meta, use_bin_type=True)
        head = struct.pack("<QII", self._offset, len(meta_bytes), crc32c(meta_bytes))
        head += struct.pack("<I", FORMAT_VERSION)
        footer = head + struct.pack("<IQ", crc32c(head), MAGIC)
        assert len(footer) == FOOTER_SIZE
        return b"".join([*self._parts, meta_bytes, footer]), meta


def decode_block_py(raw: bytes, expect: int) -> DecodedBlock:
    """Splits a decompressed data block into ``(keys, seqs, values)`` (pure-Python
    reference of ``_native.decode_block``).

    Args:
        raw: The decompressed block (layout ``raw_block`` above).
        expect: The entry count the sparse index gives.

    Returns:
        Parallel lists: keys (strictly ascending), sequence numbers, values (None for a
        tombstone).

    Raises:
        ValueError: Naming what is malformed (count, lengths, flags, tombstone with a
            value, order). ``struct.error`` for a block too short for its count.
    """
    try:
        (n,) = _U32.unpack_from(raw, 0)
        if n != expect:
            raise ValueError(f"{n} entries, index says {expect}")
        u32s = _U32S.get(n) or _U32S.setdefault(n, struct.Struct(f"<{n}I"))
        klens = u32s.unpack_from(raw, 4)
        vlens = u32s.unpack_from(raw, 4 + 4 * n)
        seqs = list(struct.unpack_from(f"<{n}Q", raw, 4 + 8 * n))
    except struct.error:
        raise ValueError("lengths do not add up to the block size") from None
    flags = raw[4 + 16 * n : 4 + 17 * n]
    kstart = 4 + 17 * n
    vstart = kstart + sum(klens)
    if vstart + sum(vlens) != len(raw) or len(flags) != n:
        raise ValueError("lengths do not add up to the block size")
    if flags.translate(None, b"\x00\x01"):
        raise ValueError("unknown entry flags")
    if FLAG_TOMBSTONE in flags and any(f and vl for f, vl in zip(flags, vlens)):
        raise ValueError("tombstone with a value")
    kl = klens[0] if n else 0
    if kl and klens.count(kl) == n:  # fixed-width keys: offsets are arithmetic
        keys = [raw[a : a + kl] for a in range(kstart, vstart, kl)]
    else:
        koffs = list(accumulate(klens, initial=kstart))
        keys = [raw[a:b] for a, b in zip(koffs, koffs[1:])]
    # C-level checks: sorted() of a sorted list is one pass; the set catches duplicates.
    if keys != sorted(keys) or len(set(keys)) != len(keys):
        raise ValueError("keys out of order")
    vl = vlens[0] if n else 0
    if vl and FLAG_TOMBSTONE not in flags and vlens.count(vl) == n:
        values = [raw[a : a + vl] for a in range(vstart, len(raw), vl)]
        return keys, seqs, values
    voffs = list(accumulate(vlens, initial=vstart))
    if FLAG_TOMBSTONE in flags:
        values: list[bytes | None] = [
            None if f else raw[a:b] for f, a, b in zip(flags, voffs, voffs[1:])
        ]
    else:
        values = [raw[a:b] for a, b in zip(voffs, voffs[1:])]
    return keys, seqs, values


def block_get_py(raw: bytes, expect: int, key: bytes) -> tuple[int, bytes | None] | None:
    """Looks ``key`` up in a decompressed data block without building its lists
    (pure-Python reference of ``_native.block_get``).

    Args:
        raw: The decompressed block.
        expect: The entry count the sparse index gives.
        key: The key.

    Returns:
        ``(seq, value)``, ``(seq, None)`` for a tombstone, or None if absent.

    Raises:
        ValueError: The count, lengths or flags are malformed.
    """
    n = expect
    try:
        if _U32.unpack_from(raw, 0)[0] != n:
            raise ValueError(f"{_U32.unpack_from(raw, 0)[0]} entries, index says {n}")
        u32s = _U32S.get(n) or _U32S.setdefault(n, struct.Struct(f"<{n}I"))
        klens = u32s.unpack_from(raw, 4)
        vlens = u32s.unpack_from(raw, 4 + 4 * n)
    except struct.error:
        raise ValueError("lengths do not add up to the block size") from None
    kstart = 4 + 17 * n
    kend = kstart + sum(klens)
    if kend + sum(vlens) != len(raw):
        raise ValueError("lengths do not add up to the block size")
    flags = raw[4 + 16 * n : kstart]
    if flags.translate(None, b"\x00\x01"):
        raise ValueError("unknown entry flags")
    if FLAG_TOMBSTONE in flags and any(f and vl for f, vl in zip(flags, vlens)):
        raise ValueError("tombstone with a value")
    koffs = list(accumulate(klens, initial=kstart))
    lo = bisect_left(range(n), key, key=lambda j: raw[koffs[j] : koffs[j + 1]])
    if lo == n or raw[koffs[lo] : koffs[lo + 1]] != key:
        return None
    (seq,) = _U64.unpack_from(raw, 4 + 8 * n + 8 * lo)
    if flags[lo]:
        return seq, None
    voff = kend + sum(vlens[:lo])
    return seq, raw[voff : voff + vlens[lo]]


def block_range_py(raw: bytes, expect: int, start: bytes, end: bytes | None) -> DecodedBlock:
    """``decode_block_py`` restricted to ``start <= key < end`` (``end`` None: no bound);
    pure-Python reference of ``_native.block_range``.

    Raises:
        ValueError: As ``decode_block_py``.
    """
    keys, seqs, values = decode_block_py(raw, expect)
    lo = bisect_left(keys, start)
    hi = len(keys) if end is None else max(lo, bisect_left(keys, end))
    return keys[lo:hi], seqs[lo:hi], values[lo:hi]


if NATIVE is not None:
    decode_block, block_get, block_range = (
        NATIVE.decode_block, NATIVE.block_get, NATIVE.block_range
    )
else:
    decode_block, block_get, block_range = decode_block_py, block_get_py, block_range_py


def _decode_block(raw: bytes, uri: str, block_no: int, offset: int, expect: int) -> DecodedBlock:
    try:
        return decode_block(raw, expect)
    except ValueError as e:
        raise CorruptionError(
            f"{uri}: malformed data block {block_no} at offset {offset}: {e}"
        ) from None


class SSTableReader:
    """Reads one SSTable through an ``ObjectStore``, fetching blocks on demand.

    Args:
        store: Where the table lives.
        key: The table's object key.
        size: The table's size in bytes if known (from the manifest); saves a HEAD.
        cache: Shared cache of decompressed blocks, or None.

    Raises:
        CorruptionError: The footer or meta block fails its checks.
        ObjectNotFoundError: The object does not exist.
    """

    def __init__(
        self, store: ObjectStore, key: str, size: int | None = None, cache: BlockCache | None = None,
        whole: bytes | None = None,
    ) -> None:
        self._store = store
        self.key = key
        self.uri = store.uri(key)
        self._cache = cache
        self._cache_base = cache.table_base(key) if cache is not None else 0
        self._dctx = zstandard.ZstdDecompressor()
        if whole is not None:
            if size is not None and size != len(whole):
                raise CorruptionError(
                    f"{self.uri}: object has {len(whole)} bytes, manifest says {size}"
                )
            size = len(whole)
        if size is None:
            size = store.size(key)
        self.size = size
        if size < FOOTER_SIZE:
            raise CorruptionError(f"{self.uri}: object of {size} bytes is too small for a footer")
        tail_start = max(0, size - TAIL_READ_BYTES)
        if whole is not None:
            tail_start = 0
            tail = whole
        else:
            tail = store.get_range(key, tail_start, size - tail_start)
        if len(tail) != size - tail_start:
            raise CorruptionError(
                f"{self.uri}: object shorter than recorded size {size} (read {len(tail)} bytes"
                f" at offset {tail_start})"
            )
        # Small table: keep the whole object and serve blocks from memory.
        self._whole_view = memoryview(tail) if tail_start == 0 else None
        self._parse_tail(tail, tail_start)

    def _parse_tail(self, tail: bytes, tail_start: int) -> None:
        uri = self.uri
        foff = self.size - FOOTER_SIZE
        fbytes = tail[foff - tail_start :]
        meta_off, meta_len, meta_crc, version, footer_crc, magic = FOOTER.unpack(fbytes)
        if magic != MAGIC:
            raise CorruptionError(f"{uri}: bad magic in footer at offset {foff}")
        if crc32c(fbytes[:20]) != footer_crc:
            raise CorruptionError(f"{uri}: footer crc32c mismatch at offset {foff}")
        if version != FORMAT_VERSION:
            raise CorruptionError(f"{uri}: unsupported SSTable format version {version} in footer at offset {foff}")
        if meta_off + meta_len != foff:
            raise CorruptionError(f"{uri}: meta block bounds disagree with footer at {foff}")
        if meta_off >= tail_start:
            meta_bytes = tail[meta_off - tail_start : foff - tail_start]
        else:
            meta_bytes = self._store.get_range(self.key, meta_off, meta_len)
        if crc32c(meta_bytes) != meta_crc:
            raise CorruptionError(f"{uri}: meta block crc32c mismatch at offset {meta_off}")
        try:
            meta = msgpack.unpackb(meta_bytes, raw=False)
            blocks = meta["blocks"]
            bloom = meta["bloom"]
            self.entries = int(meta["entries"])
            self.min_key = bytes(meta["min_key"])
            self.max_key = bytes(meta["max_key"])
            self.min_seq = int(meta["min_seq"])
            self.max_seq = int(meta["max_seq"])
            self._bloom_bits = bytes(bloom["bits"])
            self._bloom_k = int(bloom["k"])
            bloom_name = bloom["name"]
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
            raise CorruptionError(
                f"{uri}: malformed meta block at offset {meta_off}: {e}"
            ) from None
        if bloom_name != POLICY_NAME:
            raise CorruptionError(f"{uri}: unknown Bloom filter policy {bloom_name!r} "
                                  f"in meta block at offset {meta_off}")
        self.bloom_bits = len(self._bloom_bits) * 8
        self.format_version = version
        # (first_key, offset, disk_len, raw_len, entries) per block, for tools.
        self.block_index = [
            (bytes(b[0]), int(b[1]), int(b[2]), int(b[3]), int(b[4])) for b in blocks
        ]
        self._first_keys = [bytes(b[0]) for b in blocks]
        self._blocks = [(int(b[1]), int(b[2]), int(b[4])) for b in blocks]
        self._counts = [b[2] for b in self._blocks]  # entries per block
        # Structural checks on the index: blocks tile [0, meta_off) in order.
        pos = 0
        for i, (off, ln, _n) in enumerate(self._blocks):
            if off != pos or ln <= 4:
                raise CorruptionError(f"{uri}: sparse index row {i} inconsistent at offset {off}")
            pos += ln
        if pos != meta_off or self._first_keys != sorted(self._first_keys) or not blocks:
            raise CorruptionError(f"{uri}: sparse index in meta block at offset {meta_off} "
                                  "does not cover the data blocks")
        if sum(b[2] for b in self._blocks) != self.entries:
            raise CorruptionError(f"{uri}: entry count in meta block at offset {meta_off} disagrees with index")

    @property
    def num_blocks(self) -> int:
        """Number of data blocks."""
        return len(self._blocks)

    def block_bounds(self) -> list[tuple[int, int]]:
        """Returns ``(offset, disk_len)`` of each data block (for tests and tools)."""
        return [(off, ln) for off, ln, _ in self._blocks]

    def _raw_block(self, i: int) -> bytes:
        """Returns data block ``i`` decompressed (through the block cache), after checking
        its crc32c on a miss."""
        cache = self._cache
        if cache is not None:
            hit = cache.get(self._cache_base + i)
            if hit is not None:
                return hit
        return self._load_block(i)

    def _load_block(self, i: int) -> bytes:
        """Reads, verifies and decompresses data block ``i`` (a block cache miss) and
        caches it."""
        cache = self._cache
        off, ln, _n = self._blocks[i]
        view = self._whole_view
        if view is not None:
            frame = view[off : off + ln - 4]  # no copy
            (crc,) = _U32.unpack_from(view, off + ln - 4)
        else:
            disk = self._store.get_range_immutable(self.key, off, ln)
            if len(disk) != ln:
                raise CorruptionError(f"{self.uri}: short read of data block {i} at offset {off}")
            frame = disk[:-4]
            crc = int.from_bytes(disk[-4:], "little")
        if crc32c(frame) != crc:
            raise CorruptionError(f"{self.uri}: data block {i} crc32c mismatch at offset {off}")
        try:
            raw = self._dctx.decompress(frame)
        except zstandard.ZstdError as e:
            raise CorruptionError(f"{self.uri}: data block {i} at offset {off}: {e}") from None
        if cache is not None:
            cache.put(self._cache_base + i, raw, len(raw))
        return raw

    def _block(self, i: int) -> DecodedBlock:
        # The cache holds decompressed bytes, not lists: their charge is their true size,
        # and splitting a block into lists costs ~1 µs per block in _native.decode_block.
        off, _ln, n = self._blocks[i]
        block = _decode_block(self._raw_block(i), self.uri, i, off, n)
        if not block[0] or block[0][0] != self._first_keys[i]:
            raise CorruptionError(
                f"{self.uri}: data block {i} at offset {off} does not start at its index key"
            )
        return block

    def may_contain(self, key: bytes) -> bool:
        """Cheap pre-check: key range then Bloom filter. No I/O."""
        if key < self.min_key or key > self.max_key:
            return False
        return may_contain(self._bloom_bits, self._bloom_k, key)

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """Looks up ``key``.

        Returns:
            ``(seq, value)``, ``(seq, None)`` for a tombstone, or ``None`` if absent.
        """
        if not self.may_contain(key):
            return None
        return self.get_unfiltered(key)

    @property
    def bloom(self) -> tuple[bytes, int]:
        """``(bits, k)``: the table's Bloom filter (verified with the meta block)."""
        return self._bloom_bits, self._bloom_k

    def get_unfiltered(self, key: bytes) -> tuple[int, bytes | None] | None:
        """Like ``get`` for a caller that already checked the key range and Bloom filter."""
        i = bisect_right(self._first_keys, key) - 1
        if i < 0:
            return None
        raw = self._raw_block(i)
        try:
            return block_get(raw, self._blocks[i][2], key)
        except ValueError as e:
            raise CorruptionError(
                f"{self.uri}: malformed data block {i} at offset {self._blocks[i][0]}: {e}"
            ) from None

    def scan_batches(
        self, start: bytes, end: bytes | None = None
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """Yields ``(keys, values)`` list pairs per block for ``start <= key < end``.

        The batch form of ``iter_from`` without sequence numbers (a scan over one sorted
        source needs none); ``None`` values are tombstones.
        """
        if (end is not None and end <= self.min_key) or start > self.max_key:
            return
        first_keys = self._first_keys
        i = max(0, bisect_right(first_keys, start) - 1)
        nblocks = len(self._blocks)
        first = True
        while i < nblocks:
            if end is not None and first_keys[i] >= end:
                return
            keys, _seqs, values = self._block(i)
            j = bisect_left(keys, start) if first else 0
            first = False
            if end is not None and keys[-1] >= end:
                k = bisect_left(keys, end, j)
                yield keys[j:k], values[j:k]
                return
            yield (keys[j:], values[j:]) if j else (keys, values)
            i += 1

    def _block_range(self, i: int, start: bytes, end: bytes | None) -> DecodedBlock:
        try:
            return block_range(self._raw_block(i), self._blocks[i][2], start, end)
        except ValueError as e:
            raise CorruptionError(
                f"{self.uri}: malformed data block {i} at offset {self._blocks[i][0]}: {e}"
            ) from None

    def block_span(self, start: bytes, end: bytes | None) -> range:
        """The data blocks that may hold keys in ``[start, end)`` (sparse index; no I/O)."""
        if (end is not None and end <= self.min_key) or start > self.max_key:
            return range(0)
        first_keys = self._first_keys
        i = max(0, bisect_right(first_keys, start) - 1)
        return range(i, len(first_keys) if end is None else bisect_left(first_keys, end, i))

    def scan_column_batches(
        self, start: bytes, end: bytes | None = None
    ) -> Iterator[DecodedBlock]:
        """Yields per block ``(keys, seqs, values)`` lists (values None for tombstones) of
        the entries with ``start <= key < end``, ascending; never an empty batch. Only the
        entries in range become Python objects (``block_range``).

        Raises:
            CorruptionError: A block fails its checksum or is malformed.
        """
        for i in self.block_span(start, end):
            batch = self._block_range(i, start, end)
            if batch[0]:
                yield batch

    def read_span(
        self, start: bytes, end: bytes | None, max_blocks: int
    ) -> tuple[list[bytes], list[int], bytes, bytes | None] | None:
        """The data blocks that may hold keys in ``[start, end)``, decompressed through the
        block cache, as ``(raws, counts, start, end)`` (``counts``: entries per block per
        the sparse index): a short scan's input to ``merge.merge_spans_live``, which reads
        the blocks in place and checks their structure (``check_blocks`` then names a bad
        one). Returns None, without reading, if more than ``max_blocks`` blocks would be
        needed.

        Raises:
            CorruptionError: A block fails its checksum or cannot be decompressed.
        """
        if (end is not None and end <= self.min_key) or start > self.max_key:
            return [], [], start, end
        first_keys = self._first_keys
        i = bisect_right(first_keys, start) - 1
        if i < 0:
            i = 0
        j = len(first_keys) if end is None else bisect_left(first_keys, end, i)
        if j - i > max_blocks:
            return None
        span = range(i, j)
        cache = self._cache
        if cache is None:
            raws = [self._load_block(b) for b in span]
        else:
            raws = cache.get_run(self._cache_base, span)
            if None in raws:
                load = self._load_block
                raws = [raw if raw is not None else load(b) for b, raw in zip(span, raws)]
        return raws, self._counts[i:j], start, end

    def check_blocks(self, span: range) -> None:
        """Decodes every block of ``span`` in full.

        Raises:
            CorruptionError: Naming the first malformed block, its number and offset.
        """
        for i in span:
            self._block(i)

    def last_key_before(self, end: bytes | None) -> bytes | None:
        """Returns the largest key ``< end`` (the last key if ``end`` is None), or None."""
        if end is None or end > self.max_key:
            return self.max_key
        i = bisect_left(self._first_keys, end) - 1
        if i < 0:
            return None
        keys = self._block(i)[0]
        j = bisect_left(keys, end) - 1
        return keys[j] if j >= 0 else None

    def entries_between(self, start: bytes, end: bytes | None) -> int:
        """Estimates entries with ``start <= key < end`` (whole blocks; no I/O)."""
        i = max(0, bisect_right(self._first_keys, start) - 1)
        j = len(self._blocks) if end is None else bisect_left(self._first_keys, end)
        return max(1, sum(b[2] for b in self._blocks[i:j]))

    def iter_from(self, start: bytes, end: bytes | None = None) -> Iterator[Entry]:
        """Yields entries with ``start <= key < end`` in ascending order, lazily.

        Args:
            start: Inclusive lower bound.
            end: Exclusive upper bound or ``None``.
        """
        if (end is not None and end <= self.min_key) or start > self.max_key:
            return
        i = max(0, bisect_right(self._first_keys, start) - 1)
        nblocks = len(self._blocks)
        first = True
        while i < nblocks:
            if end is not None and self._first_keys[i] >= end:
                return
            keys, seqs, values = self._block(i)
            lo = bisect_left(keys, start) if first else 0
            first = False
            for j in range(lo, len(keys)):
                k = keys[j]
                if end is not None and k >= end:
                    return
                yield k, seqs[j], values[j]
            i += 1

    def info(self) -> TableInfo:
        """Returns the table's manifest description."""
        return TableInfo(
            self.key, self.size, self.entries, self.min_key, self.max_key, self.min_seq,
            self.max_seq,
        )
