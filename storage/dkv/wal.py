"""The write-ahead log: format, encoder and decoder of WAL objects.

DKV buffers WAL records in memory (no object-store request per record) and writes the
records appended since the previous checkpoint as ONE immutable WAL object at checkpoint
time. The manifest lists the WAL objects whose records are not yet in an SSTable, in
order, with their sequence ranges; ``DKV.open`` replays them into the memtable.

Grammar (all integers little-endian)::

    wal_object := header record*
    header     := magic "DKVWAL\\x00\\x01" (8 bytes)
    record     := crc32c u32 | body_len u32 | body
    body       := seq u64 | flags u8 | key_len u32 | key | [value_len u32 | value]
    flags      := bit 0 = tombstone (then the value part is absent); other bits zero

``crc32c`` covers ``body_len`` and ``body`` (so a corrupted length is caught too). Records
appear in strictly increasing ``seq`` order.

Example: put(b"a", b"1") at seq 7 then delete(b"a") at seq 8 is the header followed by
``crc | 19 | 7 | 0x00 | 1 | "a" | 1 | "1"`` and ``crc | 14 | 8 | 0x01 | 1 | "a"``
(57 bytes in all: 8 + (8 + 19) + (8 + 14)).

Torn-tail rule: a WAL object is written with one atomic ``put``, so unlike a local log file
it can never legitimately end in a partial record. Any torn tail, bad checksum, unknown
flag, non-increasing seq, or a seq range that differs from the one the manifest records is
a ``CorruptionError`` naming the object's URI and the byte offset of the bad record. (A
cut at a record boundary is caught by the manifest's ``last_seq``.)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from crc32c import crc32c

from storage.errors import CorruptionError

MAGIC = b"DKVWAL\x00\x01"
FLAG_TOMBSTONE = 0x01
_REC_HEAD = struct.Struct("<II")  # crc32c, body_len
_BODY_HEAD = struct.Struct("<QBI")  # seq, flags, key_len
_U32 = struct.Struct("<I")

WalRecord = tuple[int, bytes, "bytes | None"]  # (seq, key, value or None for a delete)


def encode_wal(records: Iterable[WalRecord]) -> bytes:
    """Encodes records as one WAL object.

    Args:
        records: ``(seq, key, value-or-None)`` in increasing seq order.

    Returns:
        The object bytes (header + records).
    """
    out = [MAGIC]
    body_head = _BODY_HEAD.pack
    rec_head = _REC_HEAD.pack
    u32 = _U32.pack
    for seq, key, value in records:
        if value is None:
            body = body_head(seq, FLAG_TOMBSTONE, len(key)) + key
        else:
            body = b"".join((body_head(seq, 0, len(key)), key, u32(len(value)), value))
        blen = u32(len(body))
        out.append(rec_head(crc32c(body, crc32c(blen)), len(body)))
        out.append(body)
    return b"".join(out)


def decode_wal(
    data: bytes, uri: str, expect_first: int | None = None, expect_last: int | None = None
) -> list[WalRecord]:
    """Decodes and verifies a WAL object.

    Args:
        data: The object's bytes.
        uri: The object's URI, for error messages.
        expect_first: The first seq the manifest records, if known.
        expect_last: The last seq the manifest records, if known.

    Returns:
        The records in order.

    Raises:
        CorruptionError: Bad magic, checksum, framing, ordering or seq range.
    """
    if data[:8] != MAGIC:
        raise CorruptionError(f"{uri}: bad WAL magic at offset 0")
    out: list[WalRecord] = []
    pos = 8
    n = len(data)
    prev = -1
    while pos < n:
        if pos + 8 > n:
            raise CorruptionError(f"{uri}: torn WAL record header at offset {pos}")
        crc, blen = _REC_HEAD.unpack_from(data, pos)
        body_start = pos + 8
        body_end = body_start + blen
        if body_end > n or blen < _BODY_HEAD.size:
            raise CorruptionError(f"{uri}: torn or bad-length WAL record at offset {pos}")
        body = data[body_start:body_end]
        if crc32c(body, crc32c(data[pos + 4 : pos + 8])) != crc:
            raise CorruptionError(f"{uri}: WAL record crc32c mismatch at offset {pos}")
        seq, flags, klen = _BODY_HEAD.unpack_from(body, 0)
        kend = _BODY_HEAD.size + klen
        try:
            if flags == FLAG_TOMBSTONE:
                if kend != blen:
                    raise ValueError("tombstone with trailing bytes")
                value = None
            elif flags == 0:
                (vlen,) = _U32.unpack_from(body, kend)
                if kend + 4 + vlen != blen:
                    raise ValueError("value length does not match body")
                value = body[kend + 4 :]
            else:
                raise ValueError(f"unknown flags {flags:#x}")
        except (ValueError, struct.error) as e:
            raise CorruptionError(f"{uri}: malformed WAL record at offset {pos}: {e}") from None
        if seq <= prev:
            raise CorruptionError(f"{uri}: WAL seq {seq} not increasing at offset {pos}")
        prev = seq
        out.append((seq, body[_BODY_HEAD.size : kend], value))
        pos = body_end
    if expect_first is not None and (not out or out[0][0] != expect_first):
        raise CorruptionError(f"{uri}: WAL first seq differs from manifest ({expect_first})")
    if expect_last is not None and (not out or out[-1][0] != expect_last):
        raise CorruptionError(f"{uri}: WAL last seq differs from manifest ({expect_last})")
    return out
