"""Dropping a fork: its pins at every owner go, the owners' full sweeps then collect
what no other record names, and the dropped fork never runs again.

Oracle: the reachability model (``test_savepoints_forks``): after the drop and the
parent's full sweep, the parent's DKV files are exactly those named by the parent's
retained checkpoints and savepoints, and every one of those exists.
"""
from __future__ import annotations

import pytest

from dkvstream.operators import paths
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.control import acquire_lease
from dkvstream.operators.runtime.forks import drop_fork, fork_job, forked_from
from dkvstream.operators.runtime.pins import files_by_owner, held_at, hold_for_checkpoints, read_pins
from dkvstream.operators.runtime.remote_compaction import compact_job
from dkvstream.operators.runtime.savepoints import savepoint
from dkvstream.storage.objectstore import open_object_store
from tests.operators import fork_jobs
from tests.operators import small_keyed_count as small
from tests.operators.runtime.test_savepoints_forks import assert_reachable_exist, reachable


def _parent_state(store) -> set[str]:
    return {k for root in paths.state_listing_roots("jobs/parent") for k in store.list(root)
            if paths.parse_state_key("jobs/parent", k) is not None}


def test_drop_fork_releases_the_parents_files_and_the_child_never_runs_again(tmp_path) -> None:
    root = str(tmp_path)
    p = fork_jobs.runner(root, "parent", retain_checkpoints=1)
    p.run(max_epochs=1)
    savepoint(root, "parent", "early")  # another record naming some of the same files
    p.run(max_epochs=1)
    fork_job(root, "parent", "child")  # the child never ran: it names only the parent's files
    p.run(max_epochs=2)
    compact_job(p.store, p.job.prefix, small.OPTIONS)
    p.run(max_epochs=1)
    store = open_object_store(root)
    cleanup_job(store, "jobs/parent", 1)
    held_by_child = {k for pin in read_pins(store, "jobs/parent") if pin.what == "fork" for k in pin.keys}
    assert held_by_child, "the scenario needs the fork to hold some of the parent's files"

    lease = acquire_lease(store, "jobs/child", list_epochs(store, "jobs/child")[-1] + 1)
    with pytest.raises(RecoveryRefusedError, match="is running epoch"):
        drop_fork(store, "child")
    store.delete(paths.lease_key("jobs/child"))
    assert lease.owner
    record = drop_fork(store, "child")
    assert record["parent"] == "parent" and record["owners"] == ["jobs/parent"]
    assert forked_from(store, "child")["dropped_at_ms"] > 0
    assert [pin.what for pin in read_pins(store, "jobs/parent")] == ["savepoint-early"]

    cleanup_job(store, "jobs/parent", 1)
    named = reachable(store, ["parent"])["parent"]
    parent_named = {k for k in named if paths.parse_state_key("jobs/parent", k) is not None}
    assert _parent_state(store) == parent_named, "the sweep kept a file no record names, or deleted one"
    assert held_by_child - parent_named, "nothing the fork alone held was collected"
    assert_reachable_exist(store, ["parent"], "after the drop and the parent's sweep")

    with pytest.raises(RecoveryRefusedError, match="dropped fork of job parent"):
        fork_jobs.runner(root, "child").run(max_epochs=1)
    with pytest.raises(ValueError, match="forked already|has checkpoints"):
        fork_job(store, "parent", "child")
    with pytest.raises(ValueError, match="not a fork"):
        drop_fork(store, "parent")


def test_a_job_holding_pins_without_being_forked_is_no_fork(tmp_path) -> None:
    """A job whose checkpoints name another job's files without a fork (a promoted
    main) has a pin record with owners only: it is no fork (``forked_from`` is empty),
    and ``drop_fork`` refuses it."""
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=1)
    fork_jobs.runner(root, "main", retain_checkpoints=None).run(max_epochs=1)
    store = open_object_store(root)
    hold_for_checkpoints(store, "main", files_by_owner(store, read_checkpoint(store, "jobs/parent", 1)))
    assert held_at(store, "jobs/main") == ["jobs/parent"]
    assert forked_from(store, "main") == {}
    with pytest.raises(ValueError, match="not a fork"):
        drop_fork(store, "main")
