"""Remote compaction: publish a result from a checkpoint, install or discard it later."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import RemoteResult, load_manifest
from dkvstream.storage.dkv.remote_compaction import can_install, compact_checkpoint, load_result
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.random_writes import random_writes

PREFIX = "jobs/j/state/op/kg-0000-0009"
OPTS = DKVOptions(
    memtable_bytes=3000, block_bytes=256, l0_compaction_trigger=3, target_file_bytes=1500,
    num_levels=4, level_base_bytes=5000, level_multiplier=2, zstd_level=1,
)


write = partial(random_writes, keys=range(800), delete_share=0.25, value_bytes=(0, 30))


def check(db: DKV, model: dict[bytes, bytes]) -> None:
    assert list(db.scan_range(b"", None)) == sorted(model.items())
    for i in range(0, 800, 7):
        k = b"k%04d" % i
        assert db.get(k) == model.get(k)


def test_nothing_to_do_returns_none(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db = DKV.open(store, PREFIX, options=OPTS)
    db.put(b"a", b"1")
    m = db.checkpoint("c0")
    assert compact_checkpoint(store, PREFIX, m, OPTS) is None
    assert db.install_pending_compactions() == {"installed": 0, "discarded": 0}


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_compaction_racing_the_job(tmp_path: Path, inline: bool, seed: int) -> None:
    store = LocalObjectStore(tmp_path)
    lazy = DKVOptions(**{**OPTS.__dict__, "max_inline_compaction_bytes": 0})
    opts = OPTS if inline else lazy
    rng = random.Random(seed)
    db = DKV.open(store, PREFIX, options=lazy)
    model: dict[bytes, bytes] = {}
    for _ in range(3):
        write(db, model, rng, 400)
        db.flush_memtable()
    base = db.checkpoint("e1")
    db.close()
    db = DKV.open(store, PREFIX, base, opts)  # the next epoch's task
    rkey = compact_checkpoint(store, PREFIX, base, opts, full=seed % 2 == 0)
    assert rkey is not None and rkey.startswith(f"{PREFIX}/compactions/")
    r = load_result(store, rkey)
    assert r.base_manifest == base and r.outputs
    assert all(t.key.startswith(f"{PREFIX}/compactions/{r.id}/") for t in r.outputs)
    # The job keeps going: writes, flushes and (if inline) compactions kill some inputs.
    for _ in range(rng.randint(0, 3)):
        write(db, model, rng, 300)
        db.flush()
    counts = db.install_pending_compactions()
    assert counts["installed"] + counts["discarded"] == 1
    live = {t.key for t in db.levels.all_tables()}
    outputs = {t.key for t in r.outputs}
    assert (outputs <= live) == (counts["installed"] == 1)
    check(db, model)
    mkey = db.checkpoint("e2")
    assert load_manifest(store, mkey).handled_compactions == (r.id,)
    # Handled results are never applied again, also after reopening.
    assert db.install_pending_compactions() == {"installed": 0, "discarded": 0}
    db2 = DKV.open(store, PREFIX, mkey, opts)
    assert db2.install_pending_compactions() == {"installed": 0, "discarded": 0}
    check(db2, model)
    write(db2, model, rng, 500)
    db2.flush()
    check(db2, model)


def test_result_installed_when_inputs_untouched(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    opts = DKVOptions(**{**OPTS.__dict__, "max_inline_compaction_bytes": 0})
    db = DKV.open(store, PREFIX, options=opts)
    model: dict[bytes, bytes] = {}
    rng = random.Random(9)
    for _ in range(4):
        write(db, model, rng, 300)
        db.flush()
    base = db.checkpoint("e1")
    n_base = len(db.levels.l0)
    compact_checkpoint(store, PREFIX, base, opts, full=True)
    write(db, model, rng, 200)
    db.flush()  # new L0 tables above the result's output level are fine
    n_new = len(db.levels.l0) - n_base
    assert n_new >= 1
    assert db.install_pending_compactions() == {"installed": 1, "discarded": 0}
    assert db.stats()["tables_per_level"][0] == n_new
    check(db, model)


def _t(key: str, lo: bytes, hi: bytes) -> TableInfo:
    return TableInfo(key=key, size=10, entries=1, min_key=lo, max_key=hi, min_seq=1, max_seq=1)


def test_can_install_rules() -> None:
    a, b, old = _t("a", b"a", b"c"), _t("b", b"a", b"f"), _t("old", b"b", b"b")
    out = _t("o", b"a", b"f")
    r = RemoteResult("x", "p", "m", ((1, a), (2, b)), 2, (out,), False, deeper=("old",))
    levels = LevelList(((), (a,), (b,), (old,)))
    assert can_install(levels, r)
    assert not can_install(LevelList(((), (a,), (), (b,), (old,))), r)  # moved level
    assert not can_install(LevelList(((), (a,), ())), r)  # input gone
    newer = _t("newer", b"c", b"d")
    assert not can_install(LevelList(((), (a,), (b,), (old, newer))), r)  # appeared below
    dropping = RemoteResult("x", "p", "m", ((1, a), (2, b)), 2, (out,), True)
    assert not can_install(levels, dropping)  # dropped tombstones over an older version


def test_corrupt_result_is_reported(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db = DKV.open(store, PREFIX, options=OPTS)
    write(db, {}, random.Random(1), 300)
    db.flush_memtable()
    key = compact_checkpoint(store, PREFIX, db.checkpoint("e1"), OPTS, full=True)
    data = bytearray(store.get(key))
    data[5] ^= 1
    store.put(key, bytes(data))
    with pytest.raises(CorruptionError, match="crc32c"):
        db.install_pending_compactions()
