"""The flights-and-weather job (two sources, one keyed operator) against its pandas
oracle: in process, on Spark with a rescaling restart, and on a small hand-made input
with a repeated observation."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights import HOUR_MS
from dkvstream.examples.flights_data import FLIGHT_COUNT
from dkvstream.examples.flights_weather import (
    LATE_SCHEMA,
    OUTPUT_SCHEMA,
    WEATHER_COLUMNS,
    HourlyFlightsSource,
    HourlyWeatherDelays,
    HourlyWeatherDelaysBatch,
    WeatherSource,
    flights_weather_job,
    weather_partitions,
)
from dkvstream.examples.flights_weather_oracle import (
    assert_equals_oracle,
    flights_weather_oracle,
    hourly_weather_delays,
)
from dkvstream.operators.api.columns import OFFSET_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import WATERMARK_MAX
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.union import UnionSource
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import checkpoint_entries
from tests.operators.table_sources import TableSource

WEATHER_COUNT = 26_115


@pytest.fixture(scope="module")
def oracle() -> pd.DataFrame:
    return flights_weather_oracle()


def _check_run(runner: JobRunner, oracle: pd.DataFrame) -> None:
    """Output equals the oracle, nothing late, and every hour's state and timer is gone."""
    job, store = runner.job, runner.store
    assert job.sinks["late"].read(store, job.prefix).num_rows == 0
    assert_equals_oracle(job.sinks["main"].read(store, job.prefix), oracle)
    assert list(checkpoint_entries(store, job.prefix)) == []


def test_replay_order_is_event_time_order() -> None:
    """What MAX_OUT_OF_ORDERNESS_MS rests on: in every partition of both sources, event
    time never goes back (so, with a bound of an hour, nothing can be late)."""
    for source in (HourlyFlightsSource(), WeatherSource()):
        for partition, end in source.end_offsets().items():
            stamps = source.read(partition, 0, end).column("timestamp").to_numpy()
            assert (np.diff(stamps) >= 0).all(), f"{source.name}/{partition} goes back in event time"


def test_in_process_equals_oracle(tmp_path, oracle) -> None:
    assert weather_partitions()["EWR"].num_rows > 8_000  # the weather is there to join
    runner = JobRunner(flights_weather_job(events_per_epoch=100_000), None, str(tmp_path / "store"))
    results = runner.run()
    assert sum(r.events for r in results) == FLIGHT_COUNT + WEATHER_COUNT
    assert len(results) >= 4, "the job must run several epochs"
    assert results[-1].finished and results[-1].watermark == WATERMARK_MAX
    _check_run(runner, oracle)
    # Most flight hours have an observation; some (the file's missing hours) have none.
    assert 0 < oracle["temp"].isna().sum() < len(oracle) // 100


def test_spark_rescaled_restart_equals_oracle(spark, tmp_path, oracle) -> None:
    """Three epochs with the on_event form at parallelism 2, then the rest with the
    vectorised form at parallelism 3: the state carries over both changes."""
    store = str(tmp_path / "store")
    first = JobRunner(flights_weather_job(events_per_epoch=100_000, parallelism=2), spark, store).run(max_epochs=3)
    assert [r.epoch for r in first] == [1, 2, 3] and not first[-1].finished
    runner = JobRunner(flights_weather_job(events_per_epoch=100_000, parallelism=3, batch=True), spark, store)
    rest = runner.run()
    assert rest[0].epoch == 4 and rest[-1].finished
    assert runner.latest().parallelism == 3
    assert sum(r.events for r in first + rest) == FLIGHT_COUNT + WEATHER_COUNT
    _check_run(runner, oracle)


def _hour(h: int) -> int:
    return 1_357_020_000_000 + h * HOUR_MS  # 2013-01-01 06:00 UTC + h hours


@pytest.mark.parametrize("operator", [HourlyWeatherDelays, HourlyWeatherDelaysBatch], ids=["on_event", "batch"])
@pytest.mark.parametrize("events_per_epoch", [2, 100], ids=["epochs", "one-epoch"])
def test_repeated_observation_last_wins_and_edge_hours(operator, events_per_epoch, tmp_path) -> None:
    """Hand-made input: an hour observed twice (the later observation in replay order
    wins, across epochs), an hour without an observation (null weather), an hour with
    only missing delays (NaN mean), an observation without flights (no row), weather
    offsets with gaps; against ``hourly_weather_delays`` on the same rows. The repeated
    observation's two rows come in different epochs, or both in the one epoch."""
    flights = pd.DataFrame({
        "origin": ["EWR", "EWR", "EWR", "EWR", "JFK", "JFK"],
        "hour": [_hour(0), _hour(0), _hour(1), _hour(3), _hour(0), _hour(0)],
        "minute": [5, 40, 10, 0, 15, 30],
        "dep_delay": [3.0, None, 7.0, -2.0, None, math.nan],
    })
    weather = pd.DataFrame({  # replay order per origin
        "origin": ["EWR", "EWR", "EWR", "EWR", "JFK"],
        "hour": [_hour(0), _hour(0), _hour(2), _hour(3), _hour(0)],
        "temp": [40.0, 41.5, 39.0, None, 30.0],
        "wind_speed": [5.0, 6.0, 7.0, 8.0, 9.0],
        "precip": [0.0, 0.01, 0.0, 0.0, 0.0],
        "visib": [10.0, 9.0, 10.0, 10.0, 2.0],
    })

    def table(rows: pd.DataFrame, stamps: pd.Series, columns: tuple[str, ...]) -> pa.Table:
        keys = [f"{o}|{h}".encode() for o, h in zip(rows["origin"], rows["hour"])]
        return pa.table({"key": pa.array(keys, pa.binary()), "timestamp": pa.array(stamps, pa.int64()),
                         **{c: pa.array(rows[c], pa.float64(), from_pandas=False) for c in columns}})

    def parts(frame: pd.DataFrame, stamps: pd.Series, columns: tuple[str, ...], gaps: bool) -> dict:
        out = {}
        for origin, rows in frame.groupby("origin", sort=True):
            t = table(rows, stamps[rows.index], columns)
            if gaps:  # every other offset is a gap
                t = t.append_column(OFFSET_COLUMN, pa.array(range(1, 2 * len(t), 2), pa.int64()))
            out[origin] = t
        return out

    flights_source = TableSource("flights", parts(
        flights, flights["hour"] + flights["minute"] * 60_000, ("dep_delay",), gaps=False))
    weather_source = TableSource("weather", parts(weather, weather["hour"], WEATHER_COLUMNS, gaps=True))
    job = Job(name="weather_edges", source=UnionSource([flights_source, weather_source], name="edges"),
              operators=[operator()],
              sinks={"main": ParquetSink("edges_main", OUTPUT_SCHEMA), "late": ParquetSink("edges_late", LATE_SCHEMA)},
              events_per_epoch=events_per_epoch, max_out_of_orderness_ms=HOUR_MS)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    results = runner.run()
    assert len(results) >= 3 if events_per_epoch == 2 else len(results) == 1

    expected = hourly_weather_delays(flights, weather)
    assert expected["temp"].tolist()[:1] == [41.5]  # the oracle, too, keeps the later observation
    _check_run(runner, expected)
