"""Topics end to end: produce/fetch against a dict oracle, flush bounds, consumer
groups, idempotent commits, corruption, garbage collection, the dump CLI, S3."""
from __future__ import annotations

import io
import random

import pytest

from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.log import (
    COMPACT,
    Log,
    OffsetOutOfRangeError,
    ProducerConfig,
    TopicConfig,
    TopicExistsError,
    UnknownTopicError,
)
from dkvstream.storage.log.dump import main as dump_main


def produce_random(log: Log, n: int, seed: int = 1) -> dict[int, list]:
    rng = random.Random(seed)
    prod = log.producer(ProducerConfig(batch_bytes=300))
    oracle: dict[int, list] = {}
    pending = []
    for i in range(n):
        key = b"k%d" % rng.randrange(40)
        value = bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
        headers = (("h", b"%d" % i),) if i % 5 == 0 else ()
        _, part = prod.send("t", key, value, timestamp=10_000 + i, headers=headers)
        pending.append((part, key, value, 10_000 + i, headers))
        if rng.random() < 0.05:
            for (_, p), _ in prod.flush().items():
                oracle.setdefault(p, [])
            pending = _assign(pending, oracle)
    prod.flush()
    return _assign_all(pending, oracle)


def _assign(pending, oracle):
    for part, key, value, ts, hs in pending:
        oracle.setdefault(part, []).append((len(oracle[part]), ts, key, value, hs))
    return []


def _assign_all(pending, oracle):
    _assign(pending, oracle)
    return oracle


def test_produce_fetch_matches_oracle(store) -> None:
    log = Log(store)
    log.create_topic("t", TopicConfig(partitions=3, index_interval_bytes=256))
    oracle = produce_random(log, 1500)
    assert log.end_offsets("t") == [len(oracle.get(p, [])) for p in range(3)]
    for p, expected in oracle.items():
        got = log.read("t", p)
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == expected
        mid = len(expected) // 2
        res = log.fetch("t", p, mid, max_records=7)
        assert [r.offset for r in res.records] == list(range(mid, mid + 7)) and res.next_offset == mid + 7
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch("t", 0, 10**9)
    with pytest.raises(UnknownTopicError, match="no partition 3"):
        log.fetch("t", 3, 0)


def test_flush_bounds_and_files(tmp_path) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("t", TopicConfig(partitions=4))
    now = [0]
    prod = log.producer(ProducerConfig(linger_ms=250, max_file_bytes=10_000), clock=lambda: now[0])
    for i in range(100):
        prod.send("t", b"k%d" % i, b"x" * 50)
    assert prod.files_written == 0
    now[0] = 250
    prod.send("t", b"late", b"x")
    assert prod.files_written == 1 and sum(log.end_offsets("t")) == 101
    for i in range(400):
        prod.send("t", b"k%03d" % i, b"x" * 50)
    # size bound: 78 B per record (24 + key + value), a flush at each 129th record
    assert prod.files_written == 4 and sum(log.end_offsets("t")) == 101 + 3 * 129
    assert len(log.store.list("log/files/")) == 4  # one file per flush, holding every partition


def test_topic_creation_is_idempotent(store) -> None:
    log = Log(store)
    log.create_topic("t", TopicConfig(partitions=2))
    log.create_topic("t", TopicConfig(partitions=2))
    with pytest.raises(TopicExistsError):
        log.create_topic("t", TopicConfig(partitions=3))


def test_consumer_group_offsets_survive_a_new_consumer(store) -> None:
    log = Log(store)
    log.create_topic("t", TopicConfig(partitions=2))
    prod = log.producer()
    for i in range(50):
        prod.send("t", b"k%d" % i, b"v%d" % i)
    prod.flush()
    c = log.consumer("g1")
    c.assign("t")
    first = c.poll(max_records=30)
    c.commit()
    c2 = log.consumer("g1")
    c2.assign("t")
    rest = c2.poll(max_records=1000)
    assert sorted((p, r.offset) for _, p, r in first + rest) == sorted(
        (p, o) for p in range(2) for o in range(log.end_offsets("t")[p]))
    assert log.committed_offsets("g2") == {}
    assert log.metadata().topic("__consumer_offsets").config.cleanup_policy == COMPACT
    for _ in range(3):
        c2.commit()
    log.clean(force=True)
    assert log.committed_offsets("g1") == c2.positions


