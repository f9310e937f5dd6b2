"""The flights job (``examples/flights.py``) written with the window library: daily delay
statistics per route in tumbling one-day windows, the same output and late output as
``flights_job`` and its oracle (``flights_oracle``)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.flights import HOUR_MS, FlightsSource
from dkvstream.examples.flights_data import DAY_MS
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.windows import Count, First, Max, Mean, Sum, TumblingWindows, window_operator
from dkvstream.operators.io.sinks import ParquetSink


def flights_windowed_job(scale: int = 1, name: str = "flights_windowed", form: str = "batch", **settings) -> Job:
    """``flights_job`` on ``window_operator``; ``settings`` are further ``Job`` fields."""
    op = window_operator("route_daily_delays", TumblingWindows(DAY_MS), {
        "origin": First("origin", pa.string()), "dest": First("dest", pa.string()), "flights": Count(),
        "cancelled": Sum(pc.is_null(pc.field("dep_time")), pa.int64()),
        "dep_delay_mean": Mean("dep_delay"), "dep_delay_max": Max("dep_delay")},
        key_column=None, late_output="late", late_columns={"origin": pa.string(), "dest": pa.string()}, form=form)
    return Job(name=name, source=FlightsSource(scale), operators=[op], max_out_of_orderness_ms=HOUR_MS,
               sinks={"main": ParquetSink("route_daily_delays", op.outputs["main"]),
                      "late": ParquetSink("route_daily_delays_late", op.outputs["late"])},
               **{"max_watermark_drift_ms": DAY_MS, **settings})
