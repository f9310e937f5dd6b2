"""The driver's incremental retention reads pins once: an epoch costs one LIST of
``pins/`` while no pin changes, and the cache follows every change of a pin (a pin key
is written once). Oracles: request counts of a counting store, and ``read_pins``."""
from __future__ import annotations

from collections import Counter

from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.cleanup import IncrementalRetention, cleanup_job
from dkvstream.operators.runtime.forks import drop_fork, fork_job
from dkvstream.operators.runtime.pins import PinCache, files_by_owner, hold_for_checkpoints, pinned_keys
from dkvstream.operators.runtime.savepoints import drop_savepoint, savepoint
from dkvstream.storage.objectstore import ForwardingObjectStore, open_object_store
from tests.operators import fork_jobs


class _Counting(ForwardingObjectStore):
    """Counts LISTs of and GETs under ``pins/``."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.counts: Counter = Counter()

    def get(self, key: str) -> bytes:
        if "/pins/" in key:
            self.counts["GET"] += 1
        return self.inner.get(key)

    def list(self, prefix: str) -> list[str]:
        if prefix.endswith("/pins/"):
            self.counts["LIST"] += 1
        return self.inner.list(prefix)


def test_an_epochs_retention_reads_only_new_pins(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=6)
    store = open_object_store(root)
    for epoch in (1, 2, 3):
        savepoint(store, "parent", f"sp{epoch}", epoch=epoch)
    counting = _Counting(store)
    retention = IncrementalRetention(counting, "jobs/parent", 5)
    deleted = []
    for retain, take, new_pins in [(5, False, 3), (4, False, 0), (3, True, 1)]:
        if take:
            savepoint(store, "parent", f"new{retain}", epoch=6)
        counting.counts.clear()
        retention.retain = retain  # one more checkpoint expires each call
        report = retention.apply()
        deleted.append(report.files_deleted)
        assert not report.full_sweep and not report.damaged, report
        assert counting.counts == Counter({"LIST": 1, "GET": new_pins}), (retain, counting.counts)
    assert sum(deleted) > 0


def test_the_cache_follows_every_pin_change(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=3)
    store = open_object_store(root)
    cache = PinCache(store, "jobs/parent")

    def agrees(step: str) -> None:
        assert cache.pinned_keys() == pinned_keys(store, "jobs/parent"), step

    agrees("no pin")
    fork_job(store, "parent", "child", epoch=1)
    agrees("fork")
    savepoint(store, "parent", "sp", epoch=2)
    agrees("savepoint")
    # A checkpoint of the child naming more of the parent's files (as a promotion does).
    hold_for_checkpoints(store, "child", files_by_owner(store, read_checkpoint(store, "jobs/parent", 3)))
    agrees("the fork's pin extended")
    cleanup_job(store, "jobs/child", 1)  # shrinks it back to what the child's checkpoint names
    agrees("the fork's pin shrunk")
    drop_savepoint(store, "parent", "sp")
    savepoint(store, "parent", "sp", epoch=3)  # the same name again, other files
    agrees("savepoint dropped and taken again")
    drop_fork(store, "child")
    agrees("fork dropped")
