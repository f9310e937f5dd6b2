"""``OperatorTestHarness`` against the runtime itself: fed a job's epochs (the events
each epoch read and the watermark it reached), the harness gives the job's output, late
output, state and pending timers, in both operator forms; timers fire in order; errors
are the job's; a restart or rescale changes nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.keygroups import key_group_of
from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN, Operator
from dkvstream.operators.api.state import StateTtl, ValueSpec
from dkvstream.operators.errors import InvalidJobError, OperatorError
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.testing import OperatorTestHarness
from dkvstream.operators.tools.state_reader import list_timers, read_state
from tests.operators.harness_operators import (
    LATE,
    OUTPUT,
    WINDOW_MS,
    RekeyByParity,
    TimerLog,
    TimerLogBatch,
    WindowCount,
    WindowCountBatch,
)
from tests.operators.processing_time import DELAY_MS, EVERY, Timeout, TimeoutBatch
from tests.operators.table_sources import TableSource

FORMS = pytest.mark.parametrize("form", [WindowCount, WindowCountBatch], ids=["on_event", "batch"])
BOUND_MS = 5_000
T0 = 1_700_000_000_000  # 2023-11-14 UTC: a job dead-letters events before 1970


def _events(n: int = 400, seed: int = 7) -> pa.Table:
    """``n`` events of 8 keys, a second apart, each up to 20 s early: with a 5 s bound,
    some are late."""
    rng = np.random.default_rng(seed)
    ts = T0 + np.arange(n, dtype=np.int64) * 1_000 - rng.integers(0, 20_000, n)
    return pa.table({"key": pa.array([f"k{i}".encode() for i in rng.integers(0, 8, n)], pa.binary()),
                     "timestamp": pa.array(ts, pa.int64()), "x": pa.array(rng.integers(0, 100, n), pa.int64())})


def _job(operator: Operator, events: pa.Table) -> Job:
    return Job(name="wc", source=TableSource("in", {"p0": events}), operators=[operator],
               sinks={"main": ParquetSink("wc_main", OUTPUT), "late": ParquetSink("wc_late", LATE)},
               events_per_epoch=50, max_out_of_orderness_ms=BOUND_MS, parallelism=2)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


def _feed(harness: OperatorTestHarness, events: pa.Table, results: list, start: int = 0) -> int:
    """The job's epochs into the harness: each epoch's events (by its source offsets)
    and the watermark it reached. Returns the offset reached."""
    for r in results:
        end = r.source_offsets["p0"]
        harness.process_events(events.slice(start, end - start), watermark=r.watermark)
        start = end
    return start


def _harness_state(h: OperatorTestHarness) -> tuple[dict, dict, list]:
    windows = {(k, start): w for k in h.state_keys("windows") for start, w in h.state(k, "windows").items()}
    seen = {k: h.state(k, "seen") for k in h.state_keys("seen")}
    return windows, seen, h.timers()


def _job_state(runner: JobRunner) -> tuple[dict, dict, list]:
    job, store = runner.job, runner.store
    w = read_state(store, job, "windows").to_pylist()
    s = read_state(store, job, "seen").to_pylist()
    t = list_timers(store, job)
    timers = sorted(zip(t.column("timestamp").cast(pa.int64()).to_pylist(), t.column("key_group").to_pylist(),
                        t.column("subject_key").to_pylist()))
    return ({(r["subject_key"], r["map_key"]): r["value"] for r in w}, {r["subject_key"]: r["value"] for r in s},
            [(ts, k) for ts, _, k in timers])


@FORMS
def test_harness_equals_a_job_run_epoch_by_epoch(form, tmp_path) -> None:
    """The oracle is the runtime: the same operator in a job (in process, two ranges);
    state and timers after four epochs, then all output, late output included."""
    events = _events()
    store = str(tmp_path / "store")
    first = JobRunner(_job(form(), events), None, store)
    head = first.run(max_epochs=4)
    harness = OperatorTestHarness(form(), parallelism=2)
    offset = _feed(harness, events, head)
    windows, seen, timers = _job_state(first)
    first.close()
    assert (windows, seen, timers) == _harness_state(harness)
    assert windows and timers  # windows are open at epoch 4

    runner = JobRunner(_job(form(), events), None, store)
    tail = runner.run()
    assert tail[-1].watermark == WATERMARK_MAX
    _feed(harness, events, tail, offset)
    job, st = runner.job, runner.store
    late = job.sinks["late"].read(st, job.prefix).select(LATE.names)
    main = job.sinks["main"].read(st, job.prefix).select(OUTPUT.names)
    assert late.num_rows > 0, "the input must have late events"
    assert _rows(harness.output_table("late")) == _rows(late)
    assert _rows(harness.output_table()) == _rows(main)
    assert sorted(tuple(r.values()) for r in harness.output()) == _rows(main)
    assert harness.timers() == [] and harness.state_keys("windows") == []
    assert harness.state_keys() == sorted({k for k in events.column("key").to_pylist()})
    runner.close()


@FORMS
def test_a_late_event_goes_to_the_late_output(form) -> None:
    h = OperatorTestHarness(form())
    h.process_events([{"key": "a", "timestamp": 12_000, "x": 1}, {"key": "a", "timestamp": 15_000, "x": 2}])
    assert h.output() == [] and h.timers("a") == [20_000]
    assert h.state("a", "windows") == {10_000: {"events": 2, "total": 3}}
    h.advance_watermark(20_000)
    assert h.output() == [{"key": "a", "window": 10_000, "events": 2, "total": 3}]
    h.process_event("a", 19_999, {"x": 5})  # its window was emitted: late
    h.process_event(b"a", 20_000, {"x": 7})  # the next window: on time
    assert h.output("late") == [{"key": "a", "timestamp": 19_999, "watermark": 20_000}]
    assert h.state("a", "windows") == {20_000: {"events": 1, "total": 7}}
    assert h.state("a", "seen") == 3 and h.state("b", "seen") is None and h.state("b", "windows") == {}
    h.clear_output()
    h.process_events([], watermark=25_000)  # no events: as advance_watermark
    assert h.output() == [] and h.watermark == 25_000 and h.timers("a") == [30_000]
    h.finish()
    assert h.output() == [{"key": "a", "window": 20_000, "events": 1, "total": 7}] and h.output("late") == []
    assert h.watermark == WATERMARK_MAX


@pytest.mark.parametrize("form", [TimerLog, TimerLogBatch], ids=["on_event", "batch"])
def test_timers_fire_in_order(form) -> None:
    """In (timestamp, key group, key) order; a timer set while firing that the watermark
    covers fires in the same advance (on_event: in its place; batch: in a following
    on_timers call, itself in order)."""
    rng = np.random.default_rng(3)
    keys = [f"k{i}" for i in range(30)]
    at = rng.integers(0, 1_000, 300)
    h = OperatorTestHarness(form(), key_groups=16)
    h.process_events([{"key": keys[i % 30], "timestamp": 0, "at": int(a)} for i, a in enumerate(at)])
    timers = {(int(a), keys[i % 30]) for i, a in enumerate(at)}
    order = lambda ts, k: (ts, key_group_of(k.encode(), 16), k)  # noqa: E731
    assert h.timers() == [(ts, k.encode()) for ts, k in sorted(timers, key=lambda t: order(*t))]
    h.advance_watermark(500)
    fired = [(r["at"], r["key"]) for r in h.output()]
    due = sorted((t for t in timers if t[0] <= 500), key=lambda t: order(*t))
    chained = sorted(((ts + 1, k) for ts, k in due if ts % 2 and ts + 1 <= 500), key=lambda t: order(*t))
    if form is TimerLog:
        assert fired == sorted(due + chained, key=lambda t: order(*t))
    else:
        assert fired == due + chained
    pending = {t for t in timers if t[0] > 500} | {(ts + 1, k) for ts, k in due if ts % 2 and ts + 1 > 500}
    assert h.timers() == [(ts, k.encode()) for ts, k in sorted(pending, key=lambda t: order(*t))]
    assert h.timers("k1") == sorted(ts for ts, k in pending if k == "k1")


@FORMS
def test_restart_and_rescale_change_nothing(form) -> None:
    """Steps with a restart and two rescales in between give the uninterrupted run's
    output, state and timers; the restarted operator is a new unpickled copy."""
    events = _events(200)
    steps = [(events.slice(i, 25), T0 + i * 1_000 - BOUND_MS) for i in range(0, 200, 25)]
    plain, moved = OperatorTestHarness(form(), parallelism=2), OperatorTestHarness(form(), parallelism=2)
    original = moved.operator
    for i, (batch, watermark) in enumerate(steps):
        for h in (plain, moved):
            h.process_events(batch, watermark=max(watermark, h.watermark))
        if i == 2:
            moved.operator.scratch = "kept on self"
            moved.restart(parallelism=3)
            assert moved.parallelism == 3 and moved.operator is not original
            assert not hasattr(moved.operator, "scratch")
            assert _harness_state(moved) == _harness_state(plain)
        if i == 4:
            moved.restart()
        if i == 5:
            moved.restart(parallelism=1)
    assert _harness_state(moved) == _harness_state(plain)
    for h in (plain, moved):
        h.finish()
    for name in ("main", "late"):
        assert _rows(moved.output_table(name)) == _rows(plain.output_table(name))


@pytest.mark.parametrize("form", [TimerLog, TimerLogBatch], ids=["on_event", "batch"])
def test_an_operator_error_fails_the_step_and_keeps_nothing(form) -> None:
    h = OperatorTestHarness(form())
    h.process_events([{"key": "a", "timestamp": 0, "at": 4}], watermark=1)
    with pytest.raises(OperatorError, match=r"key b'b' \(source harness partition harness offset 2"):
        h.process_events([{"key": "a", "timestamp": 3, "at": 8}, {"key": "b", "timestamp": 4, "at": -1}],
                         watermark=10)
    assert h.watermark == 1 and h.epoch == 1 and h.timers() == [(4, b"a")] and h.output() == []
    h.advance_watermark(10)  # the failed step's timer at 8 was never set
    assert h.output() == [{"key": "a", "at": 4}]


@pytest.mark.parametrize("form", [TimerLog, TimerLogBatch], ids=["on_event", "batch"])
def test_dead_letter_policy_sets_the_event_aside(form) -> None:
    h = OperatorTestHarness(form(), on_operator_error="dead_letter")
    h.process_events([{"key": "a", "timestamp": 0, "at": 4}, {"key": "b", "timestamp": 1, "at": -1}], watermark=10)
    assert h.output() == [{"key": "a", "at": 4}]
    dead = h.dead_letters().to_pylist()
    assert [(d["source"], d["partition"], d["offset"], d["key"]) for d in dead] == [("harness", "harness", 1, b"b")]
    assert "negative time -1" in dead[0]["error"]


def test_wrong_use_is_named() -> None:
    h = OperatorTestHarness(WindowCount())
    h.advance_watermark(100)
    with pytest.raises(ValueError, match="only advances: it is at 100, asked for 99"):
        h.advance_watermark(99)
    with pytest.raises(KeyError, match="no state 'window'.*'seen', 'windows'"):
        h.state("a", "window")
    with pytest.raises(KeyError, match="no output 'lat'"):
        h.output("lat")
    with pytest.raises(ValueError, match="event 1 .* has no timestamp"):
        h.process_events([{"key": "a", "timestamp": 1, "x": 1}, {"key": "a", "x": 2}])
    with pytest.raises(InvalidJobError, match="is a class, not an instance"):
        OperatorTestHarness(WindowCount)
    unpicklable = WindowCount()
    unpicklable.log = open(__file__)  # noqa: SIM115 - the point is an open file on the operator
    try:
        with pytest.raises(TypeError, match="does not pickle"):
            OperatorTestHarness(unpicklable)
    finally:
        unpicklable.log.close()
    assert h.watermark == 100 and h.epoch == 1 and WATERMARK_MIN < h.watermark


def test_the_harness_needs_no_spark() -> None:
    """A unit test of an operator starts in a second, not in Spark's 10-40 s."""
    code = ("import sys; from dkvstream.operators.testing import OperatorTestHarness; "
            "print(sorted(m for m in ('pyspark', 'py4j', 'dagster') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def _window_model(steps: list[tuple[list[dict], int]]) -> tuple[list, list, dict]:
    """``WindowCount`` by hand: ``(main rows, late rows, open windows)`` after the steps,
    each ``(events, watermark after)``; the rows as sorted tuples."""
    watermark, windows, main, late = WATERMARK_MIN, {}, [], []
    for events, after in steps:
        for e in events:
            start = e["timestamp"] - e["timestamp"] % WINDOW_MS
            if start + WINDOW_MS <= watermark:
                late.append((e["key"], e["timestamp"], watermark))
                continue
            n, total = windows.get((e["key"], start), (0, 0))
            windows[(e["key"], start)] = (n + 1, total + e["x"])
        watermark = after
        for key, start in [w for w in windows if w[1] + WINDOW_MS <= watermark]:
            main.append((key, start, *windows.pop((key, start))))
    return sorted(main), sorted(late), windows


@given(steps=st.lists(st.tuples(
    st.lists(st.fixed_dictionaries({"key": st.sampled_from("abcd"), "timestamp": st.integers(0, 60_000),
                                    "x": st.integers(-5, 5)}), max_size=8),
    st.integers(0, 15_000), st.sampled_from([None, None, None, 1, 2, 3])), min_size=1, max_size=8),
    batch=st.booleans(), parallelism=st.sampled_from([1, 2, 3]))
@settings(max_examples=30, deadline=None)
def test_any_steps_restarts_and_rescales_match_a_model(steps, batch, parallelism) -> None:
    """Random events, watermark advances, restarts and rescales (the third element of a
    step: restart after it with that parallelism) against ``_window_model``."""
    h = OperatorTestHarness(WindowCountBatch() if batch else WindowCount(), key_groups=8, parallelism=parallelism)
    fed, watermark = [], 0
    for events, advance, restart in steps:
        watermark += advance
        h.process_events(events, watermark=watermark)
        fed.append((events, watermark))
        if restart is not None:
            h.restart(parallelism=restart)
    main, late, windows = _window_model(fed)
    assert sorted((r["key"], r["window"], r["events"], r["total"]) for r in h.output()) == main
    assert sorted(tuple(r.values()) for r in h.output("late")) == late
    got = {(k.decode(), start): (w["events"], w["total"]) for k in h.state_keys("windows")
           for start, w in h.state(k, "windows").items()}
    assert got == windows
    assert sorted(h.timers()) == sorted((start + WINDOW_MS, k.encode()) for k, start in windows)


@FORMS
def test_harness_equals_a_job_on_spark(form, spark, tmp_path) -> None:
    """The job on Spark ``local[2]`` (its tasks in Spark's Python workers) and the harness
    in process give the same output and late output."""
    events = _events()
    runner = JobRunner(_job(form(), events), spark, str(tmp_path / "store"))
    results = runner.run()
    harness = OperatorTestHarness(form(), parallelism=2)
    _feed(harness, events, results)
    job, store = runner.job, runner.store
    assert _rows(harness.output_table()) == _rows(job.sinks["main"].read(store, job.prefix).select(OUTPUT.names))
    late = job.sinks["late"].read(store, job.prefix).select(LATE.names)
    assert late.num_rows and _rows(harness.output_table("late")) == _rows(late)
    runner.close()


def test_output_events_are_what_a_next_operator_receives(tmp_path) -> None:
    """An operator with only a main output: its rows with the emitted key and time, equal
    to the events a chain's next operator gets (the oracle: a two-operator job whose second
    operator, ``WindowCount``, counts them)."""
    events = _events(120)
    h = OperatorTestHarness(RekeyByParity())
    h.process_events(events)
    got = h.output_events()
    assert [(e.key, e.timestamp, e.value["x"]) for e in got] == sorted(
        ((b"odd" if x % 2 else b"even", ts + 1_000, x) for ts, x in
         zip(events.column("timestamp").to_pylist(), events.column("x").to_pylist())), key=lambda e: e[1])
    assert [e.value for e in got] == h.output()
    second = OperatorTestHarness(WindowCount())
    second.process_events(got)
    second.finish()
    job = Job(name="chain", source=TableSource("in", {"p0": events}), operators=[RekeyByParity(), WindowCount()],
              sinks={"main": ParquetSink("c_main", OUTPUT), "late": ParquetSink("c_late", LATE)})
    with JobRunner(job, None, str(tmp_path / "store")) as runner:
        runner.run()
        assert _rows(second.output_table()) == _rows(job.sinks["main"].read(runner.store, job.prefix)
                                                     .select(OUTPUT.names))
    with pytest.raises(ValueError, match="only an operator whose one output is 'main'"):
        OperatorTestHarness(WindowCount()).output_events()


@pytest.mark.parametrize("operator", [Timeout(), TimeoutBatch()], ids=["on_event", "batch"])
def test_processing_time_timers_fire_as_the_model_says(operator) -> None:
    """Processing-time timers in the harness, against a plain-Python model of the
    ``Timeout`` operator (a key's first event, and every fifth, sets its timer
    ``DELAY_MS`` after the step's processing time; a due timer emits the key's count):
    they fire once, when ``advance_processing_time`` reaches them, deleted ones never,
    across a restart and a rescale, and time never goes back."""
    h = OperatorTestHarness(operator, key_groups=16, parallelism=2)
    counts: dict[str, int] = {}
    due: dict[str, int] = {}
    want: list[tuple] = []
    now = 0
    steps = [("events", ["a", "b", "a"]), ("time", 5_000), ("events", ["a", "a", "c"]), ("time", 10_000),
             ("restart", 3), ("events", ["b"] * 6), ("time", 15_000), ("time", 40_000), ("events", ["d"]),
             ("restart", 1), ("time", 50_000)]
    for kind, arg in steps:
        if kind == "events":
            h.process_events([{"key": k, "timestamp": 1_000 + i} for i, k in enumerate(arg)])
            for k in arg:
                counts[k] = counts.get(k, 0) + 1
                if k not in due or counts[k] % EVERY == 0:
                    due[k] = now + DELAY_MS
        elif kind == "time":
            now = arg
            h.advance_processing_time(now)
            for k, t in sorted(due.items(), key=lambda kv: (kv[1], kv[0])):
                if t <= now:
                    want.append((k, counts[k], t, now, "processing_time"))
                    del due[k]
        else:
            h.restart(parallelism=arg)
        assert sorted(h.timers(domain="processing_time")) == sorted((t, k.encode()) for k, t in due.items())
        assert h.timers() == [], "no event-time timer was set"
    got = [(r["key"], r["count"], r["due"], r["fired_at"], r["domain"]) for r in h.output()]
    assert sorted(got) == sorted(want) and len(want) == 5, (got, want)
    assert h.processing_time == 50_000
    with pytest.raises(ValueError, match="only advances"):
        h.advance_processing_time(49_999)


class KeepLast(Operator):
    """Emits the last timestamp seen for the key (None if none or expired), then keeps
    the event's: a ``ValueSpec`` with a one-hour event-time TTL."""

    name = "keep_last"
    outputs = {"main": pa.schema([("key", pa.string()), ("seen", pa.int64())])}
    last = ValueSpec(IntCodec(), ttl=StateTtl(3_600_000))

    def on_event(self, subject, event) -> None:
        state = self.last.state_for(subject)
        subject.emit({"key": subject.key.decode(), "seen": state.get()})
        state.set(event.timestamp)


def test_event_time_ttl_counts_from_the_input_before_a_watermark_and_reads_in_the_harness() -> None:
    """Event-time TTL by hand (the oracle: an entry written in an epoch expires once the
    watermark reaches that epoch's watermark + TTL, or, before the job has a watermark,
    the epoch's newest event time + TTL): an entry written before the first watermark
    does not vanish at it; the harness's ``state`` and ``state_keys`` read TTL'd state as
    the next step would, and reading changes nothing."""
    hour = 3_600_000
    h = OperatorTestHarness(KeepLast())
    h.process_event("a", 1_000_000)                        # no watermark: expiry 1_000_000 + 1 h
    h.process_event("b", 1_000_010, watermark=1_000_000)   # expiry 1_000_000 + 1 h
    h.process_event("a", 1_000_020)                        # reads a's entry of the first step
    assert [(r["key"], r["seen"]) for r in h.output()] == [("a", None), ("b", None), ("a", 1_000_000)]
    assert h.state_keys() == [b"a", b"b"] and h.state("b", "last") == 1_000_010
    h.advance_watermark(1_000_000 + hour - 1)
    assert h.state("a", "last") == 1_000_020 and h.state_keys("last") == [b"a", b"b"]
    h.advance_watermark(1_000_000 + hour)                  # both expiries reached
    assert h.state("a", "last") is None and h.state("b", "last") is None
    assert h.state_keys() == []
    h.process_event("a", 5_000_000)
    assert h.output()[-1] == {"key": "a", "seen": None}
