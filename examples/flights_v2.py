"""A changed version of the flights job, to try with a branch (``docs/branches.md``): the
route-delays operator with one more output column, ``dep_delay_sum`` (the sum of the
window's reported departure delays; null when none was reported). Its state is the
flights job's, so a fork of the flights job's state is what this code would have built.
"""
from __future__ import annotations

import dataclasses

import pyarrow as pa

from dkvstream.examples.flights import LATE_SCHEMA, OUTPUT_SCHEMA, RouteDailyDelays, flights_job
from dkvstream.examples.flights_data import DAY_MS
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import Subject
from dkvstream.operators.io.sinks import ParquetSink

SUM_SCHEMA = OUTPUT_SCHEMA.append(pa.field("dep_delay_sum", pa.float64()))


class RouteDailyDelaysWithSum(RouteDailyDelays):
    """``RouteDailyDelays`` whose window rows also carry ``dep_delay_sum``."""

    outputs = {"main": SUM_SCHEMA, "late": LATE_SCHEMA}

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        windows = self.windows.state_for(subject)
        agg = windows.get(timestamp - DAY_MS)
        if agg is None:
            return
        origin, dest = subject.key.decode().split("-", 1)
        n = agg["delay_count"]
        subject.emit({"origin": origin, "dest": dest, "window_start": timestamp - DAY_MS, "window_end": timestamp,
                      "flights": agg["flights"], "cancelled": agg["cancelled"],
                      "dep_delay_mean": agg["delay_sum"] / n if n else None, "dep_delay_max": agg["delay_max"],
                      "dep_delay_sum": agg["delay_sum"] if n else None})
        windows.delete(timestamp - DAY_MS)


def with_delay_sum(job: Job, name: str) -> Job:
    """``job`` (a route-delays job) under ``name`` with ``RouteDailyDelaysWithSum`` and
    its ``main`` sink's schema widened by the new column. The source object is ``job``'s:
    for a source that holds connections (Kafka), give the branch a source of its own."""
    sinks = {**job.sinks, "main": ParquetSink(job.sinks["main"].name, SUM_SCHEMA)}
    return dataclasses.replace(job, name=name, operators=[RouteDailyDelaysWithSum()], sinks=sinks)


def flights_v2_job(scale: int = 1, events_per_epoch: int = 50_000, name: str = "flights_v2") -> Job:
    """The flights job (``flights_job``'s settings) with the new column, as job ``name``."""
    return with_delay_sum(flights_job(scale=scale, events_per_epoch=events_per_epoch), name)
