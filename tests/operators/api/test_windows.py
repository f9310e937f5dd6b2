"""Windows (dkvstream.operators.api.windows) against a replay model with pandas aggregates.

The model replays the job's epochs (their end offsets and watermarks, from the runner's
``EpochResult``s) event by event with plain dicts: window assignment, session merging,
late events, allowed lateness, early, on-time and late firings. Each fired window's
aggregates are then computed by pandas over the events the model put in it.
"""
from __future__ import annotations

import tempfile

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import WATERMARK_MIN, KeyedEvent, Operator, Subject
from dkvstream.operators.api.windows import (
    AggregateFunction,
    Count,
    First,
    Last,
    Max,
    Mean,
    Min,
    SessionWindows,
    SlidingWindows,
    Sum,
    TumblingWindows,
    window_operator,
)
from dkvstream.operators.errors import JobFailedError
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import read_state
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at
from tests.operators.table_sources import TableSource

BOUND_MS = 1_000


def _events(n: int = 1_500, keys: int = 4, seed: int = 7) -> pa.Table:
    """One partition: timestamps rising with +-1.5 s of disorder, every 25th event 15 s
    late (late for many windows), a float with nulls and NaN, a string."""
    rng = np.random.default_rng(seed)
    ts = 100_000 + np.arange(n, dtype=np.int64) * 60 + rng.integers(-1_500, 1_500, n)
    ts[::25] -= 15_000
    x = rng.normal(size=n).round(3)
    x[::13] = np.nan
    xs = pa.array(x, mask=np.arange(n) % 11 == 0)
    return pa.table({"key": pa.array([f"k{i}".encode() for i in rng.integers(0, keys, n)], pa.binary()),
                     "timestamp": pa.array(ts), "x": xs, "s": pa.array([f"s{i}" for i in range(n)])})


AGGREGATES = {"n": Count(), "nx": Count("x"), "sx": Sum("x"), "lo": Min("x"), "hi": Max("x"), "mean": Mean("x"),
              "first": First("s", pa.string()), "last": Last("s", pa.string()),
              "big": Sum(pc.greater(pc.field("x"), 0.5), pa.int64())}


def _job(windows, name: str, form: str = "batch", lateness: int = 0, early: int | None = None,
         aggregates: dict | None = None, table: pa.Table | None = None, parallelism: int = 2,
         bounded: bool = True, early_ms: int | None = None) -> Job:
    op = window_operator("w", windows, aggregates or AGGREGATES, allowed_lateness_ms=lateness, early_every=early,
                         early_every_ms=early_ms, late_output="late", late_columns={"s": pa.string()}, form=form)
    return Job(name=name, source=TableSource("t", {"p": table if table is not None else _events()}, bounded),
               operators=[op], sinks={"main": ParquetSink("windows", op.outputs["main"]),
                                      "late": ParquetSink("late", op.outputs["late"])},
               key_groups=16, parallelism=parallelism, events_per_epoch=150, max_out_of_orderness_ms=BOUND_MS)


def _run(job: Job, store: str, max_epochs: int | None = None, parallelism: int | None = None, spark=None,
         clock=None):
    if parallelism:
        job.parallelism = parallelism
    # With a (fake) clock, every checkpoint is kept: each records its epoch's processing time.
    kept = {"clock": clock, "retain_checkpoints": None} if clock else {}
    with JobRunner(job, spark, store, **kept) as runner:
        results = runner.run(max_epochs=max_epochs)
        for r in results if clock else ():
            r.processing_time_ms = read_checkpoint(runner.store, job.prefix, r.epoch).processing_time_ms
        main = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
        late = job.sinks["late"].read(runner.store, job.prefix).to_pandas()
    return results, main, late


