"""WAL object encoding: round trip, example bytes, and every corruption rule."""

from __future__ import annotations

import pytest

from storage.dkv.wal import MAGIC, decode_wal, encode_wal
from storage.errors import CorruptionError

RECORDS = [(7, b"a", b"1"), (8, b"a", None), (9, b"", b""), (12, b"key\x00\xff", b"v" * 300)]


def test_roundtrip() -> None:
    assert decode_wal(encode_wal(RECORDS), "mem://w", 7, 12) == RECORDS
    assert decode_wal(encode_wal([]), "mem://w") == []


def test_documented_example_sizes() -> None:
    data = encode_wal(RECORDS[:2])
    assert data.startswith(MAGIC)
    # header 8 + (8 + 19) + (8 + 14), as in the module docstring's example
    assert len(data) == 8 + 27 + 22 == 57


def test_every_single_byte_flip_is_detected() -> None:
    data = encode_wal(RECORDS[:3])
    for off in range(len(data)):
        bad = bytearray(data)
        bad[off] ^= 0x01
        with pytest.raises(CorruptionError, match="mem://w"):
            decode_wal(bytes(bad), "mem://w", 7, 9)


def test_torn_tail_is_corruption() -> None:
    data = encode_wal(RECORDS)
    for cut in (len(data) - 1, len(data) - 300, 9):
        with pytest.raises(CorruptionError, match="offset"):
            decode_wal(data[:cut], "mem://w")


def test_cut_at_record_boundary_caught_by_manifest_seq() -> None:
    data = encode_wal(RECORDS[:2])
    first_only = encode_wal(RECORDS[:1])
    assert data.startswith(first_only)
    assert decode_wal(first_only, "mem://w") == RECORDS[:1]
    with pytest.raises(CorruptionError, match="last seq"):
        decode_wal(first_only, "mem://w", 7, 8)


def test_non_increasing_seq_rejected() -> None:
    with pytest.raises(CorruptionError, match="not increasing"):
        decode_wal(encode_wal([(5, b"a", b""), (5, b"b", b"")]), "mem://w")
