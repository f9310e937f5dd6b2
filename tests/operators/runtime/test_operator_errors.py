"""``Job.on_operator_error``: an event or timer an operator raises on.

A source holds two poison events in epoch 2 (a negative amount, a non-UTF-8 key) and an
operator whose timer raises for one window; each poison writes state (and sets a timer,
and emits) before raising. With ``"fail"`` every run fails in epoch 2; with
``"dead_letter"`` the job finishes, the dead-letter table holds exactly those events and
that timer with their source position, and the output is the pandas oracle over the
input without the poison events (their state changes discarded). Both operator forms.
NaN in a float value column: both forms treat it alike (flights: a NaN delay is a
missing one, as pandas does; the runtime keeps an emitted NaN a NaN in both forms).
"""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from dkvstream.examples.flights import OUTPUT_SCHEMA as FLIGHTS_SCHEMA
from dkvstream.examples.flights import RouteDailyDelays, RouteDailyDelaysBatch
from dkvstream.examples.flights_oracle import assert_equals_oracle
from dkvstream.examples.synthetic import (
    GROUP_SUM_SCHEMA,
    GroupWindowSum,
    KeyWindowCount,
    SyntheticSource,
    group_of,
)
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec
from dkvstream.operators.errors import JobFailedError, OperatorError
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.runtime import exchange as runtime
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.operator_errors import WriteBuffer, isolate
from dkvstream.operators.runtime.task import _emitted_table
from dkvstream.operators.testing import OperatorTestHarness
from dkvstream.storage.dkv import DKV
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark workers cannot import tests

W = 10_000  # window, ms
EVENTS = 200  # per partition; 100 events per epoch -> 4 epochs, epoch 2 = offsets [50, 100)
BAD_KEY = b"k\xff\xfe"  # not UTF-8
OUT = pa.schema([pa.field("key", pa.string()), pa.field("window_start", pa.int64()),
                 pa.field("count", pa.int64()), pa.field("amount", pa.float64())])
AGG = RecordCodec({"count": pa.int64(), "amount": pa.float64()})


def _base() -> SyntheticSource:
    return SyntheticSource(EVENTS, keys=12, partitions=2, step_ms=700)


def _poison_value_offset() -> int:
    """An offset of p0 in epoch 2 whose event is the first of its (key, window) in event
    time, with a later event of that key and window also in epoch 2: its discarded
    ``set_timer`` must not keep the later event from setting the same timer."""
    src = _base()
    df = pd.concat([src.full_partition(p).to_pandas().assign(part=p, offset=range(EVENTS))
                    for p in src.partitions()]).sort_values(["timestamp", "part", "offset"])
    df["window"] = df["timestamp"] - df["timestamp"] % W
    for _, g in df.groupby(["key", "window"]):
        first, rest = g.iloc[0], g.iloc[1:]
        if (first["part"] == "p0" and 50 <= first["offset"] < 100
                and ((rest["offset"] >= 50) & (rest["offset"] < 100)).any()):
            return int(first["offset"])
    raise AssertionError("no such event in the synthetic data")


POISON_VALUE = ("p0", _poison_value_offset())  # amount -1: the operator raises after writing
POISON_KEY = ("p1", 73)  # key BAD_KEY: decoding it raises after writing
POISON_TIMER = (b"k5", 60_000)  # (key, window start): its timer raises after emitting


class PoisonSource(Source):
    """``SyntheticSource`` events with float amounts and the two poison events."""

    name = "poison"

    def __init__(self) -> None:
        self.inner = _base()

    def partitions(self) -> list[str]:
        return self.inner.partitions()

    def end_offsets(self) -> dict[str, int]:
        return self.inner.end_offsets()

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field("amount", pa.float64())])

    def full(self, partition: str) -> pd.DataFrame:
        df = self.inner.full_partition(partition).to_pandas()
        df["amount"] = df["amount"].astype("float64")
        if partition == POISON_VALUE[0]:
            df.loc[POISON_VALUE[1], "amount"] = -1.0
        if partition == POISON_KEY[0]:
            df.loc[POISON_KEY[1], "key"] = BAD_KEY
        return df

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        return pa.Table.from_pandas(self.full(partition).iloc[start:end], preserve_index=False,
                                    schema=pa.schema([("key", pa.binary()), ("timestamp", pa.int64()),
                                                      ("amount", pa.float64())]))


