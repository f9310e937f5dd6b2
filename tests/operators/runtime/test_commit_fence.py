"""The commit fence's parts (``dkvstream.operators.runtime.checkpoints``, module docstring "The
fence"): retention raises the floor before it deletes a checkpoint; a commit into a
retired gap is withdrawn and refused; a commit of a new epoch is recorded; the markers
do not grow with the job's age. In process, on the small keyed counting job."""

from __future__ import annotations

import dataclasses

import pytest

from dkvstream.operators import paths
from dkvstream.operators.errors import JobFencedError
from dkvstream.operators.runtime.checkpoints import (
    commit_checkpoint,
    list_epochs,
    read_checkpoint,
    read_commit_log,
)
from dkvstream.storage import faults
from tests.operators import small_keyed_count as small


def test_markers_do_not_grow(tmp_path) -> None:
    runner = small.runner(str(tmp_path), retain=2)
    runner.run()
    keys = runner.store.list(paths.checkpoint_prefix(runner.job.prefix))
    assert [k.rsplit("/", 1)[1] for k in keys] == [
        "committed-0000000008.json",
        "epoch-0000000007.json",
        "epoch-0000000008.json",
        "retired-0000000006.json",
    ]


def test_floor_is_raised_before_a_checkpoint_is_deleted(tmp_path) -> None:
    runner = small.runner(str(tmp_path), retain=1)
    runner.run(max_epochs=1)
    seen = []

    def check_floor(point: str, epoch: int | None) -> None:  # one expired checkpoint (epoch 1) was just deleted
        seen.append(read_commit_log(runner.store, runner.job.prefix).retired_through)

    faults.arm("cleanup_checkpoint", 1, check_floor)
    try:
        runner.run(max_epochs=1)
    finally:
        faults.disarm_all()
    assert seen == [1]


def test_commit_into_a_retired_gap_is_withdrawn(tmp_path) -> None:
    """A driver that fell behind writes epoch 2 after retention deleted it: refused, and
    its object is gone again; the job's commits are as before."""
    runner = small.runner(str(tmp_path), retain=1)
    runner.run(max_epochs=4)
    store, prefix = runner.store, runner.job.prefix
    assert list_epochs(store, prefix) == [4] and not store.exists(paths.checkpoint_key(prefix, 2))
    stale = dataclasses.replace(read_checkpoint(store, prefix, 4), epoch=2)
    with pytest.raises(
        JobFencedError, match="epoch 2 was committed before by another driver .*up to epoch 4"
    ):
        commit_checkpoint(store, prefix, stale)
    assert not store.exists(paths.checkpoint_key(prefix, 2))
    log = read_commit_log(store, prefix)
    assert (log.epochs, log.retired_through, log.last_recorded) == ([4], 3, 4)
    assert [r.epoch for r in runner.run(max_epochs=1)] == [5]  # the job goes on


def test_a_write_below_the_floor_is_never_listed(tmp_path) -> None:
    """A fenced driver killed between its write and its withdrawal leaves an object no
    reader lists; the next retention deletes it."""
    runner = small.runner(str(tmp_path), retain=1)
    runner.run(max_epochs=4)
    store, prefix = runner.store, runner.job.prefix
    left = paths.checkpoint_key(prefix, 2)
    store.put_if_absent(
        left, dataclasses.replace(read_checkpoint(store, prefix, 4), epoch=2).encode()
    )
    assert list_epochs(store, prefix) == [4] and runner.latest().epoch == 4
    assert read_commit_log(store, prefix).withdrawn == [left]
    runner.run(max_epochs=1)
    assert not store.exists(left)
