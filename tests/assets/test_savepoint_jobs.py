"""The savepoint, savepoint_drop and fork_stream_job Dagster jobs against a store written
by a real (in-process) job run; oracle: the Python API's view of the same store."""
from __future__ import annotations

from dkvstream.assets.definitions import dkvstream_definitions
from dkvstream.assets.jobs import op_config
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.assets.savepoints import (
    drop_fork_job,
    drop_savepoint_job,
    fork_stream_job,
    savepoint_job,
    savepoints_asset_key,
)
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.pins import read_pins
from dkvstream.operators.runtime.savepoints import list_savepoints
from dkvstream.storage.objectstore import open_object_store
from tests.operators import fork_jobs


def test_savepoint_fork_and_drop_jobs(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent").run(max_epochs=2)
    resources = {"object_store": ObjectStoreResource(root_uri=root)}
    result = savepoint_job.execute_in_process(run_config=op_config("take_savepoint", "parent", name="sp"),
                                              resources=resources)
    [mat] = result.asset_materializations_for_node("take_savepoint")
    meta = {k: v.value for k, v in mat.metadata.items()}
    [sp] = list_savepoints(root, "parent")
    assert mat.asset_key == savepoints_asset_key("parent")
    assert (meta["epoch"], meta["files"], meta["bytes_pinned"]) == (2, sp.files, sp.bytes)
    result = fork_stream_job.execute_in_process(
        run_config=op_config("fork", "parent", child="child", savepoint="sp"), resources=resources)
    assert result.output_for_node("fork") == {"child": "child", "epoch": 2}
    store = open_object_store(root)
    assert list_epochs(store, "jobs/child") == [2]
    drop_savepoint_job.execute_in_process(run_config=op_config("drop_savepoint", "parent", name="sp"),
                                          resources=resources)
    assert list_savepoints(store, "parent") == []
    assert [p.holder for p in read_pins(store, "jobs/parent")] == ["child"]  # the fork's pin stays
    result = drop_fork_job.execute_in_process(run_config=op_config("drop_fork", "child"), resources=resources)
    assert result.output_for_node("drop_fork") == {"child": "child", "parent": "parent"}
    assert read_pins(store, "jobs/parent") == []


def test_definitions_have_the_savepoints_asset_and_jobs() -> None:
    defs = dkvstream_definitions(fork_jobs.job("parent"))
    assert savepoints_asset_key("parent") in defs.resolve_all_asset_keys()
    for name in ("savepoint", "savepoint_drop", "fork_stream_job", "fork_drop"):
        assert defs.get_job_def(name).name == name