class PoisonCount(Operator):
    """Per key and window: count and amount sum; raises on a negative amount or a key
    that is not UTF-8 after writing state, and in the timer of ``POISON_TIMER`` after
    emitting and deleting the window."""

    name = "poison_count"
    outputs = {"main": OUT}
    windows = MapSpec(IntCodec(), AGG, id="windows")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % W
        m = self.windows.state_for(subject)
        agg = m.get(start)
        if agg is None:
            agg = {"count": 0, "amount": 0.0}
            subject.set_timer(start + W)
        agg["count"] += 1
        agg["amount"] += event.value["amount"]
        m.set(start, agg)
        subject.key.decode()
        if event.value["amount"] < 0:
            raise ValueError(f"negative amount {event.value['amount']}")

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - W
        m = self.windows.state_for(subject)
        agg = m.get(start)
        if agg is None:
            return
        subject.emit({"key": subject.key.decode(), "window_start": start, **agg})
        m.delete(start)
        if (subject.key, start) == POISON_TIMER:
            raise RuntimeError("poison timer")


class PoisonCountBatch(BatchOperator):
    """``PoisonCount`` in vectorised form: the same state, output and failures (a
    non-UTF-8 key fails the cast of the whole batch)."""

    name = PoisonCount.name
    outputs = PoisonCount.outputs
    windows = PoisonCount.windows

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        ts = events.column("timestamp").to_numpy()
        groups = pa.table({"key": events.column("key"), "kg": events.column("key_group"),
                           "start": ts - ts % W, "amount": events.column("amount")}) \
            .group_by(["key", "kg", "start"], use_threads=False) \
            .aggregate([("amount", "count"), ("amount", "sum")])
        keys, kgs = groups.column("key").to_pylist(), groups.column("kg").to_pylist()
        starts = groups.column("start").to_pylist()
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        olds = state.get_rows_at(at)
        state.set_rows_at(at, [(n, s) if old is None else (old[0] + n, old[1] + s) for old, n, s in zip(
            olds, groups.column("amount_count").to_pylist(), groups.column("amount_sum").to_pylist())])
        new = [i for i, old in enumerate(olds) if old is None]
        ctx.set_timers([keys[i] for i in new], [kgs[i] for i in new], [starts[i] + W for i in new])
        pc.cast(events.column("key"), pa.string())
        if pc.any(pc.less(events.column("amount"), 0)).as_py():
            raise ValueError("negative amount")

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs = timers.column("key").to_pylist(), timers.column("key_group").to_pylist()
        starts = [t - W for t in timers.column("timestamp").to_pylist()]
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        aggs = state.get_rows_at(at)
        hit = [i for i, a in enumerate(aggs) if a is not None]
        ctx.emit({"key": [keys[i].decode() for i in hit], "window_start": [starts[i] for i in hit],
                  "count": [aggs[i][0] for i in hit], "amount": [aggs[i][1] for i in hit]},
                 keys=[keys[i] for i in hit], timestamps=[starts[i] + W for i in hit])
        state.delete_at([at[i] for i in hit])
        if any((keys[i], starts[i]) == POISON_TIMER for i in hit):
            raise RuntimeError("poison timer")


def _job(batch: bool, policy: str) -> Job:
    return Job(name="poison", source=PoisonSource(), operators=[PoisonCountBatch() if batch else PoisonCount()],
               sinks={"main": ParquetSink("counts", OUT)}, key_groups=16, parallelism=2,
               events_per_epoch=100, max_out_of_orderness_ms=5_000, on_operator_error=policy)


