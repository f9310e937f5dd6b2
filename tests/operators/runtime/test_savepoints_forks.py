"""Savepoints, restore and zero-copy forks, at the job level, in process.

Oracles: the pandas answer of the small keyed count (``tests.operators.small_keyed_count``,
a run of the same events), the store's request counts (a fork PUTs no state file and
COPYs nothing), and a reachability model: every file named by every retained checkpoint
and savepoint of every job exists, whatever the collector did or where it was killed.
"""
from __future__ import annotations

import random
import re
import shutil
import tempfile

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dkvstream.operators import paths
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import IncrementalRetention, cleanup_job
from dkvstream.operators.runtime.control import acquire_lease
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
from dkvstream.storage import faults
from dkvstream.storage.objectstore import ForwardingObjectStore, open_object_store
from tests.operators import fork_jobs
from tests.operators import small_keyed_count as small


def reachable(store, jobs: list[str]) -> dict[str, set[str]]:
    """``{job: keys}`` every retained checkpoint and savepoint of ``job`` names."""
    out = {}
    for name in jobs:
        prefix = paths.job_prefix(name)
        ckpts = [read_checkpoint(store, prefix, e) for e in list_epochs(store, prefix)]
        ckpts += [sp.checkpoint for sp in list_savepoints(store, name)]
        out[name] = {k for c in ckpts for files in files_by_owner(store, c).values() for k in files}
    return out


def assert_reachable_exist(store, jobs: list[str], what: str) -> None:
    present = set(store.list("jobs/"))
    for name, keys in reachable(store, jobs).items():
        missing = sorted(keys - present)
        assert not missing, f"{what}: job {name} names {len(missing)} deleted files, e.g. {missing[:3]}"


def delete_output_after(store, job: str, epoch: int) -> int:
    """Deletes the published output (sinks, dead letters) of epochs after ``epoch``."""
    keys = [k for k in store.list(paths.sinks_root(paths.job_prefix(job)))
            if (m := re.search(r"epoch=(\d+)", k)) and int(m.group(1)) > epoch]
    store.delete_many(keys)
    return len(keys)


def test_savepoint_outlives_retention_and_restore_equals_an_uninterrupted_run(tmp_path) -> None:
    """(a) + (d): a savepoint at epoch 3 keeps its files while retention (incremental and
    full sweeps) expires checkpoint 3; restore is refused while epochs 4.. have visible
    output, and after that output is deleted, restore + running to the end gives
    exactly the oracle's output."""
    root = str(tmp_path)
    p = fork_jobs.runner(root, "counts", retain_checkpoints=2, full_sweep_every=2)
    p.run(max_epochs=3)
    sp = savepoint(p.store, "counts", "before-change")
    assert sp.epoch == 3 and sp.bytes > 0
    with pytest.raises(ValueError, match="exists"):
        savepoint(p.store, "counts", "before-change")
    p.run(max_epochs=3)
    assert 3 not in list_epochs(p.store, p.job.prefix)
    cleanup_job(p.store, p.job.prefix, 1)
    pinned = {k for pin in read_pins(p.store, p.job.prefix) for k in pin.keys}
    sp_files = {k for files in files_by_owner(p.store, sp.checkpoint).values() for k in files}
    assert sp_files == pinned and len(sp_files) == sp.files
    assert_reachable_exist(p.store, ["counts"], "after retention")

    with pytest.raises(RecoveryRefusedError, match=r"Delete the published output.*fork a new job"):
        restore(p.store, p.job, "before-change")
    assert delete_output_after(p.store, "counts", 3) > 0
    lease = acquire_lease(p.store, p.job.prefix, list_epochs(p.store, p.job.prefix)[-1] + 1)
    with pytest.raises(RecoveryRefusedError, match="is running epoch"):
        restore(p.store, p.job, "before-change")
    p.store.delete(paths.lease_key(p.job.prefix))
    assert lease.owner
    newest = list_epochs(p.store, p.job.prefix)[-1]
    restored = restore(p.store, p.job, "before-change")
    assert restored.epoch == newest + 1 and restored.source_offsets == sp.checkpoint.source_offsets
    r = fork_jobs.runner(root, "counts", retain_checkpoints=2, full_sweep_every=2)
    r.run()
    small.assert_output_exact(r, "restored from the savepoint")
    assert_reachable_exist(r.store, ["counts"], "after the restored run")
    drop_savepoint(r.store, "counts", "before-change")
    assert read_pins(r.store, r.job.prefix) == [] and list_savepoints(r.store, "counts") == []


