"""Aircraft rotations: a job that upserts one row per aircraft into a Delta table.

Same flights data as the flights job (``dkvstream.examples.flights_data``), keyed by
``tailnum`` (flights without a tail number, ``NA`` in the file, are left out by the source; cancelled
flights, those without ``air_time``, are ignored by the operator).

Operator 1, ``aircraft`` (keyed by tailnum):

- ``last``: ValueState of the aircraft's last flight: origin, dest, arrival time
  (``arrival_ms`` = event time + (``dep_delay`` + ``air_time``) minutes: actual departure
  plus time in the air), and the counters ``flights`` and ``repositioned`` (departures
  from an airport other than the previous flight's destination);
- ``delays``: ListState of the last 20 (``rolling``) arrival delays (``arr_delay`` when known);
- ``days``: MapState day start (ms, UTC) -> ``{carrier: [flights, arr_delay sum,
  arr_delay count]}`` and a timer at the day's end that *closes the aircraft's day*:
  it sends one row per carrier flown that day, keyed by carrier, to operator 2 and
  drops the day.

After each flight it sends the aircraft's row (tailnum, flights so far, last origin,
last dest, last arrival time, rolling mean of the last 20 arrival delays, repositioned
count), keyed by tailnum, to operator 2, which passes it to the ``aircraft`` table
sink: the sink keeps each key's last row of the epoch, so the table gets one upsert
per aircraft per epoch.

Operator 2, ``carrier_daily`` (re-keyed by carrier for the day rows): per carrier and
UTC day, flights, aircraft flown, arrival-delay sum and count; a timer at the day's end
emits the day to the ``carrier_daily`` Parquet table. Why the aircraft rows pass
through operator 2: only the last operator's outputs reach sinks in the runtime.

Order: a task handles an epoch's events in (event time, partition, offset) order, so
"last" means last in that order within an epoch; an aircraft's flights spread over
two epochs are taken epoch by epoch (the oracle does the same, from the checkpoint
offsets).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.flights_data import DAY_MS, FLIGHT_FIELDS, ORIGINS, flights_with_tailnum, replay_partitions
from dkvstream.operators.api.codecs import FloatCodec, IntCodec, JsonCodec, RecordCodec
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ListSpec, MapSpec, ValueSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.io.table_sink import TableSink

ROLLING = 20
EVENT_COLUMNS = ("carrier", "tailnum", "origin", "dest", "dep_delay", "arr_delay", "air_time")

AIRCRAFT_SCHEMA = pa.schema([
    pa.field("tailnum", pa.string()), pa.field("flights", pa.int64()), pa.field("last_origin", pa.string()),
    pa.field("last_dest", pa.string()), pa.field("last_arrival_ms", pa.int64()),
    pa.field("rolling_arr_delay", pa.float64()), pa.field("repositioned", pa.int64()),
])
CARRIER_DAILY_SCHEMA = pa.schema([
    pa.field("carrier", pa.string()), pa.field("day", pa.int64()), pa.field("flights", pa.int64()),
    pa.field("aircraft", pa.int64()), pa.field("arr_delay_sum", pa.float64()), pa.field("arr_delay_count", pa.int64()),
])
# Operator 1's main output: an aircraft row (kind "aircraft") or an aircraft-day row
# (kind "day"), one schema for both since an intermediate operator has one output.
FORWARD_SCHEMA = pa.schema([pa.field("kind", pa.string()), *AIRCRAFT_SCHEMA,
                            pa.field("carrier", pa.string()), pa.field("day", pa.int64()),
                            pa.field("arr_delay_sum", pa.float64()), pa.field("arr_delay_count", pa.int64())])

LAST = RecordCodec({"origin": pa.string(), "dest": pa.string(), "arrival_ms": pa.int64(),
                    "flights": pa.int64(), "repositioned": pa.int64()})


class AircraftSource(Source):
    """The flights replay keyed by tail number: partitions EWR, JFK, LGA, offsets are
    positions among the partition's flights with a tail number.

    Args:
        scale: copies of the year (``replay_partitions``).
        days: keep only flights departing in the first ``days`` days of the replay
            (None: all), for quick runs.
    """

    name = "aircraft_replay"

    def __init__(self, scale: int = 1, days: int | None = None) -> None:
        self.scale, self.days = scale, days

    def partition_table(self, partition: str) -> pa.Table:
        """The partition's rows (replay order), with ``event_time_ms``."""
        t = replay_partitions(self.scale)[partition]
        # pyarrow's CSV reader keeps the file's "NA" as a string in string columns.
        keep = pc.and_(pc.is_valid(t.column("tailnum")), pc.not_equal(t.column("tailnum"), "NA"))
        if self.days is not None:
            first = min(pc.min(p.column("event_time_ms")).as_py() for p in replay_partitions(self.scale).values())
            start = first - first % DAY_MS
            keep = pc.and_(keep, pc.less(t.column("event_time_ms"), start + self.days * DAY_MS))
        return t.filter(keep)

    def partitions(self) -> list[str]:
        return list(ORIGINS)

    def end_offsets(self) -> dict[str, int]:
        """From the replay's index (``flights_data.flights_with_tailnum``): nothing is loaded."""
        return {p: flights_with_tailnum(p, self.scale, self.days) for p in ORIGINS}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([FLIGHT_FIELDS.field(c) for c in EVENT_COLUMNS])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        table = self.partition_table(partition)
        if not 0 <= start <= end <= table.num_rows:
            raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside [0, {table.num_rows}]")
        part = table.slice(start, end - start)
        return pa.table({KEY_COLUMN: part.column("tailnum").cast(pa.binary()),
                         TIMESTAMP_COLUMN: part.column("event_time_ms"),
                         **{c: part.column(c) for c in EVENT_COLUMNS}})


