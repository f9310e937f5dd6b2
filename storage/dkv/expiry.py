"""The expiry compaction filter: entries past their expiry are dropped by compaction.

A DKV user marks entries that expire in their keys and puts the expiry at the start of
their values; the filter is described by data, not code, so a compaction run anywhere
(inline, or remote from the manifest alone, ``remote_compaction.py``) applies the same
one. Like RocksDB's ``CompactionFilter`` returning ``kRemove``, it never reads anything
but the entries being merged: expired data leaves the store as compaction rewrites it,
never by a scan.

An entry is *subject* to the filter iff its key has a byte at ``marker_offset`` and that
byte is a marker of ``clocks``; its value then starts with its expiry, a signed 64-bit
big-endian integer (8 bytes; a shorter value is never expired). It is *expired* iff
``expiry <= clocks[marker]``. Tombstones are never subject. The clocks are the user's
(e.g. an event-time watermark and a processing time, in ms): recorded in the manifest
at each checkpoint (``manifest.py``, ``"compaction_filter"``), they must never go back,
so an entry expired for one compaction stays expired for every later read.

The merge keeps each key's newest version only; an expired newest version is dropped
when the plan may drop tombstones (no older version of it can lie below the inputs),
else it becomes a tombstone with its sequence number, so an older version below never
resurfaces (RocksDB turns a removed key into a deletion marker the same way).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dkvstream.storage.dkv.merge import ColumnBatch

EXPIRY = struct.Struct(">q")


@dataclass(frozen=True)
class ExpiryFilter:
    """Which entries expire and when (see the module docstring).

    Attributes:
        marker_offset: byte offset in the key of the marker (>= 0).
        clocks: ``(marker byte, clock)`` pairs, markers distinct and in [0, 255]; clocks
            in the user's unit (ms), signed 64-bit.

    Raises:
        ValueError: an offset, marker or clock out of range, or a marker given twice.
    """

    marker_offset: int
    clocks: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        markers = [m for m, _ in self.clocks]
        if self.marker_offset < 0:
            raise ValueError(f"marker_offset must be >= 0, got {self.marker_offset}")
        if len(set(markers)) != len(markers) or any(not 0 <= m <= 255 for m in markers):
            raise ValueError(f"markers must be distinct bytes in [0, 255], got {markers}")
        if any(not -(1 << 63) <= c < (1 << 63) for _, c in self.clocks):
            raise ValueError(f"clocks must be signed 64-bit integers, got {self.clocks}")

    def expired(self, key: bytes, value: bytes | None) -> bool:
        """Whether the entry ``key`` -> ``value`` (None: a tombstone) is expired."""
        if value is None or len(key) <= self.marker_offset or len(value) < 8:
            return False
        clock = dict(self.clocks).get(key[self.marker_offset])
        return clock is not None and EXPIRY.unpack_from(value)[0] <= clock

    def apply(self, batch: ColumnBatch, drop_tombstones: bool) -> ColumnBatch:
        """A compaction's merged columns with expired entries dropped (``drop_tombstones``)
        or turned into tombstones (otherwise), see the module docstring.

        Args:
            batch: ``(keys, seqs, values)``, each key once with its newest version.
            drop_tombstones: whether the plan may drop tombstones.

        Returns:
            The filtered columns, still ascending; ``batch`` itself if nothing expired.
        """
        keys, seqs, values = batch
        off, clocks = self.marker_offset, dict(self.clocks)
        unpack = EXPIRY.unpack_from
        hits = [i for i, (k, v) in enumerate(zip(keys, values))
                if v is not None and len(k) > off and k[off] in clocks and len(v) >= 8
                and unpack(v)[0] <= clocks[k[off]]]
        if not hits:
            return batch
        if drop_tombstones:
            gone = set(hits)
            keep = [i for i in range(len(keys)) if i not in gone]
            return [keys[i] for i in keep], [seqs[i] for i in keep], [values[i] for i in keep]
        values = list(values)
        for i in hits:
            values[i] = None
        return keys, seqs, values

    def to_json(self) -> dict:
        """The manifest form: ``{"kind": "expiry", "marker_offset": int, "clocks": [[marker, clock], ...]}``."""
        return {"kind": "expiry", "marker_offset": self.marker_offset,
                "clocks": [[m, c] for m, c in self.clocks]}

    @classmethod
    def from_json(cls, d: dict) -> ExpiryFilter:
        """Decodes ``to_json``'s form.

        Raises:
            ValueError: another kind of filter, or values out of range.
            KeyError, TypeError: a field missing or of the wrong type.
        """
        if d["kind"] != "expiry":
            raise ValueError(f"unknown compaction filter kind {d['kind']!r}")
        return cls(int(d["marker_offset"]), tuple((int(m), int(c)) for m, c in d["clocks"]))
