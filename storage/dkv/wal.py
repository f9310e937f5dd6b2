"""The write-ahead log: format, encoder and decoder of WAL objects.

DKV buffers WAL records in memory (no object-store request per record) and writes the
records appended since the previous checkpoint as ONE immutable WAL object at checkpoint
time. The manifest lists the WAL objects whose records are not yet in an SSTable, in
order, with their sequence ranges; ``DKV.open`` replays them into the memtable.

Grammar (all integers little-endian)::

    wal_object := header record*
    header     := magic "DKVWAL\\x00\\x01" (8 bytes)
    record     := crc32c u32 | body_len u32 | body
    body       := single | batch
    single     := seq u64 | flags u8 | key_len u32 | key | [value_len u32 | value]
    flags      := bit 0 = tombstone (then the value part is absent); 0x02 = batch; others
                  are invalid
    batch      := first_seq u64 | flags u8 = 0x02 | count u32 | key_len u32 * count
                  | value_len u32 * count | key bytes (concatenated)
                  | value bytes (concatenated)
                  value_len 0xFFFFFFFF = a delete (no value bytes); count >= 1

``crc32c`` covers ``body_len`` and ``body`` (so a corrupted length is caught too). A batch
record (RocksDB's ``WriteBatch``) holds ``count`` writes with the consecutive sequence
numbers ``first_seq .. first_seq + count - 1``, in that order, under one checksum; it is
columnar (lengths first, then the bytes) so that it is encoded and decoded with a few
C-level joins and array operations instead of a ``struct`` call per write. Records (a
batch counting as its writes) appear in strictly increasing ``seq`` order. The format
version is unchanged: objects holding only single records (all DKV wrote before batches)
read as before.

Example: put(b"a", b"1") at seq 7 then delete(b"a") at seq 8 is the header followed by
``crc | 19 | 7 | 0x00 | 1 | "a" | 1 | "1"`` and ``crc | 14 | 8 | 0x01 | 1 | "a"``
(57 bytes in all: 8 + (8 + 19) + (8 + 14)). The same two writes as one batch are the
header and ``crc | 32 | 7 | 0x02 | 2 | 1 1 | 1 0xFFFFFFFF | "aa" | "1"`` (48 bytes).

Torn-tail rule: a WAL object is written with one atomic ``put``, so unlike a local log file
it can never legitimately end in a partial record. Any torn tail, bad checksum, unknown
flag, non-increasing seq, or a seq range that differs from the one the manifest records is
a ``CorruptionError`` naming the object's URI and the byte offset of the bad record. (A
cut at a record boundary is caught by the manifest's ``last_seq``.)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
from crc32c import crc32c

from dkvstream.storage.errors import CorruptionError

MAGIC = b"DKVWAL\x00\x01"
FLAG_TOMBSTONE = 0x01
FLAG_BATCH = 0x02
DELETED = 0xFFFFFFFF  # value_len of a delete in a batch
# Writes per batch record when a buffer is encoded: bounds one record's size.
BATCH_RECORD_WRITES = 1 << 16
_REC_HEAD = struct.Struct("<II")  # crc32c, body_len
_BODY_HEAD = struct.Struct("<QBI")  # seq, flags, key_len (single) or count (batch)
_U32 = struct.Struct("<I")
_LE_U32 = np.dtype("<u4")

WalRecord = tuple[int, bytes, "bytes | None"]  # (seq, key, value or None for a delete)


def _frame(body: bytes) -> bytes:
    blen = _U32.pack(len(body))
    return _REC_HEAD.pack(crc32c(body, crc32c(blen)), len(body)) + body


def encode_wal(records: Iterable[WalRecord]) -> bytes:
    """Encodes records as one WAL object of single records.

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


def encode_batch_body(first_seq: int, keys: Sequence[bytes], values: Sequence[bytes | None]) -> bytes:
    """The body of one batch record (see the grammar), without its crc/length framing.

    Args:
        first_seq: Sequence number of ``keys[0]``; the rest follow consecutively.
        keys: At least one key.
        values: One per key; None marks a delete.
    """
    n = len(keys)
    klens = np.fromiter(map(len, keys), _LE_U32, n)
    vlens = np.fromiter([DELETED if v is None else len(v) for v in values], _LE_U32, n)
    if None in values:
        vbytes = b"".join([v for v in values if v is not None])
    else:
        vbytes = b"".join(values)
    return b"".join((_BODY_HEAD.pack(first_seq, FLAG_BATCH, n), klens.tobytes(), vlens.tobytes(),
                     b"".join(keys), vbytes))


