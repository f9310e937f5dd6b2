"""A job whose operator reads, then writes, state with TTLs of every kind on each event
and emits what it read; its two forms, its input, and a replay model with the TTL rules.

In an importable module so that Spark tasks can unpickle the operators. Each key occurs
at most once per epoch in the input (``probe_source``), so the vectorised form can read
all rows' state before writing any and still equal the per-event form.
"""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.operator import WATERMARK_MIN, KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ListSpec, MapSpec, StateClock, StateTtl, ValueSpec
from tests.operators.table_sources import TableSource

TTL_MS = 15  # event time
PROC_TTL_MS = 2_500  # processing time; the tests' clock moves 1 s per epoch
EVENTS_PER_EPOCH = 4
KEYS = [b"k%d" % i for i in range(6)]
REC = RecordCodec({"n": pa.int64()})

SCHEMA = pa.schema([
    ("k", pa.string()), ("v", pa.int64()), ("last", pa.int64()), ("touched", pa.int64()),
    ("slot", pa.int64()), ("n_hist", pa.int64()), ("proc", pa.int64()), ("rec", pa.int64()),
])


class TtlProbe(Operator):
    name = "ttl_probe"
    outputs = {"main": SCHEMA}
    last = ValueSpec(IntCodec(), ttl=StateTtl(TTL_MS))
    touched = ValueSpec(IntCodec(), ttl=StateTtl(TTL_MS, update="on_read_and_write"))
    slots = MapSpec(IntCodec(), IntCodec(), ttl=StateTtl(TTL_MS))
    hist = ListSpec(IntCodec(), ttl=StateTtl(TTL_MS))
    proc = ValueSpec(IntCodec(), ttl=StateTtl(PROC_TTL_MS, time="processing"))
    rec = ValueSpec(REC, ttl=StateTtl(TTL_MS))

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        v = event.value["v"]
        last, touched = self.last.state_for(subject), self.touched.state_for(subject)
        slots, hist = self.slots.state_for(subject), self.hist.state_for(subject)
        proc, rec = self.proc.state_for(subject), self.rec.state_for(subject)
        out = {"k": subject.key.decode(), "v": v, "last": last.get(), "touched": touched.get(),
               "slot": slots.get(v % 2), "n_hist": len(hist.get()), "proc": proc.get(),
               "rec": (rec.get() or {}).get("n")}
        last.set(v)
        if v % 3 == 0:
            touched.set(v)
        slots.set(v % 2, v)
        hist.append(v)
        proc.set(v)
        rec.set({"n": v})
        subject.emit(out)


class TtlProbeBatch(BatchOperator):
    name = TtlProbe.name
    outputs = TtlProbe.outputs
    last, touched, slots, hist, proc, rec = (TtlProbe.last, TtlProbe.touched, TtlProbe.slots, TtlProbe.hist,
                                             TtlProbe.proc, TtlProbe.rec)

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        keys, kgs, vs = events.column("key"), events.column("key_group"), events.column("v")
        last, touched, slots = ctx.state(self.last), ctx.state(self.touched), ctx.state(self.slots)
        hist, proc, rec = ctx.state(self.hist), ctx.state(self.proc), ctx.state(self.rec)
        slot_keys = slots.dkv_keys(keys, kgs, pc.bit_wise_and(vs, 1))  # v % 2, from the Arrow column
        rows = rec.get_columns(keys, kgs)
        out = {"k": [k.decode() for k in keys.to_pylist()], "v": vs, "last": last.get(keys, kgs),
               "touched": touched.get(keys, kgs), "slot": slots.get_at(slot_keys),
               "n_hist": [len(h) for h in hist.get(keys.to_pylist(), kgs.to_pylist())],
               "proc": proc.get(keys, kgs), "rec": pc.struct_field(rows, "n")}
        last.set(keys, kgs, vs.to_pylist())
        third = pa.array([v % 3 == 0 for v in vs.to_pylist()])
        touched.set(keys.filter(third), kgs.filter(third), vs.filter(third).to_pylist())
        slots.set_at(slot_keys, vs.to_pylist())
        hist.append(keys.to_pylist(), kgs.to_pylist(), vs.to_pylist())
        proc.set(keys, kgs, vs.to_pylist())
        rec.set_columns(keys, kgs, {"n": vs})
        ctx.emit(out, keys=keys.to_pylist(), timestamps=events.column("timestamp").to_pylist())


def probe_source(epochs: int, seed: int = 0, bounded: bool = True) -> TableSource:
    """One partition, ``EVENTS_PER_EPOCH`` events per epoch with distinct keys each,
    timestamps rising by 1..9 ms, ``v`` the event's index; ``bounded=False``: a live
    source (its watermark never reaches +infinity)."""
    rng = random.Random(seed)
    keys, stamps, ts = [], [], 0
    for _ in range(epochs):
        keys += rng.sample(KEYS, EVENTS_PER_EPOCH)
        for _ in range(EVENTS_PER_EPOCH):
            ts += rng.randint(1, 9)
            stamps.append(ts)
    table = pa.table({"key": pa.array(keys, pa.binary()), "timestamp": pa.array(stamps, pa.int64()),
                      "v": pa.array(range(len(keys)), pa.int64())})
    return TableSource("probe", {"p0": table}, bounded=bounded)


def probe_model(source: TableSource, epochs: list[tuple[int, int, int]]) -> list[dict]:
    """The rows ``TtlProbe`` emits, replayed with the TTL rules of ``StateTtl``.

    Args:
        source: the input.
        epochs: per committed epoch, (source offset reached, watermark reached,
            processing time ms).
    """
    table = source.tables["p0"].to_pylist()
    state: dict = {}  # (state, key) -> (value, expiry)

    def get(name, key, now, refresh=None):
        v = state.get((name, key))
        if v is None or v[1] <= now:
            return None
        if refresh is not None:
            state[(name, key)] = (v[0], refresh)
        return v[0]

    rows, start, wm = [], 0, WATERMARK_MIN
    for end, wm_after, proc in epochs:
        clock = StateClock(wm, wm_after, proc)
        ev, pt = clock.watermark, clock.processing_time
        exp, pexp = clock.expiry(StateTtl(TTL_MS)), clock.expiry(StateTtl(PROC_TTL_MS, time="processing"))
        for e in table[start:end]:
            k, v = e["key"], e["v"]
            hist = get("hist", k, ev) or []
            rows.append({"k": k.decode(), "v": v, "last": get("last", k, ev), "touched": get("touched", k, ev, exp),
                         "slot": get("slots", (k, v % 2), ev), "n_hist": len(hist), "proc": get("proc", k, pt),
                         "rec": get("rec", k, ev)})
            state[("last", k)] = (v, exp)
            if v % 3 == 0:
                state[("touched", k)] = (v, exp)
            state[("slots", (k, v % 2))] = (v, exp)
            state[("hist", k)] = (hist + [v], exp)
            state[("proc", k)] = (v, pexp)
            state[("rec", k)] = (v, exp)
        start, wm = end, wm_after
    return rows
