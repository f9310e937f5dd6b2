"""State TTL over a real DKV, against a dict model with a clock: both state forms (the
per-event objects and the bulk ones, columns paths included), with compactions at the
clocks' checkpoints in between, never changing what is visible."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.batch import BatchContext
from dkvstream.operators.api.codecs import IntCodec, RecordCodec, StrCodec
from dkvstream.operators.api.state import (
    SCHEMA_STATE_TTL_EVENT,
    SCHEMA_STATE_TTL_PROCESSING,
    ListSpec,
    MapSpec,
    StateClock,
    StateTtl,
    ValueSpec,
    decode_state_key,
    subject_prefix,
)
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.objectstore.local import LocalObjectStore

TTL = 10
OPTS = DKVOptions(memtable_bytes=1500, block_bytes=256, l0_compaction_trigger=2, target_file_bytes=1000, zstd_level=1)
REC = RecordCodec({"n": pa.int64(), "s": pa.string()})


class Specs:
    value = ValueSpec(IntCodec(), ttl=StateTtl(TTL))
    read_refreshed = ValueSpec(IntCodec(), ttl=StateTtl(TTL, update="on_read_and_write"))
    items = ListSpec(StrCodec(), ttl=StateTtl(TTL))
    slots = MapSpec(IntCodec(), IntCodec(), ttl=StateTtl(TTL, time="processing"))
    record = ValueSpec(REC, ttl=StateTtl(TTL))
    plain = ValueSpec(IntCodec())


class FakeSubject:
    def __init__(self, db, key: bytes, clock: StateClock) -> None:
        self._db, self.key, self.key_group, self.state_clock = db, key, key[0] % 4, clock
        self._state_prefix = subject_prefix(self.key_group, key)


class Model:
    """``{(state, key): (value, expiry)}`` with the TTL rules of ``StateTtl``."""

    def __init__(self) -> None:
        self.d: dict = {}

    def get(self, name: str, key, now: int, refresh_expiry: int | None = None):
        v = self.d.get((name, key))
        if v is None or v[1] <= now:
            return None
        if refresh_expiry is not None:
            self.d[(name, key)] = (v[0], refresh_expiry)
        return v[0]

    def set(self, name: str, key, value, expiry: int) -> None:
        self.d[(name, key)] = (value, expiry)


KEYS = [b"a", b"ab", b"b", b"c"]
step = st.tuples(st.sampled_from(KEYS), st.sampled_from(["set", "read", "append", "mset", "mget", "rec", "plain"]),
                 st.integers(0, 5))
epoch = st.tuples(st.integers(0, 12), st.integers(0, 12), st.booleans(), st.lists(step, max_size=15))


@given(st.lists(epoch, min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_per_event_ttl_state_matches_model(tmp_path_factory, epochs) -> None:
    db = DKV.open(LocalObjectStore(tmp_path_factory.mktemp("s")), "state", options=OPTS)
    model = Model()
    wm = proc = 0
    for i, (dwm, dproc, compact, steps) in enumerate(epochs):
        # An epoch reads at the watermark before it and writes at the one it reaches.
        clock = StateClock(wm, wm + dwm, proc + dproc)
        ev, ev_exp = clock.watermark, clock.epoch_watermark + TTL
        pt, pt_exp = clock.processing_time, clock.processing_time + TTL
        for key, op, n in steps:
            s = FakeSubject(db, key, clock)
            if op == "set":
                Specs.value.state_for(s).set(n)
                model.set("value", key, n, ev_exp)
                assert Specs.value.state_for(s).get() == n
            elif op == "read":
                got = Specs.read_refreshed.state_for(s).get()
                assert got == model.get("rr", key, ev, refresh_expiry=ev_exp)
                if n == 0:
                    Specs.read_refreshed.state_for(s).set(i)
                    model.set("rr", key, i, ev_exp)
            elif op == "append":
                lst = Specs.items.state_for(s)
                assert lst.get() == (model.get("items", key, ev) or [])
                lst.append(str(n))
                model.set("items", key, (model.get("items", key, ev) or []) + [str(n)], ev_exp)
            elif op == "mset":
                Specs.slots.state_for(s).set(n % 3, n)
                model.set("slots", (key, n % 3), n, pt_exp)
            elif op == "mget":
                m = Specs.slots.state_for(s)
                assert m.get(n % 3) == model.get("slots", (key, n % 3), pt)
                slots = [mk for name, mk in model.d if name == "slots" and mk[0] == key]
                assert dict(m.items()) == {mk: model.get("slots", (key, mk), pt) for _, mk in slots
                                           if model.get("slots", (key, mk), pt) is not None}
            elif op == "rec":
                r = Specs.record.state_for(s)
                assert r.get() == model.get("record", key, ev)
                r.set({"n": n, "s": "x" * n})
                model.set("record", key, {"n": n, "s": "x" * n}, ev_exp)
            else:  # a state without TTL never expires
                p = Specs.plain.state_for(s)
                assert p.get() == model.get("plain", key, ev)
                p.set(n)
                model.set("plain", key, n, 1 << 62)
        for key in KEYS:
            s = FakeSubject(db, key, clock)
            assert Specs.value.state_for(s).get() == model.get("value", key, ev)
        db.set_compaction_filter(clock.compaction_filter())
        if compact:
            db.flush()
        db.checkpoint(f"e{i}")
        wm, proc = clock.epoch_watermark, clock.processing_time
    db.compact_all()
    # Every entry left in the tables is one the model holds unexpired at the clocks of
    # the last checkpoint, and the other way round.
    names = {"read_refreshed": "rr"}
    left = set()
    for k, _ in db.scan_range(b"", None):
        _, key, sid, map_key = decode_state_key(k)
        left.add((names.get(sid, sid), (key, IntCodec().decode(map_key)) if map_key else key))
    now = {SCHEMA_STATE_TTL_PROCESSING: proc}
    alive = {(name, key) for (name, key) in model.d
             if model.get(name, key, now.get(SCHEMA_STATE_TTL_PROCESSING if name == "slots" else 0, wm)) is not None}
    assert left == alive


def test_bulk_ttl_state_matches_per_event_state(tmp_path) -> None:
    # The bulk objects (lists, Arrow columns, *_columns, *_rows_at) see and write the
    # same entries as the per-event ones, expiry included.
    db = DKV.open(LocalObjectStore(tmp_path), "state")
    keys = pa.array([b"a", b"b", b"c"], pa.binary())
    kgs = pa.array([1, 2, 3], pa.int32())
    c1 = StateClock(0, 100, 0)
    ctx = BatchContext(db, None, {})  # type: ignore[arg-type]
    ctx.state_clock = c1
    ctx.state(Specs.value).set(keys, kgs, [1, 2, 3])
    ctx.state(Specs.record).set_columns(keys, kgs, {"n": [1, 2, 3], "s": ["a", "b", "c"]})
    ctx.state(Specs.items).append(keys.to_pylist(), kgs.to_pylist(), ["x", "y", "z"])
    slots = ctx.state(Specs.slots)
    slots.set(keys, kgs, pa.array([0, 1, 2]), [7, 8, 9])

    def subject(key: bytes, kg: int, clock: StateClock) -> FakeSubject:
        s = FakeSubject(db, key, clock)
        s.key_group, s._state_prefix = kg, subject_prefix(kg, key)
        return s

    c2 = StateClock(100 + TTL - 1, 200, TTL - 1)  # all still visible
    ctx.state_clock = c2
    assert ctx.state(Specs.value).get(keys, kgs) == [1, 2, 3]
    assert ctx.state(Specs.record).get_columns(keys, kgs).to_pylist() == [
        {"n": 1, "s": "a"}, {"n": 2, "s": "b"}, {"n": 3, "s": "c"}]
    assert ctx.state(Specs.items).get(keys, kgs) == [["x"], ["y"], ["z"]]
    assert ctx.state(Specs.slots).get(keys, kgs, [0, 1, 2]) == [7, 8, 9]
    assert Specs.slots.state_for(subject(b"b", 2, c2)).get(1) == 8
    assert list(ctx.state(Specs.slots).items(b"c", 3)) == [(2, 9)]
    ctx.state(Specs.value).set(keys[:1], kgs[:1], [10])  # refreshed: expires at 200 + TTL
    c3 = StateClock(100 + TTL, 300, TTL)  # the rest expired in both clocks
    ctx.state_clock = c3
    assert ctx.state(Specs.value).get(keys, kgs) == [10, None, None]
    assert Specs.value.state_for(subject(b"b", 2, c3)).get() is None
    assert ctx.state(Specs.record).get_columns(keys, kgs).to_pylist() == [None, None, None]
    assert ctx.state(Specs.items).get(keys, kgs) == [[], [], []]
    assert ctx.state(Specs.slots).get(keys, kgs, [0, 1, 2]) == [None, None, None]
    assert list(ctx.state(Specs.slots).items(b"c", 3)) == []
    # Keys carry the TTL schema byte of their clock.
    schemas = {k[2] for k, _ in db.scan_range(b"", None)}
    assert schemas == {SCHEMA_STATE_TTL_EVENT, SCHEMA_STATE_TTL_PROCESSING}


def test_ttl_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="ttl_ms must be a positive int"):
        StateTtl(0)
    with pytest.raises(ValueError, match="time must be"):
        StateTtl(5, time="ingestion")
    with pytest.raises(ValueError, match="update must be"):
        StateTtl(5, update="never")
    with pytest.raises(TypeError, match="ttl must be a StateTtl"):
        ValueSpec(IntCodec(), ttl=5)  # type: ignore[arg-type]
    assert StateClock(0, (1 << 63) - 1, 0).expiry(StateTtl(5)) == (1 << 63) - 1  # saturates
