"""verify_manifest: a healthy checkpoint verifies; any flipped byte, truncation or missing
file of a manifest, table or WAL object is reported, naming the file."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc import files_named_by
from dkvstream.storage.dkv.verify import verify_manifest
from dkvstream.storage.objectstore.local import LocalObjectStore

OPTS = DKVOptions(memtable_bytes=16 << 10, block_bytes=512, l0_compaction_trigger=10)


def _checkpoint(root: Path) -> tuple[LocalObjectStore, str, dict[bytes, bytes]]:
    """A range with several tables and an unflushed WAL; returns (store, manifest, model)."""
    store = LocalObjectStore(root)
    model: dict[bytes, bytes] = {}
    db = DKV.open(store, "p", None, OPTS)
    for i in range(3000):
        k, v = b"key-%05d" % (i * 7 % 2000), b"v%d" % i
        db.put(k, v)
        model[k] = v
    db.flush()
    for i in range(50):  # stays in the WAL
        db.put(b"wal-%03d" % i, b"x")
        model[b"wal-%03d" % i] = b"x"
    key = db.checkpoint("c1")
    db.close()
    return store, key, model


def _path(store: LocalObjectStore, key: str) -> Path:
    return Path(store.uri(key).removeprefix("file://"))


def test_healthy_checkpoint_verifies_every_file(tmp_path) -> None:
    store, key, model = _checkpoint(tmp_path)
    report = verify_manifest(store, key)
    assert report.ok, report.errors
    named = files_named_by(store, [key])
    tables = [k for k in named if k.endswith(".sst")]
    assert report.manifests == 1 and report.tables == len(tables) >= 2
    assert report.wal_objects == 1 and report.wal_records == 50
    assert report.table_bytes == sum(store.size(k) for k in tables)
    with DKV.open(store, "p", key, OPTS) as db:  # the verified state is the model's
        assert dict(db.scan_prefix(b"")) == model


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flipped_byte_is_reported_naming_the_file(tmp_path_factory, data) -> None:
    store, key, _ = _checkpoint(tmp_path_factory.mktemp("ckpt"))
    victim = data.draw(st.sampled_from(sorted(files_named_by(store, [key]))))
    path = _path(store, victim)
    raw = bytearray(path.read_bytes())
    offset = data.draw(st.integers(0, len(raw) - 1))
    raw[offset] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(raw))
    report = verify_manifest(store, key)
    assert not report.ok
    assert any(store.uri(victim) in e for e in report.errors), report.errors


@pytest.mark.parametrize("suffix", [".sst", ".wal"])
def test_missing_or_truncated_file_is_reported(tmp_path, suffix) -> None:
    store, key, _ = _checkpoint(tmp_path)
    victims = sorted(k for k in files_named_by(store, [key]) if k.endswith(suffix))
    store.delete(victims[0])
    path = _path(store, victims[-1])
    if len(victims) > 1:
        path.write_bytes(path.read_bytes()[:-3])
    report = verify_manifest(store, key)
    assert len(report.errors) == min(2, len(victims))
    for v in {victims[0], victims[-1]}:
        assert any(store.uri(v) in e for e in report.errors), report.errors
