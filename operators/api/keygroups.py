"""Key groups: the fixed unit of state partitioning (Flink's term).

A key's key group is ``xxh3_64(key) mod K`` with K fixed per job (default 256). The hash
is stable across processes, platforms and Python versions (never Python's ``hash``), so a
key lands in the same key group on every run and after a restart.

A job with parallelism P splits ``0..K-1`` into P contiguous ranges, as Flink's
``KeyGroupRangeAssignment`` does: range ``i`` is ``[ceil(i*K/P), ceil((i+1)*K/P))``, so
key group ``g`` belongs to range ``g*P//K``. Each range is
owned by one Spark task and one DKV instance. Every DKV key starts with the 2-byte
big-endian key group, so one range is one contiguous DKV key interval.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

DEFAULT_KEY_GROUPS = 256
MAX_KEY_GROUPS = 1 << 15

_KG = struct.Struct(">H")


def key_group_of(key: bytes, key_groups: int) -> int:
    """Return the key group of ``key``.

    Args:
        key: the subject key bytes.
        key_groups: K, the job's number of key groups.

    Returns:
        An int in ``[0, key_groups)``.
    """
    return xxhash.xxh3_64_intdigest(key) % key_groups


def key_groups_of(keys: list[bytes], key_groups: int) -> np.ndarray:
    """Vector form of :func:`key_group_of` for a batch of keys (int32 array)."""
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(k) % key_groups for k in keys), dtype=np.int32, count=len(keys))


def key_groups_of_column(keys: pa.Array | pa.ChunkedArray, key_groups: int) -> np.ndarray:
    """:func:`key_groups_of` for an Arrow binary column, hashing each distinct key once
    when keys repeat.

    An epoch's events often repeat their keys (the flights job: ~200 routes in 50,000
    events); there the column is dictionary-encoded in one C pass and only its distinct
    keys are hashed: 1.4-1.9 ms instead of 8-14 ms per 50,000 events. Where keys barely
    repeat, the encoding costs more than it saves (1,000,000 distinct keys: 633 ms
    against 305 ms), so the first ``_SAMPLE`` keys decide: the dictionary when at most a
    quarter of them are distinct, else one hash per event.

    Args:
        keys: the subject keys (binary, no nulls), one per event.
        key_groups: K, the job's number of key groups.

    Returns:
        An int32 array, element i the key group of ``keys[i]``.

    Raises:
        TypeError: a key is null (``xxhash`` hashes bytes only).
    """
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int32)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    sample = keys.slice(0, _SAMPLE)
    if len(pc.unique(sample)) * 4 > len(sample):
        return key_groups_of(keys.to_pylist(), key_groups)
    encoded = pc.dictionary_encode(keys)
    per_distinct = key_groups_of(encoded.dictionary.to_pylist(), key_groups)
    return per_distinct[encoded.indices.to_numpy(zero_copy_only=False)]


_SAMPLE = 4096


def key_group_prefix(key_group: int) -> bytes:
    """The 2-byte big-endian prefix every DKV key of ``key_group`` starts with."""
    return _KG.pack(key_group)


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """A contiguous range of key groups ``[start, end)`` owned by one task.

    Attributes:
        start: first key group (inclusive).
        end: last key group (exclusive).
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= MAX_KEY_GROUPS:
            raise ValueError(f"invalid key group range [{self.start}, {self.end})")

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group < self.end

    def __iter__(self):
        return iter(range(self.start, self.end))

    @property
    def label(self) -> str:
        """A stable name for paths, e.g. ``kg-0000-0127`` (inclusive bounds)."""
        return f"kg-{self.start:04d}-{self.end - 1:04d}"

    @classmethod
    def from_label(cls, label: str) -> KeyGroupRange:
        """The range a ``label`` names (``kg-0000-0127`` -> ``[0, 128)``).

        Raises:
            ValueError: not a range label.
        """
        prefix, _, rest = label.partition("-")
        first, _, last = rest.partition("-")
        if prefix != "kg" or not first.isdigit() or not last.isdigit():
            raise ValueError(f"not a key-group range label: {label!r}")
        return cls(int(first), int(last) + 1)

    @property
    def key_interval(self) -> tuple[bytes, bytes]:
        """The DKV key interval ``[lo, hi)`` that holds exactly this range's keys."""
        return key_group_prefix(self.start), key_group_prefix(self.end)


def key_group_ranges(key_groups: int, parallelism: int) -> list[KeyGroupRange]:
    """Split ``0..key_groups-1`` into ``parallelism`` contiguous ranges.

    Args:
        key_groups: K, at least ``parallelism``.
        parallelism: P, the number of tasks.

    Returns:
        P ranges covering every key group once, in ascending order.

    Raises:
        ValueError: if P < 1 or P > K.
    """
    if not 1 <= parallelism <= key_groups:
        raise ValueError(f"parallelism {parallelism} must be in [1, key_groups={key_groups}]")
    return [
        KeyGroupRange(_ceil_div(i * key_groups, parallelism), _ceil_div((i + 1) * key_groups, parallelism))
        for i in range(parallelism)
    ]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def range_index_of(key_group: int, key_groups: int, parallelism: int) -> int:
    """Index of the range (in :func:`key_group_ranges` order) that owns ``key_group``."""
    return key_group * parallelism // key_groups


def range_indexes_of(key_group_array: np.ndarray, key_groups: int, parallelism: int) -> np.ndarray:
    """Vector form of :func:`range_index_of` (int32 array)."""
    return (key_group_array.astype(np.int64) * parallelism // key_groups).astype(np.int32)
