"""The route-daily-delays aggregate as the Python-native baselines fold it, one event at a time.

One accumulator per route and window, a list ``[flights, cancelled, delay_sum, delay_count,
delay_max]`` (a plain list, so engines that persist state as JSON, e.g. Quix Streams'
RocksDB store, keep it as is): ``fold`` adds one event, ``merge`` combines two partial
accumulators, ``to_output_table`` turns closed windows into the spec's output table
(``examples/flights_oracle.py`` columns). Bytewax (``bytewax_flights.py``,
``bytewax_kafka_flights.py``) and Quix Streams (``quix_flights.py``) share it.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute  # pa.compute

from dkvstream.examples.flights_data import DAY_MS


def new_accumulator() -> list:
    """The empty accumulator ``[0, 0, 0.0, 0, None]``."""
    return [0, 0, 0.0, 0, None]


def fold(acc: list, dep_time, dep_delay) -> list:
    """Adds one flight to ``acc`` (in place) and returns it.

    Args:
        acc: an accumulator (``new_accumulator``).
        dep_time: the actual departure time (None: the flight was cancelled).
        dep_delay: the departure delay, minutes (None: unknown; not in the mean or max).
    """
    acc[0] += 1
    if dep_time is None:
        acc[1] += 1
    if dep_delay is not None:
        acc[2] += dep_delay
        acc[3] += 1
        if acc[4] is None or dep_delay > acc[4]:
            acc[4] = float(dep_delay)
    return acc


def merge(a: list, b: list) -> list:
    """Two partial accumulators of the same route and window combined (a new list)."""
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3],
            max((x for x in (a[4], b[4]) if x is not None), default=None)]


def to_output_table(rows: list) -> pa.Table:
    """Closed windows ``(route "origin-dest", window_start_ms, accumulator)`` as the spec's
    output table: origin, dest, window_start and window_end (timestamp ms UTC), flights,
    cancelled, dep_delay_mean and dep_delay_max (float64, null when no delay is known)."""
    ts = pa.timestamp("ms", tz="UTC")
    routes = [r for r, _, _ in rows]
    starts = pa.array([s for _, s, _ in rows], pa.int64())
    return pa.table({
        "origin": pa.array([r.split("-", 1)[0] for r in routes], pa.string()),
        "dest": pa.array([r.split("-", 1)[1] for r in routes], pa.string()),
        "window_start": starts.cast(ts), "window_end": pa.compute.add(starts, DAY_MS).cast(ts),
        "flights": pa.array([a[0] for _, _, a in rows], pa.int64()),
        "cancelled": pa.array([a[1] for _, _, a in rows], pa.int64()),
        "dep_delay_mean": pa.array([a[2] / a[3] if a[3] else None for _, _, a in rows], pa.float64()),
        "dep_delay_max": pa.array([a[4] for _, _, a in rows], pa.float64()),
    })
