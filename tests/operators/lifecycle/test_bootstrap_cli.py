"""``python -m dkvstream.operators.tools.bootstrap``: writes the state a Parquet file holds,
prints each range, refuses a bad table with a one-line message and exit status 2."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from dkvstream.operators.tools.bootstrap import main
from dkvstream.operators.tools.state_reader import read_state
from dkvstream.storage.objectstore import open_object_store
from tests.operators.lifecycle.bootstrap_jobs import count_job

JOB = "tests.operators.lifecycle.bootstrap_jobs:count_job"


def test_cli_writes_the_table_and_prints_each_range(tmp_path) -> None:
    pq.write_table(pa.table({"key": ["a", "b", "c"], "value": [1, 2, 3]}), tmp_path / "counts.parquet")
    pq.write_table(pa.table({"key": ["a"], "timestamp": [5]}), tmp_path / "timers.parquet")
    out = io.StringIO()
    store = str(tmp_path / "store")
    status = main(["--store", store, "--job", JOB, "--state", f"running_count.count={tmp_path / 'counts.parquet'}",
                   "--timers", f"running_count={tmp_path / 'timers.parquet'}", "--parallelism", "3"], out)
    assert status == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and lines[0].startswith("running_count kg-0000-0005: ")
    assert "job boot_count: 3 ranges, 4 entries" in lines[-1] and "epoch-0000000001.json" in lines[-1]
    state = read_state(open_object_store(store), count_job(), "count")
    assert sorted(zip(state.column("subject_key").to_pylist(), state.column("value").to_pylist())) == [
        (b"a", 1), (b"b", 2), (b"c", 3)]


def test_cli_refuses_with_a_one_line_message(tmp_path, capsys) -> None:
    pq.write_table(pa.table({"key": ["a", "a"], "value": [1, 2]}), tmp_path / "dup.parquet")
    store = str(tmp_path / "store")
    assert main(["--store", store, "--job", JOB, "--state", "running_count.nope=x.parquet"]) == 2
    assert "operator 'running_count' declares no state 'nope'" in capsys.readouterr().err
    assert main(["--store", store, "--job", JOB, "--state", "running_count=x.parquet"]) == 2
    assert "give OPERATOR.STATE_ID=PATH" in capsys.readouterr().err
    assert main(["--store", store, "--job", JOB, "--state", f"running_count.count={tmp_path / 'dup.parquet'}"]) == 2
    assert "key b'a' appears twice" in capsys.readouterr().err
    out = io.StringIO()
    pq.write_table(pa.table({"key": ["a"], "value": [1]}), tmp_path / "one.parquet")
    assert main(["--store", store, "--job", JOB, "--json", "--state",
                 f"running_count.count={tmp_path / 'one.parquet'}"], out) == 0
    assert json.loads(out.getvalue())["entries"] == 1
