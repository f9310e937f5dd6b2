"""K-way merges of sorted sources, the newest version of each key winning.

Each source holds ``(key, seq, value-or-None)`` entries in ascending key order with at
most one entry per key. Sequence numbers are unique within a DKV instance, so the entry
with the highest sequence number of a key is its newest version; older versions are
skipped, and a tombstone (value None) hides the older values of its key. Scans merge
into ``(key, value)`` pairs of live keys (``merge_live``, ``merge_spans_live``,
``merge_batches_live``); a compaction merges into columns of every key's newest
version, tombstones kept unless its plan drops them (``merge_spans_columns``). The C
functions of ``_native.c`` do the merging when built; the ``*_py`` functions here are
their references and the fallback.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import compress, islice
from operator import neg

from dkvstream.storage.dkv.native import NATIVE
from dkvstream.storage.dkv.sstable import block_range_py

# A scan batch: parallel lists of keys (ascending, unique), sequence numbers and values
# (None = tombstone), as SSTable blocks decode.
ColumnBatch = tuple[list[bytes], list[int], "list[bytes | None]"]


def merge_live_py(parts: list[tuple]) -> list[tuple[bytes, bytes]]:
    """Merges slices of column batches: each key once, ascending, with the value of its
    highest sequence number; keys whose newest version is a tombstone are dropped.
    Pure-Python reference of ``_native.merge_live``.

    Args:
        parts: ``(keys, seqs, values, lo, hi)``: a ``ColumnBatch`` and the slice
            ``[lo, hi)`` of it to merge; or a ``ColumnBatch`` alone (all of it).

    Returns:
        ``(key, value)`` pairs.
    """
    chunk = sorted(
        e for keys, seqs, values, lo, hi in (p if len(p) == 5 else (*p, 0, len(p[0])) for p in parts)
        for e in zip(keys[lo:hi], seqs[lo:hi], values[lo:hi])
    )
    newest = {k: v for k, _s, v in chunk}  # ascending (key, seq): the newest comes last
    return [kv for kv in newest.items() if kv[1] is not None]


merge_live = NATIVE.merge_live if NATIVE is not None else merge_live_py

# The consecutive data blocks of one table a short scan reads in place: decompressed
# bytes (``sstable.py``, ``raw_block``), their entry counts per the sparse index, and the
# ``[start, end)`` to read of them (``end`` None: no bound).
BlockSpan = tuple[list[bytes], list[int], bytes, "bytes | None"]


def merge_spans_live_py(parts: list[tuple], spans: list[BlockSpan]) -> list[tuple[bytes, bytes]]:
    """``merge_live_py`` over ``parts`` plus one source per span: the in-range entries of
    its blocks, in order. Pure-Python reference of ``_native.merge_spans_live``, which
    reads the blocks in place and builds objects only for the pairs it returns.

    Args:
        parts: As ``merge_live_py`` (e.g. memtable ranges).
        spans: ``(raws, counts, start, end)`` per table.

    Returns:
        ``(key, value)`` pairs, ascending, newest version per key, tombstones dropped.

    Raises:
        ValueError: A block is malformed (as ``sstable.decode_block_py``), or a span's
            keys do not ascend across its blocks.
    """
    return merge_live_py(list(parts) + _span_batches(spans))


def _span_batches(spans: list[BlockSpan]) -> list[ColumnBatch]:
    """Each span's in-range entries as one ``ColumnBatch``.

    Raises:
        ValueError: As ``merge_spans_live_py``.
    """
    out = []
    for i, (raws, counts, start, end) in enumerate(spans):
        keys: list[bytes] = []
        seqs: list[int] = []
        values: list[bytes | None] = []
        for raw, n in zip(raws, counts, strict=True):
            k, s, v = block_range_py(raw, n, start, end)
            if k and keys and keys[-1] >= k[0]:
                raise ValueError(f"span {i}: keys out of order across blocks")
            keys += k
            seqs += s
            values += v
        out.append((keys, seqs, values))
    return out


merge_spans_live = NATIVE.merge_spans_live if NATIVE is not None else merge_spans_live_py


def merge_spans_columns_py(parts: list[tuple], spans: list[BlockSpan], drop_tombstones: bool) -> ColumnBatch:
    """The merge of ``merge_spans_live_py`` as columns, tombstones kept unless
    ``drop_tombstones``: a compaction's merge of one key range. Pure-Python reference of
    ``_native.merge_spans_columns``.

    Every entry becomes a ``(key, -seq, value)`` row and one ``list.sort`` (timsort
    merges the sorted sources; ``(key, -seq)`` is unique, so values are never compared)
    puts each key's newest version first.

    Args:
        parts: As ``merge_live_py``.
        spans: ``(raws, counts, start, end)`` per table.
        drop_tombstones: Leave out keys whose newest version is a tombstone.

    Returns:
        ``(keys, seqs, values)``: each key once, ascending, with the sequence number and
        value (None: tombstone) of its newest version.

    Raises:
        ValueError: As ``merge_spans_live_py``.
    """
    rows: list[tuple[bytes, int, bytes | None]] = []
    for p in list(parts) + _span_batches(spans):
        keys, seqs, values, lo, hi = p if len(p) == 5 else (*p, 0, len(p[0]))
        rows += zip(keys[lo:hi], map(neg, seqs[lo:hi]), values[lo:hi])
    if not rows:
        return [], [], []
    rows.sort()
    keys = [r[0] for r in rows]
    # A key's newest version sorts first: keep rows whose key differs from the previous.
    rows = [rows[0], *compress(islice(rows, 1, None), map(bytes.__ne__, islice(keys, 1, None), keys))]
    if drop_tombstones:
        rows = [r for r in rows if r[2] is not None]
    return [r[0] for r in rows], [-r[1] for r in rows], [r[2] for r in rows]


merge_spans_columns = NATIVE.merge_spans_columns if NATIVE is not None else merge_spans_columns_py


def merge_batches_live(sources: list[Iterator[ColumnBatch]]) -> Iterator[tuple[bytes, bytes]]:
    """Each key once, ascending, with the value of its newest version, tombstones
    dropped: the merge of sources that yield sorted ``ColumnBatch``es.

    Works a chunk at a time: the bound is the smallest last key among the sources' current
    batches; every entry up to it (from all sources) is in hand, so all versions of those
    keys are, and ``merge_live`` folds them in one C call instead of a heap step per
    entry. Lazy at batch (block) granularity. Each source yields ascending keys, one entry
    per key, across all its batches; ``(key, seq)`` pairs are unique.
    """
    cur: list[list] = []  # [keys, seqs, values, position, iterator] per live source
    for it in sources:
        it = iter(it)
        for b in it:
            if b[0]:
                cur.append([*b, 0, it])
                break
    while cur:
        if len(cur) == 1:
            keys, seqs, values, pos, it = cur[0]
            while True:
                yield from merge_live([(keys, seqs, values, pos, len(keys))])
                b = next(it, None)
                if b is None:
                    return
                keys, seqs, values = b
                pos = 0
        bound = min([c[0][-1] for c in cur])
        parts = []
        nxt = []
        for c in cur:
            keys, seqs, values, pos, it = c
            if keys[-1] <= bound:
                parts.append((keys, seqs, values, pos, len(keys)))
                for b in it:
                    if b[0]:
                        c[0], c[1], c[2] = b
                        c[3] = 0
                        nxt.append(c)
                        break
            else:
                j = bisect_right(keys, bound, pos)
                if j > pos:
                    parts.append((keys, seqs, values, pos, j))
                    c[3] = j
                nxt.append(c)
        cur = nxt
        yield from merge_live(parts)