def _oracle() -> pd.DataFrame:
    """Per key and window over the input without the poison events, without the window
    whose timer raises."""
    src = PoisonSource()
    df = pd.concat([src.full(p).assign(part=p, offset=range(EVENTS)) for p in src.partitions()])
    poison = df.apply(lambda r: (r["part"], r["offset"]) in (POISON_VALUE, POISON_KEY), axis=1)
    df = df[~poison]
    df["window_start"] = df["timestamp"] - df["timestamp"] % W
    df["key"] = df["key"].map(bytes.decode)
    out = df.groupby(["key", "window_start"], as_index=False).agg(count=("amount", "size"),
                                                                   amount=("amount", "sum"))
    out = out[~((out["key"] == POISON_TIMER[0].decode()) & (out["window_start"] == POISON_TIMER[1]))]
    return _sorted(out)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["key", "window_start"]).reset_index(drop=True).astype(
        {"window_start": "int64", "count": "int64", "amount": "float64"})


def _check_dead_letters(runner: JobRunner, batch: bool) -> None:
    job = runner.job
    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    from_timer = dead["source"] == "timer:poison_count"  # a timer's row says so
    events = dead[~from_timer].sort_values(["partition", "offset"])
    assert list(zip(events["partition"], events["offset"])) == sorted([POISON_VALUE, POISON_KEY])
    assert set(dead["reason"]) == {"operator_error"} and set(events["source"]) == {"poison"}
    assert set(events["epoch"]) == {2} and list(dead.loc[from_timer, "epoch"]) == [3]
    src = PoisonSource()
    value_row = events[events["partition"] == POISON_VALUE[0]].iloc[0]
    assert value_row["key"] == src.full("p0").loc[POISON_VALUE[1], "key"]
    assert value_row["value"] == b'{"amount":-1.0}'
    key_row = events[events["partition"] == POISON_KEY[0]].iloc[0]
    assert key_row["key"] == BAD_KEY
    handler = "on_batch" if batch else "on_event"
    assert value_row["error"].startswith(f"operator poison_count {handler}: ValueError: negative amount")
    key_error = "ArrowInvalid" if batch else "UnicodeDecodeError"
    assert key_row["error"].startswith(f"operator poison_count {handler}: {key_error}")
    timers = dead[from_timer]
    assert len(timers) == 1
    timer = timers.iloc[0]
    assert (timer["key"], timer["timestamp"]) == (POISON_TIMER[0], POISON_TIMER[1] + W)
    assert pd.isna(timer["partition"]) and pd.isna(timer["offset"]) and timer["value"] is None
    timer_handler = "on_timers" if batch else "on_timer_expired"
    assert timer["error"].startswith(f"operator poison_count {timer_handler}: RuntimeError: poison timer")


@pytest.mark.parametrize("batch", [False, True], ids=["on_event", "on_batch"])
def test_fail_policy_fails_every_rerun(batch, tmp_path) -> None:
    root = str(tmp_path / "store")
    for _ in range(2):
        with pytest.raises(JobFailedError, match="epoch 2 failed in operator poison_count"):
            JobRunner(_job(batch, "fail"), None, root).run()
    assert latest_checkpoint(open_object_store(root), "jobs/poison").epoch == 1


