"""Restoring or forking from a savepoint or checkpoint older than an erasure of the job
would bring the erased key back: refused, naming the erasure; after it, allowed."""
from __future__ import annotations

import pytest

from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime import erasure
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.forks import fork_job
from dkvstream.operators.runtime.savepoints import drop_savepoint, restore, savepoint
from dkvstream.storage.objectstore import open_object_store
from tests.operators import fork_jobs
from tests.operators.runtime.test_savepoints_forks import delete_output_after

KEY = b"k199"


def test_restore_and_fork_from_before_an_erasure_are_refused(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=2)
    store = open_object_store(root)
    savepoint(store, "parent", "old")
    rid = erasure.request_erasure(store, "jobs/parent", KEY)
    erasure.apply_offline(store, "jobs/parent")
    erased_at = erasure.read_report(store, "jobs/parent", rid).applied_epoch
    assert erased_at == 3 and list_epochs(store, "jobs/parent")[-1] == 3

    delete_output_after(store, "parent", 2)
    with pytest.raises(RecoveryRefusedError, match=rf"savepoint 'old' \(epoch 2\).*{rid}.*drop_savepoint"):
        restore(store, fork_jobs.job("parent"), "old")
    with pytest.raises(RecoveryRefusedError, match=rf"savepoint 'old'.*{rid}"):
        fork_job(store, "parent", "child", savepoint="old")
    with pytest.raises((RecoveryRefusedError, ValueError), match="checkpoint epoch 2"):  # (expired too)
        fork_job(store, "parent", "child", epoch=2)
    assert list_epochs(store, "jobs/child") == [] and list_epochs(store, "jobs/parent")[-1] == 3

    # From the erasure's epoch on: allowed.
    savepoint(store, "parent", "new")
    fork_job(store, "parent", "child", savepoint="new")
    drop_savepoint(store, "parent", "old")
    assert list_epochs(store, "jobs/child") == [3]
