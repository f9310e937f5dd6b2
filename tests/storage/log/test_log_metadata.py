"""The log metadata's chain of snapshots, deltas and entry pages: a flush costs the same
requests and about the same bytes after 2,600 flushes as after a few, the number of
metadata objects stays bounded, a cold reader rebuilds exactly the writer's state, and
format-1 metadata is still read and migrated."""
from __future__ import annotations

import json

from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.log import COMPACT, Log, TopicConfig
from dkvstream.storage.log.metadata import FANOUT, SEAL_ENTRIES, SNAPSHOT_INTERVAL, LogMetadata, MetadataStore
from dkvstream.storage.objectstore import subtract_requests
from dkvstream.storage.objectstore.local import LocalObjectStore
from dkvstream.storage.objectstore.memory import MemoryObjectStore

REQUESTS = ("GET", "PUT", "LIST", "DELETE", "HEAD")


def _state(md: LogMetadata) -> tuple:
    """Everything a version holds, runs included."""
    return (md.version, sorted(md.producers.items()),
            [(n, t.config, [(p.scalars(), p.entries, p.runs) for p in t.partitions])
             for n, t in sorted(md.topics.items())])


def test_flush_cost_and_metadata_objects_do_not_grow_with_flushes() -> None:
    """Per flush, requests and bytes measured from the store's counters: two windows of
    512 versions, one early and one ending after 2,000 flushes, each with 32 snapshots, 8
    page seals and a merge per partition, issue the same requests; bytes are the same
    order. A flush writing a delta is one LIST and two PUTs (file, version), no GET."""
    store = MemoryObjectStore()
    log = Log(store)
    log.create_topic("t", TopicConfig(partitions=2))  # version 1; flush k writes version k + 1
    prod = log.producer()
    per_version: dict[int, dict[str, int]] = {}
    last = 2_082
    for v in range(2, last):
        prod.send("t", b"k", b"v", partition=0)
        prod.send("t", b"k", b"v", partition=1)
        before = log.store.stats.snapshot()
        prod.flush()
        per_version[v] = subtract_requests(log.store.stats.snapshot(), before)
        if v % SNAPSHOT_INTERVAL:
            assert {k: per_version[v][k] for k in REQUESTS} == {"GET": 0, "PUT": 2, "LIST": 1, "DELETE": 0,
                                                                 "HEAD": 0}, v

    def window(first: int) -> dict[str, int]:
        return {k: sum(per_version[v][k] for v in range(first, first + 512)) for k in per_version[first]}

    early, late = window(600), window(1_570)
    assert {k: early[k] for k in REQUESTS} == {k: late[k] for k in REQUESTS}
    # 512 flushes: 512 files and versions; per partition 8 pages (7 seals, and a seal
    # carried into the merge of 8 pages into one of the next level).
    assert early["PUT"] == 512 * 2 + 2 * 8
    assert early["bytes_read"] == late["bytes_read"] == 0
    assert late["bytes_written"] < 1.3 * early["bytes_written"]
    small = per_version[11]["bytes_written"]  # the tenth flush, a delta
    assert all(per_version[v]["bytes_written"] < 1.1 * small for v in range(last - 40, last) if v % SNAPSHOT_INTERVAL)

    assert log.metadata().version == last - 1
    versions = log.store.list("log/metadata/")
    pages = log.store.list("log/pages/")
    assert len(versions) <= 2 * SNAPSHOT_INTERVAL
    entries = last - 2  # per partition
    levels = 1
    while SEAL_ENTRIES * FANOUT ** levels < entries:
        levels += 1
    assert len(pages) <= 2 * FANOUT * levels
    md = log.metadata()
    assert set(pages) == md.pages() | md.base_pages | set(md.retired)

    # A cold reader: the chain from the snapshot (<= 16 versions) and the pages, once each.
    fresh = Log(store)
    before = fresh.store.stats.snapshot()
    assert _state(fresh.metadata()) == _state(md)
    cold = subtract_requests(fresh.store.stats.snapshot(), before)
    assert cold["LIST"] == 1 and cold["GET"] <= SNAPSHOT_INTERVAL + len(md.base_pages)
    got = fresh.read("t", 1)
    assert [r.offset for r in got] == list(range(entries)) and {r.value for r in got} == {b"v"}


def _small(log: Log) -> Log:
    """``log`` with tiny snapshot interval, seal size and fanout: pages, merges, slices
    and trims after a few flushes."""
    log.meta = MetadataStore(log.store, log.prefix, snapshot_interval=3, seal_entries=2, fanout=2)
    return log


records = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6), st.booleans()), min_size=1, max_size=4)
ops = st.lists(st.one_of(
    st.tuples(st.just("flush"), st.integers(0, 1), records),  # writer 0 or 1 sends and flushes
    st.tuples(st.just("send"), st.just(0), records),  # writer 0 buffers (lost on "reopen")
    st.tuples(st.just("clean"), st.integers(0, 12), st.just([])),  # records younger than this stay dirty
    st.tuples(st.just("reopen"), st.just(0), st.just([])),
), min_size=10, max_size=60)


@given(ops)
@settings(max_examples=40, deadline=None)
def test_cold_and_warm_readers_rebuild_the_writers_state(tmp_path_factory, ops) -> None:
    """Random flushes by two writers, cleanings and cold reopenings of a compacted topic
    and a plain one, with a tiny snapshot interval, seal size and fanout (pages, merges,
    page slices left by the cleaner, trims), against a dict model: the plain topic holds
    every record in order, the compacted one each key's latest record; every reader (the
    other writer warm, a new one cold) rebuilds the writer's state exactly, runs
    included; the pages left are those the newest chain names or will trim."""
    store = MemoryObjectStore()
    log, other = _small(Log(store)), _small(Log(store))
    log.create_topic("c", TopicConfig(partitions=2, cleanup_policy=COMPACT, min_cleanable_dirty_ratio=0.0))
    log.create_topic("d", TopicConfig(partitions=2))
    producers = {0: log.producer(), 1: other.producer()}
    pending: dict[int, list] = {0: [], 1: []}
    plain: dict[int, list] = {0: [], 1: []}
    latest: dict[int, dict] = {0: {}, 1: {}}
    n = 0
    for op, arg, recs in ops:
        writer = arg if op in ("flush", "send") else 0
        for part, k, tombstone in recs:
            n += 1
            value = None if tombstone else b"v%d" % n
            producers[writer].send("c", b"k%d" % k, value, partition=part, timestamp=n)
            producers[writer].send("d", b"k%d" % k, b"v%d" % n, partition=part, timestamp=n)
            pending[writer].append((part, b"k%d" % k, value, b"v%d" % n))
        if op == "flush":
            assigned = producers[writer].flush()
            nxt = {(t, p): first for (t, p), (first, _) in assigned.items()}
            for part, key, value, dvalue in pending[writer]:
                latest[part][key] = (nxt[("c", part)], value)
                nxt[("c", part)] += 1
                plain[part].append(dvalue)
            pending[writer] = []
        elif op == "clean":  # up to the first entry holding one of the newest ``arg`` records
            log.clean(force=True, clock=lambda now=n - arg: now)
        elif op == "reopen":
            log = _small(Log(store))
            producers[0] = log.producer()  # what the old one buffered is lost, as in a crash
            pending[0] = []
        newest = log.metadata()
        assert _state(other.metadata()) == _state(newest)
        assert _state(Log(store).metadata()) == _state(newest)
        for part in (0, 1):
            assert [r.value for r in log.read("d", part)] == plain[part]
            got = {r.key: (r.offset, r.value) for r in log.read("c", part)}
            assert all(latest[part][k] == v for k, v in got.items())
            assert {k for k, (_, v) in latest[part].items() if v is not None} <= set(got)
    md = log.metadata()
    assert set(store.list("log/pages/")) <= md.pages() | md.base_pages | set(md.retired)
    assert len(store.list("log/metadata/")) <= 2 * 3


def _v1_version(md: LogMetadata) -> bytes:
    """``md`` encoded in metadata format 1 (one full state per version), as the format's
    description says: compact sorted JSON, then a CRC32C trailer line."""
    body = json.dumps({
        "format_version": 1, "version": md.version, "producers": md.producers,
        "topics": {n: {"config": t.config.to_json(),
                       "partitions": [{"log_start": p.log_start, "next_offset": p.next_offset,
                                       "cleaned_to": p.cleaned_to, "entries": [e.to_json() for e in p.entries]}
                                      for p in t.partitions]}
                   for n, t in md.topics.items()},
    }, sort_keys=True, separators=(",", ":")).encode()
    return body + b"\n" + b'{"crc32c":"%08x"}' % crc32c(body) + b"\n"