def _model(events: pd.DataFrame, epochs: list[tuple], windows, lateness: int,
           early: int | None, open_windows: set | None = None, keep=None,
           early_ms: int | None = None) -> tuple[list[tuple], list[int]]:
    """Fired windows as (firing, key, start, end, event rows) and the late event rows;
    ``epochs``: (end offset, watermark[, processing time]) per epoch; ``open_windows``
    receives the (key, start, end) the state holds after the epochs; ``keep``: a mask of
    the events the operator passes to the windows (None: all); ``early_ms``: the
    processing-time trigger's interval (Flink's ``ContinuousProcessingTimeTrigger``)."""
    gap = getattr(windows, "gap_ms", None)
    state: dict[bytes, dict[int, list]] = {}  # key -> {start: [end, rows, fresh]}
    # early_ms: key -> [timer (ms) or None, max end of its updated windows, starts updated since a firing]
    ticking: dict[bytes, list] = {}
    fired, late = [], []
    wm, lo = WATERMARK_MIN, 0
    for end_offset, new_wm, *pt in epochs:
        for i in range(lo, end_offset):
            if keep is not None and not keep[i]:
                continue
            key, ts = events.key[i], int(events.timestamp[i])
            windows_of = state.setdefault(key, {})
            if gap is not None:
                if ts + gap - 1 + lateness <= wm:
                    late.append(i)
                    continue
                start, end, rows, fresh = ts, ts + gap, [i], 1
                merged = True
                while merged:
                    merged = False
                    for s2, (e2, rows2, f2) in list(windows_of.items()):
                        if s2 <= end and e2 >= start:
                            start, end, rows, fresh = min(start, s2), max(end, e2), rows2 + rows, fresh + f2
                            del windows_of[s2]
                            merged = True
                windows_of[start] = [end, rows, fresh]
                continue
            size, slide = windows.size_ms, windows.slide_ms
            start = ts - ts % slide
            kept = False
            while start + size > ts:
                if start + size - 1 + lateness > wm:
                    w = windows_of.setdefault(start, [start + size, [], 0])
                    w[1].append(i)
                    w[2] += 1
                    kept = True
                start -= slide
            if not kept:
                late.append(i)
        lo = end_offset
        for key, windows_of in state.items():
            for start, w in windows_of.items():
                end, rows, fresh = w
                if fresh and end - 1 <= wm:
                    fired.append(("late", key, start, end, tuple(rows)))
                elif fresh and early and (len(rows) - fresh) // early != len(rows) // early:
                    fired.append(("early", key, start, end, tuple(rows)))
                if fresh and early_ms and end - 1 > wm:
                    t = ticking.setdefault(key, [None, end, set()])
                    if t[0] is None:
                        t[0] = pt[0] - pt[0] % early_ms + early_ms
                    t[1], t[2] = max(t[1], end), t[2] | {start}
                w[2] = 0
        for key, windows_of in state.items():
            for start in list(windows_of):
                end, rows, _ = windows_of[start]
                if wm < end - 1 <= new_wm:
                    fired.append(("on_time", key, start, end, tuple(rows)))
                if end - 1 + lateness <= new_wm:
                    del windows_of[start]
        for key, t in ticking.items():  # processing-time timers, after the event-time ones
            if t[0] is None or t[0] > pt[0]:
                continue
            for start, (end, rows, _) in sorted(state[key].items()):
                if end - 1 > new_wm and any(start <= s < end for s in t[2]) \
                        and (gap is not None or start in t[2]):
                    fired.append(("early", key, start, end, tuple(rows)))
            t[0] = pt[0] - pt[0] % early_ms + early_ms if t[1] - 1 > new_wm else None
            t[2] = set()
        wm = new_wm
    if open_windows is not None:
        open_windows.update((k, s, w[0]) for k, ws in state.items() for s, w in ws.items())
    return fired, late


def _expected(events: pd.DataFrame, fired: list[tuple], with_firing: bool) -> pd.DataFrame:
    out = []
    for firing, key, start, end, rows in fired:
        w = events.iloc[sorted(rows)]  # ties in event time: the earlier offset first
        x = w.x.astype(float)
        by_ts = w.sort_values("timestamp", kind="stable")
        row = {"key": key.decode(), "window_start": start, "window_end": end, "n": len(w),
               "nx": int(w.x.notna().sum()), "sx": x.sum(min_count=1), "lo": x.min(), "hi": x.max(),
               "mean": x.mean(), "first": by_ts.s.iloc[0], "last": by_ts.s.iloc[-1],
               "big": int((x > 0.5).sum()) if w.x_valid.any() else None}
        if "bucket" in w.columns:
            row = {**{k: row[k] for k in ("key", "window_start", "window_end", "n")}, "buckets": w.bucket.nunique()}
        if with_firing:
            row["firing"] = firing
        out.append(row)
    return pd.DataFrame(out)


