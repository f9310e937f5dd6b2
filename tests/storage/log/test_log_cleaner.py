"""Compacted topics: the cleaner against a dict model, with keys beyond the dedupe
buffer, tombstone retention, compaction lag, GET counting and file separation."""
from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.log import COMPACT, CleanerConfig, InvalidRecordError, Log, TopicConfig
from dkvstream.storage.log.offset_map import OffsetMap, hash_keys
from dkvstream.storage.log.segment import SegmentWriter, read_directory
from dkvstream.storage.objectstore.local import LocalObjectStore


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def compacted_log(tmp, retention=1_000, lag=0, ratio=0.0, partitions=2, **kw):
    log = Log(LocalObjectStore(tmp))
    log.create_topic("c", TopicConfig(partitions=partitions, cleanup_policy=COMPACT, delete_retention_ms=retention,
                                      min_compaction_lag_ms=lag, min_cleanable_dirty_ratio=ratio, **kw))
    return log


def check_against_model(log: Log, history: dict[int, list], now: int, retention: int,
                        horizons: dict) -> None:
    """Per partition: every key's latest record, offsets unchanged, in offset order;
    a tombstone may be gone only once its retention passed."""
    for part, produced in history.items():
        got = log.read("c", part)
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        latest = {}
        for off, key, value in produced:
            latest[key] = (off, value)
        by_key = {r.key: r for r in got}
        assert len(by_key) == len(got), "a key appears twice after compaction"
        for key, (off, value) in latest.items():
            r = by_key.get(key)
            if value is None and r is None:
                assert horizons.get((part, off)) is not None and now >= horizons[(part, off)], \
                    f"tombstone of {key!r} at {off} removed before its retention"
                continue
            assert r is not None, f"latest record of {key!r} (offset {off}) is missing"
            assert (r.offset, r.value) == (off, value)
        assert set(by_key) <= set(latest)


ops_st = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("flush"), st.just(0), st.just(False)),
    st.tuples(st.just("clean"), st.integers(0, 3000), st.just(False)),
), max_size=120)


@given(ops_st, st.sampled_from([256, 4096]), st.sampled_from([0, 64 * 1024 * 1024]))
@settings(max_examples=40, deadline=None)
def test_compaction_matches_model(tmp_path_factory, ops, buffer, io_buffer) -> None:
    run_model(tmp_path_factory, ops, buffer, io_buffer)


def run_model(tmp_path_factory, ops, buffer, io_buffer=64 * 1024 * 1024) -> None:
    """Random produce / delete / flush / clean against a dict per partition (``io_buffer``
    0: every file read a chunk at a time; output files cut at 2,000 bytes)."""
    retention = 1_000
    clock = Clock()
    log = compacted_log(tmp_path_factory.mktemp("c"), retention)
    prod = log.producer(clock=clock)
    history: dict[int, list] = {0: [], 1: []}
    buffered = []
    horizons: dict = {}
    counter = 0
    for op, n, flag in ops:
        if op == "put":
            counter += 1
            key = b"k%d" % n
            value = None if flag and n % 3 == 0 else b"v%d" % counter
            _, part = prod.send("c", key, value)
            buffered.append((part, key, value))
        elif op == "flush" or (op == "clean" and buffered):
            assigned = prod.flush()
            nexts = {p: a for (_, p), (a, _) in assigned.items()}
            for part, key, value in buffered:
                history[part].append((nexts[part], key, value))
                nexts[part] += 1
            buffered = []
        if op == "clean":
            clock.now += n
            # a tombstone's horizon starts at the first cleaning that saw it
            for part, produced in history.items():
                for off, _, value in produced:
                    if value is None:
                        horizons.setdefault((part, off), clock.now + retention)
            log.clean(CleanerConfig(dedupe_buffer_size=buffer, max_file_bytes=2000, io_buffer_size=io_buffer),
                      clock=clock)
            check_against_model(log, history, clock.now, retention, horizons)
    prod.flush()


def test_keys_beyond_the_buffer_are_all_deduplicated(tmp_path) -> None:
    log = compacted_log(tmp_path, partitions=1)
    prod = log.producer()
    keys = 3000
    for rnd in range(3):
        for i in range(keys):
            prod.send("c", b"key-%05d" % ((i * 7919) % keys), b"r%d-%d" % (rnd, i))
        prod.flush()
    cfg = CleanerConfig(dedupe_buffer_size=12 * 1024)  # 1024 slots, 819 keys per pass
    assert OffsetMap(cfg.dedupe_buffer_size).capacity < keys
    report = log.clean(cfg)
    assert report.map_passes > 1 and report.hash_ranges >= 4
    assert report.duplicates_removed == 2 * keys and report.records_out == keys
    got = log.read("c", 0)
    assert len(got) == keys and len({r.key for r in got}) == keys
    assert all(r.value.startswith(b"r2-") for r in got)
    assert report.gets == 2 * len(report.input_files) == 6
    assert 0 < report.collision_bound < 1e-12