def encode_wal_batches(first_seq: int, keys: Sequence[bytes], values: Sequence[bytes | None],
                       per_record: int = BATCH_RECORD_WRITES) -> bytes:
    """Encodes consecutive writes as one WAL object of batch records.

    Args:
        first_seq: Sequence number of ``keys[0]``; write i has ``first_seq + i``.
        keys: The written keys.
        values: One per key; None marks a delete.
        per_record: Writes per batch record (the last record may hold fewer).

    Returns:
        The object bytes (header + ``ceil(len(keys) / per_record)`` batch records).
    """
    out = [MAGIC]
    for i in range(0, len(keys), per_record):
        out.append(_frame(encode_batch_body(first_seq + i, keys[i : i + per_record],
                                            values[i : i + per_record])))
    return b"".join(out)


def encoded_batches_size(keys: Sequence[bytes], values: Sequence[bytes | None],
                         per_record: int = BATCH_RECORD_WRITES) -> int:
    """``len(encode_wal_batches(_, keys, values, per_record))`` without encoding (bytes)."""
    n = len(keys)
    records = -(-n // per_record)
    payload = sum(map(len, keys)) + sum([len(v) for v in values if v is not None])
    return len(MAGIC) + records * (_REC_HEAD.size + _BODY_HEAD.size) + 8 * n + payload


def _decode_batch(body: bytes, blen: int, n: int) -> tuple[list[bytes], list[bytes | None]]:
    """Keys and values of a batch body holding ``n`` writes; ValueError if malformed."""
    head = _BODY_HEAD.size
    if n < 1:
        raise ValueError("empty batch")
    if head + 8 * n > blen:
        raise ValueError("batch lengths do not fit the body")
    klens = np.frombuffer(body, _LE_U32, n, head).astype(np.int64)
    vlens = np.frombuffer(body, _LE_U32, n, head + 4 * n).astype(np.int64)
    deleted = vlens == DELETED
    vlens[deleted] = 0
    kstart = head + 8 * n
    kend = kstart + int(klens.sum())
    if kend + int(vlens.sum()) != blen:
        raise ValueError("batch lengths do not add up to the body")
    koffs = np.cumsum(klens) + kstart
    voffs = np.cumsum(vlens) + kend
    kb = koffs.tolist()
    ke = (koffs - klens).tolist()
    keys = [body[a:b] for a, b in zip(ke, kb)]
    vb = voffs.tolist()
    va = (voffs - vlens).tolist()
    values: list[bytes | None] = [body[a:b] for a, b in zip(va, vb)]
    if deleted.any():
        for i in np.flatnonzero(deleted).tolist():
            values[i] = None
    return keys, values


def decode_wal_columns(
    data: bytes, uri: str, expect_first: int | None = None, expect_last: int | None = None
) -> tuple[list[int], list[bytes], list[bytes | None]]:
    """Decodes and verifies a WAL object into parallel lists ``(seqs, keys, values)``.

    Args, raises: as ``decode_wal``.
    """
    if data[:8] != MAGIC:
        raise CorruptionError(f"{uri}: bad WAL magic at offset 0")
    seqs: list[int] = []
    keys: list[bytes] = []
    values: list[bytes | None] = []
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
        if seq <= prev:
            raise CorruptionError(f"{uri}: WAL seq {seq} not increasing at offset {pos}")
        try:
            if flags == FLAG_BATCH:
                bkeys, bvalues = _decode_batch(body, blen, klen)
                seqs.extend(range(seq, seq + klen))
                keys += bkeys
                values += bvalues
                prev = seq + klen - 1
                pos = body_end
                continue
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
        prev = seq
        seqs.append(seq)
        keys.append(body[_BODY_HEAD.size : kend])
        values.append(value)
        pos = body_end
    if expect_first is not None and (not seqs or seqs[0] != expect_first):
        raise CorruptionError(f"{uri}: WAL first seq differs from manifest ({expect_first})")
    if expect_last is not None and (not seqs or seqs[-1] != expect_last):
        raise CorruptionError(f"{uri}: WAL last seq differs from manifest ({expect_last})")
    return seqs, keys, values


def decode_wal(
    data: bytes, uri: str, expect_first: int | None = None, expect_last: int | None = None
) -> list[WalRecord]:
    """Decodes and verifies a WAL object (single and batch records).

    Args:
        data: The object's bytes.
        uri: The object's URI, for error messages.
        expect_first: The first seq the manifest records, if known.
        expect_last: The last seq the manifest records, if known.

    Returns:
        The writes in order, a batch record's writes one by one.

    Raises:
        CorruptionError: Bad magic, checksum, framing, ordering or seq range.
    """
    return list(zip(*decode_wal_columns(data, uri, expect_first, expect_last)))
