"""State specs and timers over a real DKV, against plain Python models."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.codecs import (
    BytesCodec,
    FloatCodec,
    IntCodec,
    JsonCodec,
    MsgpackCodec,
    RecordCodec,
    StrCodec,
)
from dkvstream.operators.api.state import ListSpec, MapSpec, ValueSpec, decode_state_key, subject_prefix
from dkvstream.operators.runtime.timers import TimerService, decode_timer_key, timer_key
from dkvstream.storage.dkv import DKV
from dkvstream.storage.objectstore.local import LocalObjectStore


class FakeSubject:
    def __init__(self, db, key: bytes, key_group: int) -> None:
        self._db, self.key, self.key_group = db, key, key_group
        self._state_prefix = subject_prefix(key_group, key)


class Specs:
    count = ValueSpec(IntCodec())
    seen = ListSpec(StrCodec())
    totals = MapSpec(StrCodec(), FloatCodec())


@pytest.fixture
def db(tmp_path):
    return DKV.open(LocalObjectStore(tmp_path), "state")


@given(st.lists(st.tuples(st.sampled_from([b"a", b"ab", b"b"]), st.sampled_from(["set", "drop", "append", "clear",
       "mset", "mdel"]), st.text(max_size=3), st.floats(allow_nan=False)), max_size=60))
@settings(max_examples=60, deadline=None)
def test_state_objects_match_dict_model(tmp_path_factory, ops) -> None:
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("s")), "state")
    model_v, model_l, model_m = {}, {}, {}
    for key, op, text, num in ops:
        subj = FakeSubject(db, key, key[0] % 4)
        v, lst, m = Specs.count.state_for(subj), Specs.seen.state_for(subj), Specs.totals.state_for(subj)
        if op == "set":
            v.set(len(text))
            model_v[key] = len(text)
        elif op == "drop":
            v.drop()
            model_v.pop(key, None)
        elif op == "append":
            lst.append(text)
            model_l.setdefault(key, []).append(text)
        elif op == "clear":
            lst.clear()
            model_l.pop(key, None)
        elif op == "mset":
            m.set(text, num)
            model_m.setdefault(key, {})[text] = num
        elif op == "mdel":
            m.delete(text)
            model_m.get(key, {}).pop(text, None)
    for key in (b"a", b"ab", b"b"):
        subj = FakeSubject(db, key, key[0] % 4)
        assert Specs.count.state_for(subj).get() == model_v.get(key)
        assert Specs.seen.state_for(subj).get() == model_l.get(key, [])
        expected = sorted(model_m.get(key, {}).items(), key=lambda kv: kv[0].encode())
        assert list(Specs.totals.state_for(subj).items()) == expected
        assert Specs.totals.state_for(subj).size() == len(expected)


def test_state_key_layout_round_trips(db) -> None:
    subj = FakeSubject(db, b"EWR-IAH", 218)
    Specs.totals.state_for(subj).set("x", 1.5)
    (k, _), = list(db.scan_prefix(b""))
    assert decode_state_key(k) == (218, b"EWR-IAH", "totals", b"x")
    assert k[:2] == (218).to_bytes(2, "big"), "DKV keys start with the big-endian key group"


@pytest.mark.parametrize("codec,value", [
    (BytesCodec(), b"\x00\xff"), (StrCodec(), "zürich"), (IntCodec(), -(1 << 63)), (IntCodec(), 42),
    (FloatCodec(), -0.5), (JsonCodec(), {"a": [1, None]}), (MsgpackCodec(), [1, "x", b"y"]),
    (RecordCodec({"n": pa.int64(), "s": pa.string()}), {"n": None, "s": "v"}),
])
def test_codec_round_trip(codec, value) -> None:
    assert codec.decode(codec.encode(value)) == value


@given(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 63), (1 << 63) - 1))
def test_int_codec_preserves_order(a, b) -> None:
    c = IntCodec()
    assert (c.encode(a) < c.encode(b)) == (a < b)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 40), st.sampled_from([b"x", b"y", b"xy"])),
                max_size=40), st.integers(-5, 45))
@settings(max_examples=80, deadline=None)
def test_timers_fire_in_order_up_to_watermark(tmp_path_factory, timers, watermark) -> None:
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("t")), "timers")
    service = TimerService(db, range(4))
    for kg, ts, key in timers:
        service.set(kg, ts, key)
    fired = list(service.due(watermark))
    expected = sorted({t for t in timers if t[1] <= watermark}, key=lambda t: (t[1], t[0], t[2]))
    assert fired == [(ts, kg, key) for kg, ts, key in expected]
    # Fired timers are gone; the rest stay.
    remaining = sorted(decode_timer_key(k) for k, _ in db.scan_prefix(b""))
    assert remaining == sorted({t for t in timers if t[1] > watermark})


def test_timer_set_while_firing_fires_in_same_advance(db) -> None:
    service = TimerService(db, [0])
    service.set(0, 10, b"k")
    fired = []
    for ts, kg, key in service.due(100):
        fired.append(ts)
        if ts < 50:
            service.set(kg, ts + 20, key)   # due within this advance
        service.set(kg, 500, key)           # beyond the watermark: kept for later
    assert fired == [10, 30, 50]
    assert [decode_timer_key(k)[1] for k, _ in db.scan_prefix(b"")] == [500]
    assert timer_key(0, -1, b"k") < timer_key(0, 0, b"k"), "negative timestamps sort first"


_timer_ops = st.lists(st.tuples(st.sampled_from(["set", "set_many", "delete", "delete_many", "checkpoint"]),
                                # few values, so deletes often hit timers that are set
                                st.lists(st.tuples(st.integers(0, 3), st.sampled_from([-5, 0, 7, 40]),
                                                   st.sampled_from([b"x", b"xy", b""])), max_size=8)),
                      max_size=12)


@given(_timer_ops, st.integers(-5, 45), st.booleans())
@settings(max_examples=80, deadline=None)
def test_bulk_timers_match_a_set_model(tmp_path_factory, ops, watermark, batch_pop) -> None:
    """Model: a Python set of (key group, timestamp, key). ``set_many``/``delete_many``
    equal the per-row calls, timers survive checkpoint and reopen (they are in DKV), and
    ``pop_due`` returns what ``due`` yields, in (timestamp, key group, key) order."""
    store = LocalObjectStore(tmp_path_factory.mktemp("t"))
    db = DKV.open(store, "timers")
    service = TimerService(db, range(4))
    model: set[tuple[int, int, bytes]] = set()
    for n, (op, rows) in enumerate(ops):
        if op == "checkpoint":
            key = db.checkpoint(f"c{n}")
            db.close()
            db = DKV.open(store, "timers", key)
            service = TimerService(db, range(4))
            continue
        call = getattr(service, op)  # set, set_many, delete or delete_many
        if op.endswith("_many"):
            call([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        else:
            for kg, ts, key in rows:
                call(kg, ts, key)
        if op.startswith("set"):
            model.update(rows)
        else:
            model.difference_update(rows)
    fired = service.pop_due(watermark) if batch_pop else list(service.due(watermark))
    expected = sorted((ts, kg, key) for kg, ts, key in model if ts <= watermark)
    assert fired == expected
    remaining = sorted(decode_timer_key(k) for k, _ in db.scan_prefix(b""))
    assert remaining == sorted(t for t in model if t[1] > watermark)
    db.close()


_pass_ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(["set", "set_many", "delete_many"]),
              st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 60), st.sampled_from([b"x", b"xy"])),
                       max_size=6)),
    st.tuples(st.sampled_from(["pop_due", "due"]), st.integers(-5, 60)),
    # a pass abandoned after k timers (the caller stopped iterating, e.g. on an error)
    st.tuples(st.just("due_partial"), st.tuples(st.integers(-5, 60), st.integers(0, 3))),
    # timers set from inside a pass (an on_timer callback), at, below and above its watermark
    st.tuples(st.just("due_set_inside"),
              st.tuples(st.integers(-5, 60),
                        st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 60), st.sampled_from([b"x", b"z"])),
                                 min_size=1, max_size=4)))), max_size=25)


@given(_pass_ops)
@settings(max_examples=120, deadline=None)
def test_timer_lower_bound_skips_scans_and_loses_nothing(tmp_path_factory, ops) -> None:
    """One service over many due passes (as a reused open DKV keeps it): every pass fires
    exactly the model's timers at or below its watermark, in order, and a pass whose
    watermark is below every stored timer reads nothing from DKV."""
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("t")), "timers")
    service = TimerService(db, range(4))
    model: set[tuple[int, int, bytes]] = set()
    scans = []
    scan_range = db.scan_range
    db.scan_range = lambda *a: (scans.append(a), scan_range(*a))[1]
    for op, arg in ops:
        if op == "set":
            for kg, ts, key in arg:
                service.set(kg, ts, key)
            model.update(arg)
        elif op == "set_many":
            service.set_many([r[0] for r in arg], [r[1] for r in arg], [r[2] for r in arg])
            model.update(arg)
        elif op == "delete_many":
            service.delete_many([r[0] for r in arg], [r[1] for r in arg], [r[2] for r in arg])
            model.difference_update(arg)
        elif op == "due_partial":
            watermark, k = arg
            passing = service.due(watermark)
            fired = [t for _, t in zip(range(k), passing)]
            passing.close()
            assert fired == sorted((ts, kg, key) for kg, ts, key in model if ts <= watermark)[:k]
            model.difference_update((kg, ts, key) for ts, kg, key in fired)
            assert service.low is None or all(ts >= service.low for _, ts, _ in model)
        elif op == "due_set_inside":
            watermark, rows = arg
            fired = []
            for t in service.due(watermark):
                if not fired:  # once, from the first timer's callback
                    for kg, ts, key in rows:
                        service.set(kg, ts, key)
                    model.update(rows)
                fired.append(t)
            model.difference_update((kg, ts, key) for ts, kg, key in fired)
            # Everything due fired, the timers set while firing at or below the watermark too.
            assert not any(ts <= watermark for _, ts, _ in model)
            # A timer fires once per setting: twice only if the callback set it again after
            # it fired (as in Flink: a timer registered at or below the watermark while
            # firing fires in the same advance).
            again = {(ts, kg, key) for kg, ts, key in rows if ts <= watermark}
            assert all(fired.count(t) == 1 or (fired.count(t) == 2 and t in again) for t in fired)
            assert service.low is not None and all(ts >= service.low for _, ts, _ in model)
        else:
            scans.clear()
            low_before = service.low
            fired = service.pop_due(arg) if op == "pop_due" else list(service.due(arg))
            assert fired == sorted((ts, kg, key) for kg, ts, key in model if ts <= arg)
            model = {t for t in model if t[1] > arg}
            assert service.low is not None and all(ts >= service.low for _, ts, _ in model)
            if low_before is not None and arg < low_before:
                assert scans == []
    remaining = sorted(decode_timer_key(k) for k, _ in db.scan_prefix(b""))
    assert remaining == sorted(model)


def test_timer_pass_below_the_lower_bound_reads_nothing(db) -> None:
    service = TimerService(db, range(4))
    service.set_many([0, 1], [100, 200], [b"a", b"b"])
    scans = []
    scan_range = db.scan_range
    db.scan_range = lambda *a: (scans.append(a), scan_range(*a))[1]
    assert service.pop_due(50) == [] and scans and service.low == 100  # unknown bound: scans
    scans.clear()
    assert service.pop_due(99) == [] and scans == []       # every timer is at 100 or later
    assert service.pop_due(150) == [(100, 0, b"a")] and scans and service.low == 200
    service.set(3, 120, b"c")                               # lowers the bound
    scans.clear()
    assert service.pop_due(130) == [(120, 3, b"c")] and scans and service.low == 200


@given(st.lists(st.fixed_dictionaries({"n": st.integers(-(1 << 63), (1 << 63) - 1) | st.none()},
                                      optional={"s": st.text(max_size=5)}), max_size=20),
       st.booleans())
@settings(max_examples=80, deadline=None)
def test_bulk_codec_calls_equal_one_call_per_value(records, one_field) -> None:
    """``encode_many``/``decode_many`` give the bytes and values of ``encode``/``decode``
    per value (records missing a field included; None passes through decode_many)."""
    codec = RecordCodec({"n": pa.int64()} if one_field else {"n": pa.int64(), "s": pa.string()})
    raws = codec.encode_many(records)
    assert raws == [codec.encode(r) for r in records]
    assert codec.decode_many(raws + [None]) == [codec.decode(r) for r in raws] + [None]
    ints = IntCodec()
    assert ints.encode_many([r["n"] or 0 for r in records]) == [ints.encode(r["n"] or 0) for r in records]


def test_encode_many_reads_fields_as_encode_does() -> None:
    """A mapping with ``__missing__`` (defaultdict, Counter) missing a field: ``encode``
    reads it with ``get`` (null); ``encode_many`` gives the same bytes per record and
    does not add the field."""
    from collections import Counter, defaultdict

    codec = RecordCodec({"n": pa.int64(), "m": pa.int64()})
    records = [defaultdict(int, n=1), Counter(n=2), {"n": 3, "m": 4}, {"n": 5}]
    assert codec.encode_many(records) == [codec.encode(r) for r in records]
    assert codec.decode(codec.encode_many(records)[0]) == {"n": 1, "m": None}
    assert "m" not in records[0] and "m" not in records[1]


@given(st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1) | st.none(), st.text(max_size=5)), max_size=20),
       st.lists(st.booleans(), max_size=20))
@settings(max_examples=80, deadline=None)
def test_record_rows_equal_dict_records(rows, absent) -> None:
    """``encode_rows`` gives ``encode``'s bytes for the same record as a dict, and
    ``decode_rows`` gives ``decode``'s values as tuples in field order, None passing
    through (the dict codec is the oracle); a value of another shape is a ValueError."""
    codec = RecordCodec({"n": pa.int64(), "s": pa.string()})
    raws = codec.encode_rows(rows)
    assert raws == [codec.encode({"n": n, "s": s}) for n, s in rows]
    mixed = [None if (i < len(absent) and absent[i]) else r for i, r in enumerate(raws)]
    assert codec.decode_rows(mixed) == [None if r is None else tuple(codec.decode(r).values()) for r in mixed]
    with pytest.raises(ValueError):
        codec.encode_rows([(1,)])
    with pytest.raises(ValueError):
        codec.decode_rows([RecordCodec({"n": pa.int64()}).encode({"n": 1})])
    with pytest.raises(ValueError):
        codec.decode_rows([codec.encode({"n": 1, "s": "a"}) + b"\x01"])  # trailing bytes


def test_bulk_map_rows_equal_dict_accessors(db) -> None:
    """``get_rows_at``/``set_rows_at`` read and write what ``get_at``/``set_at`` do with
    the equivalent dicts; a codec without a rows form is a TypeError."""
    from dkvstream.operators.api.batch import BulkMapState
    spec = MapSpec(IntCodec(), RecordCodec({"count": pa.int64(), "amount": pa.int64()}), id="w")
    state = BulkMapState(db, spec)
    at = state.dkv_keys([b"a", b"b", b"c"], [0, 1, 1], [10, 20, 30])
    state.set_rows_at(at[:2], [(1, 5), (2, -7)])
    assert state.get_at(at) == [{"count": 1, "amount": 5}, {"count": 2, "amount": -7}, None]
    state.set_at(at[2:], [{"count": 3, "amount": 9}])
    assert state.get_rows_at(at) == [(1, 5), (2, -7), (3, 9)]
    with pytest.raises(TypeError):
        BulkMapState(db, MapSpec(IntCodec(), IntCodec(), id="i")).get_rows_at(at)


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([-(1 << 62), -1, 0, 1, 7, 1 << 40, (1 << 62)]),
                          st.sampled_from([b"x", b"xy", b""])), max_size=30),
       st.sampled_from([-(1 << 62), -1, 0, 7, 1 << 40, (1 << 62)]))
@settings(max_examples=80, deadline=None)
def test_pop_due_columns_match_a_set_model(tmp_path_factory, timers, watermark) -> None:
    """``pop_due_columns`` returns (timestamps, key groups, keys) of every timer at or
    below the watermark in (timestamp, key group, key) order, negative and far times
    included (the sorted set is the oracle), and removes exactly those."""
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("t")), "timers")
    service = TimerService(db, range(4))
    service.set_many([t[0] for t in timers], [t[1] for t in timers], [t[2] for t in timers])
    expected = sorted((ts, kg, key) for kg, ts, key in set(timers) if ts <= watermark)
    stamps, kgs, keys = service.pop_due_columns(watermark)
    assert list(zip(stamps, kgs, keys)) == expected
    assert all(type(x) is int for x in stamps + kgs)
    remaining = sorted(decode_timer_key(k) for k, _ in db.scan_prefix(b""))
    assert remaining == sorted(t for t in set(timers) if t[1] > watermark)


class Totals:
    """An operator-like owner: its ``name`` is what errors call the operator."""

    name = "totals_by_key"
    by_id = MapSpec(IntCodec(), FloatCodec())
    last = ValueSpec(IntCodec())
    names = ListSpec(StrCodec())
    raw = ValueSpec(BytesCodec())


@pytest.mark.parametrize("call, role, codec, expects, value", [
    (lambda s: Totals.by_id.state_for(s).set("x", 1.0), "map key", "int64", "int (64-bit signed)", "'x'"),
    (lambda s: Totals.by_id.state_for(s).get("x"), "map key", "int64", "int (64-bit signed)", "'x'"),
    (lambda s: Totals.by_id.state_for(s).delete(b"x"), "map key", "int64", "int (64-bit signed)", "b'x'"),
    (lambda s: Totals.by_id.state_for(s).set(1, "1.5"), "value", "float64", "float", "'1.5'"),
    (lambda s: Totals.last.state_for(s).set(1 << 63), "value", "int64", "int (64-bit signed)", str(1 << 63)),
    (lambda s: Totals.names.state_for(s).append(b"ab"), "value", "str", "str", "b'ab'"),
    (lambda s: Totals.raw.state_for(s).set(5), "value", "bytes", "bytes", "5"),
])
def test_wrong_type_in_a_state_call_names_operator_state_and_codec(db, call, role, codec, expects, value) -> None:
    """A value or map key the state's codec cannot encode raises ``StateTypeError``
    naming the operator, the state id, the codec, the expected type and the value, and
    writes nothing (an int out of 64-bit range and an int given to ``BytesCodec`` used to
    be stored silently as other values)."""
    from dkvstream.operators.errors import StateTypeError
    subj = FakeSubject(db, b"k", 3)
    Totals.by_id.state_for(subj).set(1, 2.0)
    before = list(db.scan_prefix(b""))
    with pytest.raises(StateTypeError) as info:
        call(subj)
    message = str(info.value)
    assert "operator 'totals_by_key'" in message and role in message
    assert f"({codec}) expects {expects}" in message and value in message
    state_id = next(n for n, spec in vars(Totals).items() if f"state {n!r}" in message)
    assert state_id in ("by_id", "last", "names", "raw")
    assert list(db.scan_prefix(b"")) == before


def test_wrong_type_in_a_bulk_state_call_names_the_first_bad_value(db) -> None:
    """The vectorised form's bulk calls name the first value the codec rejects, and
    write nothing of the batch."""
    from dkvstream.operators.api.batch import BulkListState, BulkMapState, BulkValueState
    from dkvstream.operators.errors import StateTypeError
    cases = [
        (lambda: BulkMapState(db, Totals.by_id).set([b"a", b"b"], [0, 0], [1, "2"], [1.0, 2.0]), "'2'", "map key"),
        (lambda: BulkMapState(db, Totals.by_id).set([b"a", b"b"], [0, 0], [1, 2], [1.0, None]), "None", "value"),
        (lambda: BulkValueState(db, Totals.last).set([b"a", b"b"], [0, 0], [1, 2.5]), "2.5", "value"),
        (lambda: BulkListState(db, Totals.names).append([b"a", b"b"], [0, 0], ["x", 7]), "7", "value"),
    ]
    for call, bad, role in cases:
        with pytest.raises(StateTypeError,
                           match=rf"operator 'totals_by_key' state '\w+': the {role} codec .* got \w+ {bad}"):
            call()
    assert list(db.scan_prefix(b"")) == []
