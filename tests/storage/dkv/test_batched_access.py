"""Batched state access: ``DKV.get_many`` and ``DKV.write_batch`` against a dict oracle,
with keys spread over the memtable and SSTables, tombstones, a key repeated in one batch
and empty batches; and the compiled loops behind them (``_native.memtable_get_many``,
``concat_rows``, ``pack_int_rows``, ``unpack_int_rows``) against their references."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.state import concat_rows_py
from dkvstream.storage.dkv import DKV, DKVOptions, native
from dkvstream.storage.dkv.memtable import get_values_py
from dkvstream.storage.objectstore.local import LocalObjectStore


@pytest.fixture(scope="module")
def c():
    """The compiled module (as in test_native.py: its absence fails, unless
    ``DKVSTREAM_DKV_NATIVE=0`` forces the pure-Python paths)."""
    if native.DISABLED:
        pytest.skip("DKVSTREAM_DKV_NATIVE=0: pure-Python paths forced")
    if native.NATIVE is None:
        pytest.fail("dkvstream.storage.dkv._native is not built: run platform/setup.sh (needs gcc)")
    return native.NATIVE


# A small key space, so batches overwrite and delete keys that earlier steps flushed.
key_st = st.sampled_from([b"", b"a", b"ab", b"b", b"k\x00", b"k\xff", b"zz"]) | st.binary(min_size=1, max_size=4)
value_st = st.none() | st.binary(max_size=12)  # None: a delete (tombstone)
step_st = st.one_of(
    st.tuples(st.just("write"), st.lists(st.tuples(key_st, value_st), max_size=12)),  # [] = an empty batch
    st.tuples(st.just("get"), st.lists(key_st, max_size=12)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("compact")),
)


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(step_st, min_size=1, max_size=14), probe=st.lists(key_st, max_size=20))
def test_get_many_and_write_batch_match_a_dict(tmp_path_factory, steps, probe) -> None:
    """After any sequence of batched writes (repeats and deletes within a batch; empty
    batches), flushes to SSTables and compactions, ``get_many`` of any keys (repeats
    allowed) equals a dict's answer and ``get`` per key."""
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("dkv")), "s",
                  options=DKVOptions(l0_compaction_trigger=3))
    model: dict[bytes, bytes] = {}
    for step in steps:
        if step[0] == "write":
            rows = step[1]
            db.write_batch([k for k, _ in rows], [v for _, v in rows])
            for k, v in rows:  # in order: a key given twice keeps its later value
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
        elif step[0] == "get":
            assert db.get_many(step[1]) == [model.get(k) for k in step[1]]
        elif step[0] == "flush":
            db.flush()
        else:
            db.compact_all()
    keys = probe + list(model)
    assert db.get_many(keys) == [model.get(k) for k in keys] == [db.get(k) for k in keys]
    assert db.get_many([]) == []


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.binary(max_size=6), st.tuples(st.integers(0, 2**40), st.none() | st.binary(max_size=6)),
                       max_size=30), st.lists(st.binary(max_size=6), max_size=40))
def test_memtable_get_many_matches_reference(c, d, extra) -> None:
    """``memtable_get_many`` gives ``get_values_py``'s values and missing indices, and the
    dict's own answer: a tombstone is None and not missing; an absent key is missing."""
    keys = list(d) + extra
    values, missing = c.memtable_get_many(d, keys)
    assert (values, missing) == get_values_py(d, keys)
    assert values == [d[k][1] if k in d else None for k in keys]
    assert missing == [i for i, k in enumerate(keys) if k not in d]
    with pytest.raises(TypeError):
        c.memtable_get_many({b"k": (1,)}, [b"k"])


@st.composite
def parts_st(draw):
    n = draw(st.integers(0, 8))
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["const", "fixed", "var"]))
        if kind == "const":
            parts.append(draw(st.binary(max_size=4)))
        elif kind == "fixed":
            w = draw(st.integers(0, 3))
            parts.append((np.frombuffer(draw(st.binary(min_size=n * w, max_size=n * w)), np.uint8), w))
        else:
            rows = draw(st.lists(st.binary(max_size=4), min_size=n, max_size=n))
            offsets = np.zeros(n + 1, np.int64)
            offsets[1:] = np.cumsum([len(r) for r in rows])
            parts.append((b"".join(rows), offsets))
    return n, parts