def _described(partition: str, offset: int) -> str:
    """How an ``OperatorError`` names the poison event at (partition, offset)."""
    row = PoisonSource().full(partition).loc[offset]
    ts = int(row["timestamp"])
    iso = pd.Timestamp(ts, unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return (f"with key {bytes(row['key'])!r} (source poison partition {partition} offset {offset}, "
            f"event time {ts} ({iso}))")


@pytest.mark.parametrize("batch", [False, True], ids=["on_event", "on_batch"])
def test_fail_policy_error_names_key_partition_offset_and_event_time(batch, tmp_path) -> None:
    """Oracle: the poison events' rows in the source. The error names one of them, with
    the handler, the cause and what to do; nothing of epoch 2 is committed."""
    root = str(tmp_path / "store")
    with pytest.raises(OperatorError) as raised:
        JobRunner(_job(batch, "fail"), None, root).run()
    message = str(raised.value)
    handler = "on_batch" if batch else "on_event"
    assert f"epoch 2 failed in operator poison_count: operator poison_count {handler} raised on the event" in message
    named = [p for p in (POISON_VALUE, POISON_KEY) if _described(*p) in message]
    assert len(named) == 1, message
    cause = ("ValueError: negative amount" if named[0] == POISON_VALUE
             else "ArrowInvalid" if batch else "UnicodeDecodeError")
    assert f"): {cause}" in message
    assert "on_operator_error='dead_letter'" in message
    assert latest_checkpoint(open_object_store(root), "jobs/poison").epoch == 1


@pytest.mark.parametrize("long_lived_tasks", [True, False], ids=["long-lived", "stages-per-epoch"])
def test_fail_policy_error_on_spark(spark, tmp_path, long_lived_tasks) -> None:
    """On Spark the task's error reaches the driver as text: the ``OperatorError`` raised
    there names the same event."""
    with pytest.raises(OperatorError) as raised:
        JobRunner(_job(False, "fail"), spark, str(tmp_path / "store"), long_lived_tasks=long_lived_tasks).run()
    message = str(raised.value)
    assert message.startswith("job poison: epoch 2 failed in operator poison_count: operator poison_count on_event "
                              "raised on the event with key"), message
    assert [p for p in (POISON_VALUE, POISON_KEY) if _described(*p) in message], message


class CleanSource(PoisonSource):
    """``PoisonSource`` without the poison events: only the timer raises."""

    def full(self, partition: str) -> pd.DataFrame:
        df = self.inner.full_partition(partition).to_pandas()
        df["amount"] = df["amount"].astype("float64")
        return df


@pytest.mark.parametrize("batch", [False, True], ids=["on_event", "on_batch"])
def test_fail_policy_error_names_the_timer(batch, tmp_path) -> None:
    """A timer that raises under "fail": the error names its key and time."""
    job = dataclasses.replace(_job(batch, "fail"), source=CleanSource())
    with pytest.raises(OperatorError) as raised:
        JobRunner(job, None, str(tmp_path / "store")).run()
    handler = "on_timers" if batch else "on_timer_expired"
    key, start = POISON_TIMER
    assert (f"operator poison_count {handler} raised on the timer of key {key!r} at {start + W} "
            f"(1970-01-01T00:01:10.000Z): RuntimeError: poison timer") in str(raised.value)


@pytest.mark.parametrize("batch", [False, True], ids=["on_event", "on_batch"])
def test_dead_letter_policy_skips_poison_and_discards_its_state(batch, tmp_path) -> None:
    job = _job(batch, "dead_letter")
    runner = JobRunner(job, None, str(tmp_path / "store"))
    results = runner.run()
    assert results[-1].finished and len(results) == 4
    got = _sorted(job.sinks["main"].read(runner.store, job.prefix).to_pandas())
    pd.testing.assert_frame_equal(got, _oracle())
    _check_dead_letters(runner, batch)
    # The poison events in epoch 2, the poison timer fires in epoch 3 (checkpoint metrics).
    assert [r.dead_letter["operator_error"] for r in results] == [0, 2, 1, 0]
    assert [r.dead_letter["total"] for r in results] == [0, 2, 1, 0]


def test_dead_letters_are_exactly_once_across_crashes(tmp_path) -> None:
    """A crash after the commit of epoch 2 (before its publish), and one after the tasks
    of epoch 3 (staged, not committed): each dead letter is published once."""
    root = str(tmp_path / "store")

    for point, epoch in (("after_commit", 2), ("after_tasks", 3)):
        with crash_at(point, epoch), pytest.raises(Crash):
            JobRunner(_job(False, "dead_letter"), None, root).run()
    runner = JobRunner(_job(False, "dead_letter"), None, root)
    runner.run()
    _check_dead_letters(runner, batch=False)
    got = _sorted(runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas())
    pd.testing.assert_frame_equal(got, _oracle())


@pytest.mark.parametrize("batch", [False, True], ids=["on_event", "on_batch"])
def test_duplicate_task_attempts_publish_dead_letters_once(batch, tmp_path, monkeypatch) -> None:
    """Every task runs twice, as a Spark retry or speculative copy would, and the second
    result is committed: both attempts staged dead letters, each row is published once."""
    real = runtime.run_task
    staged = []

    def twice(*args, **kwargs):
        first, second = real(*args, **kwargs), real(*args, **kwargs)
        staged.extend(k for k in (first.dead_letter_key, second.dead_letter_key) if k)
        return second

    monkeypatch.setattr(runtime, "run_task", twice)
    job = _job(batch, "dead_letter")
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    assert len(staged) == len(set(staged)) >= 4  # two attempts of each task with dead letters
    _check_dead_letters(runner, batch)
    pd.testing.assert_frame_equal(_sorted(job.sinks["main"].read(runner.store, job.prefix).to_pandas()), _oracle())


def test_dead_letter_policy_on_spark(spark, tmp_path) -> None:
    """Tasks on Spark stage their dead letters; the driver names them in the checkpoint."""
    job = _job(True, "dead_letter")
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    runner.run()
    pd.testing.assert_frame_equal(_sorted(job.sinks["main"].read(runner.store, job.prefix).to_pandas()), _oracle())
    _check_dead_letters(runner, batch=True)


@settings(max_examples=150)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-60, 10)), min_size=1, max_size=80))
def test_isolate_drops_what_on_event_would_drop(rows) -> None:
    """Oracle: a handler that raises iff some key's running sum goes negative; the rows
    to drop are those a replay in order (``on_event``) raises on."""
    rows.sort(key=lambda r: r[0])  # the batch is sorted by key, stable
    keys = np.array([k for k, _ in rows])
    values = [v for _, v in rows]

    def raises(idx: np.ndarray) -> BaseException | None:
        sums: dict[int, int] = {}
        for r in idx.tolist():
            sums[keys[r]] = sums.get(keys[r], 0) + values[r]
            if sums[keys[r]] < 0:
                return ValueError(f"row {r}")
        return None

    want, sums = set(), {}
    for r in range(len(rows)):
        if sums.get(keys[r], 0) + values[r] < 0:
            want.add(r)
        else:
            sums[keys[r]] = sums.get(keys[r], 0) + values[r]
    everything = np.arange(len(rows))
    err = raises(everything)
    if err is None:
        assert not want
        return
    groups = np.split(everything, np.flatnonzero(np.diff(keys)) + 1)
    bad = isolate(groups, raises, err, "operator t on_batch")
    assert set(bad) == want
    assert all(str(bad[r]) == f"row {r}" for r in bad)  # each row's own exception


