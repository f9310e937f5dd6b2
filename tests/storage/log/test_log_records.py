"""Record batches and segment files: round trips, checksums, truncation."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.log.records import HEADER_SIZE, Batch, Record, encode_batch
from dkvstream.storage.log.segment import SegmentWriter, chunk_batches, read_directory, read_indexes

records_st = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=300)),
              st.integers(-2**40, 2**45),
              st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2)),
    min_size=1, max_size=60)


@given(records_st, st.integers(0, 1000), st.booleans())
@settings(max_examples=60, deadline=None)
def test_batch_round_trip(recs, first, compress) -> None:
    deltas = [first + 3 * i for i in range(len(recs))]
    keys, values, ts, hs = (list(x) for x in zip(*recs))
    data = encode_batch(deltas, ts, keys, values, hs, compress=compress, delete_horizon=7)
    b = Batch(data, 0, "mem")
    assert b.header.delete_horizon == 7 and b.header.size == len(data)
    expected = [Record(1000 + d, t, k, v, tuple((a, c) for a, c in h)) for d, t, k, v, h in
                zip(deltas, ts, keys, values, hs)]
    assert b.records(1000) == expected


def test_every_flipped_byte_is_detected() -> None:
    data = encode_batch(range(50), range(50), [b"k%d" % i for i in range(50)], [b"v" * 30] * 50)
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptionError, match=r"mem.* at byte 1000"):
            Batch(bytes(bad), 0, "mem", base=1000)


def test_batch_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        encode_batch([1, 1], [0, 0], [b"a", b"b"], [b"", b""])
    with pytest.raises(ValueError, match="non-zero"):
        encode_batch([], [], [], [])


def _segment():
    w = SegmentWriter(index_interval_bytes=100, batch_bytes=200)
    for topic, part in [("a", 0), ("a", 3), ("b", 1)]:
        w.begin_chunk(topic, part)
        n = 40
        w.append(range(n), range(n), [b"k%d" % i for i in range(n)], [b"value-%d" % i for i in range(n)])
        w.end_chunk()
    return w.finish()


def test_segment_directory_and_chunks(store) -> None:
    data, infos = _segment()
    store.put("seg", data)
    assert read_directory(store, "seg") == infos
    for c in infos:
        recs = [r for _, b in chunk_batches(data, c, 0, "seg") for r in b.records(0)]
        assert [r.offset for r in recs] == list(range(40))
        idx = read_indexes(store, "seg", c)
        assert len(idx.offsets) > 2 and idx.present is None


def test_segment_chunks_must_be_ordered() -> None:
    w = SegmentWriter()
    w.begin_chunk("b", 0)
    w.end_chunk()
    with pytest.raises(ValueError, match="out of order"):
        w.begin_chunk("a", 5)


def test_truncated_segment_names_file_and_offset(store) -> None:
    data, infos = _segment()
    store.put("seg", data[:-5])
    with pytest.raises(CorruptionError, match=r"seg.*trailer at byte"):
        read_directory(store, "seg")
    c = infos[1]
    cut = data[:c.position + c.length - 10]
    with pytest.raises(CorruptionError, match=r"seg: .*(truncated|not in the read range)"):
        list(chunk_batches(cut, c, 0, "seg"))
    bad = bytearray(data)
    bad[c.position + HEADER_SIZE + 3] ^= 1
    with pytest.raises(CorruptionError, match=rf"seg: batch CRC32C mismatch at byte {c.position}"):
        list(chunk_batches(bytes(bad), c, 0, "seg"))