def test_fork_copies_nothing_runs_other_code_and_parallelism_and_equals_the_oracle(tmp_path) -> None:
    """(b): a fork at epoch 3 PUTs only its checkpoint, commit record, fork record and
    pin, COPYs nothing; the child, with 3 ranges instead of 2 and a changed operator
    (amounts doubled), outputs what the oracle says for windows closing after epoch 3,
    while the parent, whose retention expires epoch 3 meanwhile, stays exact."""
    root = str(tmp_path)
    p = fork_jobs.runner(root, "parent", retain_checkpoints=2, full_sweep_every=2)
    p.run(max_epochs=3)
    at_fork = fork_jobs.output(p)
    state_keys = set(p.store.list("jobs/parent/state/"))
    before = p.store.stats.snapshot()
    first = fork_job(p.store, "parent", fork_jobs.job("child", 3, doubled=True))
    spent = {k: p.store.stats.snapshot()[k] - before[k] for k in before}
    assert spent["COPY"] == 0 and spent["PUT"] == 4, spent  # checkpoint, commit record, fork record, pin
    assert spent["bytes_written"] < 20_000, spent
    assert set(p.store.list("jobs/child/")) <= {
        paths.checkpoint_key("jobs/child", 3), paths.commit_record_key("jobs/child", 3),
        paths.fork_record_key("jobs/child")}
    assert all(m in state_keys for ranges in first.operators.values() for m in ranges.values())

    p.run()  # the parent runs on and expires epoch 3: the pin keeps the child's files
    small.assert_output_exact(p, "parent after the fork")
    c = fork_jobs.runner(root, "child", 3, doubled=True, retain_checkpoints=2, full_sweep_every=2)
    c.run()
    want = small.oracle()
    want = want[~want.set_index(["key", "window_start"]).index.isin(
        at_fork.set_index(["key", "window_start"]).index)].assign(amount=lambda d: d["amount"] * 2)
    pd.testing.assert_frame_equal(fork_jobs.output(c), small._sorted(want), obj="child output")
    assert_reachable_exist(c.store, ["parent", "child"], "after both ran")

    # The child's full sweep shrinks its pin to what it still names (maybe nothing).
    cleanup_job(c.store, c.job.prefix, 1)
    pin = [x for x in read_pins(c.store, "jobs/parent") if x.holder == "child"]
    named = reachable(c.store, ["child"])["child"]
    assert {k for x in pin for k in x.keys} == {k for k in named if k.startswith("jobs/parent/")}
    cleanup_job(p.store, p.job.prefix, 1)
    assert_reachable_exist(c.store, ["parent", "child"], "after both swept")


def test_fork_refuses_a_taken_name_and_opens_ranges_from_the_parent(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent").run(max_epochs=1)
    fork_job(root, "parent", "child")
    with pytest.raises(ValueError, match="has checkpoints already"):
        fork_job(root, "parent", "child")
    with pytest.raises(ValueError, match="not retained"):
        fork_job(root, "parent", "other", epoch=99)
    # Same parallelism: the child's ranges open from the parent's manifests (new files
    # under its own prefix, its retention told nothing about the parent's files).
    c = fork_jobs.runner(root, "child")
    c.run(max_epochs=1)
    assert read_checkpoint(c.store, "jobs/child", 2).dropped == {"keyed_window_count": None}


class _Crash(Exception):
    pass


def _scenario(root: str) -> None:
    """Parent with a savepoint, a child forked from it at epoch 3 (same parallelism)
    and a savepoint of its own, a grandchild forked from the child (parallelism 1); every checkpoint
    kept so far (retention off), so the collector has much to do."""
    p = fork_jobs.runner(root, "parent", retain_checkpoints=None)
    p.run(max_epochs=3)
    savepoint(root, "parent", "sp")
    fork_job(root, "parent", "child")
    p.run(max_epochs=3)
    fork_jobs.runner(root, "child", 2, retain_checkpoints=None).run(max_epochs=2)
    savepoint(root, "child", "csp")
    fork_job(root, "child", "grandchild")
    fork_jobs.runner(root, "grandchild", 1, retain_checkpoints=None).run(max_epochs=1)
    fork_jobs.runner(root, "child", 2, retain_checkpoints=None).run(max_epochs=1)


JOBS = ["parent", "child", "grandchild"]
POINTS = ("cleanup_checkpoint", "gc_delete", "cleanup_staged")


def _collect(root: str) -> None:
    """The collector of every job: incremental retention (the parent's is incremental,
    the forks' fall back to the full sweep), then the full sweep."""
    store = open_object_store(root)
    for name in JOBS:
        IncrementalRetention(store, paths.job_prefix(name), 1).apply()
    for name in JOBS:
        cleanup_job(store, paths.job_prefix(name), 1, concurrent=True)


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow("every pass: 15 s"))],
                         ids=["sampled", "every-pass"])