class AircraftRotations(Operator):
    """Operator 1: per aircraft, its last flight, last 20 arrival delays, open days."""

    name = "aircraft"
    outputs = {"main": FORWARD_SCHEMA}
    last = ValueSpec(LAST)
    delays = ListSpec(FloatCodec())
    days = MapSpec(IntCodec(), JsonCodec())

    def __init__(self, rolling: int = ROLLING) -> None:
        self.rolling = rolling  # arrival delays kept for the rolling mean

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        f = event.value
        if f["air_time"] is None:
            return  # cancelled or diverted: no arrival
        last_state = self.last.state_for(subject)
        prev = last_state.get() or {"flights": 0, "repositioned": 0, "dest": None}
        moved = prev["dest"] is not None and prev["dest"] != f["origin"]
        arrival = event.timestamp + int(round(((f["dep_delay"] or 0) + f["air_time"]) * 60_000))
        cur = {"origin": f["origin"], "dest": f["dest"], "arrival_ms": arrival, "flights": prev["flights"] + 1,
               "repositioned": prev["repositioned"] + int(moved)}
        last_state.set(cur)
        delays = self.delays.state_for(subject)
        recent = delays.get()
        if f["arr_delay"] is not None:
            recent = (recent + [float(f["arr_delay"])])[-self.rolling:]
            delays.clear()
            for d in recent:
                delays.append(d)
        day = event.timestamp - event.timestamp % DAY_MS
        days = self.days.state_for(subject)
        totals = days.get(day) or {}
        t = totals.setdefault(f["carrier"], [0, 0.0, 0])
        t[0] += 1
        if f["arr_delay"] is not None:
            t[1] += float(f["arr_delay"])
            t[2] += 1
        days.set(day, totals)
        subject.set_timer(day + DAY_MS)
        tail = subject.key.decode()
        subject.emit({"kind": "aircraft", "tailnum": tail, "flights": cur["flights"], "last_origin": cur["origin"],
                      "last_dest": cur["dest"], "last_arrival_ms": arrival,
                      "rolling_arr_delay": sum(recent) / len(recent) if recent else None,
                      "repositioned": cur["repositioned"]}, key=subject.key)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        day = timestamp - DAY_MS
        days = self.days.state_for(subject)
        for carrier, (flights, delay_sum, delay_count) in sorted((days.get(day) or {}).items()):
            subject.emit({"kind": "day", "tailnum": subject.key.decode(), "carrier": carrier, "day": day,
                          "flights": flights, "arr_delay_sum": delay_sum, "arr_delay_count": delay_count},
                         key=carrier.encode())
        days.delete(day)


DAY_TOTALS = RecordCodec({"flights": pa.int64(), "aircraft": pa.int64(), "arr_delay_sum": pa.float64(),
                          "arr_delay_count": pa.int64()})


class CarrierDaily(Operator):
    """Operator 2: per carrier and day, totals of the closed aircraft days; passes the
    aircraft rows on to the table sink."""

    name = "carrier_daily"
    outputs = {"aircraft": AIRCRAFT_SCHEMA, "carrier_daily": CARRIER_DAILY_SCHEMA}
    totals = MapSpec(IntCodec(), DAY_TOTALS)

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        v = event.value
        if v["kind"] == "aircraft":
            subject.emit({c: v[c] for c in AIRCRAFT_SCHEMA.names}, output="aircraft")
            return
        totals = self.totals.state_for(subject)
        t = totals.get(v["day"]) or {"flights": 0, "aircraft": 0, "arr_delay_sum": 0.0, "arr_delay_count": 0}
        t["flights"] += v["flights"]
        t["aircraft"] += 1
        t["arr_delay_sum"] += v["arr_delay_sum"]
        t["arr_delay_count"] += v["arr_delay_count"]
        totals.set(v["day"], t)
        subject.set_timer(v["day"] + DAY_MS)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        day = timestamp - DAY_MS
        totals = self.totals.state_for(subject)
        t = totals.get(day)
        if t is not None:
            subject.emit({"carrier": subject.key.decode(), "day": day, **t}, output="carrier_daily")
            totals.delete(day)


def aircraft_table() -> TableSink:
    """The ``aircraft`` Delta table: key tailnum, 8 hash buckets, no range column."""
    return TableSink("aircraft", AIRCRAFT_SCHEMA, primary_key=["tailnum"], hash_buckets=8)


def aircraft_job(scale: int = 1, days: int | None = None, events_per_epoch: int = 50_000,
                 parallelism: int = 2, rolling: int = ROLLING) -> Job:
    """The aircraft rotations job (module docstring); ``rolling`` arrival delays (20)
    make the rolling mean."""
    return Job(name="aircraft_rotations", source=AircraftSource(scale, days),
               operators=[AircraftRotations(rolling), CarrierDaily()],
               sinks={"aircraft": aircraft_table(),
                      "carrier_daily": ParquetSink("carrier_daily", CARRIER_DAILY_SCHEMA)},
               parallelism=parallelism, events_per_epoch=events_per_epoch, max_out_of_orderness_ms=3_600_000)
