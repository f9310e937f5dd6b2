"""The pandas oracle of the flights job: a plain groupby over the whole file.

``groupby([origin, dest, window_start])`` gives the rows the job must produce
(spec: ``shared/specs/flights-route-delays.md``).
"""
from __future__ import annotations

import pandas as pd

from operators.examples.flights_data import DAY_MS, SHIFT_MS, flights_csv_path

KEY_COLUMNS = ["origin", "dest", "window_start"]


def route_daily_delays_oracle(scale: int = 1) -> pd.DataFrame:
    """Expected output rows, sorted by (origin, dest, window_start).

    Returns:
        DataFrame with the spec's columns; timestamps tz-aware UTC (ms).
    """
    # Read with pandas, not the job's own loader, so the oracle shares no code with it.
    df = pd.read_csv(flights_csv_path(), usecols=["origin", "dest", "dep_time", "dep_delay", "time_hour", "minute"])
    hour = pd.to_datetime(df["time_hour"], utc=True).astype("datetime64[ms, UTC]").astype("int64")
    event_ms = hour + df["minute"].astype("int64") * 60_000
    frames = []
    for k in range(scale):
        f = df[["origin", "dest", "dep_time", "dep_delay"]].copy()
        ms = event_ms + k * SHIFT_MS
        f["window_start"] = ms - ms % DAY_MS
        frames.append(f)
    all_rows = pd.concat(frames, ignore_index=True)
    g = all_rows.groupby(KEY_COLUMNS, sort=True)
    out = pd.DataFrame({
        "flights": g.size(),
        "cancelled": g.size() - g["dep_time"].count(),
        "dep_delay_mean": g["dep_delay"].mean(),
        "dep_delay_max": g["dep_delay"].max().astype("float64"),
    }).reset_index()
    out["window_end"] = out["window_start"] + DAY_MS
    for c in ("window_start", "window_end"):
        out[c] = pd.to_datetime(out[c], unit="ms", utc=True).astype("datetime64[ms, UTC]")
    out["flights"] = out["flights"].astype("int64")
    out["cancelled"] = out["cancelled"].astype("int64")
    return out[["origin", "dest", "window_start", "window_end", "flights", "cancelled",
                "dep_delay_mean", "dep_delay_max"]]
