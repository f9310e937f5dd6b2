"""The window benchmark's sessions job is right: sessions per aircraft over the first
days of the replay equal a pandas sessionisation of the same flights."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.windows_throughput import sessions_job
from dkvstream.examples.flights import HOUR_MS
from dkvstream.examples.flights_data import ORIGINS
from dkvstream.operators.runtime.driver import JobRunner

GAP_MS = 6 * HOUR_MS


def _oracle(source) -> pd.DataFrame:
    flights = pa.concat_tables([source.partition_table(p) for p in ORIGINS]).to_pandas()
    flights = flights.sort_values(["tailnum", "event_time_ms"], kind="stable")
    ts = flights.event_time_ms.to_numpy()
    new = (flights.tailnum != flights.tailnum.shift()).to_numpy()
    new[1:] |= np.diff(ts) > GAP_MS
    flights["session"] = np.cumsum(new)
    g = flights.groupby("session")
    return pd.DataFrame({"key": g.tailnum.first(), "window_start": g.event_time_ms.min(),
                         "window_end": g.event_time_ms.max() + GAP_MS, "flights": g.size(),
                         "dep_delay_mean": g.dep_delay.mean()}).reset_index(drop=True)


def test_sessions_per_aircraft_equal_pandas(tmp_path) -> None:
    job = sessions_job(1, 5_000, days=10)
    with JobRunner(job, None, str(tmp_path)) as runner:
        runner.run()
        got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    want = _oracle(job.source)
    for c in ("window_start", "window_end"):
        got[c] = got[c].astype("datetime64[ms, UTC]").astype("int64")
    got = got.sort_values(["key", "window_start"]).reset_index(drop=True)
    want = want.sort_values(["key", "window_start"]).reset_index(drop=True)
    assert len(got) == len(want) > 1_000
    for c in ("key", "window_start", "window_end", "flights"):
        assert got[c].tolist() == want[c].tolist(), c
    assert np.allclose(got.dep_delay_mean, want.dep_delay_mean, equal_nan=True, rtol=1e-9)
