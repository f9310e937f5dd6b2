"""Sparse per-chunk indexes: offset index and time index, searched Kafka's way.

Each chunk (one topic-partition inside a segment file) carries two indexes, written
one entry per ``index.interval.bytes`` (default 4096) of batches, as Kafka's
``OffsetIndex`` / ``TimeIndex`` do (seed ``kafka-index-binary-search.txt``):

* offset index: 8-byte entries ``(relative offset u32, position u32)``: the first
  record of a batch and the batch's byte position relative to the chunk start;
* time index: 12-byte entries ``(timestamp i64, relative offset u32)``: every record
  before ``relative offset`` has a timestamp <= ``timestamp``; entries are strictly
  increasing in both fields (an entry is only added when the maximum grows).

Lookups use Kafka's warm/cold binary search (``AbstractIndex.indexSlotRangeFor``): the
last ``8192 // entry_size`` entries (8 KiB, two 4 KiB pages) are the *warm* section that
tail lookups (consumers near the end) always hit; a target at or above the first warm
entry is searched there only, anything else in the cold section. A tail lookup thus
touches the same few pages whatever the index size, and those pages stay cached.
``pages`` (a set) collects the 4 KiB pages touched, for ``bench/log_index.py``.

Both indexes are little-endian numpy structured arrays; ``from_bytes`` checks the
length is a whole number of entries.
"""
from __future__ import annotations

import numpy as np

from dkvstream.storage.errors import CorruptionError

PAGE_BYTES = 4096
WARM_BYTES = 8192
OFFSET_ENTRY = np.dtype([("offset", "<u4"), ("position", "<u4")])
TIME_ENTRY = np.dtype([("timestamp", "<i8"), ("offset", "<u4")])


def _largest_at_most(keys: np.ndarray, target: int, entry_size: int, strict: bool,
                     pages: set[int] | None) -> int:
    """Slot of the largest key <= target (< target if ``strict``), or -1; warm/cold search."""
    n = len(keys)
    if n == 0:
        return -1

    def before(i: int) -> bool:  # key[i] is on the "found" side of target
        if pages is not None:
            pages.add(i * entry_size // PAGE_BYTES)
        k = int(keys[i])
        return k < target if strict else k <= target

    warm = WARM_BYTES // entry_size
    first_warm = max(0, n - warm)
    # Kafka: search the warm section if the target is at/after its first entry.
    if first_warm > 0 and before(first_warm):
        lo, hi = first_warm, n - 1
    else:
        if not before(0):
            return -1
        lo, hi = 0, (first_warm - 1 if first_warm > 0 else n - 1)
    while lo < hi:  # invariant: before(lo) holds
        mid = (lo + hi + 1) // 2
        if before(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _SparseIndex:
    """Entries of one fixed-size dtype over a byte buffer (no copy)."""

    dtype: np.dtype
    kind: str

    def __init__(self, entries: np.ndarray) -> None:
        self.entries = entries

    @property
    def entry_size(self) -> int:
        """Bytes per entry."""
        return self.dtype.itemsize

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, where: str):
        """Decodes an index.

        Raises:
            CorruptionError: the length is not a whole number of entries (names ``where``).
        """
        if len(data) % cls.dtype.itemsize:
            raise CorruptionError(f"{where}: {cls.kind} of {len(data)} bytes is not whole entries")
        return cls(np.frombuffer(data, cls.dtype))

    def __len__(self) -> int:
        return len(self.entries)


class OffsetIndex(_SparseIndex):
    """Relative offset -> byte position, for one chunk (8-byte entries)."""

    dtype, kind = OFFSET_ENTRY, "offset index"

    def lookup(self, rel_offset: int, pages: set[int] | None = None) -> tuple[int, int]:
        """The entry with the largest offset <= ``rel_offset``.

        Returns:
            ``(relative offset, position)``; ``(0, 0)`` when the target precedes every
            entry (scan from the chunk start).
        """
        i = _largest_at_most(self.entries["offset"], rel_offset, self.entry_size, False, pages)
        if i < 0:
            return 0, 0
        e = self.entries[i]
        return int(e["offset"]), int(e["position"])


class TimeIndex(_SparseIndex):
    """Timestamp -> relative offset, for one chunk (12-byte entries; module docstring)."""

    dtype, kind = TIME_ENTRY, "time index"

    def lookup(self, timestamp: int, pages: set[int] | None = None) -> int:
        """Relative offset to start scanning from for the first record with ts >= ``timestamp``.

        Takes the entry with the largest timestamp strictly below the target (every
        record before its offset is older than the target, so none of them can be the
        answer). Kafka's ``TimeIndex.lookup`` takes <=, which can skip an earlier record
        with an equal timestamp; strict keeps ``offsets_for_times`` equal to a linear scan.

        Returns:
            A relative offset (0 when no entry is below the target).
        """
        i = _largest_at_most(self.entries["timestamp"], timestamp, self.entry_size, True, pages)
        return 0 if i < 0 else int(self.entries[i]["offset"])


class IndexBuilder:
    """Builds both indexes while batches are appended to a chunk.

    Args:
        interval_bytes: ``index.interval.bytes``: bytes of batches between entries.
    """

    def __init__(self, interval_bytes: int = 4096) -> None:
        self.interval_bytes = interval_bytes
        self._offsets: list[tuple[int, int]] = []
        self._times: list[tuple[int, int]] = []
        self._since = 0
        self._max_ts: int | None = None
        self._written = 0

    def add_batch(self, first_delta: int, position: int, size: int, max_ts: int) -> None:
        """Records a batch about to be appended at ``position`` (relative to the chunk)."""
        if self._written and self._since >= self.interval_bytes:
            self._offsets.append((first_delta, position))
            if self._max_ts is not None and (not self._times or self._max_ts > self._times[-1][0]):
                self._times.append((self._max_ts, first_delta))
            self._since = 0
        self._since += size
        self._written += 1
        self._max_ts = max_ts if self._max_ts is None else max(self._max_ts, max_ts)

    def offset_index_bytes(self) -> bytes:
        """Encoded offset index."""
        return np.array(self._offsets, OFFSET_ENTRY).tobytes()

    def time_index_bytes(self) -> bytes:
        """Encoded time index."""
        return np.array(self._times, TIME_ENTRY).tobytes()
