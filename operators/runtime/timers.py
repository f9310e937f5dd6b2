"""Timers, stored in DKV so they survive checkpoints and restarts: event-time timers
and processing-time timers, one ``TimerService`` per time domain (``Timers``).

DKV key layout of a timer (no value; docs/design.md, "Key groups and keys")::

    key_group   u16 big-endian
    schema      u8  = 0x01 (event time) or 0x04 (processing time)
    timestamp   u64 big-endian, ms + 2**63  (so negative times sort first)
    key         rest: the subject key

The two domains differ only in the schema byte, so processing-time timers move with
their key group on a rescale exactly as event-time timers and state do (a range's key
interval holds every schema of its key groups).

Putting the timestamp before the subject key makes ``scan_prefix(key_group | schema)``
return a key group's timers in time order (the seed's timer query), so finding the due
timers of a range is one short scan per key group that stops at the first timer past
the watermark.
"""
from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dkvstream.operators.api.operator import TimeDomain
from dkvstream.operators.api.state import SCHEMA_PROCESSING_TIMER, SCHEMA_TIMER, StateStore
from dkvstream.storage.dkv.db import prefix_successor

_U16 = struct.Struct(">H")
_TS = struct.Struct(">Q")
_OFFSET = 1 << 63
_NONE_STORED = 1 << 64  # the lower bound when no timer is stored: above every timestamp


# The schema byte of each time domain's timers.
SCHEMAS = {TimeDomain.EVENT_TIME: SCHEMA_TIMER, TimeDomain.PROCESSING_TIME: SCHEMA_PROCESSING_TIMER}


def timer_key(key_group: int, timestamp: int, key: bytes, schema: int = SCHEMA_TIMER) -> bytes:
    """The DKV key of the timer of ``key`` at ``timestamp`` (ms); ``schema``: its time
    domain's schema byte (``SCHEMAS``)."""
    return _U16.pack(key_group) + bytes((schema,)) + _TS.pack(timestamp + _OFFSET) + key


def decode_timer_key(dkv_key: bytes, schema: int = SCHEMA_TIMER) -> tuple[int, int, bytes]:
    """Split a timer's DKV key into (key group, timestamp ms, subject key).

    Raises:
        ValueError: not a timer key of the domain whose schema byte is ``schema``.
    """
    if len(dkv_key) < 11 or dkv_key[2] != schema:
        raise ValueError(f"not a timer key: {dkv_key!r}")
    return _U16.unpack_from(dkv_key, 0)[0], _TS.unpack_from(dkv_key, 3)[0] - _OFFSET, dkv_key[11:]


def timer_keys(key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes],
               schema: int = SCHEMA_TIMER) -> list[bytes]:
    """``timer_key`` of every row (aligned sequences), without a call per row."""
    heads = {kg: _U16.pack(kg) + bytes((schema,)) for kg in set(key_groups)}
    return [heads[kg] + (ts + _OFFSET).to_bytes(8, "big") + k for kg, ts, k in zip(key_groups, timestamps, keys)]