def test_idempotent_commit_is_applied_once(store) -> None:
    log = Log(store)
    log.create_topic("t")
    for _ in range(2):
        prod = log.producer()
        prod.send("t", b"k", b"v")
        prod.flush(producer=("sink-a", 7))
    assert log.end_offsets("t") == [1]
    assert len(log.store.list("log/files/")) == 1


def test_corrupt_file_detected_on_fetch(tmp_path) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("t")
    prod = log.producer()
    for i in range(20):
        prod.send("t", b"k", b"value %d" % i)
    prod.flush()
    (key,) = log.store.list("log/files/")
    data = bytearray(log.store.get(key))
    data[100] ^= 0xFF
    log.store.put(key, bytes(data))
    with pytest.raises(CorruptionError, match=rf"{key}.* at byte 0"):
        log.read("t", 0)
    out = io.StringIO()
    assert dump_main(["segment", str(tmp_path / key)], out) == 1


def test_garbage_collection_spares_young_and_live_files(tmp_path) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("t")
    prod = log.producer()
    prod.send("t", b"k", b"v")
    prod.flush()
    orphan = log.put_segment(b"never committed")
    assert log.collect_garbage() == []
    assert log.collect_garbage(grace_ms=0, now=10**13) == [orphan]
    assert len(log.read("t", 0)) == 1


def test_dump_cli(tmp_path) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("c", TopicConfig(partitions=1, cleanup_policy=COMPACT, index_interval_bytes=50))
    prod = log.producer()
    for i in range(300):
        prod.send("c", b"k%d" % (i % 30 if i % 3 else i), b"v%d" % i, timestamp=i)
    prod.flush()
    log.clean()
    (key,) = log.store.list("log/files/")
    out = io.StringIO()
    assert dump_main(["segment", str(tmp_path / key), "--records", "2"], out) == 0
    text = out.getvalue()
    assert "chunk c/0:" in text and "compacted=True" in text and "gaps=" in text
    assert "offset index:" in text and "present offsets bitmap:" in text and "key='k" in text
    out = io.StringIO()
    assert dump_main(["describe", str(tmp_path), "--entries"], out) == 0
    assert "dirty_ratio" in out.getvalue() and "c/0 [0, 300)" in out.getvalue()


def test_produce_consume_compact_on_s3(s3_store) -> None:
    log = Log(s3_store)
    log.create_topic("c", TopicConfig(partitions=2, cleanup_policy=COMPACT))
    prod = log.producer()
    for rnd in range(3):
        for i in range(100):
            prod.send("c", b"k%d" % i, b"r%d" % rnd)
        prod.flush()
    report = log.clean()
    assert report.gets == 6 and report.records_out == 100
    got = log.read("c", 0) + log.read("c", 1)
    assert sorted(r.key for r in got) == sorted(b"k%d" % i for i in range(100))
    assert {r.value for r in got} == {b"r2"}
    assert log.offsets_for_times("c", {0: 0})[0] is not None


def test_fetch_with_stale_metadata_survives_a_cleaning(tmp_path) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("c", TopicConfig(cleanup_policy=COMPACT))
    prod = log.producer()
    for i in range(100):
        prod.send("c", b"k%d" % (i % 10), b"v%d" % i)
    prod.flush()
    versions = [log.metadata()]  # names the produced file, which the cleaning deletes
    assert log.clean().files_deleted

    class StaleLog(Log):
        def metadata(self):
            return versions.pop() if versions else super().metadata()

    got = StaleLog(log.store).fetch("c", 0, 0).records
    assert [r.value for r in got] == [b"v%d" % i for i in range(90, 100)]
