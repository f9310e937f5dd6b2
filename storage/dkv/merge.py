"""K-way merge of sorted entry streams, newest version of each key first.

Each source yields ``(key, seq, value-or-None)`` in ascending key order with at most one
entry per key. Sequence numbers are unique within a DKV instance, so ordering the heap by
``(key, -seq)`` puts the newest version of a key first; older versions are skipped. The
merge is lazy: it pulls one entry per source at a time (blocks load on demand).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

Entry = tuple[bytes, int, "bytes | None"]


def _order(e: Entry) -> tuple[bytes, int]:
    return e[0], -e[1]


def merge_newest(sources: Iterable[Iterable[Entry]]) -> Iterator[Entry]:
    """Merges sources, yielding only the newest entry per key (tombstones included).

    Args:
        sources: Sorted entry streams.

    Yields:
        Entries in ascending key order, one per key.
    """
    srcs = list(sources)
    if len(srcs) == 1:
        yield from srcs[0]
        return
    last: bytes | None = None
    for e in heapq.merge(*srcs, key=_order):
        k = e[0]
        if k != last:
            last = k
            yield e


def live_only(entries: Iterable[Entry]) -> Iterator[tuple[bytes, bytes]]:
    """Drops tombstones and sequence numbers: yields ``(key, value)``."""
    for k, _seq, v in entries:
        if v is not None:
            yield k, v
