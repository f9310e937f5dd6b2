"""The pandas oracle of the aircraft rotations job (``aircraft_rotations``).

Reads the CSV with pandas (no code shared with the job's loader), replays each origin in
the spec's order, and computes what the ``aircraft`` table holds after any committed
epoch and the ``carrier_daily`` table of a drained run. The epoch each event belongs
to comes from the checkpoints' source offsets, the job's only input besides the data.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dkvstream.examples.flights_data import DAY_MS, ORIGINS, flights_csv_path

ROLLING = 20


def replay(days: int | None = None) -> pd.DataFrame:
    """Flights with a tail number in replay order per origin: columns of the CSV plus
    ``event_ms``, ``part`` (origin index) and ``offset`` (position in the partition)."""
    df = pd.read_csv(flights_csv_path())
    hour = pd.to_datetime(df["time_hour"], utc=True).astype("datetime64[ms, UTC]").astype("int64")
    df["event_ms"] = hour + df["minute"].astype("int64") * 60_000
    df["date"] = pd.to_datetime(df[["year", "month", "day"]])
    df["file_pos"] = np.arange(len(df))
    frames = []
    start = df["event_ms"].min() - df["event_ms"].min() % DAY_MS
    for i, origin in enumerate(ORIGINS):
        f = df[df["origin"] == origin].sort_values(["date", "sched_dep_time", "file_pos"], kind="stable")
        f = f[f["tailnum"].notna()]
        if days is not None:
            f = f[f["event_ms"] < start + days * DAY_MS]
        f = f.assign(part=i, offset=np.arange(len(f)))
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def with_epochs(flights: pd.DataFrame, offsets_per_epoch: list[dict[str, int]]) -> pd.DataFrame:
    """Adds ``epoch``: the first epoch whose committed offset of the flight's origin is
    past the flight's offset."""
    epoch = np.zeros(len(flights), dtype=np.int64)
    for e in range(len(offsets_per_epoch), 0, -1):
        ends = np.array([offsets_per_epoch[e - 1][o] for o in ORIGINS])[flights["part"].to_numpy()]
        epoch[flights["offset"].to_numpy() < ends] = e
    return flights.assign(epoch=epoch)


def aircraft_rows(flights: pd.DataFrame, as_of_epoch: int, rolling: int = ROLLING) -> pd.DataFrame:
    """The ``aircraft`` table after ``as_of_epoch``: one row per tail number, sorted."""
    f = flights[(flights["epoch"] <= as_of_epoch) & (flights["epoch"] > 0) & flights["air_time"].notna()]
    f = f.sort_values(["epoch", "event_ms", "part", "offset"], kind="stable").copy()
    g = f.groupby("tailnum", sort=False)
    f["flights"] = g.cumcount() + 1
    prev_dest = g["dest"].shift(1)
    f["repositioned"] = (prev_dest.notna() & (prev_dest != f["origin"])).astype("int64").groupby(f["tailnum"]).cumsum()
    f["last_arrival_ms"] = f["event_ms"] + ((f["dep_delay"].fillna(0) + f["air_time"]) * 60_000).round().astype("int64")
    known = f[f["arr_delay"].notna()]
    rolling = known.groupby("tailnum", sort=False)["arr_delay"].transform(
        lambda s: s.rolling(rolling, min_periods=1).mean())
    f["rolling_arr_delay"] = rolling.reindex(f.index)
    f["rolling_arr_delay"] = f.groupby("tailnum", sort=False)["rolling_arr_delay"].ffill()
    last = f.groupby("tailnum", sort=True).tail(1)
    out = pd.DataFrame({"tailnum": last["tailnum"], "flights": last["flights"].astype("int64"),
                        "last_origin": last["origin"], "last_dest": last["dest"],
                        "last_arrival_ms": last["last_arrival_ms"], "rolling_arr_delay": last["rolling_arr_delay"],
                        "repositioned": last["repositioned"].astype("int64")})
    return out.sort_values("tailnum").reset_index(drop=True)