@settings(max_examples=300, deadline=None)
@given(parts_st())
def test_concat_rows_matches_reference(c, case) -> None:
    """``concat_rows`` equals ``concat_rows_py`` and the row-by-row concatenation."""
    n, parts = case
    expected = []
    for i in range(n):
        row = b""
        for p in parts:
            if isinstance(p, bytes):
                row += p
            elif isinstance(p[1], int):
                row += bytes(p[0][i * p[1]:(i + 1) * p[1]])
            else:
                row += p[0][p[1][i]:p[1][i + 1]]
        expected.append(row)
    assert c.concat_rows(n, parts) == concat_rows_py(n, parts) == expected


def test_concat_rows_rejects_short_or_disordered_parts(c) -> None:
    """A part too short for the rows, or offsets out of order or outside the data, is a
    ValueError in both implementations, never a read past the buffer."""
    bad = [
        (3, [(np.zeros(5, np.uint8), 2)]),
        (2, [(b"abc", np.array([0, 2, 1], np.int64))]),
        (2, [(b"abc", np.array([0, 2, 9], np.int64))]),
        (2, [(b"abc", np.array([0, 2], np.int64))]),
    ]
    for n, parts in bad:
        for f in (c.concat_rows, concat_rows_py):
            with pytest.raises(ValueError):
                f(n, parts)
    with pytest.raises(TypeError):
        c.concat_rows(1, [42])


int64_st = st.integers(-2**63, 2**63 - 1)
edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1,
         -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 15).flatmap(lambda f: st.lists(st.lists(int64_st | st.sampled_from(edges), min_size=f,
                                                              max_size=f), max_size=20).map(lambda r: (f, r))))
def test_int_rows_are_msgpack_byte_for_byte(c, case) -> None:
    """``pack_int_rows`` writes what ``msgpack.packb`` writes for each row (so records
    stored by either path read back the same), and ``unpack_int_rows`` reads them back."""
    f, rows = case
    packed = c.pack_int_rows(np.array(rows, np.int64).reshape(len(rows), f), f)
    assert packed == [msgpack.packb(r) for r in rows]
    values, valid, present = c.unpack_int_rows(packed, f)
    assert np.frombuffer(values, np.int64).reshape(len(rows), f).tolist() == [list(r) for r in rows]
    assert set(valid) <= {1} and set(present) <= {1}


def test_unpack_int_rows_nulls_absent_rows_and_other_records(c) -> None:
    """A None row is absent (every field invalid), a nil field is null; a record that is
    not ``fields`` ints (a float, a string, another length, trailing bytes, an int beyond
    int64) is left to the general decoder (None)."""
    values, valid, present = c.unpack_int_rows([msgpack.packb([5, None]), None, msgpack.packb([-7, 2**40])], 2)
    assert np.frombuffer(values, np.int64).tolist() == [5, 0, 0, 0, -7, 2**40]
    assert list(valid) == [1, 0, 0, 0, 1, 1] and list(present) == [1, 0, 1]
    for other in ([1.5, 2], ["a", 2], [1, 2, 3], [2**64 - 1, 0]):
        assert c.unpack_int_rows([msgpack.packb(other)], 2) is None
    assert c.unpack_int_rows([msgpack.packb([1, 2]) + b"\x00"], 2) is None
    assert c.unpack_int_rows([msgpack.packb([1, 2])[:-1] + b"\xcd"], 2) is None
    assert c.unpack_int_rows([], 2) == (b"", b"", b"")


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 15).flatmap(lambda f: st.lists(st.lists(int64_st, min_size=f, max_size=f),
                                                     max_size=10).map(lambda r: (f, r))),
       st.binary(max_size=16))
def test_int_rows_after_a_header(c, case, header) -> None:
    """With a header (a ``RecordCodec`` schema version's), each row is the header and then
    what ``msgpack.packb`` writes, and only rows that start with it are read back."""
    f, rows = case
    packed = c.pack_int_rows(np.array(rows, np.int64).reshape(len(rows), f), f, header)
    assert packed == [header + msgpack.packb(r) for r in rows]
    values, valid, present = c.unpack_int_rows(packed + [None], f, header)
    assert np.frombuffer(values, np.int64).reshape(len(rows) + 1, f)[:-1].tolist() == [list(r) for r in rows]
    if rows and header:
        assert c.unpack_int_rows([msgpack.packb(rows[0])], f, header) is None  # no header
        assert c.unpack_int_rows([header[:-1] + msgpack.packb(rows[0])], f, header) is None
    with pytest.raises(TypeError, match="header must be bytes of at most 16"):
        c.unpack_int_rows([], f, b"x" * 17)
