"""DKV facade: lifecycle, flush triggers, WAL truncation, request counts, naming, errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.db import prefix_successor
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.errors import ClosedError, ManifestConflictError, ObjectNotFoundError
from dkvstream.storage.objectstore import open_object_store
from dkvstream.storage.objectstore.local import LocalObjectStore

PREFIX = "jobs/flights/state/route_daily_delays/kg-0000-0127"


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path)


def test_empty_db(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    assert db.get(b"x") is None
    assert list(db.scan_prefix(b"")) == []
    assert db.stats()["last_seq"] == 0


def test_put_get_delete_scan(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    db.put(b"a/1", b"x")
    db.put(b"a/2", b"y")
    db.put(b"b/1", b"z")
    db.put(b"a/1", b"x2")
    db.delete(b"a/2")
    db.delete(b"never")
    assert db.get(b"a/1") == b"x2" and db.get(b"a/2") is None
    assert list(db.scan_prefix(b"a/")) == [(b"a/1", b"x2")]
    assert list(db.scan_range(b"a/2", None)) == [(b"b/1", b"z")]
    assert db.stats()["last_seq"] == 6


def test_no_object_store_request_per_key(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(memtable_bytes=1 << 30))
    store.stats.reset()
    for i in range(5000):
        db.put(b"k%d" % i, b"v")
        db.get(b"k%d" % i)
    assert store.stats.snapshot()["PUT"] == 0 and store.stats.snapshot()["GET"] == 0
    db.checkpoint("c1")
    s = store.stats.snapshot()
    assert s["PUT"] == 2  # one WAL object + one manifest


def test_memtable_limit_flushes_during_put(store: LocalObjectStore) -> None:
    opts = DKVOptions(memtable_bytes=10_000, l0_compaction_trigger=99)
    db = DKV.open(store, PREFIX, options=opts)
    for i in range(1000):
        db.put(b"key-%05d" % i, b"v" * 20)
    st = db.stats()
    assert st["tables_per_level"][0] >= 5
    assert st["memtable_bytes"] < 10_000
    assert st["flushed_seq"] > 0 and st["wal_buffered_records"] < 1000
    assert all(db.get(b"key-%05d" % i) == b"v" * 20 for i in range(1000))


def test_checkpoint_wal_then_flush_truncates_wal(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(wal_flush_bytes=1 << 20))
    db.put(b"a", b"1")
    m1 = db.checkpoint("e1-a")
    db.put(b"b", b"2")
    m2 = db.checkpoint("e2-a")
    man2 = load_manifest(store, m2)
    assert [w.first_seq for w in man2.wal] == [1, 2]  # WAL objects in order, not in a table
    assert man2.levels.levels == ((),)
    db.flush()
    m3 = db.checkpoint("e3-a")
    man3 = load_manifest(store, m3)
    assert man3.wal == () and len(man3.levels.l0) == 1 and man3.flushed_seq == 2
    both = {b"a": b"1", b"b": b"2"}
    for key, expected in ((m1, {b"a": b"1"}), (m2, both), (m3, both)):
        assert dict(DKV.open(store, PREFIX, key).scan_prefix(b"")) == expected


def test_checkpoint_flushes_when_wal_would_exceed_limit(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(wal_flush_bytes=2000))
    for i in range(20):
        db.put(b"k%02d" % i, b"x" * 50)
    m = load_manifest(store, db.checkpoint("c1"))
    assert len(m.wal) == 1 and not m.levels.l0
    for i in range(20):
        db.put(b"j%02d" % i, b"x" * 50)
    m = load_manifest(store, db.checkpoint("c2"))
    assert m.wal == () and len(m.levels.l0) == 1  # flushed instead of listing > 2000 bytes
    assert len(dict(DKV.open(store, PREFIX, db.checkpoint("c3")).scan_prefix(b""))) == 40


def test_writes_after_checkpoint_are_not_in_it(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(memtable_bytes=300))
    db.put(b"a", b"1")
    m = db.checkpoint("c1")
    for i in range(50):
        db.put(b"z%d" % i, b"later")  # forces flushes of tables the manifest doesn't name
    db.delete(b"a")
    db.checkpoint("c2")
    old = DKV.open(store, PREFIX, m)
    assert list(old.scan_prefix(b"")) == [(b"a", b"1")]
    assert old.stats()["last_seq"] == 1


def test_sequence_numbers_continue_after_reopen(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(memtable_bytes=200))
    for i in range(30):
        db.put(b"k", b"%d" % i)
    m = db.checkpoint("c1")
    db2 = DKV.open(store, PREFIX, m, DKVOptions(memtable_bytes=200))
    assert db2.stats()["last_seq"] == 30
    db2.put(b"k", b"new")
    db2.flush()  # new table must shadow older tables holding b"k"
    assert db2.get(b"k") == b"new"
    assert db2.stats()["last_seq"] == 31


def test_manifest_conflict_and_names(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    db.put(b"a", b"1")
    db.checkpoint("e00000007-a3f9c1")
    with pytest.raises(ManifestConflictError, match="e00000007-a3f9c1"):
        db.checkpoint("e00000007-a3f9c1")
    for bad in ("", "a/b", "..", "x y"):
        with pytest.raises(ValueError):
            db.checkpoint(bad)


def test_retried_attempts_never_clash(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    db.put(b"a", b"0")
    base = db.checkpoint("e1-a")
    attempts = []
    for attempt in ("a", "b"):
        d = DKV.open(store, PREFIX, base)
        d.put(b"a", attempt.encode())
        d.flush()
        attempts.append(d.checkpoint(f"e2-{attempt}"))
    assert len(store.list(f"{PREFIX}/sst/")) == 2  # distinct files
    assert [DKV.open(store, PREFIX, m).get(b"a") for m in attempts] == [b"a", b"b"]


def test_store_reopens_from_uri_like_a_spark_task(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    db.put(b"a", b"1")
    m = db.checkpoint("c1")
    uri = pickle.loads(pickle.dumps(store.root_uri))
    assert DKV.open(open_object_store(uri), PREFIX, m).get(b"a") == b"1"


def test_missing_manifest(store: LocalObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError, match="nope.json"):
        DKV.open(store, PREFIX, f"{PREFIX}/manifests/nope.json")


def test_closed_and_type_errors(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    with pytest.raises(TypeError):
        db.put("str", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        db.put(b"k", bytearray(b"v"))  # type: ignore[arg-type]
    db.put(b"k", b"v")  # close() empties the memtable: get and get_many of k raise alike
    assert db.get_many([b"k", b"x"]) == [b"v", None]
    db.close()
    for call in (lambda: db.put(b"k", b"v"), lambda: db.get(b"k"), lambda: db.scan_prefix(b""),
                 lambda: db.checkpoint("c"), lambda: db.delete(b"k"), lambda: db.get_many([b"k"]),
                 lambda: db.get_many([b"x"])):
        with pytest.raises(ClosedError):
            call()


def test_stats_shape(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX, options=DKVOptions(l0_compaction_trigger=2))
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2")
    st = db.stats()
    assert st["tables_per_level"] == [1] and st["bytes_per_level"][0] > 0
    assert st["memtable_entries"] == 1 and st["approx_live_keys"] == 2
    assert st["last_seq"] == 2 and st["memtable_bytes"] > 0
    db.flush()  # second L0 table hits the trigger: compacted into L1
    assert db.stats()["tables_per_level"] == [0, 1]


def test_prefix_successor() -> None:
    assert prefix_successor(b"ab") == b"ac"
    assert prefix_successor(b"a\xff") == b"b"
    assert prefix_successor(b"\xff\xff") is None
    assert prefix_successor(b"") is None


def test_scan_prefix_with_ff_bytes(store: LocalObjectStore) -> None:
    db = DKV.open(store, PREFIX)
    for k in (b"\xff", b"\xff\x00", b"\xff\xff", b"\xfe\xff", b"a"):
        db.put(k, k)
    db.flush()
    assert [k for k, _ in db.scan_prefix(b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xff"]
    assert [k for k, _ in db.scan_prefix(b"\xfe")] == [b"\xfe\xff"]


def test_gets_over_more_tables_than_the_table_cache_holds_read_blocks_not_tables(store: LocalObjectStore) -> None:
    """Eight ~64 KiB tables against a 256 KiB table cache: each table is fetched whole at
    most once; after its eviction it is read by 4 KiB blocks, so 400 random gets read a
    few whole tables plus blocks, not a whole table per get. Values equal a dict."""
    import random

    opts = DKVOptions(memtable_bytes=80 << 10, table_cache_bytes=256 << 10, block_cache_bytes=16 << 10,
                      l0_compaction_trigger=100)
    model = {}
    with DKV.open(store, "db", options=opts) as db:
        for i in range(8 * 600):
            key, value = f"k{i:06d}".encode(), random.Random(i).randbytes(100)
            db.put(key, value)
            model[key] = value
        db.flush()
        assert len(list(db.levels.all_tables())) >= 6
        table_bytes = sum(t.size for t in db.levels.all_tables())
        before = store.stats.snapshot()["bytes_read"]
        rng = random.Random(7)
        keys = sorted(model)
        for _ in range(400):
            key = rng.choice(keys)
            assert db.get(key) == model[key]
        read = store.stats.snapshot()["bytes_read"] - before
    assert read < table_bytes + 400 * 8 * 1024, f"read {read:,} bytes for 400 gets over {table_bytes:,} bytes of tables"


def test_flush_and_compaction_restore_the_garbage_collector(tmp_path, monkeypatch) -> None:
    """The collector is paused while a flush or compaction builds tables and restored
    after, also when the build fails; a collector the caller disabled stays disabled."""
    import gc

    from dkvstream.storage.dkv import db as db_module

    seen = []
    real = db_module.TableStore.write_table_columns

    def spying(self, *a, **k):
        seen.append(gc.isenabled())
        return real(self, *a, **k)

    monkeypatch.setattr(db_module.TableStore, "write_table_columns", spying)
    db = DKV.open(LocalObjectStore(str(tmp_path)), PREFIX)
    db.put(b"k", b"v")
    assert gc.isenabled()
    db.flush()
    assert seen == [False] and gc.isenabled()

    def failing(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(db_module.TableStore, "write_table_columns", failing)
    db.put(b"k2", b"v")
    with pytest.raises(OSError):
        db.flush()
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(db_module.TableStore, "write_table_columns", real)
        db.flush()
        assert not gc.isenabled()
    finally:
        gc.enable()

    # Compaction: two flushed tables merged by compact_all, then a compaction that fails.
    monkeypatch.setattr(db_module.TableStore, "write_table_columns", real)
    merging = []
    real_compaction = db_module.run_compaction

    def compacting(*a, **k):
        merging.append(gc.isenabled())
        return real_compaction(*a, **k)

    monkeypatch.setattr(db_module, "run_compaction", compacting)
    db.put(b"k3", b"v")
    db.flush()
    db.compact_all()
    assert merging == [False] and gc.isenabled()
    assert [db.get(k) for k in (b"k", b"k2", b"k3")] == [b"v", b"v", b"v"]

    def failing_compaction(*a, **k):
        raise OSError("disk full")

    db.put(b"k4", b"v")  # compact_all flushes it to L0, then merges
    monkeypatch.setattr(db_module, "run_compaction", failing_compaction)
    with pytest.raises(OSError):
        db.compact_all()
    assert gc.isenabled()


def _at_checkpoint(store: LocalObjectStore):
    """An instance ``a`` checkpointed at ``m1`` with entries in its memtable, and the
    dict model of its state. Returns (a, m1, model)."""
    a = DKV.open(store, PREFIX)
    model = {}
    for i in range(40):
        k, v = f"k{i:03d}".encode(), f"v{i}".encode()
        a.put(k, v)
        model[k] = v
    a.delete(b"k007")
    del model[b"k007"]
    return a, a.checkpoint("e1-a"), model


def _another_epoch(store: LocalObjectStore, manifest: str, model: dict, name: str, writes: int = 20) -> str:
    """Another worker's epoch from ``manifest``: ``writes`` writes, a checkpoint."""
    b = DKV.open(store, PREFIX, manifest)
    for i in range(writes):
        k = f"k{(i * 7) % 60:03d}".encode()
        b.put(k, name.encode())
        model[k] = name.encode()
    m = b.checkpoint(name)
    b.close()
    return m


