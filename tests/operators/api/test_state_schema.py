"""Record state across schema versions (``RecordCodec.bind``, ``api.state_schema``),
against a model of Avro-style resolution: by field name, an added field reads as its
default, a dropped one is ignored, an int read as a float becomes a float."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.batch import BatchContext
from dkvstream.operators.api.codecs import IntCodec, JsonCodec, RecordCodec, StrCodec, resolution_problem
from dkvstream.operators.api.state import ListSpec, MapSpec, StateTtl, ValueSpec, subject_prefix
from dkvstream.operators.api.state_schema import bind_operator, describe, evolve, evolve_job
from dkvstream.operators.errors import StateSchemaError
from dkvstream.storage.dkv import DKV
from dkvstream.storage.objectstore.local import LocalObjectStore

POOL = ["a", "b", "c", "d", "e"]
INT_TYPES = [pa.int32(), pa.int64()]


@st.composite
def evolution(draw):
    """A writer schema, a reader schema it widens to, defaults, and writer records."""
    writer_names = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=5, unique=True))
    writer = {n: draw(st.sampled_from(INT_TYPES)) for n in writer_names}
    kept = [n for n in writer_names if draw(st.booleans())] or writer_names[:1]
    added = [n for n in POOL if n not in writer and draw(st.booleans())]
    reader_names = draw(st.permutations(kept + added))
    widen = {pa.int32(): [pa.int32(), pa.int64(), pa.float64()], pa.int64(): [pa.int64(), pa.float64()]}
    reader = {n: draw(st.sampled_from(widen[writer[n]])) if n in writer else pa.int64() for n in reader_names}
    defaults = {n: draw(st.integers(-5, 5)) for n in added if draw(st.booleans())}
    value = st.one_of(st.none(), st.integers(-2**31, 2**31 - 1))
    records = draw(st.lists(st.one_of(st.none(), st.fixed_dictionaries({n: value for n in writer})), max_size=8))
    return writer, reader, defaults, records


def _model(record: dict | None, reader: dict, defaults: dict) -> dict | None:
    if record is None:
        return None
    out = {}
    for n, t in reader.items():
        v = record[n] if n in record else defaults.get(n)
        out[n] = float(v) if v is not None and n in record and pa.types.is_floating(t) else v
    return out


@settings(max_examples=150, deadline=None)
@given(evolution())
def test_old_entries_read_in_the_new_fields(case) -> None:
    writer_fields, reader_fields, defaults, records = case
    old = RecordCodec(writer_fields)
    reader = RecordCodec(reader_fields, defaults)
    same = old.schema_fields() == reader.schema_fields()
    history = [old.schema_fields()] if same else [old.schema_fields(), reader.schema_fields()]
    bound = reader.bind(history)
    raws = [None if r is None else old.encode(r) for r in records]
    want = [_model(r, reader_fields, defaults) for r in records]
    assert bound.decode_many(raws) == want
    rows = [None if w is None else tuple(w[n] for n in reader_fields) for w in want]
    assert bound.decode_rows(raws) == rows
    assert bound.decode_struct(raws).to_pylist() == want
    # New entries carry the version; old and new entries read together.
    new = [w for w in want if w is not None]
    written = bound.encode_many(new)
    assert bound.encode_rows([tuple(w[n] for n in reader_fields) for w in new]) == written
    if new and not same:
        assert all(w[:3] == b"\xc1\x00\x01" for w in written)
        assert bound.encode_struct(pa.array(new, reader.arrow_type)) == written
        with pytest.raises(ValueError, match="written with schema version 1"):
            reader.decode(written[0])  # an unbound codec knows version 0 only
    assert bound.decode_struct(raws + written).to_pylist() == want + new
    assert bound.decode_struct(written).to_pylist() == new  # all current: the C path


def test_refused_changes_name_the_field() -> None:
    was = RecordCodec({"n": pa.int64(), "s": pa.string(), "f": pa.float64()}).schema_fields()
    assert resolution_problem(was, RecordCodec({"n": pa.int32()})) == "field 'n' was int64, is int32: a narrowing"
    assert resolution_problem(was, RecordCodec({"s": pa.int64()})) == "field 's' was string, is int64: a type change"
    assert resolution_problem(was, RecordCodec({"f": pa.int64()})) == "field 'f' was double, is int64: a narrowing"
    assert resolution_problem(was, RecordCodec({"x": pa.bool_(), "f": pa.float64()})) is None
    with pytest.raises(ValueError, match="cannot read version 0: field 'n'"):
        RecordCodec({"n": pa.string()}).bind([was, (("n", "string"),)])
    with pytest.raises(ValueError, match="defaults name fields it does not have: z"):
        RecordCodec({"n": pa.int64()}, defaults={"z": 1})
    with pytest.raises(ValueError, match="default of field 'n' \\(int64\\): 'x' is not a value of that type"):
        RecordCodec({"n": pa.int64()}, defaults={"n": "x"})


class Old:
    name = "op"
    total = ValueSpec(RecordCodec({"n": pa.int64(), "gone": pa.string()}))
    history = ListSpec(RecordCodec({"n": pa.int64()}))
    by_key = MapSpec(StrCodec(), RecordCodec({"n": pa.int32()}))
    plain = ValueSpec(IntCodec())


class New:
    name = "op"
    total = ValueSpec(RecordCodec({"m": pa.int64(), "n": pa.float64()}, defaults={"m": -1}))
    history = ListSpec(RecordCodec({"n": pa.int64(), "k": pa.string()}, defaults={"k": "none"}))
    by_key = MapSpec(StrCodec(), RecordCodec({"n": pa.int64()}))
    plain = ValueSpec(IntCodec())


class FakeSubject:
    def __init__(self, db, key: bytes, key_group: int) -> None:
        self._db, self.key, self.key_group = db, key, key_group
        self._state_prefix = subject_prefix(key_group, key)


def test_both_forms_read_old_entries_after_a_restart(tmp_path) -> None:
    db = DKV.open(LocalObjectStore(tmp_path), "state")
    old = Old()
    recorded = evolve_job([old], {})
    bind_operator(old, recorded["op"])
    s = FakeSubject(db, b"k", 3)
    Old.total.state_for(s).set({"n": 4, "gone": "x"})
    Old.history.state_for(s).append({"n": 1})
    Old.by_key.state_for(s).set("a", {"n": 2})
    Old.plain.state_for(s).set(9)

    new = New()
    schemas = evolve_job([new], recorded, epoch=5)
    assert schemas["op"]["plain"] == recorded["op"]["plain"]
    assert len(schemas["op"]["total"]["versions"]) == 2
    bind_operator(new, schemas["op"])
    New.history.state_for(s).append({"n": 2, "k": "z"})  # a list of mixed versions
    assert New.total.state_for(s).get() == {"m": -1, "n": 4.0}
    assert New.history.state_for(s).get() == [{"n": 1, "k": "none"}, {"n": 2, "k": "z"}]
    assert dict(New.by_key.state_for(s).items()) == {"a": {"n": 2}}
    ctx = BatchContext(db, None, {}, "op")
    keys, kgs = pa.array([b"k", b"other"]), [3, 3]
    assert ctx.state(New.total).get_columns(keys, kgs).to_pylist() == [{"m": -1, "n": 4.0}, None]
    assert ctx.state(New.total).get([b"k"], [3]) == [{"m": -1, "n": 4.0}]
    at = ctx.state(New.by_key).dkv_keys([b"k"], [3], ["a"])
    assert ctx.state(New.by_key).get_rows_at(at) == [(2,)]
    # Idempotent: a task binds every epoch.
    bound = New.total.codec
    bind_operator(new, schemas["op"])
    assert New.total.codec is bound


def test_evolve_refuses_other_codecs_and_kinds() -> None:
    rec = describe(ValueSpec(IntCodec()))
    with pytest.raises(StateSchemaError, match="operator 'op' state 's': its values were encoded by int64, "
                                               "are declared with json: a new value codec"):
        evolve("op", "s", rec, ValueSpec(JsonCodec()), epoch=3)
    with pytest.raises(StateSchemaError, match="was a value state, is declared as a list state"):
        evolve("op", "s", rec, ListSpec(IntCodec()))
    assert evolve("op", "s", rec, ValueSpec(IntCodec())) is rec
    assert evolve("op", "s", None, ValueSpec(IntCodec())) == rec


def test_evolve_refuses_a_ttl_added_removed_or_moved_to_another_clock() -> None:
    """A TTL, or its clock, decides where entries are stored: changing it is refused at
    restart (naming the state); its length and update policy may change."""
    plain, event = describe(ValueSpec(IntCodec())), describe(ValueSpec(IntCodec(), ttl=StateTtl(10)))
    with pytest.raises(StateSchemaError, match="state 's': was declared without a TTL, is declared with an "
                                               "event-time TTL"):
        evolve("op", "s", plain, ValueSpec(IntCodec(), ttl=StateTtl(10)))
    with pytest.raises(StateSchemaError, match="was declared with an event-time TTL, is declared without a TTL"):
        evolve("op", "s", event, ValueSpec(IntCodec()))
    with pytest.raises(StateSchemaError, match="is declared with a processing-time TTL"):
        evolve("op", "s", event, ValueSpec(IntCodec(), ttl=StateTtl(10, time="processing")))
    assert evolve("op", "s", event, ValueSpec(IntCodec(), ttl=StateTtl(99, update="on_read_and_write"))) is event
    legacy = {k: v for k, v in plain.items() if k != "ttl"}  # a checkpoint written before TTLs
    assert evolve("op", "s", legacy, ValueSpec(IntCodec())) is legacy


def test_a_state_no_longer_declared_keeps_its_record() -> None:
    recorded = evolve_job([Old()], {})

    class Fewer:
        name = "op"
        plain = Old.plain

    kept = evolve_job([Fewer()], recorded)
    assert kept["op"]["total"] == recorded["op"]["total"]


def test_a_native_module_built_without_headers_gives_the_same_bytes(monkeypatch) -> None:
    """A C module built before the loops took a header: the header is added and checked
    in Python, with the same bytes and values."""
    from dkvstream.operators.api import codecs

    old = RecordCodec({"a": pa.int64()})
    new = RecordCodec({"a": pa.int64(), "b": pa.int64()}, defaults={"b": 5})
    bound = new.bind([old.schema_fields(), new.schema_fields()])
    columns = {"a": pa.array([1, 2]), "b": pa.array([3, 4])}
    raws = bound.encode_struct(columns) + [None, old.encode({"a": 9})]
    want = bound.decode_struct(raws).to_pylist()
    assert want == [{"a": 1, "b": 3}, {"a": 2, "b": 4}, None, {"a": 9, "b": 5}]
    monkeypatch.setattr(codecs, "_NATIVE_HEADERS", False)
    assert bound.encode_struct(columns) == raws[:2]
    assert bound.decode_struct(raws).to_pylist() == want
    assert bound.decode_struct(raws[:3]).to_pylist() == want[:3]


ALL_TYPES = [pa.int32(), pa.int64(), pa.float64(), pa.string()]


@st.composite
def history(draw):
    """Two to four versions of random fields, with records written under each."""
    versions = []
    for _ in range(draw(st.integers(2, 4))):
        names = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=5, unique=True))
        versions.append({n: draw(st.sampled_from(ALL_TYPES)) for n in names})
    values = {pa.int32(): st.integers(-2**31, 2**31 - 1), pa.int64(): st.integers(-2**63, 2**63 - 1),
              pa.float64(): st.floats(allow_nan=False), pa.string(): st.text(max_size=3)}
    records = [draw(st.lists(st.fixed_dictionaries({n: st.none() | values[t] for n, t in v.items()}), max_size=4))
               for v in versions]
    defaults = {n: draw(values[t]) for n, t in versions[-1].items() if draw(st.booleans())}
    return versions, records, defaults


@settings(max_examples=150, deadline=None)
@given(history())
def test_a_history_of_versions_reads_every_version_or_is_refused(case) -> None:
    """Entries of every version read in the newest fields when each older version
    resolves to them (``resolution_problem``); otherwise ``bind`` (and a restart's
    ``evolve``) refuses."""
    versions, records, defaults = case
    reader = RecordCodec(versions[-1], defaults)
    fields = [RecordCodec(v).schema_fields() for v in versions]
    # Only histories whose every release was accepted in its turn exist.
    assume(all(resolution_problem(f, RecordCodec(versions[w])) is None
               for w in range(1, len(versions) - 1) for f in fields[:w]))
    problems = [resolution_problem(f, reader) for f in fields[:-1]]
    if any(problems):
        with pytest.raises(ValueError, match="cannot read version"):
            reader.bind(fields)
        return
    bound = reader.bind(fields)
    for w, (v, rows) in enumerate(zip(versions, records)):
        writer = RecordCodec(v).bind(fields[:w + 1])  # what release w wrote
        raws = writer.encode_many(rows)
        want = [_model(r, versions[-1], defaults) for r in rows]
        assert bound.decode_many(raws) == want
        assert bound.decode_struct(raws).to_pylist() == want


def test_binding_is_undone_for_a_job_without_a_history() -> None:
    """Specs are class attributes, shared by every instance: a task binding them to one
    job's schema history must not leave the next job in the same process (a new job,
    another history) writing with that history's version header."""
    old, new = Old(), New()
    history = evolve_job([new], evolve_job([old], {}))["op"]
    bind_operator(new, history)
    assert New.total.codec.encode({"m": 1, "n": 2.0})[:1] == b"\xc1"   # version 1 of total
    bind_operator(New(), None)                                          # a job from empty state
    assert New.total.codec.encode({"m": 1, "n": 2.0})[:1] != b"\xc1"
    assert New.total.codec.decode(New.total.codec.encode({"m": 1, "n": 2.0})) == {"m": 1, "n": 2.0}
    bind_operator(new, history)
    assert New.total.codec.encode({"m": 1, "n": 2.0})[:1] == b"\xc1"
    bind_operator(New(), {})
