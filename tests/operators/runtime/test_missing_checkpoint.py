"""A restart after the newest job checkpoint object was lost. Its epoch's output is
visible, so continuing from the checkpoint before would compute that epoch again (with
another parallelism: under other file names, so every row twice); the restart must
refuse and say what to do, whether or not the job has commit records (stores written
before they existed have none). In process; oracle: the pandas answer of the job."""

from __future__ import annotations

import pytest

from dkvstream.operators import paths
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime.checkpoints import read_commit_log
from tests.operators import small_keyed_count as small


def _finished_run(root: str):
    runner = small.runner(root)
    assert [r.epoch for r in runner.run()] == list(range(1, small.EPOCHS + 1))
    return runner


def _delete_markers(store, prefix: str) -> None:
    """The store as an older version wrote it: checkpoints only, no commit records or
    retention floors."""
    for key in store.list(paths.checkpoint_prefix(prefix)):
        if paths.epoch_of_checkpoint(key) is None:
            store.delete(key)


@pytest.mark.parametrize("records", [True, False], ids=["commit-records", "older-store"])
def test_restart_refuses_when_the_newest_checkpoint_is_lost(tmp_path, records) -> None:
    root = str(tmp_path)
    runner = _finished_run(root)
    store, prefix = runner.store, runner.job.prefix
    newest = paths.checkpoint_key(prefix, small.EPOCHS)
    store.delete(newest)
    if not records:
        _delete_markers(store, prefix)
    with pytest.raises(RecoveryRefusedError) as err:
        small.runner(root, parallelism=3).run()
    message = str(err.value)
    assert message.startswith("job small_count: "), message
    if records:
        assert f"{store.uri(newest)} is missing" in message, message
        assert "commit record" in message and "says epoch 8 was committed" in message, message
        assert "falling back to epoch 7 would replay epochs 8..8" in message, message
    else:
        assert "output of epochs after the newest checkpoint, epoch 7, is visible" in message, (
            message
        )
    assert "00000008/part-kg-0000-0127.parquet" in message, message  # the visible output, named
    assert (
        "Restore the" in message and "delete that output to have those epochs recomputed" in message
    )
    small.assert_output_exact(runner, "after the refused restart")  # nothing was published

    # As the message says: without epoch 8's output, the restart recomputes it once.
    for key in store.list(paths.sinks_root(prefix)):
        if "/epoch=00000008/" in key:
            store.delete(key)
    again = small.runner(root, parallelism=3)
    assert [r.epoch for r in again.run()] == [small.EPOCHS]
    small.assert_output_exact(again, "after deleting the output and restarting")
    assert read_commit_log(store, prefix).last_recorded == small.EPOCHS


def test_store_without_commit_records_still_opens(tmp_path) -> None:
    """A job stopped at epoch 4 by a version without commit records or retention floors
    goes on to the end; its first commit writes a record."""
    root = str(tmp_path)
    runner = small.runner(root)
    runner.run(max_epochs=4)
    _delete_markers(runner.store, runner.job.prefix)
    assert read_commit_log(runner.store, runner.job.prefix).last_recorded == 0
    again = small.runner(root)
    assert [r.epoch for r in again.run()] == list(range(5, small.EPOCHS + 1))
    small.assert_output_exact(again, "older store")
    assert read_commit_log(again.store, again.job.prefix).last_recorded == small.EPOCHS