def test_isolate_refuses_an_error_no_key_raises_alone() -> None:
    """A batch-level failure (here: more than 10 rows) is no event's: nothing is dropped."""
    groups = np.split(np.arange(16), 4)
    with pytest.raises(RuntimeError, match="not over any half of them"):
        isolate(groups, lambda idx: ValueError("too big") if len(idx) > 10 else None, ValueError("too big"),
                "operator t on_batch")


def test_storage_errors_are_not_dead_lettered(tmp_path) -> None:
    """An error of the storage (here raised by the operator as DKV would) fails the epoch
    under "dead_letter" too: the event is not to blame."""

    class StoreFails(PoisonCount):
        def on_event(self, subject: Subject, event: KeyedEvent) -> None:
            if event.value["amount"] < 0:
                raise CorruptionError("block checksum mismatch")
            super().on_event(subject, event)

    job = _job(False, "dead_letter")
    job.operators = [StoreFails()]
    with pytest.raises(JobFailedError, match="epoch 2 failed in operator poison_count: .*checksum"):
        JobRunner(job, None, str(tmp_path / "store")).run()


def test_write_buffer_reads_its_writes_over_dkv(tmp_path) -> None:
    db = DKV.open(open_object_store(str(tmp_path)), "dkv")
    db.write_batch([b"a", b"b", b"c", b"e"], [b"1", b"2", b"3", b"5"])
    buf = WriteBuffer(db)
    buf.put(b"d", b"4")
    buf.delete(b"b")
    buf.write_batch([b"a", b"f"], [b"10", b"6"])
    assert buf.get_many([b"a", b"b", b"c", b"d"]) == [b"10", None, b"3", b"4"]
    assert list(buf.scan_range(b"a", b"f")) == [(b"a", b"10"), (b"c", b"3"), (b"d", b"4"), (b"e", b"5")]
    assert list(buf.scan_prefix(b"f")) == [(b"f", b"6")]
    assert db.get(b"a") == b"1"  # nothing reached DKV
    assert sorted(buf.discard()) == [b"a", b"b", b"d", b"f"]
    assert buf.get(b"a") == b"1"
    buf.delete(b"c")
    buf.commit()
    assert db.get(b"c") is None and list(buf.scan_range(b"a", None))[-1] == (b"e", b"5")


