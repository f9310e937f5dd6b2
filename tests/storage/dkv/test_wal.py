"""WAL object encoding: round trip, example bytes, and every corruption rule."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dkvstream.storage.dkv.wal import MAGIC, decode_wal, encode_wal, encode_wal_batches, encoded_batches_size
from dkvstream.storage.errors import CorruptionError

RECORDS = [(7, b"a", b"1"), (8, b"a", None), (9, b"", b""), (12, b"key\x00\xff", b"v" * 300)]


def test_roundtrip() -> None:
    assert decode_wal(encode_wal(RECORDS), "mem://w", 7, 12) == RECORDS
    assert decode_wal(encode_wal([]), "mem://w") == []


def test_documented_example_sizes() -> None:
    data = encode_wal(RECORDS[:2])
    assert data.startswith(MAGIC)
    # header 8 + (8 + 19) + (8 + 14), as in the module docstring's example
    assert len(data) == 8 + 27 + 22 == 57


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


BATCH_KEYS = [b"a", b"a", b"", b"key\x00\xff"]
BATCH_VALUES = [b"1", None, b"", b"v" * 300]


def test_batch_roundtrip_and_documented_example() -> None:
    data = encode_wal_batches(7, BATCH_KEYS, BATCH_VALUES)
    assert decode_wal(data, "mem://w", 7, 10) == [(7 + i, k, v) for i, (k, v) in
                                                 enumerate(zip(BATCH_KEYS, BATCH_VALUES))]
    # header 8 + framing 8 + body 13 + 2 * 4 + 2 * 4 + "aa" + "1", as in the docstring
    assert len(encode_wal_batches(7, [b"a", b"a"], [b"1", None])) == 48
    assert decode_wal(encode_wal_batches(7, [], []), "mem://w") == []


@pytest.mark.parametrize("data", [
    encode_wal(RECORDS[:3]),
    encode_wal_batches(7, BATCH_KEYS[:3], BATCH_VALUES[:3], per_record=2),
], ids=["single_records", "batch_records"])
def test_every_single_byte_flip_is_detected(data: bytes) -> None:
    """Seq 7..9 either way: three single records, or a batch record of two and one of one."""
    for off in range(len(data)):
        bad = bytearray(data)
        bad[off] ^= 0x01
        with pytest.raises(CorruptionError, match="mem://w"):
            decode_wal(bytes(bad), "mem://w", 7, 9)


def test_batch_torn_tail_and_record_boundary_cut() -> None:
    data = encode_wal_batches(7, BATCH_KEYS, BATCH_VALUES, per_record=3)
    for cut in (len(data) - 1, len(data) - 300, 9):
        with pytest.raises(CorruptionError, match="offset"):
            decode_wal(data[:cut], "mem://w")
    first = encode_wal_batches(7, BATCH_KEYS[:3], BATCH_VALUES[:3])
    assert data.startswith(first)
    with pytest.raises(CorruptionError, match="last seq"):
        decode_wal(first, "mem://w", 7, 10)


def test_batch_seq_must_increase_across_records() -> None:
    data = encode_wal_batches(5, [b"a", b"b"], [b"", b""]) + encode_wal_batches(6, [b"c"], [b""])[8:]
    with pytest.raises(CorruptionError, match="not increasing"):
        decode_wal(data, "mem://w")


_rows = st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=20) | st.none()), max_size=60)


@settings(max_examples=200, deadline=None)
@given(rows=_rows, first=st.integers(1, 2**40), per_record=st.integers(1, 70), mixed=st.booleans())
def test_batch_records_decode_like_single_records(rows, first, per_record, mixed) -> None:
    """Model: a buffer encoded as batch records (optionally after single records) decodes
    to exactly the writes that ``encode_wal`` of single records gives."""
    expected = [(first + i, k, v) for i, (k, v) in enumerate(rows)]
    split = len(rows) // 2 if mixed else 0
    data = encode_wal(expected[:split])
    data += encode_wal_batches(first + split, [k for k, _ in rows[split:]], [v for _, v in rows[split:]],
                               per_record)[8:]
    got = decode_wal(data, "mem://w", first if rows else None, first + len(rows) - 1 if rows else None)
    keys, values = [k for k, _ in rows], [v for _, v in rows]
    assert encoded_batches_size(keys, values, per_record) == len(encode_wal_batches(first, keys, values, per_record))
    assert got == decode_wal(encode_wal(expected), "mem://w") == expected
