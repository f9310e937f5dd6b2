"""What a DKV checkpoint stops naming (``DKV.dropped_at_checkpoint``,
``manifest.dropped_files``), the input of incremental checkpoint retention.

Oracle: the bucket itself. Deleting, after each checkpoint, exactly what it dropped must
leave under the instance's prefix exactly the files its newest manifest names (and the
manifest), whatever the writes, flushes, compactions and reopenings; and every
checkpoint's own files must survive until a later checkpoint drops them.
"""
from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc import files_named_by
from dkvstream.storage.dkv.manifest import dropped_files, load_manifest
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.random_writes import random_writes

OPTS = DKVOptions(
    memtable_bytes=2500, block_bytes=200, l0_compaction_trigger=3, target_file_bytes=1200,
    num_levels=4, level_base_bytes=4000, level_multiplier=2, zstd_level=1, wal_flush_bytes=3000,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), steps=st.lists(st.sampled_from(["write", "flush", "reopen", "compact_all"]),
                                                  min_size=3, max_size=14))
def test_deleting_what_each_checkpoint_dropped_leaves_what_the_newest_names(tmp_path_factory, seed, steps) -> None:
    store = LocalObjectStore(tmp_path_factory.mktemp("dkv"))
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    db = DKV.open(store, "op/r", options=OPTS)
    manifest = None
    for i, step in enumerate(steps):
        if step == "reopen" and manifest is not None:
            db.close()
            db = DKV.open(store, "op/r", manifest, OPTS)
        elif step == "flush":
            db.flush()
        elif step == "compact_all":
            db.compact_all()
        random_writes(db, model, rng, rng.randrange(1, 120), keys=range(400), delete_share=0.2,
                      value_bytes=(0, 40))
        previous = manifest
        manifest = db.checkpoint(f"c{i}")
        dropped, unkept = db.dropped_at_checkpoint(), db.unkept_at_checkpoint()
        assert dropped is not None
        named = files_named_by(store, [manifest])
        assert not (set(dropped) | set(unkept)) & named, "a file the new manifest names was dropped"
        assert not set(dropped) & set(unkept)
        if previous is not None:
            assert previous in dropped
        for key, size in (*dropped.items(), *unkept.items()):
            if key != previous:
                assert store.size(key) == size, key
        store.delete_many([*dropped, *unkept])
        assert set(store.list("op/r/")) == named
    db.close()
    assert dict(DKV.open(store, "op/r", manifest, OPTS).scan_range(b"", None)) == model


def test_rescale_and_shared_tables_are_unknown(tmp_path: Path) -> None:
    """Opened from parents, or dropping a table another range may share (a clipped
    one), the answer is None: only a sweep over every range can tell."""
    store = LocalObjectStore(tmp_path)
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    parent = DKV.open(store, "op/all", options=OPTS)
    random_writes(parent, model, rng, 600, keys=range(800), delete_share=0.0, value_bytes=(5, 20))
    parent.compact_all()
    pkey = parent.checkpoint("p1")
    parent.close()
    # Split inside a table, so that both halves reference it, clipped.
    mid = next(t.max_key for t in load_manifest(store, pkey).levels.all_tables() if t.min_key < t.max_key)

    low = DKV.open_from_parents(store, "op/low", [pkey], (b"", mid), OPTS)
    first = low.checkpoint("l1")
    assert low.dropped_at_checkpoint() is None  # the rescale epoch
    m1 = load_manifest(store, first)
    assert any(t.clip is not None for t in m1.levels.all_tables())
    low.put(b"k0001", b"x")
    second = low.checkpoint("l2")  # nothing compacted: only the manifest is dropped
    assert set(low.dropped_at_checkpoint()) == {first}
    low.compact_all()  # rewrites the clipped (shared) tables
    low.checkpoint("l3")
    assert low.dropped_at_checkpoint() is None
    m2, m3 = load_manifest(store, second), load_manifest(store, low.checkpoint("l4"))
    assert dropped_files(second, m2, m3) is None  # the pure form agrees