# ---------------------------------------------------------------------------------- NaN
NAN_DAY = 86_400_000
NAN_BASE = 1_700_006_400_000  # a UTC midnight
# day -> delays in event-time order; NaN first and in the middle (max is order-sensitive)
NAN_DELAYS = ((float("nan"), 5.0, 2.0), (1.0, float("nan"), 3.0), (None, float("nan")), (4.0, None))
NAN_VALUES = pa.schema([("dep_time", pa.int64()), ("dep_delay", pa.float64()), ("origin", pa.string()),
                        ("dest", pa.string())])


def _nan_flights() -> list[dict]:
    """Flights of one route with float delays, some NaN, some null, over four days."""
    return [{"key": b"EWR-LAX", "timestamp": NAN_BASE + d * NAN_DAY + 60_000 * i,
             "dep_time": 900, "dep_delay": delay, "origin": "EWR", "dest": "LAX"}
            for d, day in enumerate(NAN_DELAYS) for i, delay in enumerate(day)]


@pytest.mark.parametrize("operator", [RouteDailyDelays, RouteDailyDelaysBatch], ids=["on_event", "batch"])
@pytest.mark.parametrize("step", [2, 100], ids=["epochs", "one-epoch"])
def test_nan_delays_are_missing_delays_in_both_forms(operator, step) -> None:
    """The flights pair over NaN delays (``OperatorTestHarness``): both forms give pandas'
    answer (NaN skipped, as null), whatever the order of the NaN and the epoch
    boundaries (two events per epoch, or all in one; the watermark just behind the newest
    event, as a job's with no out-of-orderness bound)."""
    flights = _nan_flights()
    df = pd.DataFrame(flights)
    df["window_start"] = df["timestamp"] - df["timestamp"] % NAN_DAY
    g = df.groupby("window_start")
    want = pd.DataFrame({"flights": g.size(), "cancelled": 0, "dep_delay_mean": g["dep_delay"].mean(),
                         "dep_delay_max": g["dep_delay"].max()}).reset_index()
    want["window_end"] = want["window_start"] + NAN_DAY
    for c in ("window_start", "window_end"):
        want[c] = pd.to_datetime(want[c], unit="ms", utc=True).astype("datetime64[ms, UTC]")
    want = want.assign(origin="EWR", dest="LAX").astype({"flights": "int64", "cancelled": "int64"})
    harness = OperatorTestHarness(operator(), key_groups=4, value_schema=NAN_VALUES)
    for i in range(0, len(flights), step):
        newest = max(f["timestamp"] for f in flights[i:i + step])
        harness.process_events(flights[i:i + step], watermark=newest - 1)
    harness.finish()
    assert harness.output("late") == []
    assert_equals_oracle(harness.output_table(), want[list(FLIGHTS_SCHEMA.names)])