def test_collector_killed_at_every_step_never_deletes_a_reachable_file(tmp_path, every: bool) -> None:
    """(c): the collector (incremental retention and full sweep of parent, child and
    grandchild) is killed at every pass of each of its fault points (``every``; else at
    the first, the last and a tenth of the others), one kill per copy of the store;
    after each kill, and after it runs again to the end, every file a retained
    checkpoint or savepoint of any job names exists, and the jobs still run."""
    base = str(tmp_path / "base")
    _scenario(base)
    passes: dict[str, int] = {}
    dry = str(tmp_path / "dry")
    shutil.copytree(base, dry)
    with faults.callback(lambda point, _e: passes.__setitem__(point, passes.get(point, 0) + 1)):
        _collect(dry)
    assert all(passes.get(pt, 0) >= 1 for pt in POINTS), passes
    rng = random.Random(7)
    cases = sorted({(pt, h) for pt in POINTS for h in range(1, passes[pt] + 1)
                    if every or h in (1, passes[pt]) or rng.random() < 0.1})
    for i, (point, hit) in enumerate(cases):
        root = str(tmp_path / f"case{i}")
        shutil.copytree(base, root)
        fired = []

        def crash(pt, _epoch, fired=fired):
            fired.append(pt)
            raise _Crash(pt)

        faults.arm(point, hit, crash)
        with pytest.raises(_Crash):
            _collect(root)
        assert fired == [point], f"{point}#{hit} did not fire"
        store = open_object_store(root)
        assert_reachable_exist(store, JOBS, f"killed at {point}#{hit}")
        _collect(root)
        assert_reachable_exist(store, JOBS, f"after {point}#{hit} and a full run")
        if hit == passes[point]:  # the jobs still run (once per point: seconds each)
            for name, parallelism in (("parent", 2), ("child", 2), ("grandchild", 1)):
                fork_jobs.runner(root, name, parallelism, retain_checkpoints=1).run(max_epochs=1)
            assert_reachable_exist(store, JOBS, f"after {point}#{hit} and an epoch of each")


def test_fork_runs_on_spark_with_other_parallelism(spark, tmp_path) -> None:
    """(e): a child forked from a savepoint runs its epochs as Spark tasks (local[2]),
    3 ranges opened from the parent's 2, and outputs what the oracle says."""
    root = str(tmp_path)
    p = fork_jobs.runner(root, "parent")
    p.run(max_epochs=4)
    at_fork = fork_jobs.output(p)
    savepoint(root, "parent", "sp")
    fork_job(root, "parent", "child", savepoint="sp")
    c = fork_jobs.runner(root, "child", 3, doubled=True, spark=spark)
    c.run()
    want = small.oracle()
    want = want[~want.set_index(["key", "window_start"]).index.isin(
        at_fork.set_index(["key", "window_start"]).index)].assign(amount=lambda d: d["amount"] * 2)
    pd.testing.assert_frame_equal(fork_jobs.output(c), small._sorted(want), obj="child output on Spark")
    assert_reachable_exist(c.store, ["parent", "child"], "after the Spark run")


PARALLELISM = {"a": 2, "b": 3, "c": 1}
FORK_OF = {"b": "a", "c": "b"}
JOB = st.integers(0, 2)  # an index into the jobs existing at the step (modulo their number)
STEP = st.one_of(
    st.tuples(st.just("run"), JOB),
    st.tuples(st.just("savepoint"), JOB, st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("drop"), JOB, st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("retain"), JOB),
    st.tuples(st.just("sweep"), JOB),
    st.tuples(st.just("compact"), JOB),
    st.tuples(st.just("fork"), JOB),
    st.tuples(st.just("restore"), JOB, st.sampled_from(["s1", "s2"])),
)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(STEP, min_size=4, max_size=12))
@example([("savepoint", 0, "s1"), ("run", 0), ("retain", 0), ("sweep", 0)])
@example([("fork", 0), ("run", 0), ("retain", 0), ("run", 1), ("sweep", 1), ("compact", 1), ("run", 1),
          ("fork", 1), ("savepoint", 1, "s1"), ("run", 1), ("retain", 1), ("run", 2), ("sweep", 0)])
@example([("fork", 0), ("savepoint", 1, "s1"), ("run", 1), ("compact", 1), ("run", 1), ("sweep", 1),
          ("restore", 1, "s1"), ("drop", 1, "s1"), ("sweep", 1), ("sweep", 0), ("run", 1), ("sweep", 1)])