def carrier_daily_rows(flights: pd.DataFrame) -> pd.DataFrame:
    """The ``carrier_daily`` table of a drained run, sorted by (carrier, day)."""
    f = flights[flights["air_time"].notna()].copy()
    f["day_ms"] = f["event_ms"] - f["event_ms"] % DAY_MS
    g = f.groupby(["carrier", "day_ms"], sort=True)
    out = pd.DataFrame({"flights": g.size(), "aircraft": g["tailnum"].nunique(),
                        "arr_delay_sum": g["arr_delay"].sum(), "arr_delay_count": g["arr_delay"].count()})
    out = out.reset_index().rename(columns={"day_ms": "day"})
    return out.astype({"flights": "int64", "aircraft": "int64", "arr_delay_count": "int64", "day": "int64"})


def frame_differences(got: pd.DataFrame, exp: pd.DataFrame, keys: list[str], floats: list[str]) -> str | None:
    """None if the frames hold the same rows (any order; ``floats`` columns to 1e-9
    relative, NaN equal to NaN), else a description of the first difference."""
    got = got.sort_values(keys).reset_index(drop=True)
    exp = exp.sort_values(keys).reset_index(drop=True)
    if len(got) != len(exp):
        return f"{len(got)} rows, oracle has {len(exp)}"
    for c in exp.columns:
        g, e = got[c].to_numpy(), exp[c].to_numpy()
        if c in floats:
            g, e = g.astype(float), e.astype(float)
            ok = (np.isnan(g) & np.isnan(e)) | np.isclose(g, e, rtol=1e-9, atol=1e-12)
        else:
            ok = g == e
        if not ok.all():
            return (f"column {c} differs in {int((~ok).sum())} rows, first: "
                    f"{got[~ok].head(1).to_dict('records')} vs {exp[~ok].head(1).to_dict('records')}")
    return None


def check_run(root: str) -> str:
    """Compares a drained full-data run of ``aircraft_job()`` stored under ``root`` (run
    with every checkpoint retained) with the oracle: the table now and as of the middle
    epoch, and the carrier daily totals.

    Returns:
        a one-line summary.

    Raises:
        AssertionError: naming the table and the first difference.
    """
    from dkvstream.examples.aircraft_rotations import aircraft_job
    from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
    from dkvstream.operators.runtime.driver import JobRunner

    job = aircraft_job()
    store = JobRunner(job, None, root).store
    epochs = list_epochs(store, job.prefix)
    if not epochs or epochs[0] != 1:
        raise AssertionError(f"{root}: checkpoints {epochs[:3]}...: run with --retain-checkpoints 0")
    flights = with_epochs(replay(), [read_checkpoint(store, job.prefix, e).source_offsets for e in epochs])
    table, floats, mid = job.sinks["aircraft"], ["rolling_arr_delay", "arr_delay_sum"], len(epochs) // 2
    checks = {
        "aircraft": (table.read(store, job.prefix), aircraft_rows(flights, len(epochs)), ["tailnum"]),
        f"aircraft as of epoch {mid}": (table.scan(store, job.prefix, as_of_epoch=mid), aircraft_rows(flights, mid),
                                        ["tailnum"]),
        "carrier_daily": (job.sinks["carrier_daily"].read(store, job.prefix), carrier_daily_rows(flights),
                          ["carrier", "day"]),
    }
    for name, (got, exp, keys) in checks.items():
        diff = frame_differences(got.to_pandas(), exp, keys, floats)
        if diff:
            raise AssertionError(f"{name} under {root}: {diff}")
    return (f"{len(epochs)} epochs: aircraft ({len(checks['aircraft'][1]):,} rows), the aircraft table as of epoch "
            f"{mid} and carrier_daily ({len(checks['carrier_daily'][1]):,} rows) equal the pandas oracle")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Check a drained aircraft_job() run against the pandas oracle.")
    parser.add_argument("--store", default=".dkvstream", help="object-store root of the run")
    print(check_run(parser.parse_args().store))
