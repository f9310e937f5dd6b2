"""What an object's bytes were when its writer wrote them: size and CRC32C.

A writer that has an object's bytes in hand (a task staging a sink file) computes
``ObjectChecksum.of(data)`` at no extra request, and whoever later copies or trusts the
object compares it against the store: ``check(store, key, full=False)`` is one HEAD (the
size: catches a missing, truncated or extended object), ``full=True`` one GET (the
CRC32C too: catches any change of the bytes a reader would notice). CRC32C, as every
other checksum of the project's files (DKV tables and WAL, checkpoints), detects damage,
not tampering.

Stored in JSON as ``[size, crc32c]`` (bytes, unsigned 32-bit integer).
"""
from __future__ import annotations

from dataclasses import dataclass

from crc32c import crc32c

from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore


@dataclass(frozen=True)
class ObjectChecksum:
    """Size (bytes) and CRC32C of an object's bytes."""

    size: int
    crc32c: int

    @classmethod
    def of(cls, data: bytes) -> ObjectChecksum:
        """The checksum of ``data``."""
        return cls(len(data), crc32c(data))

    def to_json(self) -> list[int]:
        """``[size, crc32c]``."""
        return [self.size, self.crc32c]

    @classmethod
    def from_json(cls, value: list[int]) -> ObjectChecksum:
        """The inverse of ``to_json``.

        Raises:
            ValueError / TypeError: not a pair of integers.
        """
        size, crc = value
        return cls(int(size), int(crc))

    def mismatch(self, store: ObjectStore, key: str, full: bool) -> str | None:
        """Why the object ``key`` is not the one this checksum was taken of, or None.

        Args:
            store: the store holding ``key``.
            key: the object to check.
            full: False: compare the size only (one HEAD); True: read the object and
                compare size and CRC32C (one GET).

        Returns:
            None if it matches; else ``"is missing"``, ``"has N bytes, M expected"`` or
            ``"has crc32c 0x..., 0x... expected"``.
        """
        try:
            if full:
                data = store.get(key)
                got = ObjectChecksum.of(data)
            else:
                got = ObjectChecksum(store.size(key), self.crc32c)
        except ObjectNotFoundError:
            return "is missing"
        if got.size != self.size:
            return f"has {got.size} bytes, {self.size} expected"
        if got.crc32c != self.crc32c:
            return f"has crc32c 0x{got.crc32c:08x}, 0x{self.crc32c:08x} expected"
        return None