class TimerService:
    """Timers of one time domain of one task's key groups.

    Args:
        db: the task's DKV instance.
        key_groups: the key groups this task owns.
        schema: the domain's schema byte (``SCHEMAS``; event time by default).

    Timers are written to DKV on ``set`` (deduplicated in memory within an epoch, so
    an operator may set the same timer on every event at the cost of a set lookup).
    ``due`` pops timers in (timestamp, key group, key) order up to a watermark,
    including timers set while earlier ones are being handled; ``pop_due`` returns the
    due timers at once, for the vectorised form.

    Due passes without a scan: the service keeps a lower bound of the stored timers'
    timestamps (``low``): a due pass removes every timer at or below its watermark and
    reads each key group's first timer past it, so afterwards the bound is the earliest
    timer left; ``set`` lowers it. While the
    watermark stays below the bound nothing can be due and the pass reads nothing (Flink's
    RocksDB timer queue caches its head for the same reason). A new service does not know
    the bound and scans once; a task that reuses its range's open DKV reuses the service
    with it (``dkvstream.operators.runtime.open_state``), so a job whose timers are hours ahead of the
    watermark scans once per restart, not once per epoch.

    Order without a heap entry per timer: a due pass reads each key group's timers up
    to the watermark (one bounded scan each; they come in (timestamp, key) order), and
    sorts them once by (timestamp, key group, position in the scan) with numpy. Only
    timers set *while* firing, at or below the watermark, go to a small heap that is
    merged with that sorted list.
    """

    def __init__(self, db: StateStore, key_groups: Iterable[int], schema: int = SCHEMA_TIMER) -> None:
        self._db = db
        self._schema = schema
        self._key_groups = list(key_groups)
        self._set_this_epoch: set[bytes] = set()
        self._heap: list[tuple[int, int, bytes]] = []  # timers set while firing
        self._queued: set[tuple[int, int, bytes]] = set()  # due and not yet fired/deleted
        self._firing_until: int | None = None
        self.low: int | None = None  # every stored timer has timestamp >= low; None = unknown

    def begin_epoch(self) -> None:
        """Forgets the epoch's set-dedup memory (a reused service starts each task with it
        empty, as a new one does); the lower bound ``low`` stays valid."""
        self._set_this_epoch = set()

    def _lower(self, timestamp: int) -> None:
        if self.low is not None and timestamp < self.low:
            self.low = timestamp

    def set(self, key_group: int, timestamp: int, key: bytes) -> None:
        """Register a timer (idempotent)."""
        tk = timer_key(key_group, timestamp, key, self._schema)
        if tk in self._set_this_epoch:
            return
        self._set_this_epoch.add(tk)
        self._db.put(tk, b"")
        self._lower(timestamp)
        if self._firing_until is not None and timestamp <= self._firing_until:
            self._push((timestamp, key_group, key))

    def set_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None:
        """``set`` for every row of the aligned sequences, as one DKV write batch."""
        tks = timer_keys(key_groups, timestamps, keys, self._schema)
        seen = self._set_this_epoch
        new = list(dict.fromkeys(tk for tk in tks if tk not in seen))
        if not new:
            return
        seen.update(new)
        self._db.write_batch(new, [b""] * len(new))
        self._lower(min(timestamps))
        until = self._firing_until
        if until is not None:
            for kg, ts, key in zip(key_groups, timestamps, keys):
                if ts <= until:
                    self._push((ts, kg, key))

    def delete(self, key_group: int, timestamp: int, key: bytes) -> None:
        """Remove a timer; no error if absent."""
        tk = timer_key(key_group, timestamp, key, self._schema)
        self._set_this_epoch.discard(tk)
        self._db.delete(tk)
        self._queued.discard((timestamp, key_group, key))  # skipped if already listed

    def delete_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None:
        """``delete`` for every row, as one DKV write batch."""
        tks = timer_keys(key_groups, timestamps, keys, self._schema)
        self._set_this_epoch.difference_update(tks)
        self._db.write_batch(tks, [None] * len(tks))
        if self._queued:
            self._queued.difference_update(zip(timestamps, key_groups, keys))

    def undo(self, dkv_keys: Iterable[bytes], stored: Callable[[bytes], bool]) -> None:
        """Brings the in-memory bookkeeping back in line with DKV after the writes of one
        handler call were discarded (``dkvstream.operators.runtime.operator_errors``).

        Args:
            dkv_keys: every DKV key the discarded call wrote (state keys are ignored).
            stored: whether a timer's DKV key is stored now (without the call's writes).

        A discarded ``set`` must not stay in the set-dedup memory (a later ``set`` of the
        same timer would then write nothing), nor stay queued to fire in a running
        ``due`` pass; a discarded ``delete`` of a due timer queues it again. While ``due``
        runs, a timer at or below its watermark that is stored has not fired yet and is
        still ahead in the pass (fired timers are deleted before their handler runs), so
        "queued" is exactly "stored" for those. ``low`` stays: a lowered bound is still a
        lower bound.
        """
        until = self._firing_until
        for tk in dkv_keys:
            if len(tk) < 11 or tk[2] != self._schema:
                continue
            self._set_this_epoch.discard(tk)
            if until is None:
                continue
            kg, ts, key = decode_timer_key(tk, self._schema)
            if ts <= until:
                if stored(tk):
                    self._queued.add((ts, kg, key))
                else:
                    self._queued.discard((ts, kg, key))

    def _push(self, entry: tuple[int, int, bytes]) -> None:
        if entry not in self._queued:
            self._queued.add(entry)
            heapq.heappush(self._heap, entry)

    def _scan_due(self, watermark: int) -> tuple[list[bytes], list[int], list[int], list[bytes]]:
        """Every stored timer with timestamp <= ``watermark`` as columns ``(dkv keys,
        timestamps, key groups, subject keys)``, in (timestamp, key group, key) order."""
        if self.low is not None and watermark < self.low:
            return [], [], [], []
        tks: list[bytes] = []
        kgs: list[int] = []
        end_ts = (watermark + 1 + _OFFSET).to_bytes(8, "big") if watermark + 1 + _OFFSET < 1 << 64 else None
        low = _NONE_STORED
        for kg in self._key_groups:
            head = _U16.pack(kg) + bytes((self._schema,))
            last = prefix_successor(head)
            end = head + end_ts if end_ts is not None else last
            n = len(tks)
            tks += [k for k, _ in self._db.scan_range(head, end)]
            kgs += [kg] * (len(tks) - n)
            if end != last:  # the key group's first timer past the watermark bounds the rest
                nxt = next(iter(self._db.scan_range(end, last)), None)
                if nxt is not None:
                    low = min(low, int.from_bytes(nxt[0][3:11], "big") - _OFFSET)
        # Set now: the due timers are still stored while they fire, but nothing checks
        # the bound before the pass ends (``due`` forgets it if the pass is abandoned).
        self.low = low
        if not tks:
            return [], [], [], []
        # The 8 timestamp bytes of every key at once: big-endian u64 with the sign bit
        # flipped, so flipping it back and viewing as int64 gives the time in ms.
        raw = np.frombuffer(b"".join([k[3:11] for k in tks]), dtype=">u8")
        stamps = (raw ^ np.uint64(_OFFSET)).astype(np.uint64).view(np.int64)
        # Within a key group the scan is in (timestamp, key) order, so its position
        # stands in for the key: sort by (timestamp, key group, position).
        kga = np.asarray(kgs, dtype=np.int64)
        order = np.lexsort((np.arange(len(tks)), kga, stamps))
        tks = [tks[i] for i in order.tolist()]
        return tks, stamps[order].tolist(), kga[order].tolist(), [k[11:] for k in tks]

    def pop_due(self, watermark: int) -> list[tuple[int, int, bytes]]:
        """Removes every timer with timestamp <= ``watermark`` from DKV (one write batch)
        and returns them as ``(timestamp, key_group, key)`` in that order."""
        return list(zip(*self.pop_due_columns(watermark)))

    def pop_due_columns(self, watermark: int) -> tuple[list[int], list[int], list[bytes]]:
        """``pop_due`` as columns ``(timestamps, key groups, keys)``, aligned and in
        (timestamp, key group, key) order, without a tuple per timer."""
        tks, stamps, kgs, keys = self._scan_due(watermark)
        if tks:
            self._db.write_batch(tks, [None] * len(tks))
            if self._set_this_epoch:
                self._set_this_epoch.difference_update(tks)
        return stamps, kgs, keys

    def due(self, watermark: int):
        """Yield ``(timestamp, key_group, key)`` of every timer with timestamp <=
        ``watermark``, in order, deleting each from DKV before it is yielded."""
        self._firing_until = watermark
        completed = False
        _, stamps, kgs, keys = self._scan_due(watermark)
        listed = list(zip(stamps, kgs, keys))
        queued = self._queued
        queued.update(listed)
        heap = self._heap
        i, n = 0, len(listed)
        try:
            while i < n or heap:
                if heap and (i >= n or heap[0] < listed[i]):
                    entry = heapq.heappop(heap)
                else:
                    entry = listed[i]
                    i += 1
                if entry not in queued:
                    continue  # deleted while queued, or already fired
                queued.discard(entry)
                ts, kg, key = entry
                tk = timer_key(kg, ts, key, self._schema)
                self._db.delete(tk)
                self._set_this_epoch.discard(tk)
                yield entry
            completed = True
        finally:
            if not completed:  # due timers may be left stored below the bound
                self.low = None
            self._firing_until = None
            self._heap = []
            queued.clear()

    def next_timestamp(self) -> int | None:
        """A lower bound of the stored timers' timestamps (ms), None when none is stored;
        after a due pass it is the earliest timer left (``low``), or lower. When the
        service does not know (no due pass yet, or one abandoned): ``-2**63``, which is
        due at any time."""
        if self.low is None:
            return -_OFFSET
        return None if self.low >= _NONE_STORED else self.low


