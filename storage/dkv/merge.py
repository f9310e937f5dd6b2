"""K-way merge of sorted entry streams, newest version of each key first.

Each source yields ``(key, seq, value-or-None)`` in ascending key order with at most one
entry per key. Sequence numbers are unique within a DKV instance, so ordering the heap by
``(key, -seq)`` puts the newest version of a key first; older versions are skipped. The
merge is lazy: it pulls one entry per source at a time (blocks load on demand).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from operator import itemgetter

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


_key = itemgetter(0)


def merge_batches_live(sources: list[Iterator[list[Entry]]]) -> Iterator[tuple[bytes, bytes]]:
    """``live_only(merge_newest(...))`` over sources that yield sorted *batches* of entries.

    Works a chunk at a time: the bound is the smallest last key among the sources' current
    batches; every entry up to it (from all sources) is in hand, so all versions of those
    keys are. The chunk is sorted by ``(key, seq)`` and folded into a dict (the newest
    version of a key comes last and wins; dict order stays ascending) in C, instead of a
    heap step per entry. Lazy at batch (block) granularity. Each source yields ascending
    keys, one entry per key, across all its batches; ``(key, seq)`` pairs are unique.
    """
    cur: list[list] = []  # [current batch (non-empty), iterator]
    for it in sources:
        it = iter(it)
        for b in it:
            if b:
                cur.append([b, it])
                break
    while cur:
        if len(cur) == 1:
            b, it = cur[0]
            while True:
                yield from [(k, v) for k, _s, v in b if v is not None]
                b = next(it, None)
                if b is None:
                    return
        bound = min([c[0][-1][0] for c in cur])
        chunk: list[Entry] = []
        nxt = []
        for c in cur:
            b = c[0]
            if b[-1][0] <= bound:
                chunk += b
                for nb in c[1]:
                    if nb:
                        c[0] = nb
                        nxt.append(c)
                        break
            else:
                j = bisect_right(b, bound, key=_key)
                if j:
                    chunk += b[:j]
                    c[0] = b[j:]
                nxt.append(c)
        cur = nxt
        chunk.sort()
        newest = {k: v for k, _s, v in chunk}
        if None in newest.values():
            yield from [kv for kv in newest.items() if kv[1] is not None]
        else:
            yield from newest.items()
