"""Savepoints, forks and restores racing each other and the collector, interleaved
through wrapper stores (deterministic orders, no timing).

Oracle: the reachability model of ``test_savepoints_forks`` (every file a retained
checkpoint or savepoint of every job names exists), and a savepoint's pins protecting
exactly the files its record names.
"""
from __future__ import annotations

import threading

import pytest

from dkvstream.operators import paths
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.forks import fork_job
from dkvstream.operators.runtime.pins import PinError, files_by_owner, read_pins
from dkvstream.operators.runtime.remote_compaction import compact_job
from dkvstream.operators.runtime.savepoints import (
    drop_savepoint,
    get_savepoint,
    list_savepoints,
    restore,
    savepoint,
)
from dkvstream.storage.objectstore import ForwardingObjectStore, open_object_store
from tests.operators import fork_jobs
from tests.operators import small_keyed_count as small
from tests.operators.runtime.test_savepoints_forks import assert_reachable_exist, delete_output_after


def _parent_with_expired_savepoint(root: str) -> None:
    """Job ``parent`` with savepoint ``sp`` at epoch 2 whose checkpoint expired and whose
    files were compacted away from the retained checkpoint: only the pins keep them."""
    p = fork_jobs.runner(root, "parent", retain_checkpoints=1)
    p.run(max_epochs=2)
    savepoint(p.store, "parent", "sp")
    p.run(max_epochs=2)
    compact_job(p.store, p.job.prefix, small.OPTIONS)
    p.run(max_epochs=1)
    assert 2 not in list_epochs(p.store, p.job.prefix)


class _PinsListedThen(ForwardingObjectStore):
    """The collector's store: when it lists ``pins/``, ``meanwhile`` runs after the
    listing and before the collector sees it (so it deletes what that listing left
    unpinned, whatever ``meanwhile`` pinned)."""

    def __init__(self, inner, meanwhile) -> None:
        super().__init__(inner)
        self.meanwhile = meanwhile

    def list(self, prefix: str) -> list[str]:
        listed = self.inner.list(prefix)
        if "/pins/" in prefix and self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return listed


class _DropInterleaved(ForwardingObjectStore):
    """The dropping caller's store: right after its first delete, the parent's full
    sweep runs, and ``meanwhile`` (a fork or a restore) between the sweep's listing of
    pins and its deletions (the reviewer's order)."""

    def __init__(self, inner, meanwhile) -> None:
        super().__init__(inner)
        self.meanwhile, self.outcome = meanwhile, None

    def _after_first_delete(self) -> None:
        if self.meanwhile is None:
            return
        run, self.meanwhile = self.meanwhile, None

        def attempt() -> None:
            try:
                run()
                self.outcome = "done"
            except (PinError, ValueError) as err:  # failing cleanly is allowed
                self.outcome = err

        cleanup_job(_PinsListedThen(self.inner, attempt), "jobs/parent", 1)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self._after_first_delete()

    def delete_many(self, keys: list[str]) -> None:
        self.inner.delete_many(keys)
        self._after_first_delete()


@pytest.mark.parametrize("what", ["fork", "restore"])
def test_dropping_a_savepoint_while_it_is_forked_or_restored_deletes_nothing_named(tmp_path, what) -> None:
    root = str(tmp_path)
    _parent_with_expired_savepoint(root)
    store = open_object_store(root)
    if what == "fork":
        def meanwhile() -> None:
            fork_job(store, "parent", "child", savepoint="sp")
    else:
        delete_output_after(store, "parent", get_savepoint(store, "parent", "sp").epoch)

        def meanwhile() -> None:
            restore(store, fork_jobs.job("parent"), "sp")
    racing = _DropInterleaved(store, meanwhile)
    drop_savepoint(racing, "parent", "sp")
    assert racing.outcome is not None, "the interleaving did not run"
    jobs = ["parent", "child"] if what == "fork" else ["parent"]
    assert_reachable_exist(store, jobs, f"{what} while dropping ({racing.outcome})")
    if racing.outcome == "done":  # it won: it runs on from what it named
        fork_jobs.runner(root, jobs[-1], retain_checkpoints=1).run(max_epochs=1)
    else:
        assert list_epochs(store, "jobs/child") == []
    cleanup_job(store, "jobs/parent", 1)
    assert_reachable_exist(store, jobs, "after the parent's next sweep")


class _Stepped(ForwardingObjectStore):
    """One caller's store in a two-thread interleaving: after its first pin PUT it sets
    ``pinned``; before writing its savepoint record after that, it waits for ``go``."""

    def __init__(self, inner, pinned: threading.Event, go: threading.Event) -> None:
        super().__init__(inner)
        self.pinned, self.go, self.has_pinned = pinned, go, False

    def _record(self, key: str) -> None:
        if "/savepoints/" in key and self.has_pinned:
            self.go.wait()

    def put(self, key: str, data: bytes) -> None:
        self._record(key)
        self.inner.put(key, data)
        if "/pins/" in key:
            self.has_pinned = True
            self.pinned.set()

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._record(key)
        self.inner.put_if_absent(key, data)