@dataclass
class Timers:
    """A task's timer services, one per time domain, over the same DKV instance."""

    event: TimerService
    processing: TimerService

    @classmethod
    def over(cls, db: StateStore, key_groups: Iterable[int]) -> Timers:
        """Both domains' services of ``key_groups`` over ``db``."""
        key_groups = list(key_groups)
        return cls(TimerService(db, key_groups, SCHEMA_TIMER), TimerService(db, key_groups, SCHEMA_PROCESSING_TIMER))

    def begin_epoch(self) -> None:
        """``TimerService.begin_epoch`` of both."""
        self.event.begin_epoch()
        self.processing.begin_epoch()

    def next_timestamps(self) -> dict[str, int | None]:
        """``{"event_time": ..., "processing_time": ...}``: each domain's
        ``TimerService.next_timestamp`` (what a task reports to the driver)."""
        return {TimeDomain.EVENT_TIME.value: self.event.next_timestamp(),
                TimeDomain.PROCESSING_TIME.value: self.processing.next_timestamp()}

    def undo(self, dkv_keys: Iterable[bytes], stored: Callable[[bytes], bool]) -> None:
        """``TimerService.undo`` of both (each takes its own domain's keys)."""
        dkv_keys = list(dkv_keys)
        self.event.undo(dkv_keys, stored)
        self.processing.undo(dkv_keys, stored)
