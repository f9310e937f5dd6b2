"""``DKV.erase_prefixes`` against a dict model: random puts, deletes, batches, flushes,
checkpoints and compactions, then a purge; every other key reads as the model, and no
table or WAL object the next manifest names holds an erased key (decoded, any version,
tombstones included)."""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from dkvstream.storage.dkv import DKV
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.sstable import SSTableReader
from dkvstream.storage.objectstore.local import LocalObjectStore
from dkvstream.storage.objectstore.memory import MemoryObjectStore
from tests.storage.dkv.test_dkv_model import OPTIONS

PREFIX = "jobs/t/state/op/kg-0000-0003"
keys = st.binary(min_size=1, max_size=4).map(lambda b: bytes(c % 3 + 0x61 for c in b))
values = st.binary(min_size=0, max_size=40)
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("delete"), keys, st.none()),
    st.tuples(st.just("flush"), st.none(), st.none()),
    st.tuples(st.just("checkpoint"), st.none(), st.none()),
    st.tuples(st.just("compact_all"), st.none(), st.none()),
), max_size=120)


def _erased(key: bytes, prefixes: list[bytes], suffix: bytes | None) -> bool:
    return any(key.startswith(p) for p in prefixes) and (suffix is None or key.endswith(suffix))


def _table_keys(store, key: str) -> list[bytes]:
    return [k for k, _seq, _v in SSTableReader(store, key).iter_from(b"")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, prefixes=st.lists(st.sampled_from([b"a", b"ab", b"b", b"cc", b"bca"]), min_size=1, max_size=3),
       suffix=st.sampled_from([None, b"a", b"c"]), reopen=st.booleans())
def test_erase_prefixes_matches_model_and_leaves_no_bytes(ops, prefixes, suffix, reopen):
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalObjectStore(tmp)
        db = DKV.open(store, PREFIX, options=OPTIONS)
        model: dict[bytes, bytes] = {}
        n = 0
        for op, k, v in ops:
            if op == "put":
                db.put(k, v)
                model[k] = v
            elif op == "delete":
                db.delete(k)
                model.pop(k, None)
            elif op == "flush":
                db.flush()
            elif op == "compact_all":
                db.compact_all()
            else:
                n += 1
                mkey = db.checkpoint(f"c{n}")
                if reopen:
                    db.close()
                    db = DKV.open(store, PREFIX, mkey, OPTIONS)
        where = None if suffix is None else (lambda key: key.endswith(suffix))
        result = db.erase_prefixes(prefixes, where)
        expected = {k: v for k, v in model.items() if not _erased(k, prefixes, suffix)}
        assert list(db.scan_range(b"", None)) == sorted(expected.items())
        assert all(db.get(k) is None for k in model if k not in expected)
        assert result.entries >= len(model) - len(expected)
        mkey = db.checkpoint("after")
        db.close()
        manifest = load_manifest(store, mkey)
        assert manifest.wal == ()  # the flush covered every record: no WAL object named
        for t in manifest.levels.all_tables():
            assert not [k for k in _table_keys(store, t.key) if _erased(k, prefixes, suffix)], t.key
        reopened = DKV.open(store, PREFIX, mkey, OPTIONS)
        assert list(reopened.scan_range(b"", None)) == sorted(expected.items())
        reopened.close()


def _parent_of_40() -> tuple[MemoryObjectStore, str]:
    """A store and the manifest of a range holding k00 .. k39 in one table."""
    store = MemoryObjectStore()
    parent = DKV.open(store, "p", options=OPTIONS)
    for i in range(40):
        parent.put(b"k%02d" % i, b"v%d" % i)
    parent.flush()
    return store, parent.checkpoint("p1")


def test_erase_prefixes_rewrites_a_shared_table_of_a_rescale():
    """A range opened from its parent names the parent's table clipped; the purge writes
    the range's own table holding only its visible keys, and the parent's is no longer named."""
    store, pkey = _parent_of_40()
    child = DKV.open_from_parents(store, "c", [pkey], (b"k10", b"k30"), OPTIONS)
    old = {t.key for t in child.levels.all_tables()}
    result = child.erase_prefixes([b"k15"])
    assert set(result.tables_rewritten) <= old and result.tables_rewritten
    assert not {t.key for t in child.levels.all_tables()} & set(result.tables_rewritten)
    assert [k for k, _ in child.scan_range(b"", None)] == [b"k%02d" % i for i in range(10, 30) if i != 15]
    child.checkpoint("c1")
    for t in child.levels.all_tables():
        assert b"k15" not in _table_keys(store, t.key) and t.key.startswith("c/")


def test_erase_prefixes_refuses_an_empty_prefix():
    db = DKV.open(MemoryObjectStore(), "x", options=OPTIONS)
    with pytest.raises(ValueError, match="non-empty"):
        db.erase_prefixes([b""])


def test_erase_prefixes_in_a_sibling_range_rewrites_the_shared_file_holding_the_key():
    """After a split, both halves name the parent's one file. Erasing k15 in the half
    whose clip hides it still rewrites that file as the half's own table (the file holds
    k15's bytes); each half reads as before, and no file either names holds k15."""
    store, pkey = _parent_of_40()
    named = set()
    for name, (lo, hi), erased in (("a", (b"k00", b"k10"), set()), ("b", (b"k10", b"k30"), {15})):
        half = DKV.open_from_parents(store, name, [pkey], (lo, hi), OPTIONS)
        before = list(half.scan_range(b"", None))
        result = half.erase_prefixes([b"k15"])
        assert result.tables_rewritten  # the shared file, in both halves
        assert list(half.scan_range(b"", None)) == [(k, v) for k, v in before if int(k[1:]) not in erased]
        manifest = load_manifest(store, half.checkpoint("c1"))
        half.close()
        named |= {t.key for t in manifest.levels.all_tables()}
    assert named and all(b"k15" not in _table_keys(store, k) for k in named)
    assert all(k.startswith(("a/", "b/")) for k in named)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(present=st.sets(st.integers(0, 59), min_size=1), cuts=st.sets(st.integers(1, 59), max_size=3),
       erased=st.integers(0, 59), flushes=st.sets(st.integers(0, 59), max_size=4))
def test_erase_prefixes_in_every_range_of_a_split_leaves_no_file_holding_the_key(present, cuts, erased, flushes):
    """A range split at random points, the erasure sent to every part: each part reads as
    the model without the key, and no table any part names holds it (a file the parts
    share included)."""
    store = MemoryObjectStore()
    parent = DKV.open(store, "p", options=OPTIONS)
    for i in sorted(present):
        parent.put(b"k%02d" % i, b"v%d" % i)
        if i in flushes:
            parent.flush()
    parent.flush()
    pkey = parent.checkpoint("p1")
    bounds = [b""] + [b"k%02d" % c for c in sorted(cuts)] + [None]
    target = b"k%02d" % erased
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        part = DKV.open_from_parents(store, f"c{n}", [pkey], (lo, hi), OPTIONS)
        part.erase_prefixes([target])
        want = [(b"k%02d" % i, b"v%d" % i) for i in sorted(present)
                if i != erased and b"k%02d" % i >= lo and (hi is None or b"k%02d" % i < hi)]
        assert list(part.scan_range(b"", None)) == want
        manifest = load_manifest(store, part.checkpoint("c1"))
        part.close()
        for t in manifest.levels.all_tables():
            assert target not in _table_keys(store, t.key), (t.key, lo, hi)
