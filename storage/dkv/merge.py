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


def merge_newest(sources: Iterable[Iterable[Entry]]) -> Iterator[Entry]:
    """Merges sources, yielding only the newest entry per key (tombstones included).

    Args:
        sources: Sorted entry streams.

    Yields:
        Entries in ascending key order, one per key.
    """
    iters = [iter(s) for s in sources]
    if len(iters) == 1:
        yield from iters[0]
        return
    # Heap items are (key, -seq, value, source): (key, -seq) is unique, so comparison never
    # reaches the value, and tuple comparison runs in C (no key function).
    heap = []
    for i, it in enumerate(iters):
        e = next(it, None)
        if e is not None:
            heap.append((e[0], -e[1], e[2], i))
    heapq.heapify(heap)
    last: bytes | None = None
    replace = heapq.heapreplace
    pop = heapq.heappop
    while heap:
        k, nseq, v, i = heap[0]
        e = next(iters[i], None)
        if e is None:
            pop(heap)
        else:
            replace(heap, (e[0], -e[1], e[2], i))
        if k != last:
            last = k
            yield k, -nseq, v


def live_only(entries: Iterable[Entry]) -> Iterator[tuple[bytes, bytes]]:
    """Drops tombstones and sequence numbers: yields ``(key, value)``."""
    for k, _seq, v in entries:
        if v is not None:
            yield k, v
