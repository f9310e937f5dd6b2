"""The fault-point registry (``dkvstream.storage.faults``): what an armed point and a
callback see, against the driver's protocol as the oracle (per epoch: planned, tasks done,
committed, each staged output published, retention, cleanup done)."""
from __future__ import annotations

import pytest

from dkvstream.examples.keyed_count import keyed_count_job
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage import faults
from tests.crashes import Crash, crash_at

DRIVER_POINTS = ("epoch_planned", "after_tasks", "after_commit", "publish_file", "before_cleanup", "after_cleanup")


def _job():
    return keyed_count_job(3_000, 100, events_per_epoch=2_000, step_ms=1_000)  # 3 epochs


def test_callback_sees_every_driver_point_with_its_epoch(tmp_path) -> None:
    passed = []
    runner = JobRunner(_job(), None, str(tmp_path))
    with faults.callback(lambda point, epoch: passed.append((point, epoch))):
        results = runner.run()
    # One publish_file per output the epoch staged (its checkpoint names them).
    published = {r.epoch: len(read_checkpoint(runner.store, runner.job.prefix, r.epoch).outputs) for r in results}
    expected = [(p, r.epoch) for r in results for p in DRIVER_POINTS
                for _ in range(published[r.epoch] if p == "publish_file" else 1)]
    assert [(p, e) for p, e in passed if p in DRIVER_POINTS] == expected
    # The other points are the tasks' and DKV's: no epoch.
    assert {e for p, e in passed if p not in DRIVER_POINTS} == {None}
    faults.fault_point("after_commit", epoch=9)  # the callback left with its block
    assert passed[-1] != ("after_commit", 9)


def test_an_armed_point_fires_once_at_its_epoch(tmp_path) -> None:
    root = str(tmp_path)
    with crash_at("after_tasks", 2), pytest.raises(Crash, match="after_tasks of epoch 2"):
        JobRunner(_job(), None, root).run()
    runner = JobRunner(_job(), None, root)
    assert runner.latest().epoch == 1  # epoch 2 ran its tasks, never committed
    assert [r.epoch for r in runner.run()] == [2, 3]  # one shot: not armed any more


def test_hit_counts_only_the_passes_of_the_armed_epoch() -> None:
    seen = []
    faults.arm("after_commit", hit=2, action=lambda point, epoch: seen.append((point, epoch)), epoch=5)
    for epoch in (4, 5, 4, 5, 5):
        faults.fault_point("after_commit", epoch=epoch)
    assert seen == [("after_commit", 5)]
    with pytest.raises(ValueError, match="unknown fault point 'after_comit'"):
        faults.arm("after_comit")
