"""The ``bootstrap_state`` Dagster job writes a stream job's initial state from a Parquet
table; it is registered with every project's ``Definitions``."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from dagster import DagsterInstance

from dkvstream.assets.bootstrap import bootstrap_state_job
from dkvstream.assets.definitions import dkvstream_definitions
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.tools.state_reader import read_state
from dkvstream.storage.objectstore import open_object_store
from tests.operators.lifecycle.bootstrap_jobs import count_job
from tests.running_max_job import running_max_job


def test_bootstrap_state_job_writes_the_table(tmp_path) -> None:
    pq.write_table(pa.table({"key": ["a", "b"], "value": [7, 8]}), tmp_path / "counts.parquet")
    store = str(tmp_path / "store")
    run = bootstrap_state_job.execute_in_process(
        run_config={"ops": {"write_initial_state": {"config": {
            "job": "tests.operators.lifecycle.bootstrap_jobs:count_job",
            "states": {"running_count.count": str(tmp_path / "counts.parquet")}}}}},
        resources={"object_store": ObjectStoreResource(root_uri=store)}, instance=DagsterInstance.ephemeral())
    assert run.success
    done = run.output_for_node("write_initial_state")
    assert done["epoch"] == 1 and done["entries"] == 2 and done["checkpoint"].endswith("epoch-0000000001.json")
    state = read_state(open_object_store(store), count_job(), "count")
    assert sorted(zip(state.column("subject_key").to_pylist(), state.column("value").to_pylist())) == [
        (b"a", 7), (b"b", 8)]
    assert dkvstream_definitions(running_max_job("maxima_job")).get_job_def("bootstrap_state") is not None
