"""The flights output as a picture (``dkvstream.examples.flights_plot``): the monthly means it draws
against pandas over the raw flights, and the sink asset's plot metadata."""
from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights_data import replay_partitions
from dkvstream.examples.flights_plot import delay_heatmap_png, delay_plot_metadata, monthly_route_delays


def test_monthly_means_equal_pandas_over_the_raw_flights(flights_oracle) -> None:
    """The job's output (here the oracle's, which equals it) folded into months gives
    what pandas computes from the flights themselves, by the UTC month of their event
    time (the job's)."""
    got = monthly_route_delays(pa.Table.from_pandas(flights_oracle, preserve_index=False))
    raw = pa.concat_tables(replay_partitions(1).values()).to_pandas()
    raw["route"] = raw["origin"] + "-" + raw["dest"]
    raw["month"] = pd.to_datetime(raw["event_time_ms"], unit="ms", utc=True).dt.month
    want = raw.groupby(["route", "month"]).agg(flights=("dep_delay", "size"), dep_delay_mean=("dep_delay", "mean"))
    want = want.reset_index().sort_values(["route", "month"], ignore_index=True)
    assert got[["route", "month"]].equals(want[["route", "month"]].astype(got[["route", "month"]].dtypes))
    assert (got["flights"].to_numpy() == want["flights"].to_numpy()).all()
    np.testing.assert_allclose(got["dep_delay_mean"], want["dep_delay_mean"], rtol=1e-9, equal_nan=True)


def test_plot_metadata_is_an_inline_png(flights_oracle) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib comes with the bench extra")
    table = pa.Table.from_pandas(flights_oracle, preserve_index=False)
    md = delay_plot_metadata(table)["delay_plot"].value
    prefix = "![mean departure delay per route and month](data:image/png;base64,"
    assert md.startswith(prefix) and md.endswith(")")
    assert base64.b64decode(md[len(prefix):-1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert delay_plot_metadata(table.slice(0, 0)) == {}
    assert delay_heatmap_png(monthly_route_delays(table), routes=3)[:4] == b"\x89PNG"
