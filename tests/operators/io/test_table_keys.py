"""Table sinks keyed by string, binary and composite string columns, against a dict model.

Each epoch's change rows go through the sink as the driver sends them (``write_staged``,
``prepare``, ``publish``), several keys to a data file (two hash buckets). Checked after
every epoch: the table, point lookups (present and absent keys, now and as of the epoch
before), scans filtered on the key columns (``==``, ``isin``, ranges, with a value
predicate, projected), and that an insert of an existing key is an ``InsertConflictError``.
delta-rs writes the string and binary columns of a MERGE as Arrow view types, whose
statistics pyarrow could not compare with a filter's plain string or binary values.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dkvstream.operators.errors import InsertConflictError
from dkvstream.operators.io.table_sink import DELETE, INSERT, OP_COLUMN, UPSERT, TableSink, compact_table
from dkvstream.storage.objectstore import open_object_store

PREFIX = "jobs/keys"
VALUE = ("value", pa.int64())
KINDS = {
    "string": {"schema": pa.schema([("k", pa.string()), VALUE]), "key": ["k"], "range": None},
    "binary": {"schema": pa.schema([("k", pa.binary()), VALUE]), "key": ["k"], "range": None},
    "composite": {"schema": pa.schema([("tenant", pa.string()), ("item", pa.string()), VALUE]),
                  "key": ["tenant", "item"], "range": "tenant"},
}


def _keys(kind: str) -> list[tuple]:
    # Shared prefixes, the empty string, non-ASCII text and NUL bytes: order and stats matter.
    rng = np.random.default_rng(3)
    words = ["", "a", "ab", "abc", "b", "ba", "zz", "é", "日本", "N14228", "N24211"]
    words += [f"k{int(i):03d}" for i in rng.choice(1000, 29, replace=False)]
    if kind == "string":
        return [(w,) for w in words]
    if kind == "binary":
        return [(w.encode(),) for w in words] + [(b"\x00",), (b"\xff\xfe",), (b"\x00\x01",)]
    return [(t, w) for t in ("acme", "beta", "zeta") for w in words[:15]]


def _absent(key: tuple) -> tuple:
    return tuple("absent" if isinstance(v, str) else b"absent" for v in key)


def _table(sink: TableSink, rows: list[tuple]) -> pa.Table:
    """Change rows ``(key tuple, value, op)`` as the operator output the sink receives."""
    cols = {c: pa.array([r[0][i] for r in rows], sink.schema.field(c).type)
            for i, c in enumerate(sink.primary_key)}
    cols["value"] = pa.array([r[1] for r in rows], pa.int64())
    cols[OP_COLUMN] = pa.array([r[2] for r in rows], pa.string())
    return pa.table(cols)


def _as_dict(sink: TableSink, t: pa.Table) -> dict[tuple, int]:
    keys = list(zip(*(t.column(c).to_pylist() for c in sink.primary_key)))
    assert len(keys) == len(set(keys)), "duplicate primary keys"
    return dict(zip(keys, t.column("value").to_pylist()))


def _run_epochs(kind: str, tmp_path, epochs: int = 4, per_epoch: int = 60):
    """Publishes ``epochs`` epochs of random changes to a new sink; yields
    ``(sink, store, epoch, history)`` after each, ``history[e]`` the model after epoch e."""
    spec = KINDS[kind]
    sink = TableSink("t", spec["schema"], spec["key"], hash_buckets=2, range_column=spec["range"])
    store = open_object_store(str(tmp_path))
    rng = np.random.default_rng(7)
    keys = _keys(kind)
    model: dict[tuple, int] = {}
    history: dict[int, dict[tuple, int]] = {0: {}}
    for epoch in range(1, epochs + 1):
        rows = []
        for _ in range(per_epoch):
            k = keys[int(rng.integers(len(keys)))]
            r = rng.random()
            op = DELETE if r < 0.2 else (UPSERT if r < 0.5 or k in model else INSERT)
            value = int(rng.integers(1000))
            rows.append((k, value, op))
            if op == DELETE:
                model.pop(k, None)
            else:
                model[k] = value
        staged = [sink.write_staged(store, f"{PREFIX}/staging/{epoch}", _table(sink, rows))]
        sink.prepare(store, PREFIX, epoch, staged)  # checks the inserts: a lookup of their keys
        sink.publish(store, PREFIX, epoch, staged)
        history[epoch] = dict(model)
        yield sink, store, epoch, history


def _filters(kind: str) -> dict[str, tuple[pc.Expression, Callable[[tuple, int], bool]]]:
    """Name -> (pyarrow filter, the same predicate over (key tuple, value)). The oracle is
    plain Python: pandas' ``isin`` would equate b"\\x00" and b"" (numpy bytes strip NULs)."""
    keys = _keys(kind)
    first = KINDS[kind]["key"][0]
    values = sorted({k[0] for k in keys})
    pivot, chosen, low = values[len(values) // 2], values[1::4], values[2]
    filters = {
        "==": (pc.field(first) == pivot, lambda k, v: k[0] == pivot),
        "isin": (pc.field(first).isin(chosen), lambda k, v: k[0] in chosen),
        "range": ((pc.field(first) >= low) & (pc.field(first) < pivot), lambda k, v: low <= k[0] < pivot),
        "key and value": ((pc.field(first) > pivot) & (pc.field("value") < 500),
                          lambda k, v: k[0] > pivot and v < 500),
    }
    if kind == "composite":
        item = sorted({k[1] for k in keys})[5]
        filters["both keys"] = ((pc.field("tenant") == "acme") & (pc.field("item") <= item),
                                lambda k, v: k[0] == "acme" and k[1] <= item)
    return filters


@pytest.mark.parametrize("kind", list(KINDS))
def test_lookups_and_key_filtered_scans_equal_the_model(kind: str, tmp_path) -> None:
    keys, filters = _keys(kind), _filters(kind)
    probe = [*keys[::3], _absent(keys[0])]
    for sink, store, epoch, history in _run_epochs(kind, tmp_path):
        model, before = history[epoch], history[epoch - 1]
        assert _as_dict(sink, sink.read(store, PREFIX)) == model
        probe_table = _table(sink, [(p, 0, UPSERT) for p in probe]).select(sink.primary_key)
        found = sink.lookup(store, PREFIX, probe_table)
        assert _as_dict(sink, found) == {p: model[p] for p in probe if p in model}, f"epoch {epoch}"
        found = sink.lookup(store, PREFIX, probe_table, as_of_epoch=epoch - 1)
        assert _as_dict(sink, found) == {p: before[p] for p in probe if p in before}
        for name, (expr, pred) in filters.items():
            want = {k: v for k, v in model.items() if pred(k, v)}
            got = sink.scan(store, PREFIX, filter=expr)
            assert _as_dict(sink, got) == want, f"epoch {epoch}, filter {name}"
            projected = sink.scan(store, PREFIX, columns=["value"], filter=expr)
            assert projected.column_names == ["value"]
            assert sorted(projected.column("value").to_pylist()) == sorted(want.values()), name
            got = sink.scan(store, PREFIX, filter=expr, as_of_epoch=epoch - 1)
            assert _as_dict(sink, got) == {k: v for k, v in before.items() if pred(k, v)}, name


@pytest.mark.parametrize("kind", list(KINDS))
def test_insert_of_an_existing_string_key_conflicts(kind: str, tmp_path) -> None:
    *_, (sink, store, _, history) = _run_epochs(kind, tmp_path, epochs=2)
    model = history[2]
    existing = sorted(model)[len(model) // 2]
    staged = [sink.write_staged(store, f"{PREFIX}/staging/3", _table(sink, [(existing, 1, INSERT)]))]
    with pytest.raises(InsertConflictError, match="epoch 3 inserts primary key"):
        sink.prepare(store, PREFIX, 3, staged)
    fresh = _absent(existing)
    staged = [sink.write_staged(store, f"{PREFIX}/staging/3", _table(sink, [(fresh, 1, INSERT)]))]
    sink.prepare(store, PREFIX, 3, staged)
    sink.publish(store, PREFIX, 3, staged)
    assert _as_dict(sink, sink.read(store, PREFIX)) == {**model, fresh: 1}


def test_key_filters_over_compacted_and_merged_files(tmp_path) -> None:
    """A table holding both a compacted file (OPTIMIZE writes plain string columns) and a
    file of delta-rs's MERGE (string_view), as tables written by other writers hold:
    filters on the key are exact over both."""
    from deltalake import DeltaTable

    from dkvstream.operators.io.table_reader import _has_view_types

    sink = TableSink("t", KINDS["string"]["schema"], ["k"], hash_buckets=1)
    store = open_object_store(str(tmp_path))
    model: dict[tuple, int] = {}
    for epoch, words in enumerate([["a", "c", "e"], ["b", "d"], ["f", "bb", "g"]], start=1):
        rows = [((w,), 10 * epoch + i, INSERT) for i, w in enumerate(words)]  # new keys: a new file
        if epoch == 3:
            source = sink.changes_of(_table(sink, rows)).drop_columns([OP_COLUMN])
            (DeltaTable(sink.table_uri(store, PREFIX)).merge(source, "t.k = s.k", source_alias="s",
                                                             target_alias="t")
             .when_not_matched_insert_all().execute())
        else:
            staged = [sink.write_staged(store, f"{PREFIX}/staging/{epoch}", _table(sink, rows))]
            sink.prepare(store, PREFIX, epoch, staged)
            sink.publish(store, PREFIX, epoch, staged)
        model.update({k: v for k, v, _ in rows})
        if epoch == 2:
            assert compact_table(sink.table_uri(store, PREFIX), 32 << 20)["numFilesRemoved"] == 2
    views = [_has_view_types(f.physical_schema) for f in sink.dataset(store, PREFIX).get_fragments()]
    assert sorted(views) == [False, True]
    for expr, pred in [(pc.field("k") >= "b", lambda k: k[0] >= "b"),
                       (pc.field("k").isin(["a", "bb", "zz"]), lambda k: k[0] in ("a", "bb", "zz")),
                       ((pc.field("k") > "a") & (pc.field("k") < "e"), lambda k: "a" < k[0] < "e")]:
        assert _as_dict(sink, sink.scan(store, PREFIX, filter=expr)) == {k: v for k, v in model.items() if pred(k)}
    found = sink.lookup(store, PREFIX, pa.table({"k": ["a", "f", "x"]}))
    assert _as_dict(sink, found) == {("a",): 10, ("f",): 30}
    # The merge tasks rewrite the view-typed file too: upsert one of its keys, delete another.
    rows = [(("f",), 99, UPSERT), (("g",), 0, DELETE), (("h",), 7, INSERT)]
    staged = [sink.write_staged(store, f"{PREFIX}/staging/4", _table(sink, rows))]
    sink.prepare(store, PREFIX, 4, staged)
    sink.publish(store, PREFIX, 4, staged)
    model.update({("f",): 99, ("h",): 7})
    del model[("g",)]
    assert _as_dict(sink, sink.read(store, PREFIX)) == model


def test_empty_string_in_the_range_column_is_refused_in_the_task(tmp_path) -> None:
    """Delta stores an empty partition value as null: the change rows are refused when the
    task stages them, naming the sink and the column, not deep in the driver's MERGE."""
    spec = KINDS["composite"]
    sink = TableSink("t", spec["schema"], spec["key"], hash_buckets=2, range_column="tenant")
    store = open_object_store(str(tmp_path))
    rows = [(("acme", "a"), 1, UPSERT), (("", "b"), 2, UPSERT)]
    with pytest.raises(ValueError, match="table sink t: range column 'tenant' is empty in a change row"):
        sink.write_staged(store, f"{PREFIX}/staging/1", _table(sink, rows))
    staged = [sink.write_staged(store, f"{PREFIX}/staging/1", _table(sink, rows[:1]))]
    sink.publish(store, PREFIX, 1, staged)
    assert _as_dict(sink, sink.read(store, PREFIX)) == {("acme", "a"): 1}
