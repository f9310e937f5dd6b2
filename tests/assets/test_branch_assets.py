"""The branch workflow in Dagster: branch and diff assets, the promote job, and the main's
epochs job running the promoted code; checked against the library's own results and the
windows the bug fix is known to change."""
from __future__ import annotations

from dagster import DagsterInstance, Definitions, materialize

from dkvstream.assets.branches import BranchSpec, branch_definitions
from dkvstream.assets.definitions import dkvstream_definitions
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.runtime.branches import read_promotion
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore import open_object_store
from tests.assets.live_job import NoSpark
from tests.operators.branch_jobs import (
    KEY_COLUMNS,
    BuggyRouteDailyDelays,
    RouteDailyDelays,
    expected_mean_changes,
    flights_variant,
)


def _metadata(result, key: str) -> dict:
    [mat] = result.asset_materializations_for_node(key)
    return {k: v.value for k, v in mat.metadata.items()}


def _branch_run(defs, resources, instance):
    result = materialize(defs["assets"], resources=resources, instance=instance)
    assert result.success
    return _metadata(result, "flights_fix_branch"), _metadata(result, "flights_fix_diff")


def test_branch_diff_promote_in_dagster(tmp_path) -> None:
    root = tmp_path / "store"
    store = open_object_store(str(root))
    main = flights_variant("flights", BuggyRouteDailyDelays())
    fixed = flights_variant("flights_fix", RouteDailyDelays())
    resources = {"object_store": ObjectStoreResource(root_uri=str(root)), "dkv": DKVSettingsResource(),
                 "pyspark": NoSpark(spark_config={})}
    defs = branch_definitions(main, fixed, {"main": KEY_COLUMNS})
    instance = DagsterInstance.ephemeral()
    with JobRunner(main, None, store, retain_checkpoints=None) as runner:
        runner.run(max_epochs=2)
    meta, _ = _branch_run(defs, resources, instance)  # forks at epoch 2
    assert (meta["fork_epoch"], meta["epoch"], meta["epochs_this_run"]) == (2, 2, 0)
    with JobRunner(main, None, store, retain_checkpoints=None) as runner:
        runner.run(max_epochs=2)  # main at epoch 4; the branch follows at its next materialization
    meta, diff = _branch_run(defs, resources, instance)
    assert (meta["epoch"], meta["epochs_this_run"], meta["epochs_behind"]) == (4, 2, 0)
    emitted = {(r["origin"], r["dest"], int(r["window_start"].timestamp() * 1000))
               for r in fixed.sinks["main"].read(store, fixed.prefix).to_pylist()}
    assert diff["main_changed"] == len(expected_mean_changes(8_000) & emitted) > 0
    assert diff["main_columns"]["changed"] == {"dep_delay_mean": diff["main_changed"]}
    assert diff["main_only_in_main"] == diff["main_only_in_branch"] == 0
    assert "dep_delay_mean" in diff["main_epochs"]

    # Promote, then the main's epochs job (Definitions that know the branch) runs the fix.
    [promote_job] = [j for j in defs["jobs"] if getattr(j, "name", None) == "promote_flights_fix"]
    assert promote_job.execute_in_process(resources={"object_store": resources["object_store"]},
                                          instance=instance).success
    assert read_promotion(store, "flights").epoch == 5
    full = dkvstream_definitions(main, branches=[BranchSpec("flights", fixed, {"main": KEY_COLUMNS})],
                                 resources=resources)
    Definitions.validate_loadable(full)
    assert {"flights", "branch_flights_fix", "diff_flights_fix", "promote_flights_fix"} <= {j.name for j in full.jobs}
    assert full.resolve_job_def("flights").execute_in_process(instance=instance).success
    # Oracle: the fixed code from scratch; the main's epochs after the promotion are its
    # epochs after 4, one epoch later.
    ref = flights_variant("ref_new", RouteDailyDelays())
    with JobRunner(ref, None, store, retain_checkpoints=None) as runner:
        runner.run()
    got, want = _by_epoch(store, main), _by_epoch(store, ref)
    assert {e - 1: rows for e, rows in got.items() if e > 5} == {e: rows for e, rows in want.items() if e > 4}


def _by_epoch(store, job) -> dict[int, list]:
    from dkvstream.operators.runtime.branches import published_by_epoch, read_epoch

    return {e: sorted(map(repr, read_epoch(store, job, "main", keys, e).to_pylist()))
            for e, keys in published_by_epoch(store, job, "main").items()}
