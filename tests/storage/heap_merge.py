"""The lazy heap merge of entry iterators, one Python step per entry: the oracle the
DKV merges (``storage/dkv/merge.py``) and the compaction are tested against."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

Entry = tuple[bytes, int, "bytes | None"]


def merge_newest(sources: Iterable[Iterable[Entry]]) -> Iterator[Entry]:
    """Merges sources, yielding only the newest entry per key (tombstones included).

    Args:
        sources: Entry streams, each ascending by key with at most one entry per key;
            sequence numbers unique across sources.

    Yields:
        Entries in ascending key order, one per key: the one with the highest sequence
        number.
    """
    iters = [iter(s) for s in sources]
    # Heap items are (key, -seq, value, source): (key, -seq) is unique, so comparison never
    # reaches the value.
    heap = []
    for i, it in enumerate(iters):
        e = next(it, None)
        if e is not None:
            heap.append((e[0], -e[1], e[2], i))
    heapq.heapify(heap)
    last: bytes | None = None
    while heap:
        k, nseq, v, i = heap[0]
        e = next(iters[i], None)
        if e is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (e[0], -e[1], e[2], i))
        if k != last:
            last = k
            yield k, -nseq, v


def live_only(entries: Iterable[Entry]) -> Iterator[tuple[bytes, bytes]]:
    """Drops tombstones and sequence numbers: yields ``(key, value)``."""
    for k, _seq, v in entries:
        if v is not None:
            yield k, v