def test_files_beyond_the_io_buffer_are_read_a_chunk_at_a_time(tmp_path) -> None:
    """With no room to hold files, each pass GETs each chunk, extra map passes too; the
    output is the same as with the files held."""
    results = {}
    for io_buffer in (0, 64 * 1024 * 1024):
        log = compacted_log(tmp_path / str(io_buffer), partitions=2)
        prod = log.producer()
        for rnd in range(3):
            for i in range(3000):
                prod.send("c", b"key-%05d" % ((i * 7919) % 3000), b"r%d-%d" % (rnd, i))
            prod.flush()
        report = log.clean(CleanerConfig(dedupe_buffer_size=12 * 1024, io_buffer_size=io_buffer))
        assert report.map_passes > 2
        # unheld: every pass (map passes, and one copy pass per partition) GETs its chunk of every file
        files = len(report.input_files)
        assert report.gets == (2 * files if io_buffer else (report.map_passes + 2) * files)
        results[io_buffer] = [[(r.offset, r.key, r.value) for r in log.read("c", p)] for p in (0, 1)]
        assert sum(map(len, results[io_buffer])) == 3000 and report.duplicates_removed == 6000
    assert results[0] == results[64 * 1024 * 1024]


def test_two_gets_per_input_file_and_outputs_hold_only_compacted_data(tmp_path) -> None:
    log = compacted_log(tmp_path, partitions=4)
    log.create_topic("plain", TopicConfig(partitions=3))
    prod = log.producer()
    for _ in range(5):
        for i in range(200):
            prod.send("c", b"k%d" % (i % 40), b"v%d" % i)
            prod.send("plain", b"k%d" % i, b"x")
        prod.flush()
    before = log.store.stats.snapshot()["GET"]
    report = log.clean()
    assert len(report.input_files) == 5 and report.partitions == [("c", p) for p in range(4)]
    assert report.gets == 10
    # the only other GETs are of metadata versions
    assert log.store.stats.snapshot()["GET"] - before - report.gets <= 3
    for key in report.output_files:
        assert {c.topic for c in read_directory(log.store, key)} == {"c"}
        assert all(c.compacted for c in read_directory(log.store, key))
    assert report.files_deleted == []  # "plain" still lives in every input file
    assert len(log.read("plain", 0)) + len(log.read("plain", 1)) + len(log.read("plain", 2)) == 1000


def test_tombstones_kept_for_delete_retention(tmp_path) -> None:
    clock = Clock()
    log = compacted_log(tmp_path, retention=5_000, partitions=1)
    prod = log.producer(clock=clock)
    prod.send("c", b"a", b"1")
    prod.send("c", b"b", b"1")
    prod.send("c", b"a", None)
    prod.flush()
    log.clean(clock=clock)
    assert [(r.key, r.value) for r in log.read("c", 0)] == [(b"b", b"1"), (b"a", None)]
    clock.now += 4_999
    assert log.clean(clock=clock) is None
    clock.now += 1
    report = log.clean(clock=clock)
    assert report.tombstones_removed == 1
    assert [(r.offset, r.key) for r in log.read("c", 0)] == [(1, b"b")]
    assert log.fetch("c", 0, 0).next_offset == 3


def test_min_compaction_lag_and_dirty_ratio(tmp_path) -> None:
    clock = Clock()
    log = compacted_log(tmp_path, lag=10_000, ratio=0.5, partitions=1)
    prod = log.producer(clock=clock)
    for i in range(100):
        prod.send("c", b"k%d" % (i % 10), b"v%d" % i)
    prod.flush()
    assert log.clean(clock=clock) is None  # records too young
    clock.now += 10_000
    assert log.clean(clock=clock).records_out == 10
    prod.send("c", b"k1", b"new")
    prod.flush()
    clock.now += 10_000
    row = log.describe(now=clock.now)[0]
    assert 0 < row["dirty_ratio"] < 0.5 and row["cleaned_to"] == 100
    assert log.clean(clock=clock) is None
    assert log.clean(force=True, clock=clock).records_out == 10


def test_keyless_records_rejected(tmp_path) -> None:
    log = compacted_log(tmp_path)
    with pytest.raises(InvalidRecordError, match="compact"):
        log.producer().send("c", None, b"v")


