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
from dkvstream.operators.api.operator import WATERMARK_MAX
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.testing import OperatorTestHarness
from dkvstream.operators.tools.state_reader import checkpoint_entries

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
@pytest.mark.parametrize("step", [1, 100], ids=["epochs", "one-epoch"])
def test_repeated_observation_last_wins_and_edge_hours(operator, step) -> None:
    """A unit test of the operator (``OperatorTestHarness``) on hand-made input: an hour
    observed twice (the later observation in replay order wins), an hour without an
    observation (null weather), an hour with only missing delays (NaN mean), an
    observation without flights (no row); against ``hourly_weather_delays`` on the same
    rows. Events come one per epoch (the repeated observation's rows in different epochs)
    or all in one, the watermark an hour behind the newest event, as the job's bound."""
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

    def events(rows: pd.DataFrame, stamps: pd.Series, columns: tuple[str, ...], source: str) -> list[dict]:
        return [{"key": f"{r.origin}|{r.hour}", "timestamp": int(ts), "input": source,
                 **{c: float(getattr(r, c)) for c in columns}}  # None is NaN in a pandas float column
                for r, ts in zip(rows.itertuples(), stamps)]

    replay = sorted(events(weather, weather["hour"], WEATHER_COLUMNS, WeatherSource.name)
                    + events(flights, flights["hour"] + flights["minute"] * 60_000, ("dep_delay",), "flights"),
                    key=lambda e: e["timestamp"])  # stable: an hour's observations keep their order
    value_schema = pa.schema([("input", pa.string()), ("dep_delay", pa.float64()),
                              *[(c, pa.float64()) for c in WEATHER_COLUMNS]])
    harness = OperatorTestHarness(operator(), value_schema=value_schema)
    for i in range(0, len(replay), step):
        newest = max(e["timestamp"] for e in replay[:i + step])
        harness.process_events(replay[i:i + step], watermark=max(harness.watermark, newest - HOUR_MS - 1))
    harness.finish()

    expected = hourly_weather_delays(flights, weather)
    assert expected["temp"].tolist()[:1] == [41.5]  # the oracle, too, keeps the later observation
    assert harness.output("late") == []
    assert_equals_oracle(harness.output_table(), expected)
    assert harness.state_keys() == [] and harness.timers() == []  # every hour's state and timer is gone