def test_advance_to_replays_only_the_new_wal_objects(store: LocalObjectStore) -> None:
    """Accepted case: the caught-up instance holds what ``DKV.open`` of the same manifest
    holds (oracle: a dict of every write), and its next checkpoint restores it too."""
    a, m1, model = _at_checkpoint(store)
    m3 = _another_epoch(store, _another_epoch(store, m1, model, "e2-b"), model, "e3-b")
    assert a.advance_to(m3)
    assert dict(a.scan_prefix(b"")) == model == dict(DKV.open(store, PREFIX, m3).scan_prefix(b""))
    a.put(b"new", b"1")
    model[b"new"] = b"1"
    m4 = a.checkpoint("e4-a")
    assert dict(DKV.open(store, PREFIX, m4).scan_prefix(b"")) == model


def test_advance_to_refuses_writes_since_the_checkpoint(store: LocalObjectStore) -> None:
    """The instance wrote after its checkpoint; another attempt checkpointed the same
    state without writing (same WAL list, a lower last seq): refused, instance unchanged."""
    a, m1, model = _at_checkpoint(store)
    a.put(b"mine", b"x")
    m2 = _another_epoch(store, m1, dict(model), "e2-b", writes=0)
    assert a.advance_to(m2) is False
    assert dict(a.scan_prefix(b"")) == {**model, b"mine": b"x"}