def test_gaps_are_skipped_by_fetch(tmp_path) -> None:
    log = compacted_log(tmp_path, partitions=1, index_interval_bytes=64)
    prod = log.producer()
    for i in range(500):
        prod.send("c", b"k%d" % (i % 50 if i % 2 else i), b"v" * 20)
    prod.flush()
    log.clean()
    got = log.read("c", 0)
    present = [r.offset for r in got]
    for off in range(0, 501):
        nxt = next((o for o in present if o >= off), None)
        res = log.fetch("c", 0, off, max_records=1)
        assert [r.offset for r in res.records] == ([] if nxt is None else [nxt])


def test_offset_map_collision_bound_matches_knuth() -> None:
    m = OffsetMap(12 * 100_000)
    n = m.capacity
    h, lo = hash_keys([b"%d" % i for i in range(n)])
    import numpy as np
    assert m.put(h, lo, np.arange(n, dtype=np.uint32))
    mean = m.displacement / n
    assert 1.5 < mean < 2.5  # a / (2 (1 - a)) = 2 at a = 0.8
    assert sorted(m.values().tolist()) == list(range(n))
    assert not m.put(*hash_keys([b"x%d" % i for i in range(m.slots)]), np.zeros(m.slots, np.uint32))


MIB = 1024 * 1024


def clean_and_measure(tmp, mib: int) -> tuple[int, object]:
    """Writes about ``mib`` MiB of batches to a 2-partition compacted topic (files of
    ~128 KiB holding a chunk of each partition; random 20-byte values; each key twice on
    average; 2% tombstones), cleans it once under tracemalloc, checks the result against
    a dict of each partition's last value per key and returns ``(peak bytes, report)``."""
    log = compacted_log(tmp, partitions=2)
    rng = random.Random(mib)
    records = mib * MIB // 28  # a record takes ~28 bytes in a zstd batch (random 20-byte value)
    per_file = 128 * 1024 // 28
    model: dict[int, dict] = {0: {}, 1: {}}
    for _ in range(0, records, per_file):
        writer = SegmentWriter()
        for part in (0, 1):
            keys = [b"key-%08d" % (2 * rng.randrange(records // 4) + part) for _ in range(per_file // 2)]
            values = [None if rng.random() < 0.02 else rng.randbytes(20) for _ in keys]
            writer.begin_chunk("c", part)
            writer.append(range(len(keys)), [1_000] * len(keys), keys, values)
            writer.end_chunk()
            model[part].update(zip(keys, values))
        log.commit_segment(writer)
    cfg = CleanerConfig(dedupe_buffer_size=MIB, max_file_bytes=256 * 1024, io_buffer_size=MIB)
    tracemalloc.start()
    try:
        report = log.clean(cfg, force=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0.7 * mib * MIB <= report.bytes_in <= 1.3 * mib * MIB
    for part, latest in model.items():
        got = log.read("c", part)
        assert [r.offset for r in got] == sorted({r.offset for r in got})
        assert {r.key: r.value for r in got} == latest and len(got) == len(latest)
    return peak, report


def test_cleaner_memory_does_not_grow_with_the_input(tmp_path) -> None:
    """Peak traced memory of a cleaning of 1 MiB and of 4 MiB: the map, the input held for
    the two passes (``io_buffer_size``), one chunk and one output file, whatever the input."""
    small, _ = clean_and_measure(tmp_path / "small", 1)
    large, report = clean_and_measure(tmp_path / "large", 4)
    assert large <= small * 1.5 + MIB, f"peak {large / MIB:.1f} MiB at 4 MiB in, {small / MIB:.1f} MiB at 1 MiB in"
    assert len(report.output_files) > 4  # the output was cut into files of max_file_bytes


@pytest.mark.slow
def test_compaction_matches_model_long(tmp_path_factory) -> None:
    """400 examples of the model (~30 s); opt in with -m slow."""
    run = settings(max_examples=400, deadline=None)(given(
        ops_st, st.sampled_from([200, 1024, 4096]), st.sampled_from([0, 64 * 1024 * 1024]))(
        lambda ops, buffer, io_buffer: run_model(tmp_path_factory, ops, buffer, io_buffer)))
    run()


def test_corrupt_metadata_is_detected(tmp_path) -> None:
    from dkvstream.storage.errors import CorruptionError

    log = compacted_log(tmp_path)
    (key,) = log.store.list("log/metadata/")
    data = bytearray(log.store.get(key))
    data[5] ^= 1
    log.store.put(key, bytes(data))
    with pytest.raises(CorruptionError, match=rf"{key}: metadata CRC32C mismatch"):
        Log(log.store).metadata()
