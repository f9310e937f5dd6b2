"""Bulk state read and written as Arrow columns (``BulkMapState.get_columns_at`` /
``set_columns_at``, ``BulkValueState.get_columns`` / ``set_columns``, DKV keys built from
Arrow columns) against a dict model and against the per-row bulk calls."""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.batch import BulkMapState, BulkValueState
from dkvstream.operators.api.codecs import IntCodec, RecordCodec, StrCodec
from dkvstream.operators.api.state import MapSpec, ValueSpec, state_key_column, state_keys
from dkvstream.operators.errors import StateTypeError
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.objectstore.local import LocalObjectStore

INTS = RecordCodec({"count": pa.int64(), "amount": pa.int64()})
MIXED = RecordCodec({"count": pa.int64(), "name": pa.string()})

subject_st = st.sampled_from([b"", b"a", b"k1", b"k\x00\xff", b"longer-key"])
row_st = st.tuples(subject_st, st.integers(0, 3), st.integers(-2, 2))  # (key, key group, map key)


def _db(tmp_path_factory) -> DKV:
    return DKV.open(LocalObjectStore(tmp_path_factory.mktemp("dkv")), "s", options=DKVOptions(l0_compaction_trigger=3))


@settings(max_examples=80, deadline=None)
@given(codec=st.sampled_from([INTS, MIXED]), data=st.data(),
       steps=st.lists(st.sampled_from(["set", "delete", "get", "flush"]), min_size=1, max_size=10))
def test_map_state_columns_match_a_dict(tmp_path_factory, codec, data, steps) -> None:
    """Any sequence of ``set_columns_at`` (a row repeated in one call keeps its later
    record; empty calls), ``delete_at`` and flushes: ``get_columns_at`` equals the dict
    model (a null row where absent), and ``get_rows_at`` reads the same records."""
    state = BulkMapState(_db(tmp_path_factory), MapSpec(IntCodec(), codec, id="windows"))
    model: dict[tuple, tuple] = {}
    for step in steps:
        rows = data.draw(st.lists(row_st, max_size=8))
        keys = pa.array([r[0] for r in rows], pa.binary())
        at = state.dkv_keys(keys, pa.array([r[1] for r in rows], pa.int32()),
                            pa.array([r[2] for r in rows], pa.int64()))
        assert at == state.dkv_keys([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        if step == "set":
            counts = data.draw(st.lists(st.integers(-2**61, 2**61), min_size=len(rows), max_size=len(rows)))
            second = [c * 3 if codec is INTS else f"n{c}" for c in counts]
            state.set_columns_at(at, {"count": pa.array(counts, pa.int64()),
                                      "amount" if codec is INTS else "name": second})
            model.update({r: (c, s) for r, c, s in zip(rows, counts, second)})
        elif step == "delete":
            state.delete_at(at)
            for r in rows:
                model.pop(r, None)
        elif step == "flush":
            state._db.flush()
        got = state.get_columns_at(at)
        assert got.type == codec.arrow_type
        assert got.to_pylist() == [None if r not in model else dict(zip(codec.fields, model[r])) for r in rows]
        assert state.get_rows_at(at) == [model.get(r) for r in rows]


def test_columns_write_the_bytes_the_row_calls_write(tmp_path) -> None:
    """``set_columns_at`` stores the bytes ``set_rows_at`` and ``set_at`` store (one
    layout for both operator forms), nulls included."""
    db = DKV.open(LocalObjectStore(tmp_path), "s")
    state = BulkMapState(db, MapSpec(IntCodec(), INTS, id="w"))
    at = state.dkv_keys([b"a", b"b", b"c"], [0, 1, 2], [1, 2, 3])
    state.set_columns_at(at, pa.table({"count": pa.array([1, None, -300], pa.int64()),
                                       "amount": pa.array([2**40, 5, None], pa.int64())}))
    assert db.get_many(at) == [msgpack.packb(r) for r in ([1, 2**40], [None, 5], [-300, None])]
    state.set_columns_at(at, pa.StructArray.from_arrays([pa.array([7, 8, 9]), pa.array([0, 0, 1])],
                                                        names=["count", "amount"]))
    assert db.get_many(at) == INTS.encode_rows([(7, 0), (8, 0), (9, 1)])
    assert state.get_columns_at(at).field("count").to_pylist() == [7, 8, 9]


def test_value_state_columns(tmp_path) -> None:
    """``BulkValueState.get_columns``/``set_columns`` by Arrow subject keys agree with
    ``get``/``set`` by lists."""
    state = BulkValueState(DKV.open(LocalObjectStore(tmp_path), "s"), ValueSpec(MIXED, id="v"))
    keys, kgs = pa.array([b"x", b"y"], pa.binary()), pa.array([3, 4], pa.int32())
    state.set_columns(keys, kgs, {"count": [1, 2], "name": ["p", None]})
    assert state.get([b"x", b"y", b"z"], [3, 4, 3]) == [{"count": 1, "name": "p"}, {"count": 2, "name": None}, None]
    assert state.get_columns(pa.array([b"y", b"z"], pa.binary()), [4, 3]).to_pylist() == \
        [{"count": 2, "name": None}, None]


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.binary(max_size=6), st.integers(0, 0xFFFF)), max_size=12),
       cut=st.integers(0, 3), large=st.booleans(), suffix=st.binary(max_size=4))
