"""A tumbling-window count with a late output, in both operator forms, for the tests of
``OperatorTestHarness`` (``tests/operators/test_testing.py``): one job-shaped operator
whose every feature the harness must show as a job would (state of each kind, timers,
late events, a side output)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec, ValueSpec

WINDOW_MS = 10_000
OUTPUT = pa.schema([("key", pa.string()), ("window", pa.int64()), ("events", pa.int64()), ("total", pa.int64())])
LATE = pa.schema([("key", pa.string()), ("timestamp", pa.int64()), ("watermark", pa.int64())])
WINDOW = RecordCodec({"events": pa.int64(), "total": pa.int64()})


class WindowCount(Operator):
    """Per key and 10 s window: events and the sum of ``x``, emitted when the watermark
    passes the window's end; an event of an emitted window goes to ``late``. ``seen``
    counts every on-time event of the key, forever."""

    name = "window_count"
    outputs = {"main": OUTPUT, "late": LATE}
    windows = MapSpec(IntCodec(), WINDOW)  # window start (ms) -> {events, total}
    seen = ValueSpec(IntCodec())

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % WINDOW_MS
        if start + WINDOW_MS <= subject.watermark:
            subject.emit({"key": subject.key.decode(), "timestamp": event.timestamp,
                          "watermark": subject.watermark}, output="late")
            return
        windows = self.windows.state_for(subject)
        old = windows.get(start) or {"events": 0, "total": 0}
        windows.set(start, {"events": old["events"] + 1, "total": old["total"] + event.value["x"]})
        seen = self.seen.state_for(subject)
        seen.set((seen.get() or 0) + 1)
        subject.set_timer(start + WINDOW_MS)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        windows = self.windows.state_for(subject)
        start = timestamp - WINDOW_MS
        w = windows.get(start)
        subject.emit({"key": subject.key.decode(), "window": start, "events": w["events"], "total": w["total"]})
        windows.delete(start)


class WindowCountBatch(BatchOperator):
    """``WindowCount`` in the vectorised form (the same state, timers and rows)."""

    name, outputs, windows, seen = WindowCount.name, WindowCount.outputs, WindowCount.windows, WindowCount.seen

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        ts = events.column("timestamp").to_numpy()
        start = ts - ts % WINDOW_MS
        late = start + WINDOW_MS <= ctx.watermark
        if late.any():
            lt = events.filter(pa.array(late))
            ctx.emit({"key": pc.cast(lt.column("key"), pa.string()), "timestamp": lt.column("timestamp"),
                      "watermark": np.full(lt.num_rows, ctx.watermark, np.int64)}, output="late",
                     keys=lt.column("key").to_pylist(), timestamps=lt.column("timestamp").to_pylist())
        on_time = pa.table({"key": events.column("key"), "kg": events.column("key_group"),
                            "start": start, "x": events.column("x")}).filter(pa.array(~late))
        g = on_time.group_by(["key", "kg", "start"]).aggregate([("x", "count"), ("x", "sum")])
        keys, kgs, starts = (g.column(c).to_pylist() for c in ("key", "kg", "start"))
        windows = ctx.state(self.windows)
        old = windows.get(keys, kgs, starts)
        windows.set(keys, kgs, starts, [
            {"events": (o or {}).get("events", 0) + n, "total": (o or {}).get("total", 0) + s}
            for o, n, s in zip(old, g.column("x_count").to_pylist(), g.column("x_sum").to_pylist())])
        per_key = on_time.group_by(["key", "kg"]).aggregate([("x", "count")])
        k, kg = per_key.column("key").to_pylist(), per_key.column("kg").to_pylist()
        seen = ctx.state(self.seen)
        seen.set(k, kg, [(o or 0) + n for o, n in zip(seen.get(k, kg), per_key.column("x_count").to_pylist())])
        ctx.set_timers(keys, kgs, [s + WINDOW_MS for s in starts])

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs, ts = (timers.column(c).to_pylist() for c in ("key", "key_group", "timestamp"))
        starts = [t - WINDOW_MS for t in ts]
        windows = ctx.state(self.windows)
        got = windows.get(keys, kgs, starts)
        ctx.emit({"key": [k.decode() for k in keys], "window": starts, "events": [w["events"] for w in got],
                  "total": [w["total"] for w in got]}, keys=keys, timestamps=ts)
        windows.delete(keys, kgs, starts)


TIMER_LOG = pa.schema([("key", pa.string()), ("at", pa.int64())])


class TimerLog(Operator):
    """Sets a timer at each event's ``at`` and emits ``(key, at)`` when it fires; a timer
    at an odd time sets another 1 ms later (due in the same advance if the watermark
    covers it). Raises on an event whose ``at`` is negative."""

    name = "timer_log"
    outputs = {"main": TIMER_LOG}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        if event.value["at"] < 0:
            raise ValueError(f"negative time {event.value['at']}")
        subject.set_timer(event.value["at"])

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        subject.emit({"key": subject.key.decode(), "at": timestamp})
        if timestamp % 2:
            subject.set_timer(timestamp + 1)


class TimerLogBatch(BatchOperator):
    """``TimerLog`` in the vectorised form."""

    name, outputs = TimerLog.name, TimerLog.outputs

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        at = events.column("at").to_pylist()
        if min(at) < 0:
            raise ValueError(f"negative time {min(at)}")
        ctx.set_timers(events.column("key").to_pylist(), events.column("key_group").to_pylist(), at)

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs, ts = (timers.column(c).to_pylist() for c in ("key", "key_group", "timestamp"))
        ctx.emit({"key": [k.decode() for k in keys], "at": ts}, keys=keys, timestamps=ts)
        odd = [i for i, t in enumerate(ts) if t % 2]
        ctx.set_timers([keys[i] for i in odd], [kgs[i] for i in odd], [ts[i] + 1 for i in odd])


class RekeyByParity(Operator):
    """Forwards each event's ``x`` under the key ``even`` or ``odd``, one second later
    (an intermediate operator of a chain: re-keys and re-times what it emits)."""

    name = "rekey_by_parity"
    outputs = {"main": pa.schema([("x", pa.int64()), ("from_key", pa.string())])}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        x = event.value["x"]
        subject.emit({"x": x, "from_key": subject.key.decode()}, key=b"odd" if x % 2 else b"even",
                     timestamp=event.timestamp + 1_000)
