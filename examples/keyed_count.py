"""The keyed counting job of the throughput benchmark, in both operator forms.

Per key and tumbling event-time window (``window_ms``): the number of events and the sum
of their ``amount``, emitted by a timer at the window's end. ``KeyedWindowCount`` is the
``on_event`` form, ``KeyedWindowCountBatch`` the vectorised form (``dkvstream.operators.api.batch``);
they share the state layout and give the same output. Events of a window already emitted
go to the ``late`` output. ``keyed_count_oracle`` is the pandas answer.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec
from dkvstream.operators.io.sinks import ParquetSink

WINDOW_MS = 3_600_000

OUTPUT_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("window_start", pa.int64()),
                           pa.field("count", pa.int64()), pa.field("amount", pa.int64())])
LATE_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("timestamp", pa.int64()),
                         pa.field("watermark", pa.int64())])
AGG = RecordCodec({"count": pa.int64(), "amount": pa.int64()})


class KeyedWindowCount(Operator):
    """Per key and window: event count and amount sum (``on_event`` form)."""

    name = "keyed_window_count"
    outputs = {"main": OUTPUT_SCHEMA, "late": LATE_SCHEMA}
    window_ms = WINDOW_MS
    windows = MapSpec(IntCodec(), AGG, id="windows")  # window_start (ms) -> aggregate

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        ts = event.timestamp
        start = ts - ts % self.window_ms
        if start + self.window_ms <= subject.watermark:
            subject.emit({"key": event.key.decode(), "timestamp": ts, "watermark": subject.watermark},
                         output="late")
            return
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is None:  # a new window: its timer fires at the window's end
            agg = {"count": 0, "amount": 0}
            subject.set_timer(start + self.window_ms)
        agg["count"] += 1
        agg["amount"] += event.value["amount"]
        windows.set(start, agg)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - self.window_ms
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is None:
            return
        subject.emit({"key": subject.key.decode(), "window_start": start, **agg})
        windows.delete(start)


class KeyedWindowCountBatch(BatchOperator):
    """``KeyedWindowCount`` in vectorised form: one state read and write per key and
    window per epoch, aggregated with pyarrow."""

    name = "keyed_window_count"
    outputs = KeyedWindowCount.outputs
    window_ms = WINDOW_MS
    windows = KeyedWindowCount.windows

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        ts = events.column("timestamp").to_numpy()
        start = ts - ts % self.window_ms
        late = start + self.window_ms <= ctx.watermark
        if late.any():
            lt = events.filter(pa.array(late))
            ctx.emit({"key": lt.column("key").cast(pa.string()), "timestamp": lt.column("timestamp"),
                      "watermark": pa.array([ctx.watermark] * lt.num_rows, pa.int64())},
                     output="late", keys=lt.column("key").to_pylist(), timestamps=lt.column("timestamp").to_pylist())
            events, start = events.filter(pa.array(~late)), start[~late]
        groups = pa.table({"key": events.column("key"), "kg": events.column("key_group"),
                           "start": start, "amount": events.column("amount")}) \
            .group_by(["key", "kg", "start"], use_threads=False) \
            .aggregate([("amount", "count"), ("amount", "sum")])
        keys, kgs, starts = groups.column("key"), groups.column("kg"), groups.column("start")
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)  # built once for the read and the write
        old = state.get_columns_at(at)  # struct column (count, amount), null for a new window
        state.set_columns_at(at, {
            "count": pc.add(pc.fill_null(old.field("count"), 0), groups.column("amount_count")),
            "amount": pc.add(pc.fill_null(old.field("amount"), 0), groups.column("amount_sum"))})
        new = old.is_null()  # new windows get their timer
        ctx.set_timers(keys.filter(new).to_pylist(), kgs.filter(new).to_pylist(),
                       pc.add(starts.filter(new), self.window_ms).to_pylist())

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs, stamps = timers.column("key"), timers.column("key_group"), timers.column("timestamp")
        starts = pc.subtract(stamps, self.window_ms)
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        aggs = state.get_columns_at(at)  # struct column (count, amount), null where none
        hit = aggs.is_valid()
        ctx.emit({"key": keys.filter(hit).cast(pa.string()), "window_start": starts.filter(hit),
                  "count": aggs.field("count").filter(hit), "amount": aggs.field("amount").filter(hit)},
                 keys=keys.filter(hit).to_pylist(), timestamps=stamps.filter(hit).to_pylist())
        state.delete_at([at[i] for i in np.flatnonzero(hit.to_numpy(zero_copy_only=False))])


def keyed_count_job(events: int, keys: int, *, batch: bool = True, zipf: float | None = None,
                    partitions: int = 2, step_ms: int = 1, events_per_epoch: int = 500_000,
                    parallelism: int = 2, name: str = "keyed_count") -> Job:
    """The keyed counting job over ``SyntheticSource``.

    Args:
        events: events per partition.
        keys: distinct keys.
        batch: the vectorised operator form (else ``on_event``).
        zipf: Zipf exponent of the key distribution (None: uniform).
        partitions: source partitions.
        step_ms: event-time step within a partition (ms).
        events_per_epoch: micro-batch size over all partitions.
        parallelism: tasks per operator.
        name: job name.
    """
    source = SyntheticSource(events, keys, partitions=partitions, step_ms=step_ms, zipf=zipf)
    op = KeyedWindowCountBatch() if batch else KeyedWindowCount()
    return Job(name=name, source=source, operators=[op],
               sinks={"main": ParquetSink("keyed_counts", OUTPUT_SCHEMA),
                      "late": ParquetSink("keyed_counts_late", LATE_SCHEMA)},
               parallelism=parallelism, events_per_epoch=events_per_epoch,
               max_out_of_orderness_ms=partitions * step_ms)


def keyed_count_oracle(source: SyntheticSource, window_ms: int = WINDOW_MS) -> pd.DataFrame:
    """The job's output by pandas ``groupby`` over every event of ``source``."""
    df = pa.concat_tables([source.full_partition(p) for p in source.partitions()]).to_pandas()
    ts = df[TIMESTAMP_COLUMN].to_numpy()
    df["window_start"] = ts - ts % window_ms
    df["key"] = df[KEY_COLUMN].map(bytes.decode)
    out = df.groupby(["key", "window_start"], as_index=False).agg(count=("amount", "size"),
                                                                   amount=("amount", "sum"))
    return out.astype({"count": np.int64, "amount": np.int64})
