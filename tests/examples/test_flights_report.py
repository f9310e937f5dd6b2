"""The flights report and ``platform/run-flights.sh``: the report compares every output
column with the pandas oracle through ``assert_equals_oracle`` (the tests' comparison),
reads the store from ``$DKVSTREAM_STORE``, and the script exits non-zero without
reporting the store's earlier results when the Dagster run fails."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples import flights_report
from dkvstream.examples.flights import flights_job
from dkvstream.examples.flights_oracle import assert_equals_oracle
from dkvstream.operators.runtime.driver import JobRunner

ROOT = Path(__file__).resolve().parents[2]
YES = re.compile(r"equals the pandas oracle.*: yes")


@pytest.fixture(scope="module")
def finished_store(tmp_path_factory) -> Path:
    """A store holding a finished, correct run of the flights job (in-process tasks, ~6 s)."""
    root = tmp_path_factory.mktemp("flights") / "store"
    JobRunner(flights_job(), None, str(root)).run()
    return root


def _as_output(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame, preserve_index=False)


def _altered(oracle: pd.DataFrame, column: str) -> pd.DataFrame:
    """The oracle with one value of ``column`` changed (in a row where it is not null)."""
    frame = oracle.copy()
    row = frame.index[frame[column].notna()][100]
    value = frame.at[row, column]
    if isinstance(value, str):
        frame.at[row, column] = value + "X"
    elif isinstance(value, pd.Timestamp):
        frame.at[row, column] = value + pd.Timedelta(hours=1)
    elif column in ("dep_delay_mean", "dep_delay_max"):
        frame.at[row, column] = value * (1 + 1e-6) + 1e-6  # beyond the 1e-9 relative tolerance
    else:
        frame.at[row, column] = value + 1
    return frame


def _nan_against_number(oracle: pd.DataFrame, column: str, nan_in_oracle: bool) -> pd.DataFrame:
    """The oracle with one value of ``column`` turned into NaN, or one NaN into 0.0."""
    frame = oracle.copy()
    rows = frame.index[frame[column].notna() if nan_in_oracle else frame[column].isna()]
    assert len(rows), f"the oracle has no {'number' if nan_in_oracle else 'NaN'} in {column}"
    frame.at[rows[0], column] = np.nan if nan_in_oracle else 0.0
    return frame


def test_the_oracle_equals_itself(flights_oracle) -> None:
    assert_equals_oracle(_as_output(flights_oracle), flights_oracle)
    # Within the tolerance: a float sum in another order differs in the last bits.
    close = flights_oracle.copy()
    close["dep_delay_mean"] = close["dep_delay_mean"] * (1 + 1e-12)
    assert_equals_oracle(_as_output(flights_oracle), close)


@pytest.mark.parametrize("column", ["origin", "dest", "window_start", "window_end", "flights",
                                    "cancelled", "dep_delay_mean", "dep_delay_max"])
def test_any_differing_column_fails(flights_oracle, column) -> None:
    assert list(flights_oracle.columns)[-1] == "dep_delay_max"  # every column is listed here
    with pytest.raises(AssertionError):
        assert_equals_oracle(_as_output(flights_oracle), _altered(flights_oracle, column))


@pytest.mark.parametrize("nan_in_oracle", [True, False], ids=["nan-in-oracle", "nan-in-output"])
@pytest.mark.parametrize("column", ["dep_delay_mean", "dep_delay_max"])
def test_nan_never_equals_a_number(flights_oracle, column, nan_in_oracle) -> None:
    with pytest.raises(AssertionError, match=f"column {column} differs in 1 rows"):
        assert_equals_oracle(_as_output(flights_oracle),
                             _nan_against_number(flights_oracle, column, nan_in_oracle))


def test_a_missing_or_extra_column_fails(flights_oracle) -> None:
    with pytest.raises(AssertionError, match="columns"):
        assert_equals_oracle(_as_output(flights_oracle.drop(columns=["dep_delay_max"])),
                             flights_oracle)
    with pytest.raises(AssertionError, match="columns"):
        assert_equals_oracle(_as_output(flights_oracle.assign(extra=1)), flights_oracle)


def test_report_reads_dkvstream_store(finished_store, tmp_path, monkeypatch, capsys) -> None:
    """With the store only in ``$DKVSTREAM_STORE`` (none in the working directory), the
    report finds the finished run and finds it equal to the oracle."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DKVSTREAM_STORE", str(finished_store))
    assert flights_report.main([]) == 0
    out = capsys.readouterr().out
    assert "8 committed epochs" in out and "(finished)" in out, out
    assert YES.search(out), out


@pytest.mark.parametrize("change", ["dep_delay_max", "dep_delay_mean", "flights",
                                    "nan-dep_delay_max", "nan-dep_delay_mean"])
def test_report_fails_when_any_column_differs(finished_store, flights_oracle, monkeypatch, capsys,
                                              change) -> None:
    """The report compares with the same function as the tests: an oracle altered in any
    column (a NaN against a number too) makes it say NO and exit 1."""
    if change.startswith("nan-"):
        altered = _nan_against_number(flights_oracle, change[4:], nan_in_oracle=False)
    else:
        altered = _altered(flights_oracle, change)
    monkeypatch.setattr(flights_report, "route_daily_delays_oracle", lambda: altered)
    assert flights_report.main(["--store", str(finished_store)]) == 1
    out = capsys.readouterr().out
    assert not YES.search(out) and "equals the pandas oracle (63,815 rows): NO" in out, out


def test_run_flights_fails_without_java_and_reports_nothing(finished_store) -> None:
    """``JAVA_HOME`` pointing nowhere: Spark cannot start, the Dagster run fails; the
    script exits non-zero and does not print the earlier, correct run's results as if
    they were this run's. (``java`` stays on PATH, so setup.sh installs nothing.)"""
    before = sorted(p.relative_to(finished_store) for p in finished_store.rglob("*"))
    env = {**os.environ, "DKVSTREAM_STORE": str(finished_store), "JAVA_HOME": "/nonexistent",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(ROOT / "platform" / "run-flights.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Materialization failed" in out or "RUN_FAILURE" in out, out[-3000:]
    assert "the Dagster run failed" in proc.stderr, out[-3000:]
    assert not YES.search(out), out[-3000:]
    assert "committed epochs" not in out and "route_daily_delays:" not in out, out[-3000:]
    assert sorted(p.relative_to(finished_store) for p in finished_store.rglob("*")) == before
