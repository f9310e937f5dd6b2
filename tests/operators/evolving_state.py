"""A keyed window count whose state record changes between two releases, in both
operator forms (importable by Spark workers, so not in a test file).

Release 1 stores per key and hourly window ``{count, amount, last_start}`` (three int64
fields); release 2 reads the same state id as ``{amount: double, count, tag}`` with
``tag`` defaulting to 7: a field dropped, one widened from int64 to double, the fields
reordered and one added with a default. Release 2 writes ``tag = 7`` into the windows it
creates, so every row it emits has ``tag == 7`` exactly when the default was applied to
the windows release 1 left in state. The oracle is ``keyed_count_oracle``.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.keyed_count import OUTPUT_SCHEMA, WINDOW_MS
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source

NAME = "evolving_count"
TAG = 7
V1 = RecordCodec({"count": pa.int64(), "amount": pa.int64(), "last_start": pa.int64()})
V2 = RecordCodec({"amount": pa.float64(), "count": pa.int64(), "tag": pa.int64()}, defaults={"tag": TAG})
V2_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("window_start", pa.int64()),
                       pa.field("count", pa.int64()), pa.field("amount", pa.float64()),
                       pa.field("tag", pa.int64())])


class CountV1(Operator):
    """Release 1, ``on_event`` form."""

    name = NAME
    outputs = {"main": OUTPUT_SCHEMA}
    windows = MapSpec(IntCodec(), V1, id="windows")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % WINDOW_MS
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is None:
            agg = {"count": 0, "amount": 0, "last_start": start}
            subject.set_timer(start + WINDOW_MS)
        agg["count"] += 1
        agg["amount"] += event.value["amount"]
        windows.set(start, agg)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - WINDOW_MS
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is not None:
            subject.emit({"key": subject.key.decode(), "window_start": start,
                          "count": agg["count"], "amount": agg["amount"]})
            windows.delete(start)


class CountV2(Operator):
    """Release 2, ``on_event`` form."""

    name = NAME
    outputs = {"main": V2_SCHEMA}
    windows = MapSpec(IntCodec(), V2, id="windows")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % WINDOW_MS
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is None:
            agg = {"amount": 0.0, "count": 0, "tag": TAG}
            subject.set_timer(start + WINDOW_MS)
        agg["count"] += 1
        agg["amount"] += event.value["amount"]
        windows.set(start, agg)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - WINDOW_MS
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is not None:
            subject.emit({"key": subject.key.decode(), "window_start": start, **agg})
            windows.delete(start)


def _groups(events: pa.Table) -> pa.Table:
    ts = events.column("timestamp").to_numpy()
    return pa.table({"key": events.column("key"), "kg": events.column("key_group"),
                     "start": ts - ts % WINDOW_MS, "amount": events.column("amount")}) \
        .group_by(["key", "kg", "start"], use_threads=False) \
        .aggregate([("amount", "count"), ("amount", "sum")])


class _Batch(BatchOperator):
    """The vectorised form of either release: ``_record`` gives the new windows' other fields."""

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        groups = _groups(events)
        keys, kgs, starts = groups.column("key"), groups.column("kg"), groups.column("start")
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        old = state.get_columns_at(at)  # null row for a new window
        state.set_columns_at(at, self._record(old, groups))
        new = old.is_null()
        ctx.set_timers(keys.filter(new).to_pylist(), kgs.filter(new).to_pylist(),
                       pc.add(starts.filter(new), WINDOW_MS).to_pylist())

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs, stamps = timers.column("key"), timers.column("key_group"), timers.column("timestamp")
        starts = pc.subtract(stamps, WINDOW_MS)
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        aggs = state.get_columns_at(at)
        hit = aggs.is_valid()
        columns = {"key": keys.filter(hit).cast(pa.string()), "window_start": starts.filter(hit)}
        for name in self.outputs["main"].names[2:]:
            columns[name] = aggs.field(name).filter(hit)
        ctx.emit(columns, keys=keys.filter(hit).to_pylist(), timestamps=stamps.filter(hit).to_pylist())
        state.delete_at([k for k, h in zip(at, hit.to_pylist()) if h])


class CountV1Batch(_Batch):
    """Release 1, vectorised form."""

    name = NAME
    outputs = CountV1.outputs
    windows = CountV1.windows

    def _record(self, old: pa.StructArray, groups: pa.Table) -> dict:
        return {"count": pc.add(pc.fill_null(old.field("count"), 0), groups.column("amount_count")),
                "amount": pc.add(pc.fill_null(old.field("amount"), 0), groups.column("amount_sum")),
                "last_start": groups.column("start")}


class CountV2Batch(_Batch):
    """Release 2, vectorised form."""

    name = NAME
    outputs = CountV2.outputs
    windows = CountV2.windows

    def _record(self, old: pa.StructArray, groups: pa.Table) -> dict:
        return {"amount": pc.add(pc.fill_null(old.field("amount"), 0.0),
                                 groups.column("amount_sum").cast(pa.float64())),
                "count": pc.add(pc.fill_null(old.field("count"), 0), groups.column("amount_count")),
                "tag": pc.fill_null(old.field("tag"), TAG)}


def job(operator: Operator, parallelism: int = 2, source: Source | None = None) -> Job:
    """The job of ``operator`` (either release, either form) over ``source``, by default
    2 partitions x 3,000 events of 1,000 keys, 500 events an epoch (12 epochs); each
    release has its own sink."""
    release = 2 if isinstance(operator, (CountV2, CountV2Batch)) else 1
    schema = V2_SCHEMA if release == 2 else OUTPUT_SCHEMA
    source = source or SyntheticSource(3_000, 1_000, partitions=2, step_ms=6_000)
    return Job(name=NAME, source=source,
               operators=[operator], sinks={"main": ParquetSink(f"counts_v{release}", schema)},
               parallelism=parallelism, events_per_epoch=500, max_out_of_orderness_ms=12_000)
