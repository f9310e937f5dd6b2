"""The state reader against a from-scratch replay of the events a checkpoint covers."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights import FlightsSource, flights_job
from dkvstream.examples.flights_data import DAY_MS
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import list_timers, main, read_state, to_spark


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    job = flights_job(events_per_epoch=60_000)
    runner = JobRunner(job, None, str(tmp_path_factory.mktemp("store")))
    runner.run(max_epochs=2)
    return job, runner, runner.latest()


def _open_windows(ckpt) -> pd.DataFrame:
    """Replay the events of the checkpoint's offsets with pandas; keep windows still open."""
    src = FlightsSource()
    df = pd.concat([src.read(p, 0, n).to_pandas() for p, n in ckpt.source_offsets.items()])
    df["window_start"] = df["timestamp"] - df["timestamp"] % DAY_MS
    df = df[df["window_start"] + DAY_MS > ckpt.watermark]
    g = df.groupby(["key", "window_start"])
    out = pd.DataFrame({"flights": g.size(), "cancelled": g.size() - g["dep_time"].count(),
                        "delay_sum": g["dep_delay"].sum().astype(float), "delay_count": g["dep_delay"].count()})
    return out.reset_index().sort_values(["key", "window_start"]).reset_index(drop=True)


def test_read_state_equals_replay(two_epochs) -> None:
    job, runner, ckpt = two_epochs
    state = read_state(runner.store, job, "windows")
    assert state.schema.field("map_key").type == pa.int64()
    got = pd.DataFrame({
        "key": state.column("subject_key").to_pylist(),
        "window_start": state.column("map_key").to_pylist(),
        **{f: [v[f] for v in state.column("value").to_pylist()]
           for f in ("flights", "cancelled", "delay_sum", "delay_count")},
    }).sort_values(["key", "window_start"]).reset_index(drop=True)
    exp = _open_windows(ckpt)
    assert len(got) > 0
    pd.testing.assert_frame_equal(got, exp, check_dtype=False)


def test_list_timers_one_per_open_window(two_epochs) -> None:
    job, runner, ckpt = two_epochs
    timers = list_timers(runner.store, job).to_pandas()
    exp = _open_windows(ckpt)
    got = sorted(zip(timers["subject_key"], timers["timestamp"].astype("int64")))
    assert got == sorted(zip(exp["key"], exp["window_start"] + DAY_MS))
    assert (timers["timestamp"].astype("int64") > ckpt.watermark).all()


def test_older_retained_epoch_and_errors(two_epochs) -> None:
    job, runner, _ = two_epochs
    first = read_state(runner.store, job, "windows", epoch=1)
    assert first.num_rows > 0 and first.num_rows != read_state(runner.store, job, "windows").num_rows
    with pytest.raises(KeyError, match="declares no state 'nope'"):
        read_state(runner.store, job, "nope")


def test_to_spark_and_cli(two_epochs, spark, capsys) -> None:
    job, runner, _ = two_epochs
    table = read_state(runner.store, job, "windows")
    assert to_spark(spark, table).count() == table.num_rows
    main(["--store", runner.store.root_uri, "--job", "dkvstream.examples.flights:flights_job", "--timers"])
    out = capsys.readouterr().out
    assert f"{list_timers(runner.store, job).num_rows:,} rows" in out