def _check(main: pd.DataFrame, late: pd.DataFrame, results, events_table: pa.Table, windows, lateness=0,
           early=None, keep=None, early_ms=None) -> None:
    events = events_table.to_pandas()
    events["x_valid"] = events_table.column("x").is_valid().to_numpy(zero_copy_only=False)  # null, not NaN
    epochs = [(r.source_offsets["p"], r.watermark, getattr(r, "processing_time_ms", None)) for r in results]
    fired, late_rows = _model(events, epochs, windows, lateness, early, keep=keep, early_ms=early_ms)
    exp = _expected(events, fired, "firing" in main.columns)
    got = main.copy()
    for c in ("window_start", "window_end"):
        got[c] = got[c].astype("datetime64[ms, UTC]").astype("int64")
    order = ["key", "window_start", "window_end", "n"] + (["firing"] if "firing" in got.columns else [])
    got = got.sort_values(order).reset_index(drop=True)
    exp = exp.sort_values(order).reset_index(drop=True)
    assert len(got) == len(exp), (len(got), len(exp))
    for c in exp.columns:
        g, e = got[c], exp[c]
        if e.dtype.kind == "f":
            assert np.allclose(g.astype(float), e.astype(float), equal_nan=True, rtol=1e-9), c
        else:
            assert [None if pd.isna(v) else v for v in g] == [None if pd.isna(v) else v for v in e], c
    assert sorted(late.s) == sorted(events.s.iloc[late_rows]), "late output"


KINDS = [TumblingWindows(10_000), SlidingWindows(10_000, 2_500), SessionWindows(500)]


@pytest.mark.parametrize("windows", KINDS, ids=repr)
@pytest.mark.parametrize("form", ["batch", "event"])
def test_windows_equal_model_with_late_events(tmp_path, windows, form) -> None:
    table = _events(900) if form == "event" else _events()
    results, main, late = _run(_job(windows, "w", form, table=table), str(tmp_path))
    assert len(late) > 0 and "firing" not in main.columns  # late events exist; one firing per window
    _check(main, late, results, table, windows)


@pytest.mark.parametrize("windows", KINDS, ids=repr)
def test_windows_on_a_live_source_equal_model(tmp_path, windows) -> None:
    # The watermark never reaches +infinity: only the windows it closed are emitted.
    results, main, late = _run(_job(windows, "w", lateness=2_000, bounded=False), str(tmp_path))
    assert results[-1].watermark < 10**12 and len(main) > 0
    _check(main, late, results, _events(), windows, lateness=2_000)


@pytest.mark.parametrize("windows", KINDS, ids=repr)
def test_allowed_lateness_and_early_firings_equal_model(tmp_path, windows) -> None:
    job = _job(windows, "w", lateness=3_000, early=40)
    first, _, _ = _run(job, str(tmp_path), max_epochs=6)
    # The state holds the windows the model keeps (fired but within lateness, or open), no more.
    expected: set = set()
    _model(_events().to_pandas(), [(r.source_offsets["p"], r.watermark) for r in first], windows, 3_000, 40,
           expected)
    if isinstance(windows, SessionWindows):  # a key's sessions: one list of [start, end, ...]
        stored = read_state(open_object_store(str(tmp_path)), job, "sessions").to_pylist()
        held = {(e["subject_key"], row[0], row[1]) for e in stored for row in msgpack.unpackb(e["value"])}
    else:
        stored = read_state(open_object_store(str(tmp_path)), job, "windows").to_pylist()
        held = {(e["subject_key"], e["value"]["start"], e["value"]["end"]) for e in stored}
    assert held == expected
    rest, main, late = _run(_job(windows, "w", lateness=3_000, early=40), str(tmp_path))
    results = first + rest
    assert set(main.firing) == {"early", "on_time", "late"}
    _check(main, late, results, _events(), windows, lateness=3_000, early=40)


@pytest.mark.parametrize("windows", [KINDS[1], KINDS[2]], ids=repr)
def test_windows_across_crash_restart_and_rescale_equal_model(tmp_path, windows) -> None:
    first = []
    # The driver dies after epoch 4's tasks wrote their state, before its commit.
    with crash_at("after_tasks", 4), pytest.raises(Crash), \
            JobRunner(_job(windows, "w", lateness=2_000, parallelism=2), None, str(tmp_path)) as runner:
        first.extend(runner.epochs())
    assert [r.epoch for r in first] == [1, 2, 3]
    rest, main, late = _run(_job(windows, "w", lateness=2_000), str(tmp_path), parallelism=3)
    assert rest[0].epoch == 4
    _check(main, late, first + rest, _events(), windows, lateness=2_000)


