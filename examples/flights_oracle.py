"""The pandas oracle of the flights job: a plain groupby over the whole file.

``groupby([origin, dest, window_start])`` gives the rows the job must produce
(spec: ``shared/specs/flights-route-delays.md``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from dkvstream.examples.flights_data import DAY_MS, SHIFT_MS, flights_csv_path

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


def assert_equals_oracle(output: pa.Table, oracle: pd.DataFrame) -> None:
    """Asserts the job's output equals the oracle: the same columns, every route and window
    once, every column equal; float columns (the delay mean and maximum) to 1e-9 relative,
    with a NaN equal only to a NaN. The tests and ``dkvstream.examples.flights_report`` both use it.

    Args:
        output: the job's sink as read back (one row per route and window, any order).
        oracle: ``route_daily_delays_oracle()`` or a frame of the same columns.

    Raises:
        AssertionError: naming the first difference found (raised explicitly, so the check
            also holds under ``python -O``).
    """
    assert_rows_equal(output, oracle, KEY_COLUMNS)


def assert_rows_equal(output: pa.Table, oracle: pd.DataFrame, key_columns: list[str]) -> None:
    """Asserts ``output`` (any row order) equals ``oracle``: the same columns, each key
    (``key_columns``) once, every column equal; float columns to 1e-9 relative, with a
    NaN equal only to a NaN (the oracles of ``dkvstream.examples.flights`` and
    ``dkvstream.examples.flights_weather``).

    Raises:
        AssertionError: naming the first difference found (raised explicitly, so the check
            also holds under ``python -O``).
    """
    got = output.to_pandas()
    if sorted(got.columns) != sorted(oracle.columns):
        raise AssertionError(f"columns {sorted(got.columns)}, oracle has {sorted(oracle.columns)}")
    dupes = got.duplicated(key_columns)
    if dupes.any():
        raise AssertionError(f"{int(dupes.sum())} duplicate rows, "
                             f"e.g. {got[dupes].head(3).to_dict('records')}")
    got = got.sort_values(key_columns).reset_index(drop=True)
    exp = oracle.sort_values(key_columns).reset_index(drop=True)
    if len(got) != len(exp):
        raise AssertionError(f"{len(got)} rows, oracle has {len(exp)}")
    for c in exp.columns:
        if pd.api.types.is_float_dtype(exp[c]) or pd.api.types.is_float_dtype(got[c]):
            g, e = got[c].to_numpy(dtype=float), exp[c].to_numpy(dtype=float)
            # NaN (no delay, no weather) must be NaN on both sides.
            close = np.isnan(e) | np.isclose(g, e, rtol=1e-9, atol=0)
            mismatch = (np.isnan(g) != np.isnan(e)) | ~close
        else:
            mismatch = got[c].to_numpy() != exp[c].to_numpy()
        if mismatch.any():
            raise AssertionError(
                f"column {c} differs in {int(mismatch.sum())} rows, first: "
                f"{got[mismatch].head(1).to_dict('records')} "
                f"vs {exp[mismatch].head(1).to_dict('records')}")