def test_state_key_column_equals_state_keys(rows, cut, large, suffix) -> None:
    """DKV keys built from an Arrow column (sliced, binary or large binary, chunked)
    equal ``state_keys`` of the same rows."""
    keys = pa.array([r[0] for r in rows], pa.large_binary() if large else pa.binary()).slice(min(cut, len(rows)))
    kgs = [r[1] for r in rows][min(cut, len(rows)):]
    expected = state_keys(keys.to_pylist(), kgs, suffix)
    assert state_key_column(keys, np.array(kgs, np.int64), suffix) == expected
    assert state_key_column(pa.chunked_array([keys], keys.type), pa.array(kgs, pa.int32()), suffix) == expected


def test_column_errors_name_the_problem(tmp_path) -> None:
    db = DKV.open(LocalObjectStore(tmp_path), "s")
    state = BulkMapState(db, MapSpec(IntCodec(), INTS, id="w"))
    with pytest.raises(TypeError, match="nulls"):
        state.dkv_keys(pa.array([b"a", None], pa.binary()), [0, 0], [1, 2])
    with pytest.raises(TypeError, match="binary"):
        state.dkv_keys(pa.array(["a"], pa.string()), [0], [1])
    with pytest.raises(ValueError, match="65535"):
        state.dkv_keys(pa.array([b"a"], pa.binary()), [70000], [1])
    with pytest.raises(ValueError, match="key groups"):
        state.dkv_keys(pa.array([b"a"], pa.binary()), [1, 2], [1])
    with pytest.raises(StateTypeError, match="map key"):
        state.dkv_keys(pa.array([b"a"], pa.binary()), [0], pa.array([None], pa.int64()))
    at = state.dkv_keys(pa.array([b"a"], pa.binary()), [0], [1])
    with pytest.raises(TypeError, match="null records"):
        state.set_columns_at(at, pa.array([None], INTS.arrow_type))
    with pytest.raises(ValueError, match="amount"):
        state.set_columns_at(at, {"count": [1]})
    with pytest.raises(ValueError, match="1 keys but 2 records"):
        state.set_columns_at(at, {"count": [1, 2], "amount": [3, 4]})
    with pytest.raises(TypeError, match="columns form"):
        BulkMapState(db, MapSpec(IntCodec(), StrCodec(), id="s")).get_columns_at(at)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(subject_st, st.integers(0, 300), st.text(max_size=5) | st.integers(-2**63, 2**63 - 1)),
                     max_size=10))
def test_dkv_keys_from_columns_equal_the_list_form_for_any_map_key_codec(rows) -> None:
    """Map keys of a codec without a fixed width (``StrCodec``: ``Codec.encode_column``'s
    data and offsets) and of ``IntCodec`` (numpy, Arrow or a list) give the DKV keys the
    list form gives."""
    keys, kgs = pa.array([r[0] for r in rows], pa.binary()), [r[1] for r in rows]
    strs = [r[2] if isinstance(r[2], str) else str(r[2]) for r in rows]
    ints = [r[2] if isinstance(r[2], int) else len(r[2]) for r in rows]
    for codec, map_keys, columns in ((StrCodec(), strs, [pa.array(strs, pa.string()), strs]),
                                     (IntCodec(), ints, [pa.array(ints, pa.int64()), np.array(ints, np.int64), ints])):
        state = BulkMapState(None, MapSpec(codec, INTS, id="m"))
        expected = state.dkv_keys([r[0] for r in rows], kgs, map_keys)
        for column in columns:
            assert state.dkv_keys(keys, kgs, column) == expected