def test_windows_on_spark_equal_model(spark, tmp_path) -> None:
    # The operator travels to Spark's tasks pickled (rebuilt from its configuration).
    windows = SessionWindows(500)
    results, main, late = _run(_job(windows, "w", lateness=2_000, early=40), str(tmp_path), spark=spark)
    _check(main, late, results, _events(), windows, lateness=2_000, early=40)
    table, windows = _events(600), KINDS[1]
    results, main, late = _run(_job(windows, "e", "event", table=table), str(tmp_path / "event"), spark=spark)
    _check(main, late, results, table, windows)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["tumbling", "sliding", "session"]), size=st.integers(200, 3_000),
       lateness=st.sampled_from([0, 700]), epoch=st.integers(20, 400), seed=st.integers(0, 1_000))
def test_windows_equal_model_for_any_sizes_and_epochs(kind, size, lateness, epoch, seed) -> None:
    windows = {"tumbling": TumblingWindows(size), "sliding": SlidingWindows(size, max(1, size // 3)),
               "session": SessionWindows(size // 4)}[kind]
    table = _events(400, keys=3, seed=seed)
    job = _job(windows, "h", lateness=lateness, table=table)
    job.events_per_epoch = epoch
    with tempfile.TemporaryDirectory() as store:
        results, main, late = _run(job, store)
    _check(main, late, results, table, windows, lateness=lateness)


WINDOWS_OF_OWN_OPERATOR = window_operator("own", SlidingWindows(10_000, 2_500), AGGREGATES, late_output="late",
                                          late_columns={"s": pa.string()}, form="event")


class FilterThenWindow(Operator):
    """An on_event operator of one's own that hands some events to windows."""

    name = "own"
    outputs = WINDOWS_OF_OWN_OPERATOR.outputs
    windows = WINDOWS_OF_OWN_OPERATOR.windows  # its state, declared here too

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        if int(event.value["s"][1:]) % 3:  # (any per-event logic: two events in three)
            WINDOWS_OF_OWN_OPERATOR.on_event(subject, event)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        WINDOWS_OF_OWN_OPERATOR.on_timer_expired(subject, timestamp)


def test_windows_inside_an_on_event_operator(tmp_path) -> None:
    table, op = _events(600), FilterThenWindow()
    job = Job(name="own", source=TableSource("t", {"p": table}), operators=[op], key_groups=16,
              sinks={"main": ParquetSink("windows", op.outputs["main"]),
                     "late": ParquetSink("late", op.outputs["late"])},
              events_per_epoch=150, max_out_of_orderness_ms=BOUND_MS)
    results, main, late = _run(job, str(tmp_path))
    _check(main, late, results, table, WINDOWS_OF_OWN_OPERATOR.spec, keep=np.arange(600) % 3 != 0)


class DistinctCount(AggregateFunction):
    """Distinct values of a column (a user aggregate)."""

    type = pa.int64()

    def create_accumulator(self) -> list:
        return []

    def add(self, value, accumulator: list) -> list:
        return accumulator if value in accumulator else sorted(accumulator + [value])

    def merge(self, a: list, b: list) -> list:
        return sorted(set(a) | set(b))

    def get_result(self, accumulator: list) -> int:
        return len(accumulator)


@pytest.mark.parametrize("windows", KINDS, ids=repr)
def test_user_aggregate_function(tmp_path, windows) -> None:
    table = _events().append_column("bucket", pa.array(np.arange(1_500) % 7))
    results, main, late = _run(_job(windows, "w", aggregates={"n": Count(), "buckets": DistinctCount("bucket")},
                                    table=table), str(tmp_path))
    _check(main, late, results, table, windows)


def test_bad_configuration_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="size_ms must be a positive int"):
        TumblingWindows(0)
    with pytest.raises(ValueError, match="aggregate 'n' is 3, not an Aggregate"):
        window_operator("w", TumblingWindows(10), {"n": 3})
    with pytest.raises(ValueError, match="clashes with an output column"):
        window_operator("w", TumblingWindows(10), {"window_start": Count()})
    with pytest.raises(JobFailedError, match="does not evaluate on the events"):
        _run(_job(KINDS[0], "w", aggregates={"n": Sum("nope")}), str(tmp_path))


def test_flights_windowed_equals_oracle(tmp_path, check_flights_output) -> None:
    from dkvstream.examples.flights_windowed import flights_windowed_job

    job = flights_windowed_job(events_per_epoch=60_000)
    with JobRunner(job, None, str(tmp_path)) as runner:
        runner.run()
        check_flights_output(job.sinks["main"].read(runner.store, job.prefix))
        assert job.sinks["late"].read(runner.store, job.prefix).num_rows == 0


class SteppingClock:
    """A wall clock (s) that moves ``step_s`` each time the driver reads it."""

    def __init__(self, step_s: float, now: float = 1_700_000_000.0) -> None:
        self.now, self.step_s = now, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.mark.parametrize("windows", KINDS, ids=repr)
@pytest.mark.parametrize("form", ["batch", "event"])
def test_processing_time_early_firings_equal_model(tmp_path, windows, form) -> None:
    """``early_every_ms``: epochs 0.5 s of processing time apart (a fake clock, moved
    0.1 s at each reading), 2 s interval: early firings at most once per
    interval, on-time and late ones as without the option."""
    table = _events(900) if form == "event" else _events()
    # (The per-event form re-fires a window for each late event: the model's late firings are per epoch.)
    lateness = 2_000 if form == "batch" else 0
    results, main, late = _run(_job(windows, "w", form, lateness=lateness, early_ms=2_000, table=table),
                               str(tmp_path), clock=SteppingClock(0.1))
    stamps = [r.processing_time_ms for r in results]
    assert len({t // 2_000 for t in stamps}) < len(stamps) // 2  # several epochs per interval
    assert {"early", "on_time"} <= set(main.firing)
    _check(main, late, results, table, windows, lateness=lateness, early_ms=2_000)


@pytest.mark.parametrize("windows", [KINDS[0], KINDS[2]], ids=repr)
def test_processing_time_early_firings_across_a_crash_and_restart_equal_model(tmp_path, windows) -> None:
    """The driver dies after epoch 4's tasks, before its commit; a new runner (3 ranges,
    its clock read afresh) replays it: the firings are those of the committed epochs'
    processing times."""
    clock, first = SteppingClock(0.9), []
    with crash_at("after_tasks", 4), pytest.raises(Crash), \
            JobRunner(_job(windows, "w", lateness=2_000, early_ms=2_000), None, str(tmp_path), clock=clock) as runner:
        first.extend(runner.epochs())
    for r in first:
        r.processing_time_ms = read_checkpoint(open_object_store(str(tmp_path)), runner.job.prefix,
                                               r.epoch).processing_time_ms
    rest, main, late = _run(_job(windows, "w", lateness=2_000, early_ms=2_000), str(tmp_path), parallelism=3,
                            clock=clock)
    assert rest[0].epoch == 4 and "early" in set(main.firing)
    _check(main, late, first + rest, _events(), windows, lateness=2_000, early_ms=2_000)


def test_processing_time_early_firings_on_spark_equal_model(spark, tmp_path) -> None:
    windows = SlidingWindows(10_000, 2_500)
    results, main, late = _run(_job(windows, "w", lateness=2_000, early_ms=2_000), str(tmp_path), spark=spark,
                               clock=SteppingClock(0.1))
    _check(main, late, results, _events(), windows, lateness=2_000, early_ms=2_000)


@settings(max_examples=6, deadline=None)
@given(kind=st.sampled_from(["tumbling", "sliding", "session"]), interval=st.integers(300, 5_000),
       step=st.sampled_from([0.01, 0.05, 0.3]), epoch=st.integers(30, 300), batch=st.booleans(),
       seed=st.integers(0, 1_000))
def test_processing_time_early_firings_equal_model_for_any_interval_and_clock(kind, interval, step, epoch, batch,
                                                                              seed) -> None:
    windows = {"tumbling": TumblingWindows(3_000), "sliding": SlidingWindows(3_000, 1_000),
               "session": SessionWindows(400)}[kind]
    table = _events(300, keys=3, seed=seed)
    lateness = 700 if batch else 0  # (per-event late firings are not the model's)
    job = _job(windows, "p", "batch" if batch else "event", lateness=lateness, early_ms=interval, table=table)
    job.events_per_epoch = epoch
    with tempfile.TemporaryDirectory() as store:
        results, main, late = _run(job, store, clock=SteppingClock(step))
    _check(main, late, results, table, windows, lateness=lateness, early_ms=interval)
