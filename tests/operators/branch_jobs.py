"""Flights jobs for the branch tests (importable: Spark workers unpickle these operators).

``BuggyRouteDailyDelays`` is the flights operator with a known bug (the delay mean
divides by all flights, cancelled and unreported ones included); ``RouteDailyDelays``
(the example's) is its fix, and ``RouteDailyDelaysWithSum`` adds an output column
(``dep_delay_sum``, ``dkvstream.examples.flights_v2``). All three keep the same state, so a fork of one's state is the
state the other would have built: the replay oracle of a promotion is the old code from
scratch up to the promotion and the new code from scratch after it.
``expected_mean_changes`` says in advance which windows the fix changes.
"""
from __future__ import annotations

import pandas as pd

from dkvstream.examples.flights import (
    HOUR_MS,
    LATE_SCHEMA,
    FlightsSource,
    RouteDailyDelays,
)
from dkvstream.examples.flights_data import DAY_MS, ORIGINS, replay_partitions
from dkvstream.examples.flights_index import FLIGHTS
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import Subject
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source

KEY_COLUMNS = ["origin", "dest", "window_start"]


class FirstFlights(FlightsSource):
    """The replay's first ``per_partition`` flights of each airport (a small input)."""

    def __init__(self, per_partition: int = 8_000) -> None:
        super().__init__(1)
        self.per_partition = per_partition

    def end_offsets(self) -> dict[str, int]:
        return {p: min(self.per_partition, FLIGHTS[p]) for p in ORIGINS}


def _window_row(subject: Subject, timestamp: int, agg: dict, mean) -> dict:
    origin, dest = subject.key.decode().split("-", 1)
    return {"origin": origin, "dest": dest, "window_start": timestamp - DAY_MS, "window_end": timestamp,
            "flights": agg["flights"], "cancelled": agg["cancelled"], "dep_delay_mean": mean,
            "dep_delay_max": agg["delay_max"]}


class BuggyRouteDailyDelays(RouteDailyDelays):
    """The bug: the mean delay divides by every flight of the window."""

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        windows = self.windows.state_for(subject)
        agg = windows.get(timestamp - DAY_MS)
        if agg is None:
            return
        subject.emit(_window_row(subject, timestamp, agg, agg["delay_sum"] / agg["flights"]))
        windows.delete(timestamp - DAY_MS)


def flights_variant(name: str, operator, *, source: Source | None = None, events_per_epoch: int = 4_000,
                    **settings) -> Job:
    """The flights job with ``operator`` (its own output schema), on ``FirstFlights()``
    unless ``source`` is given."""
    return Job(name=name, source=source or FirstFlights(), operators=[operator],
               sinks={"main": ParquetSink("route_daily_delays", operator.outputs["main"]),
                      "late": ParquetSink("route_daily_delays_late", LATE_SCHEMA)},
               max_out_of_orderness_ms=HOUR_MS, events_per_epoch=events_per_epoch,
               max_watermark_drift_ms=settings.pop("max_watermark_drift_ms", DAY_MS), **settings)


def window_stats(per_partition: int) -> pd.DataFrame:
    """Per (origin, dest, window_start in ms): flights, reported delays and their sum,
    over the first ``per_partition`` flights of each airport (pandas, from the replay)."""
    frames = []
    for p in ORIGINS:
        t = replay_partitions(1)[p].slice(0, per_partition)
        frames.append(pd.DataFrame({"origin": t.column("origin").to_pylist(), "dest": t.column("dest").to_pylist(),
                                    "ts": t.column("event_time_ms").to_pylist(),
                                    "dep_delay": t.column("dep_delay").to_pandas()}))
    df = pd.concat(frames, ignore_index=True)
    df["window_start"] = df["ts"] - df["ts"] % DAY_MS
    g = df.groupby(["origin", "dest", "window_start"])
    return pd.DataFrame({"flights": g.size(), "delay_count": g["dep_delay"].count(),
                         "delay_sum": g["dep_delay"].sum()}).reset_index()


def expected_mean_changes(per_partition: int) -> set[tuple[str, str, int]]:
    """The windows whose mean the fix changes, known in advance: some flight without a
    reported delay, and the buggy mean (sum / flights) differs from the true one (sum /
    reported; none when nothing was reported)."""
    s = window_stats(per_partition)
    changed = s[(s["flights"] != s["delay_count"]) & ((s["delay_count"] == 0) | (s["delay_sum"] != 0))]
    return set(zip(changed["origin"], changed["dest"], changed["window_start"].astype(int)))


def buggy_flights() -> Job:
    """The main job of the CLI tests (``module:function`` for ``--main``)."""
    return flights_variant("flights", BuggyRouteDailyDelays())


def fixed_flights() -> Job:
    """The branch of the CLI tests."""
    return flights_variant("flights_fix", RouteDailyDelays())
