"""Garbage collection: named files stay, everything else under the prefixes goes, with the
remote-compaction exceptions (pending results, in-progress output directories)."""

from __future__ import annotations

from pathlib import Path

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc import collect_garbage, files_named_by
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint
from dkvstream.storage.objectstore.local import LocalObjectStore

OPTS = DKVOptions(memtable_bytes=800, l0_compaction_trigger=2, max_inline_compaction_bytes=0)
P = "op/r0"


def filled(store: LocalObjectStore, n: int = 300) -> DKV:
    db = DKV.open(store, P, options=OPTS)
    for i in range(n):
        db.put(b"k%04d" % (i % 150), b"v%d" % i)
    return db


def test_files_named_by_lists_manifest_tables_and_wal(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db = filled(store)
    db.put(b"w", b"in the wal")
    m = db.checkpoint("e1")
    named = files_named_by(store, [m])
    assert m in named
    assert {t.key for t in db.levels.all_tables()} <= named
    assert any("/wal/" in k for k in named)
    assert named <= set(store.list(P + "/"))


def test_retention_deletes_superseded_files_only_under_prefixes(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db = filled(store)
    m1 = db.checkpoint("e1")
    db.compact_all()
    m2 = db.checkpoint("e2")
    store.put("elsewhere/x", b"not ours")
    store.put(f"{P}/sst/orphan.sst", b"failed attempt")
    out = collect_garbage(store, [P], [m2], protect={f"{P}/sst/orphan.sst"})
    assert m1 in out["deleted_keys"] and out["bytes_freed"] > 0
    assert set(store.list(P + "/")) == files_named_by(store, [m2]) | {f"{P}/sst/orphan.sst"}
    assert store.exists("elsewhere/x")
    assert list(DKV.open(store, P, m2, OPTS).scan_range(b"", None)) == list(
        db.scan_range(b"", None)
    )


def with_pending_compaction(store: LocalObjectStore) -> tuple[DKV, str, str]:
    """A filled range checkpointed as ``e1`` after a flush, and a full remote compaction
    of that checkpoint published but not installed. Returns the DKV instance, the
    manifest key of ``e1`` and the result key."""
    db = filled(store)
    db.flush_memtable()
    m1 = db.checkpoint("e1")
    return db, m1, compact_checkpoint(store, P, m1, OPTS, full=True)


def test_pending_and_in_progress_compactions_are_kept(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db, m1, rkey = with_pending_compaction(store)
    outputs = [k for k in store.list(f"{P}/compactions/") if k.endswith(".sst")]
    store.put(f"{P}/compactions/00000000000000000001-abc/000001.sst", b"in progress")
    collect_garbage(store, [P], [m1])
    assert store.exists(rkey) and all(store.exists(k) for k in outputs)
    assert store.exists(f"{P}/compactions/00000000000000000001-abc/000001.sst")
    # Installed and committed: its outputs are named and stay, and so does the result
    # object until the last of them goes (see the next test).
    assert db.install_pending_compactions()["installed"] == 1
    m2 = db.checkpoint("e2")
    out = collect_garbage(store, [P], [m2], include_in_progress=True)
    assert store.exists(rkey)
    assert all(store.exists(k) for k in outputs)
    assert not store.exists(f"{P}/compactions/00000000000000000001-abc/000001.sst")
    assert m1 in out["deleted_keys"]


def test_discarded_result_outputs_are_collected(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db, m1, rkey = with_pending_compaction(store)
    db.compact_all()  # kills the result's inputs
    assert db.install_pending_compactions() == {"installed": 0, "discarded": 1}
    m2 = db.checkpoint("e2")
    collect_garbage(store, [P], [m1, m2])  # handled by m2: gone although m1 is its base
    assert store.list(f"{P}/compactions/") == []
    assert not store.exists(rkey)


def test_result_with_dropped_base_is_collected(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db, _, _ = with_pending_compaction(store)
    db.put(b"x", b"y")
    m2 = db.checkpoint("e2")
    collect_garbage(store, [P], [m2])
    assert store.list(f"{P}/compactions/") == []
    assert db.install_pending_compactions() == {"installed": 0, "discarded": 0}


def test_result_object_goes_with_its_last_installed_output(tmp_path: Path) -> None:
    """The result object stays while an installed output is named, and goes in the same
    run as the last one; an output directory never outlives its result object."""
    store = LocalObjectStore(tmp_path)
    db, _, rkey = with_pending_compaction(store)
    outputs = [k for k in store.list(f"{P}/compactions/") if k.endswith(".sst")]
    assert db.install_pending_compactions()["installed"] == 1
    m2 = db.checkpoint("e2")
    collect_garbage(store, [P], [m2])
    assert store.exists(rkey) and all(store.exists(k) for k in outputs)
    db.put(b"k0001", b"newer")
    db.compact_all()  # the installed outputs leave the level list
    m3 = db.checkpoint("e3")
    assert not set(outputs) & files_named_by(store, [m3])
    collect_garbage(store, [P], [m3])  # not include_in_progress: still collected
    assert store.list(f"{P}/compactions/") == []
    assert set(store.list(P + "/")) == files_named_by(store, [m3])


def test_handled_output_directory_without_result_is_collected(tmp_path: Path) -> None:
    """Leftovers of older GC runs: outputs of a handled compaction whose result object is
    gone are not in progress (the id was published), so they go by default."""
    store = LocalObjectStore(tmp_path)
    db, _, rkey = with_pending_compaction(store)
    db.install_pending_compactions()
    db.put(b"k0001", b"newer")
    db.compact_all()
    m2 = db.checkpoint("e2")
    store.delete(rkey)
    left = store.list(f"{P}/compactions/")
    assert left and not set(left) & files_named_by(store, [m2])
    collect_garbage(store, [P], [m2])
    assert store.list(f"{P}/compactions/") == []