def test_an_emitted_nan_stays_nan_in_both_forms() -> None:
    """``Subject.emit`` rows and ``BatchContext.emit`` columns (list, numpy, pandas) give
    the same table: NaN is a value, null is null."""
    schema = pa.schema([pa.field("x", pa.float64())])
    op = type("Op", (Operator,), {"name": "op", "outputs": {"main": schema}, "on_event": lambda *a: None})()
    values = [1.0, float("nan"), None]
    rows = _emitted_table(op, "main", [{"x": v} for v in values])
    for column in (values, np.array([1.0, np.nan, np.nan])[:2], pd.Series(values, dtype="object"),
                   pd.Series([1.0, np.nan])):
        ctx = BatchContext(None, None, {"main": schema}, "op")
        ctx.emit({"x": column}, keys=[b"k"] * len(column), timestamps=[0] * len(column))
        got = ctx.emitted["main"][0][0]
        assert got.column("x").to_pylist()[:2] == pytest.approx(rows.column("x").to_pylist()[:2], nan_ok=True)
        assert got.column("x").null_count == (1 if len(column) == 3 else 0)
        assert pc.sum(pc.is_nan(got.column("x"))).as_py() == 1


class PoisonGroupSum(GroupWindowSum):
    """``GroupWindowSum`` that raises, after writing its state and timer, on every event
    of group g2's window at 120 s (one per key of the group with events there)."""

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        super().on_event(subject, event)
        if (subject.key, event.value["window_start"]) == (b"g2", 120_000):
            raise KeyError("poison group")


def test_second_operator_events_have_no_source_position(tmp_path) -> None:
    """In a chain, events of the second operator come from the first one's output: their
    dead letters name that operator, with null partition and offset."""
    source = SyntheticSource(events=600, keys=20, partitions=2, step_ms=1_000)
    job = Job(name="chain", source=source, operators=[KeyWindowCount(), PoisonGroupSum()],
              sinks={"main": ParquetSink("sums", GROUP_SUM_SCHEMA)}, key_groups=16, parallelism=2,
              events_per_epoch=300, on_operator_error="dead_letter")
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    df = pd.concat([source.full_partition(p).to_pandas() for p in source.partitions()])
    df["group"] = [group_of(k) for k in df["key"]]
    df["window_start"] = df["timestamp"] - df["timestamp"] % 60_000
    per_key = df.groupby(["group", "key", "window_start"]).agg(count=("amount", "size"), amount=("amount", "sum"))
    poison = per_key.loc[("g2", slice(None), 120_000), :]
    want = per_key.drop(poison.index).groupby(["group", "window_start"]).agg(
        keys=("count", "size"), count=("count", "sum"), amount=("amount", "sum")).reset_index()
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    pd.testing.assert_frame_equal(got.sort_values(["group", "window_start"]).reset_index(drop=True)[want.columns],
                                  want, check_dtype=False)
    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    assert len(dead) == len(poison) > 1
    assert set(dead["source"]) == {"operator:key_window_count"}
    assert dead["partition"].isna().all() and dead["offset"].isna().all() and set(dead["key"]) == {b"g2"}
    assert sorted(json.loads(v)["count"] for v in dead["value"]) == sorted(poison["count"])
    assert all(e.startswith("operator group_window_sum on_event: KeyError: 'poison group'") for e in dead["error"])
