"""Erasure of a key from a topic (``cleaner.erase_key``) against a model: every other
record of every topic stays with its offset, the key's records and tombstone are gone,
and no segment file holds the key's bytes, raw or decoded (batches are compressed)."""
from __future__ import annotations

import random

import pytest

from dkvstream.storage.log import COMPACT, Log, TopicConfig
from dkvstream.storage.log.cleaner import erase_key
from dkvstream.storage.log.segment import chunk_batches, read_directory
from dkvstream.storage.objectstore.local import LocalObjectStore

ERASED = b"subject-erase-me-93kq"


def everything(log: Log) -> dict[tuple[str, int], list[tuple]]:
    """``{(topic, partition): [(offset, key, value), ...]}`` of the whole log."""
    md = log.metadata()
    return {(t, p): [(r.offset, r.key, r.value) for r in log.read(t, p)]
            for t in md.topics for p in range(len(md.topics[t].partitions))}


def holders(log: Log, needle: bytes) -> list[str]:
    """Every object under the log's prefix holding ``needle`` in its raw bytes or in a
    decoded record (key or value)."""
    found = []
    for key in log.store.list(log.prefix + "/"):
        data = log.store.get(key)
        decoded = []
        if key.endswith(".seg"):
            for chunk in read_directory(log.store, key, data):
                for _, b in chunk_batches(data, chunk, 0, key):
                    decoded += [x for x in b.keys() + b.values() if x]
        if needle in data or any(needle in x for x in decoded):
            found.append(key)
    return sorted(found)


def topics_holding(log: Log, needle: bytes) -> set[str]:
    """The topics of the chunks, in any segment file, that hold a record of key ``needle``
    (named by the metadata or not: a file's other chunks keep their bytes)."""
    found = set()
    for key in log.store.list(log.prefix + "/files/"):
        data = log.store.get(key)
        for chunk in read_directory(log.store, key, data):
            if any(needle in b.keys() for _, b in chunk_batches(data, chunk, 0, key)):
                found.add(chunk.topic)
    return found


def fill(log: Log, seed: int) -> None:
    """Random records of ``ERASED`` and other keys in a compacted topic ``c`` and a plain
    topic ``d``, flushed together (files shared by both), with cleanings between."""
    rng = random.Random(seed)
    prod = log.producer()
    for round_ in range(6):
        for i in range(rng.randrange(20, 60)):
            k = ERASED if rng.random() < 0.15 else b"k%d" % rng.randrange(25)
            prod.send("c", k, None if rng.random() < 0.1 else b"v%d-%d" % (round_, i))
            prod.send("d", ERASED if rng.random() < 0.1 else b"d%d" % i, b"w%d" % i)
        prod.flush()
        if round_ % 2:
            log.clean()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_erasure_from_a_compacted_topic_leaves_every_other_record(tmp_path, seed) -> None:
    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("c", TopicConfig(partitions=3, cleanup_policy=COMPACT, min_cleanable_dirty_ratio=0.0))
    log.create_topic("d", TopicConfig(partitions=2))
    fill(log, seed)
    before = everything(log)
    held = holders(log, ERASED)
    assert held and any(ERASED in (r[1] or b"") for rs in before.values() for r in rs)

    erased = erase_key(log, "c", ERASED)
    assert erased and set(erased) <= set(held)
    want = {tp: [r for r in rs if tp[0] != "c" or r[1] != ERASED] for tp, rs in before.items()}
    assert everything(log) == want
    # Only the plain topic's records of the key remain (moved where they shared a file).
    assert topics_holding(log, ERASED) == {"d"}
    assert any(r[1] == ERASED for r in want[("d", 0)] + want[("d", 1)])
    assert erase_key(log, "d", ERASED)
    assert holders(log, ERASED) == []
    assert everything(log) == {tp: [r for r in rs if r[1] != ERASED] for tp, rs in before.items()}
    # Idempotent, and the log goes on: a new record of the key is appended and read.
    assert erase_key(log, "c", ERASED) == [] and erase_key(log, "d", ERASED) == []
    prod = log.producer()
    prod.send("c", ERASED, b"new")
    prod.flush()
    assert [r[2] for rs in everything(log).values() for r in rs if r[1] == ERASED] == [b"new"]


def test_erasing_every_record_of_a_partition_keeps_its_offsets(tmp_path) -> None:
    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("c", TopicConfig(partitions=1, cleanup_policy=COMPACT))
    prod = log.producer()
    for i in range(5):
        prod.send("c", ERASED, b"v%d" % i)
    prod.flush()
    assert len(erase_key(log, "c", ERASED)) == 1
    assert log.read("c", 0) == [] and log.end_offsets("c") == [6]  # 5 records and the tombstone
    assert log.store.list(log.prefix + "/files/") == []
    prod.send("c", b"other", b"x")
    prod.flush()
    assert [(r.offset, r.key) for r in log.read("c", 0)] == [(6, b"other")]


def test_several_keys_in_one_rewrite(tmp_path) -> None:
    from dkvstream.storage.log.cleaner import erase_keys

    log = Log(LocalObjectStore(tmp_path))
    log.create_topic("d", TopicConfig(partitions=3))
    fill_keys = [ERASED, b"second-subject-x1", b"kept-a", b"kept-b"]
    prod = log.producer()
    for i in range(40):
        prod.send("d", fill_keys[i % 4], b"v%d" % i)
        if i % 10 == 9:
            prod.flush()
    before = everything(log)
    files = log.store.list(log.prefix + "/files/")
    held = erase_keys(log, "d", [ERASED, b"second-subject-x1"])
    assert held == sorted(files)  # every flush held both keys
    assert everything(log) == {tp: [r for r in rs if r[1] in (b"kept-a", b"kept-b")] for tp, rs in before.items()}
    assert holders(log, ERASED) == [] and holders(log, b"second-subject-x1") == []