def test_two_savepoints_of_one_name_leave_the_record_and_its_pins_agreeing(tmp_path) -> None:
    """A pins epoch 1; B (epoch 2) pins, A writes its record, B writes its record: the
    name's record and pins must describe the same checkpoint, whoever wins."""
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=2)
    store = open_object_store(root)
    a_pinned, b_pinned, a_done, b_done = (threading.Event() for _ in range(4))
    a = _Stepped(store, a_pinned, b_pinned)
    b = _Stepped(store, b_pinned, a_done)
    errors = {}

    def take(name: str, s, epoch: int, done: threading.Event, wait: threading.Event | None) -> None:
        try:
            if wait is not None:
                wait.wait()
            savepoint(s, "parent", "nightly", epoch=epoch)
        except ValueError as err:
            errors[name] = err
        finally:
            done.set()
            (b_pinned if name == "B" else a_pinned).set()  # never leave the other waiting

    ta = threading.Thread(target=take, args=("A", a, 1, a_done, None))
    tb = threading.Thread(target=take, args=("B", b, 2, b_done, a_pinned))
    ta.start()
    tb.start()
    ta.join(60)
    tb.join(60)
    assert not ta.is_alive() and not tb.is_alive()
    assert len(errors) == 1, errors  # exactly one caller took the name
    [sp] = list_savepoints(store, "parent")
    named = {k for files in files_by_owner(store, sp.checkpoint).values() for k in files}
    pinned = {k for pin in read_pins(store, "jobs/parent") for k in pin.keys}
    assert named == pinned, f"epoch {sp.epoch}'s record; pins miss {sorted(named - pinned)[:3]}"
    drop_savepoint(store, "parent", "nightly")
    assert read_pins(store, "jobs/parent") == []


def test_a_fork_into_a_child_being_forked_is_refused(tmp_path) -> None:
    """Another fork's record (no checkpoint yet: a fork in progress) makes a second fork
    into the same child refuse, leaving the first's record and pin as they were."""
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=2)
    store = open_object_store(root)
    fork_job(store, "parent", "child", epoch=1)
    store.delete_many([k for k in store.list("jobs/child/checkpoints/")])  # as before its commit
    before = {k: store.get(k) for k in store.list("jobs/parent/pins/") + store.list("jobs/child/")}
    with pytest.raises(ValueError, match="forked already"):
        fork_job(store, "parent", "child", epoch=2)
    assert {k: store.get(k) for k in store.list("jobs/parent/pins/") + store.list("jobs/child/")} == before


def test_a_crashed_drop_leaves_orphan_pins_that_dropping_again_deletes(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=1)
    store = open_object_store(root)
    savepoint(store, "parent", "sp")
    store.delete(paths.savepoint_key("jobs/parent", "sp"))  # the drop's first step, then a crash
    assert read_pins(store, "jobs/parent")
    assert drop_savepoint(store, "parent", "sp") is None
    assert read_pins(store, "jobs/parent") == []
    with pytest.raises(ValueError, match="no savepoint 'sp'"):
        drop_savepoint(store, "parent", "sp")


def test_restore_refuses_a_pending_savepoint(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=1)
    store = open_object_store(root)
    sp = savepoint(store, "parent", "sp")
    sp.pending = True
    store.put(paths.savepoint_key("jobs/parent", "sp"), sp.encode())
    with pytest.raises(ValueError, match="still being taken"):
        restore(store, fork_jobs.job("parent"), "sp")


def test_a_restores_pin_lasts_until_a_full_sweep_reads_its_checkpoint(tmp_path) -> None:
    """restore pins the job's own files its new checkpoint names before committing it
    (the savepoint could be dropped right after); the job's first full sweep that read
    that checkpoint as retained releases the pin, keeping every named file."""
    root = str(tmp_path)
    _parent_with_expired_savepoint(root)
    store = open_object_store(root)
    delete_output_after(store, "parent", get_savepoint(store, "parent", "sp").epoch)
    new = restore(store, fork_jobs.job("parent"), "sp")
    [pin] = [p for p in read_pins(store, "jobs/parent") if p.what == f"restore-{new.epoch}"]
    assert set(pin.keys) == set(files_by_owner(store, new)["jobs/parent"])
    drop_savepoint(store, "parent", "sp")
    cleanup_job(store, "jobs/parent", 1)
    assert [p.what for p in read_pins(store, "jobs/parent")] == []
    assert_reachable_exist(store, ["parent"], "after the restore's pin was released")
    r = fork_jobs.runner(root, "parent", retain_checkpoints=1)
    r.run()
    small.assert_output_exact(r, "restored from the savepoint, then run to the end")
