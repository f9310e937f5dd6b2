"""Event-time timers, stored in DKV so they survive checkpoints and restarts.

DKV key layout of a timer (no value; DESIGN.md, "Key groups and keys")::

    key_group   u16 big-endian
    schema      u8  = 0x01
    timestamp   u64 big-endian, ms + 2**63  (so negative times sort first)
    key         rest: the subject key

Putting the timestamp before the subject key makes ``scan_prefix(key_group | 0x01)``
return a key group's timers in time order (the seed's timer query), so finding the due
timers of a range is one short scan per key group that stops at the first timer past
the watermark.
"""
from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable

from operators.state import SCHEMA_TIMER, StateStore

_U16 = struct.Struct(">H")
_TS = struct.Struct(">Q")
_OFFSET = 1 << 63


def timer_key(key_group: int, timestamp: int, key: bytes) -> bytes:
    """The DKV key of the timer of ``key`` at ``timestamp`` (ms)."""
    return _U16.pack(key_group) + b"\x01" + _TS.pack(timestamp + _OFFSET) + key


def decode_timer_key(dkv_key: bytes) -> tuple[int, int, bytes]:
    """Split a timer's DKV key into (key group, timestamp ms, subject key)."""
    if len(dkv_key) < 11 or dkv_key[2] != SCHEMA_TIMER:
        raise ValueError(f"not a timer key: {dkv_key!r}")
    return _U16.unpack_from(dkv_key, 0)[0], _TS.unpack_from(dkv_key, 3)[0] - _OFFSET, dkv_key[11:]


class TimerService:
    """Timers of one task's key groups.

    Args:
        db: the task's DKV instance.
        key_groups: the key groups this task owns.

    Timers are written to DKV on ``set`` (deduplicated in memory within an epoch, so
    an operator may set the same timer on every event at the cost of a set lookup).
    ``due`` pops timers in (timestamp, key group, key) order up to a watermark,
    including timers set while earlier ones are being handled.
    """

    def __init__(self, db: StateStore, key_groups: Iterable[int]) -> None:
        self._db = db
        self._key_groups = list(key_groups)
        self._set_this_epoch: set[bytes] = set()
        self._heap: list[tuple[int, int, bytes]] = []
        self._in_heap: set[tuple[int, int, bytes]] = set()
        self._firing_until: int | None = None

    def set(self, key_group: int, timestamp: int, key: bytes) -> None:
        """Register a timer (idempotent)."""
        tk = timer_key(key_group, timestamp, key)
        if tk in self._set_this_epoch:
            return
        self._set_this_epoch.add(tk)
        self._db.put(tk, b"")
        if self._firing_until is not None and timestamp <= self._firing_until:
            self._push((timestamp, key_group, key))

    def delete(self, key_group: int, timestamp: int, key: bytes) -> None:
        """Remove a timer; no error if absent."""
        tk = timer_key(key_group, timestamp, key)
        self._set_this_epoch.discard(tk)
        self._db.delete(tk)
        entry = (timestamp, key_group, key)
        if entry in self._in_heap:
            self._in_heap.discard(entry)  # lazily skipped when popped

    def _push(self, entry: tuple[int, int, bytes]) -> None:
        if entry not in self._in_heap:
            self._in_heap.add(entry)
            heapq.heappush(self._heap, entry)

    def due(self, watermark: int):
        """Yield ``(timestamp, key_group, key)`` of every timer with timestamp <=
        ``watermark``, in order, deleting each from DKV before it is yielded."""
        self._firing_until = watermark
        for kg in self._key_groups:
            prefix = _U16.pack(kg) + b"\x01"
            for dkv_key, _ in self._db.scan_prefix(prefix):
                _, ts, key = decode_timer_key(dkv_key)
                if ts > watermark:
                    break
                self._push((ts, kg, key))
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                if entry not in self._in_heap:
                    continue  # deleted while queued
                self._in_heap.discard(entry)
                ts, kg, key = entry
                tk = timer_key(kg, ts, key)
                self._db.delete(tk)
                self._set_this_epoch.discard(tk)
                yield entry
        finally:
            self._firing_until = None