def test_advance_to_refuses_sealed_memtables(store: LocalObjectStore, monkeypatch) -> None:
    """A flush failed after the checkpoint and left a sealed memtable: refused."""
    from dkvstream.storage.dkv import db as db_module

    a, m1, model = _at_checkpoint(store)
    m2 = _another_epoch(store, m1, dict(model), "e2-b")

    def failing(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(db_module.TableStore, "write_table_columns", failing)
    with pytest.raises(OSError):
        a.flush_memtable()
    monkeypatch.undo()
    assert a.stats()["sealed_memtables"] == 1
    assert a.advance_to(m2) is False
    assert dict(a.scan_prefix(b"")) == model


def test_advance_to_refuses_a_manifest_behind_the_instance(store: LocalObjectStore) -> None:
    """The instance is at m2; going back to its own earlier m1, or to a sibling attempt's
    manifest from m1 (same WAL count, other objects), is refused; instance unchanged."""
    a, m1, model = _at_checkpoint(store)
    sibling = _another_epoch(store, m1, {}, "e2-b")
    a.put(b"mine", b"x")
    model[b"mine"] = b"x"
    a.checkpoint("e2-a")
    assert a.advance_to(m1) is False
    assert a.advance_to(sibling) is False
    assert dict(a.scan_prefix(b"")) == model


def test_gc_pause_overlapping_in_two_threads_keeps_the_collector_off_until_the_last_leaves() -> None:
    """Thread A enters, B enters, A leaves: B's block still runs with the collector off;
    the collector comes back when B leaves (a per-block save and restore turned it on
    under B)."""
    import gc
    import threading

    from dkvstream.storage.dkv.gc_pause import gc_paused

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen_in_b_after_a_left = []

    def a() -> None:
        with gc_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with gc_paused():
            b_in.set()
            a_out.wait(10)
            seen_in_b_after_a_left.append(gc.isenabled())

    assert gc.isenabled()
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen_in_b_after_a_left == [False]
    assert gc.isenabled()