def test_random_savepoints_forks_drops_retention_and_compaction_keep_every_reachable_file(steps) -> None:
    """Random sequences over a job, its fork and a fork of the fork (other parallelism),
    with restores from savepoints (their later output deleted first): after every step,
    every file a retained checkpoint or savepoint of any job names exists, and the
    savepoints listed are the model's; at the end, after dropping
    every savepoint and sweeping each job (forks first), each job's pins name exactly
    what the other jobs' retained checkpoints still name of its files."""
    with tempfile.TemporaryDirectory() as root:
        store = open_object_store(root)
        fork_jobs.runner(root, "a", retain_checkpoints=None).run(max_epochs=1)
        jobs, model = ["a"], {"a": set(), "b": set(), "c": set()}
        for step in steps:
            kind, name = step[0], jobs[step[1] % len(jobs)]
            if kind == "fork":
                if len(jobs) == 3:
                    continue
                name = "bc"[len(jobs) - 1]
            prefix = paths.job_prefix(name)
            if kind == "run":
                fork_jobs.runner(root, name, PARALLELISM[name], retain_checkpoints=None).run(max_epochs=2)
            elif kind == "savepoint" and step[2] not in model[name]:
                savepoint(store, name, step[2])
                model[name].add(step[2])
            elif kind == "drop" and step[2] in model[name]:
                drop_savepoint(store, name, step[2])
                model[name].discard(step[2])
            elif kind == "retain":
                IncrementalRetention(store, prefix, 1).apply()
            elif kind == "sweep":
                cleanup_job(store, prefix, 1, concurrent=True)
            elif kind == "compact":
                compact_job(store, prefix, small.OPTIONS)
            elif kind == "fork":
                fork_job(store, FORK_OF[name], name)
                jobs.append(name)
            elif kind == "restore" and step[2] in model[name]:
                delete_output_after(store, name, get_savepoint(store, name, step[2]).epoch)
                restore(store, fork_jobs.job(name, PARALLELISM[name]), step[2])
            assert_reachable_exist(store, jobs, f"after {step}")
            assert {sp.name for sp in list_savepoints(store, name)} == model.get(name, set())
        for name in jobs:
            for sp in list(model[name]):
                drop_savepoint(store, name, sp)
        for name in reversed(jobs):
            cleanup_job(store, paths.job_prefix(name), 1)
        assert_reachable_exist(store, jobs, "at the end")
        named = reachable(store, jobs)
        for owner in jobs:
            pinned = {k for pin in read_pins(store, paths.job_prefix(owner)) for k in pin.keys}
            others = {k for holder in jobs if holder != owner for k in named[holder]
                      if k.startswith(f"jobs/{owner}/")}
            assert pinned == others, f"pins of {owner}: extra {sorted(pinned - others)[:3]}"


class _RetentionRacing(ForwardingObjectStore):
    """Retention deleting checkpoint ``key`` right after a pin is written (the race the
    re-check closes)."""

    def __init__(self, inner, key: str) -> None:
        super().__init__(inner)
        self.key = key

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        if "/pins/" in key:
            self.inner.delete(self.key)


def test_a_checkpoint_expiring_while_pinned_fails_the_savepoint_and_the_fork_and_leaves_no_pin(tmp_path) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=2)
    store = open_object_store(root)
    racing = _RetentionRacing(store, paths.checkpoint_key("jobs/parent", 1))
    with pytest.raises(PinError, match="checkpoint epoch 1 of job parent .* expired meanwhile"):
        savepoint(racing, "parent", "sp", epoch=1)
    racing = _RetentionRacing(store, paths.checkpoint_key("jobs/parent", 2))
    with pytest.raises(PinError, match="expired meanwhile .*take a newer one"):
        fork_job(racing, "parent", "child")
    assert read_pins(store, "jobs/parent") == [] and list_savepoints(store, "parent") == []
    assert list_epochs(store, "jobs/child") == []


def test_a_damaged_fork_record_or_pin_is_reported_and_deletes_nothing_more(tmp_path) -> None:
    """A pin that does not read stops the owner's collection; a fork record that does not
    read leaves the holder's pins as they are; both are reported as damage."""
    root = str(tmp_path)
    fork_jobs.runner(root, "parent", retain_checkpoints=None).run(max_epochs=3)
    fork_job(root, "parent", "child", epoch=1)
    store = open_object_store(root)
    store.put(paths.fork_record_key("jobs/child"), b"{not json")
    report = cleanup_job(store, "jobs/child", 1)
    assert any("fork record" in d for d in report.damaged), report.damaged
    [pin] = read_pins(store, "jobs/parent")
    store.put(pin_key := paths.pin_key("jobs/parent", "child", "fork"), b"{not json")
    before = set(store.list("jobs/parent/state/"))
    report = cleanup_job(store, "jobs/parent", 1)
    assert any(store.uri(pin_key) in d for d in report.damaged), report.damaged
    assert report.files_deleted == 0 and set(store.list("jobs/parent/state/")) == before
