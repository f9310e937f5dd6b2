"""The pandas oracle of the flights-and-weather job (``examples/flights_weather.py``).

Flights grouped by (origin, time_hour): the number of flights and the mean departure
delay (pandas skips a missing delay); left-merged on (origin, time_hour) with the
weather, of which only the last observation of an (origin, time_hour) in replay order
(file order, copies in order) is kept. The CSV files are read with pandas, not with the
job's loaders, so the oracle shares no code with the job.
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from dkvstream.examples.flights_data import SHIFT_MS, flights_csv_path
from dkvstream.examples.flights_oracle import assert_rows_equal
from dkvstream.examples.flights_weather import WEATHER_COLUMNS, weather_csv_path

KEY_COLUMNS = ["origin", "hour"]
OUTPUT_COLUMNS = ["origin", "hour", "flights", "dep_delay_mean", *WEATHER_COLUMNS]


def hourly_weather_delays(flights: pd.DataFrame, weather: pd.DataFrame) -> pd.DataFrame:
    """The job's rows for given flights and weather.

    Args:
        flights: ``origin``, ``hour`` (int64 ms, UTC), ``dep_delay`` (float, NaN: none).
        weather: ``origin``, ``hour`` (int64 ms) and ``WEATHER_COLUMNS``, in replay order
            per origin (a later row of an (origin, hour) replaces an earlier one).

    Returns:
        One row per (origin, hour) with flights, sorted, columns ``OUTPUT_COLUMNS``; ``hour``
        tz-aware UTC (ms).
    """
    g = flights.groupby(KEY_COLUMNS, sort=True)
    out = pd.DataFrame({"flights": g.size().astype("int64"),
                        "dep_delay_mean": g["dep_delay"].mean().astype("float64")}).reset_index()
    last = weather.drop_duplicates(KEY_COLUMNS, keep="last")[[*KEY_COLUMNS, *WEATHER_COLUMNS]]
    out = out.merge(last, on=KEY_COLUMNS, how="left", validate="one_to_one")
    out["hour"] = pd.to_datetime(out["hour"], unit="ms", utc=True).astype("datetime64[ms, UTC]")
    return out[OUTPUT_COLUMNS].sort_values(KEY_COLUMNS).reset_index(drop=True)


def flights_weather_oracle(scale: int = 1) -> pd.DataFrame:
    """Expected output of ``flights_weather_job(scale)``, sorted by (origin, hour).

    Copy k of the year (k < ``scale``) has its flights' and observations' hours shifted
    by k*364 days; the weather replay puts copy k+1's observation of an hour after copy
    k's, so it wins where the copies overlap.
    """
    def hour_ms(column: pd.Series) -> pd.Series:
        return pd.to_datetime(column, utc=True).astype("datetime64[ms, UTC]").astype("int64")

    f = pd.read_csv(flights_csv_path(), usecols=["origin", "dep_delay", "time_hour"])
    w = pd.read_csv(weather_csv_path(), usecols=["origin", "time_hour", *WEATHER_COLUMNS])
    f["hour"], w["hour"] = hour_ms(f["time_hour"]), hour_ms(w["time_hour"])
    flights = pd.concat([f.assign(hour=f["hour"] + k * SHIFT_MS) for k in range(scale)], ignore_index=True)
    weather = pd.concat([w.assign(hour=w["hour"] + k * SHIFT_MS) for k in range(scale)], ignore_index=True)
    # Replay order of the weather: by hour, stable on (copy, file) order.
    weather = weather.sort_values("hour", kind="stable")
    return hourly_weather_delays(flights, weather)


def assert_equals_oracle(output: pa.Table, oracle: pd.DataFrame) -> None:
    """Asserts the job's output equals ``oracle``: the same columns, every (origin, hour)
    once, counts and hours exact, float columns to 1e-9 relative with NaN (no delay, no
    weather) equal only to NaN.

    Raises:
        AssertionError: naming the first difference found.
    """
    assert_rows_equal(output, oracle, KEY_COLUMNS)
