"""The expiry compaction filter: expired entries leave the tables as compaction rewrites
them (inline and remote), and nothing else changes; checked against a dict model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.expiry import EXPIRY, ExpiryFilter
from dkvstream.storage.dkv.manifest import Manifest, decode_manifest, encode_manifest, load_manifest
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore.local import LocalObjectStore

PREFIX = "jobs/j/state/op/kg-0000-0009"
OPTS = DKVOptions(memtable_bytes=2000, block_bytes=256, l0_compaction_trigger=3, target_file_bytes=1500,
                  num_levels=4, level_base_bytes=4000, level_multiplier=2, zstd_level=1)
MARK = 0x02  # key byte 0: expiring entries; 0x00: entries that never expire


def _key(i: int, expiring: bool) -> bytes:
    return bytes((MARK if expiring else 0,)) + b"k%04d" % i


def _value(expiry: int, payload: bytes) -> bytes:
    return EXPIRY.pack(expiry) + payload


def _visible(model: dict[bytes, bytes], clock: int) -> dict[bytes, bytes]:
    """The model's entries a reader at ``clock`` sees (expired ones hidden)."""
    f = ExpiryFilter(0, ((MARK, clock),))
    return {k: v for k, v in model.items() if not f.expired(k, v)}


def _table_entries(db: DKV) -> int:
    return sum(t.entries for t in db.levels.all_tables())


writes = st.lists(st.tuples(st.integers(0, 60), st.booleans(), st.integers(0, 100), st.booleans()),
                  min_size=1, max_size=120)


@given(st.lists(writes, min_size=1, max_size=5))
@settings(max_examples=40, deadline=None)
def test_compaction_drops_expired_and_keeps_the_rest(tmp_path_factory, epochs) -> None:
    # Each epoch writes (puts with random expiries, deletes), advances the clock and
    # checkpoints with the filter; compactions (inline, and a full one at the end) may
    # drop entries only once expired, and a full compaction leaves none in the tables.
    store = LocalObjectStore(tmp_path_factory.mktemp("s"))
    db = DKV.open(store, PREFIX, options=OPTS)
    model: dict[bytes, bytes] = {}
    clock = 0
    for e, batch in enumerate(epochs):
        for i, expiring, expiry, delete in batch:
            k = _key(i, expiring)
            if delete:
                db.delete(k)
                model.pop(k, None)
            else:
                v = _value(expiry, b"v%d" % e)
                db.put(k, v)
                model[k] = v
        clock += 20
        db.set_compaction_filter(ExpiryFilter(0, ((MARK, clock),)))
        db.flush()
        db.checkpoint(f"e{e}")
        seen = dict(db.scan_range(b"", None))
        # Nothing visible is lost, nothing deleted comes back: only expired entries go.
        assert _visible(seen, clock) == _visible(model, clock)
        assert set(seen) <= set(model)
    db.compact_all()
    assert dict(db.scan_range(b"", None)) == _visible(model, clock)
    assert _table_entries(db) == len(_visible(model, clock))


def test_remote_compaction_applies_the_manifests_filter(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    lazy = DKVOptions(**{**OPTS.__dict__, "max_inline_compaction_bytes": 0})
    db = DKV.open(store, PREFIX, options=lazy)
    model = {}
    for i in range(300):
        k, v = _key(i, i % 3 != 0), _value(i, b"x" * 20)
        db.put(k, v)
        model[k] = v
    db.flush_memtable()
    db.set_compaction_filter(ExpiryFilter(0, ((MARK, 150),)))
    base = db.checkpoint("e1")
    assert load_manifest(store, base).compaction_filter == ExpiryFilter(0, ((MARK, 150),))
    # A later clock in the instance does not change what the remote run drops: it uses
    # the manifest's.
    db.set_compaction_filter(ExpiryFilter(0, ((MARK, 10**9),)))
    assert compact_checkpoint(store, PREFIX, base, lazy, full=True) is not None
    assert db.install_pending_compactions() == {"installed": 1, "discarded": 0}
    expected = _visible(model, 150)
    assert dict(db.scan_range(b"", None)) == expected
    assert _table_entries(db) == len(expected) < len(model)
    # A reopened instance keeps the manifest's filter.
    db2 = DKV.open(store, PREFIX, base, lazy)
    db2.compact_all()
    assert _table_entries(db2) == len(expected)


def test_expired_newest_version_becomes_a_tombstone_when_tombstones_stay() -> None:
    f = ExpiryFilter(0, ((MARK, 10),))
    keys = [_key(1, True), _key(2, True), _key(3, False), _key(4, True)]
    values = [_value(5, b"a"), _value(11, b"b"), _value(1, b"c"), None]
    batch = (keys, [4, 3, 2, 1], values)
    assert f.apply(batch, drop_tombstones=True) == (keys[1:], [3, 2, 1], values[1:])
    # An older version below the inputs must not resurface: the entry becomes a tombstone.
    assert f.apply(batch, drop_tombstones=False) == (keys, [4, 3, 2, 1], [None, *values[1:]])
    nothing = ([_key(1, True)], [1], [_value(11, b"a")])
    assert f.apply(nothing, True) is nothing


def test_manifest_round_trips_the_filter_and_rejects_a_bad_one() -> None:
    m = Manifest(name="c", prefix="p", last_seq=0, flushed_seq=0,
                 compaction_filter=ExpiryFilter(2, ((2, -5), (3, 1 << 40))))
    assert decode_manifest(encode_manifest(m), "u") == m
    assert decode_manifest(encode_manifest(Manifest("c", "p", 0, 0)), "u").compaction_filter is None
    bad = encode_manifest(m).replace(b'"kind":"expiry"', b'"kind":"regex!"')
    with pytest.raises(CorruptionError):  # the crc no longer matches either
        decode_manifest(bad, "u")
    with pytest.raises(ValueError, match="distinct"):
        ExpiryFilter(2, ((2, 1), (2, 3)))
    with pytest.raises(ValueError, match="unknown compaction filter kind"):
        ExpiryFilter.from_json({"kind": "regex", "marker_offset": 0, "clocks": []})
