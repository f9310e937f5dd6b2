"""The memtable: recently written entries, in memory, readable in key order.

Layout: a ``dict`` maps ``key -> (seq, value)`` where ``value is None`` marks a tombstone.
Point reads and writes are one dict operation. Ordered reads use a list of the keys that
is sorted lazily: keys inserted since the last ordered read wait in ``_pending`` and are
merged in on the next scan (``insort`` for a few, one timsort over two sorted runs for
many). A stream operator does far more puts/gets than scans, so this keeps the hot path at
dict speed while a scan costs O(new keys) amortized.

A memtable holds one version per key (the newest); older versions it replaced are gone,
which is the "natural compaction" of memtables. Not thread-safe; owned by one DKV.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence
from operator import itemgetter

from dkvstream.storage.dkv.native import NATIVE

# Rough per-entry cost of the dict slot, tuple and int, so that many tiny entries still
# trigger a flush (bytes).
ENTRY_OVERHEAD = 64

Entry = tuple[bytes, int, "bytes | None"]  # (key, seq, value or None for a tombstone)
_first, _second = itemgetter(0), itemgetter(1)


class Memtable:
    """A mutable sorted map of ``key -> (seq, value | None)``."""

    __slots__ = ("_d", "_keys", "_pending", "approx_bytes", "max_seq", "min_seq")

    def __init__(self) -> None:
        self._d: dict[bytes, tuple[int, bytes | None]] = {}
        self._keys: list[bytes] = []
        self._pending: list[bytes] = []
        self.approx_bytes = 0
        self.min_seq = 0  # 0 = empty
        self.max_seq = 0

    def __len__(self) -> int:
        return len(self._d)

    def put(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Records ``key -> value`` at ``seq`` (``value=None`` records a delete).

        REQUIRES: ``seq`` is greater than every seq already in this memtable.
        """
        d = self._d
        old = d.get(key)
        d[key] = (seq, value)
        if old is None:
            self._pending.append(key)
            vlen = len(value) if value is not None else 0
            self.approx_bytes += len(key) + vlen + ENTRY_OVERHEAD
        else:
            self.approx_bytes += (len(value) if value is not None else 0) - (
                len(old[1]) if old[1] is not None else 0
            )
        if not self.min_seq:
            self.min_seq = seq
        self.max_seq = seq

    def put_batch(self, keys: Sequence[bytes], seqs: Sequence[int], values: Sequence[bytes | None]) -> None:
        """Records many writes at once: write i is ``keys[i] -> values[i]`` at ``seqs[i]``
        (None records a delete); a key written twice keeps its later write. Same result
        as ``put`` per write, with one ``dict.update`` instead of a call per write.

        REQUIRES: ``seqs`` ascending, and above every seq already in this memtable.
        """
        if not keys:
            return
        d = self._d
        n = len(keys)
        if NATIVE is not None and n > 1 and seqs[-1] - seqs[0] == n - 1:  # consecutive: one C loop
            new, delta = NATIVE.memtable_put(d, list(keys), seqs[0], list(values), ENTRY_OVERHEAD)
            if new:
                self._pending += new
            self.approx_bytes += delta
            if not self.min_seq:
                self.min_seq = seqs[0]
            self.max_seq = seqs[-1]
            return
        olds = list(map(d.get, keys))
        new = [k for k, o in zip(keys, olds) if o is None]
        if len(new) < len(keys):
            old_bytes = sum([len(o[1]) for o in olds if o is not None and o[1] is not None])
        else:
            old_bytes = 0
        d.update(zip(keys, zip(seqs, values)))
        if new:
            if len(d) - (len(self._keys) + len(self._pending)) != len(new):
                new = list(dict.fromkeys(new))  # a new key written twice in this batch
            self._pending += new
        self.approx_bytes += (sum(map(len, new)) + ENTRY_OVERHEAD * len(new)
                              + sum([len(v) for v in values if v is not None]) - old_bytes)
        if not self.min_seq:
            self.min_seq = seqs[0]
        self.max_seq = seqs[-1]

    def discard(self, keys: Sequence[bytes]) -> int:
        """Removes ``keys`` outright, leaving no tombstone (a purge, ``purge.py``): reads
        then fall through to the tables. ``min_seq``/``max_seq`` stay as bounds.

        Returns:
            How many of ``keys`` were present.
        """
        d = self._d
        gone = {k for k in keys if k in d}
        for k in gone:
            v = d.pop(k)[1]
            self.approx_bytes -= len(k) + (0 if v is None else len(v)) + ENTRY_OVERHEAD
        if gone:
            self._keys = [k for k in self._sorted_keys() if k not in gone]
        return len(gone)

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """Looks up ``key``.

        Returns:
            One of three results:
            * ``(seq, value)``: the key's newest value is here;
            * ``(seq, None)``: the key was deleted here (a tombstone hides older tables);
            * ``None``: this memtable knows nothing about the key; look further.
        """
        return self._d.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[tuple[int, bytes | None] | None]:
        """``get`` of every key, in order, as one list (one C-level pass of lookups).

        Args:
            keys: The keys (``bytes``).

        Returns:
            One result per key, each one of ``get``'s three.
        """
        return list(map(self._d.get, keys))

    def get_values(self, keys: Sequence[bytes]) -> tuple[list[bytes | None], list[int]]:
        """This memtable's answer for every key, and which keys to look up further.

        Args:
            keys: The keys (``bytes``), any order, repeats allowed.

        Returns:
            ``(values, missing)``: ``values[i]`` is the value of ``keys[i]``, None for a
            tombstone or a key not held; ``missing`` the ascending indices of the keys
            this memtable knows nothing about. One C loop when built
            (``_native.memtable_get_many``), else ``get_values_py``.
        """
        if NATIVE is not None:
            return NATIVE.memtable_get_many(self._d, keys if type(keys) is list else list(keys))
        return get_values_py(self._d, keys)

    def _sorted_keys(self) -> list[bytes]:
        pending = self._pending
        if pending:
            keys = self._keys
            if len(pending) < 16:
                for k in pending:
                    insort(keys, k)
            elif NATIVE is not None:
                NATIVE.sort_bytes(pending)  # a C comparison per step, not a rich compare
                if keys:
                    keys.extend(pending)
                    keys.sort()  # timsort merges the two sorted runs in linear time
                else:  # the first ordered read (a flush): nothing to merge with
                    self._keys = pending
            else:
                keys.extend(pending)
                keys.sort()
            self._pending = []
        return self._keys

    def range(self, start: bytes, end: bytes | None) -> list[Entry]:
        """Returns the entries with ``start <= key < end`` as a snapshot list, ascending.

        A snapshot (not a live view) so callers may write while iterating a scan.

        Args:
            start: Inclusive lower bound.
            end: Exclusive upper bound, or ``None`` for no bound.
        """
        keys = self._sorted_keys()
        lo = bisect_left(keys, start)
        hi = len(keys) if end is None else bisect_left(keys, end, lo)
        d = self._d
        return [(k, *d[k]) for k in keys[lo:hi]]

    def range_columns(
        self, start: bytes, end: bytes | None
    ) -> tuple[list[bytes], list[int], list[bytes | None]]:
        """Like ``range`` but as parallel lists ``(keys, seqs, values)`` (a scan batch)."""
        keys = self._sorted_keys()
        lo = bisect_left(keys, start)
        hi = len(keys) if end is None else bisect_left(keys, end, lo)
        keys = keys[lo:hi]
        return (keys, *self._columns_of(keys))

    def _columns_of(self, keys: list[bytes]) -> tuple[list[int], list[bytes | None]]:
        """``(seqs, values)`` of ``keys`` (all present), in order: one C loop with one
        dict lookup per key when built (``_native.memtable_columns``)."""
        if NATIVE is not None:
            return NATIVE.memtable_columns(self._d, keys)
        return columns_py(self._d, keys)

    def columns(self) -> tuple[list[bytes], list[int], list[bytes | None]]:
        """Every entry in ascending key order as parallel lists ``(keys, seqs, values)``
        (used to write an SSTable with ``SSTableBuilder.add_columns``)."""
        keys = self._sorted_keys()
        if not keys:
            return [], [], []
        return (list(keys), *self._columns_of(keys))

    def entries(self) -> Iterator[Entry]:
        """Yields every entry in ascending key order (used to write an SSTable)."""
        d = self._d
        for k in self._sorted_keys():
            seq, value = d[k]
            yield k, seq, value


def columns_py(d: dict[bytes, tuple[int, bytes | None]], keys: Sequence[bytes]) -> tuple[list[int], list[bytes | None]]:
    """``(seqs, values)`` of ``keys`` in the memtable dict ``d`` (pure-Python reference of
    ``_native.memtable_columns``).

    Raises:
        KeyError: a key is not in ``d``.
    """
    entries = list(map(d.__getitem__, keys))
    return list(map(_first, entries)), list(map(_second, entries))


def get_values_py(d: dict[bytes, tuple[int, bytes | None]],
                  keys: Sequence[bytes]) -> tuple[list[bytes | None], list[int]]:
    """``Memtable.get_values`` over the memtable dict ``d`` (pure-Python reference of
    ``_native.memtable_get_many``)."""
    found = list(map(d.get, keys))
    return [None if e is None else e[1] for e in found], [i for i, e in enumerate(found) if e is None]