def test_format_1_metadata_is_read_and_migrated(tmp_path) -> None:
    """A log whose metadata is format 1 (every version a full state): read as is; the
    next commits write format 2, and trimming deletes the format-1 versions."""
    store = LocalObjectStore(tmp_path)
    log = Log(store)
    log.create_topic("t", TopicConfig(partitions=2))
    prod = log.producer()
    for i in range(30):
        prod.send("t", b"k%d" % i, b"v%d" % i, partition=i % 2)
        prod.flush(producer=("sink", i))
    md = log.metadata()
    for k in store.list("log/metadata/") + store.list("log/pages/"):
        store.delete(k)
    for v in (md.version - 1, md.version):  # two old versions, the newest one the state
        store.put(log.meta.key(v), _v1_version(md))
    old = Log(store)
    got = old.metadata()
    assert got.version == md.version and got.producers == md.producers
    assert [p.entries for p in got.topic("t").partitions] == [p.entries for p in md.topic("t").partitions]
    prod = old.producer()
    for i in range(30, 30 + 3 * SNAPSHOT_INTERVAL):
        prod.send("t", b"k%d" % i, b"v%d" % i, partition=i % 2)
        prod.flush(producer=("sink", i))
    prod.flush(producer=("sink", 5))  # an old sequence: applied once, as before the migration
    fresh = Log(store)
    assert [r.value for r in fresh.read("t", 0)] == [b"v%d" % i for i in range(0, 30 + 3 * SNAPSHOT_INTERVAL, 2)]
    assert fresh.metadata().producers == {"sink": 29 + 3 * SNAPSHOT_INTERVAL}
    for k in store.list("log/metadata/"):
        assert json.loads(store.get(k).split(b"\n")[0])["format_version"] == 2


def test_reader_lists_again_when_its_chain_is_trimmed(tmp_path) -> None:
    """A reader that listed the versions, then lost the race with two snapshots that
    trimmed them, lists again and reads the newest chain."""
    store = LocalObjectStore(tmp_path)
    writer = Log(store)
    writer.create_topic("t")
    prod = writer.producer()
    prod.send("t", b"k", b"v0")
    prod.flush()
    reader = Log(store)
    real_get = store.get
    state = {"armed": True}

    def get(key: str) -> bytes:
        if state["armed"]:  # the reader listed: now two snapshots land and trim its versions
            state["armed"] = False
            for i in range(2 * SNAPSHOT_INTERVAL):
                prod.send("t", b"k", b"v%d" % (i + 1))
                prod.flush()
        return real_get(key)

    store.get = get
    try:
        md = reader.metadata()
    finally:
        store.get = real_get
    assert not state["armed"]
    assert md.version == writer.metadata().version and md.topic("t").partitions[0].next_offset == 33
    try:
        real_get(writer.meta.key(2))
    except ObjectNotFoundError:
        pass
    else:
        raise AssertionError("version 2 should have been trimmed")


def test_snapshot_losing_its_race_leaves_no_page_and_garbage_collection_spares_live_pages() -> None:
    """Writer B's snapshot (version 3) loses to writer A's: B deletes the pages it wrote
    and commits version 4. A page a crashed snapshot left is collected; named ones stay."""
    store = MemoryObjectStore()
    a, b = _small(Log(store)), _small(Log(store))
    a.create_topic("t")  # version 1
    prod_a = a.producer()
    prod_a.send("t", b"k", b"a1")
    prod_a.flush()  # version 2
    prod_b = b.producer()
    for i in range(3):
        prod_b.send("t", b"k", b"b%d" % i)
    raced = []
    real = b.meta._snapshot

    def snapshot_then_lose(before, md, body):
        written = real(before, md, body)
        if not raced:  # A commits version 3 between B's snapshot pages and B's version
            raced.append(written)
            prod_a.send("t", b"k", b"a2")
            prod_a.flush()
        return written

    b.meta._snapshot = snapshot_then_lose
    assert prod_b.flush() == {("t", 0): (2, 4)}
    assert raced and raced[0]  # B had written pages for its lost snapshot
    md = Log(store).metadata()
    assert md.version == 4 and md.base == 3
    pages = set(store.list("log/pages/"))
    assert not pages & set(raced[0]) and pages == md.pages() | md.base_pages
    assert [r.value for r in Log(store).read("t", 0)] == [b"a1", b"a2", b"b0", b"b1", b"b2"]

    orphan = "log/pages/0000000000001-crashedsnapshot.json"
    store.put(orphan, b"a page no version names")
    assert a.collect_garbage(grace_ms=0, now=10**13) == [orphan]
    assert set(store.list("log/pages/")) == pages
    assert [r.value for r in Log(store).read("t", 0)] == [b"a1", b"a2", b"b0", b"b1", b"b2"]
