"""Erasure of a key from a job's state, in process: served mid-run by the running job's
next epoch, then by a stopped job's offline epoch; state of every other key unchanged
(the model: a run without the erasure), restart and rescale after it, the report, and
the scan of every object of the job."""
from __future__ import annotations

import pytest

from dkvstream.operators.runtime import erasure
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.control import acquire_lease, release_lease
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.erasure_scan import scan_store
from dkvstream.operators.runtime.forks import fork_job
from dkvstream.operators.runtime.savepoints import drop_savepoint, savepoint
from dkvstream.storage import faults
from dkvstream.storage.objectstore import open_object_store
from tests.operators import small_keyed_count as skc
from tests.operators.lifecycle.erasure_model import checkpoint_state, subject_of

KEY = b"k199"  # no other key of the job contains it (k0 .. k199)


def _without(state: dict, key: bytes) -> dict:
    return {k: v for k, v in state.items() if subject_of(k[1]) != key}


def test_running_job_serves_the_request_and_other_keys_keep_their_state(tmp_path):
    ref_root, root = str(tmp_path / "ref"), str(tmp_path / "erased")
    with skc.runner(ref_root) as ref:
        ref.run(max_epochs=4)
        model = _without(checkpoint_state(ref.store, ref.job.prefix, 4), KEY)
        assert len(model) < len(checkpoint_state(ref.store, ref.job.prefix, 4))  # the key had state
    with skc.runner(root) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
        before = scan_store(store, KEY, f"{prefix}/state/")
        assert any(h.how == "sstable" for h in before.holding)  # compressed: found decoded only
        rid = erasure.request_erasure(store, prefix, KEY, reason="ticket 42")
        assert erasure.read_report(store, prefix, rid).status == "pending"
        [result] = r.run(max_epochs=1)
    assert result.epoch == 4
    assert checkpoint_state(store, prefix, 4) == model  # every other key as without the erasure
    assert list_epochs(store, prefix) == [4]  # checkpoints before the erasure expired
    assert scan_store(store, KEY, f"{prefix}/state/").holding == []
    assert scan_store(store, KEY, f"{prefix}/checkpoints/").holding == []
    report = erasure.read_report(store, prefix, rid)
    assert (report.status, report.applied_epoch) == ("applied", 4)
    rewritten = {old for s in report.state.values() for old in s["tables_rewritten"]}
    assert rewritten and {h.key for h in before.holding} <= set(report.objects_that_held())
    assert report.retention["still_present"] == []
    assert erasure.pending_erasures(store, prefix) == []
    assert KEY not in store.get(f"{prefix}/erasures/{rid}.json")  # the record holds a hash

    # A restart after the erasure, with another parallelism (a rescale): runs to the end,
    # and every other key's output is the oracle's.
    with skc.runner(root, parallelism=3) as again:
        again.run()
        got = skc.output(again)
    want = skc.oracle()
    other = got[got.key != KEY.decode()].reset_index(drop=True)
    assert other.equals(want[want.key != KEY.decode()].reset_index(drop=True))


def test_stopped_job_offline_epoch_report_and_whole_store_scan(tmp_path):
    root = str(tmp_path / "job")
    with skc.runner(root) as r:
        r.run()
        store, prefix, sinks = r.store, r.job.prefix, erasure.job_sinks(r.job)
        last = list_epochs(store, prefix)[-1]
        before = read_checkpoint(store, prefix, last)
    assert scan_store(store, KEY).holding  # the key is there before
    rid = erasure.request_erasure(store, prefix, KEY)
    [record] = erasure.apply_offline(store, prefix)
    assert record["applied_epoch"] == last + 1
    after = read_checkpoint(store, prefix, last + 1)
    assert (after.source_offsets, after.watermark, after.finished) == (
        before.source_offsets, before.watermark, before.finished)
    assert checkpoint_state(store, prefix, last + 1) == _without(checkpoint_state_of_ref(tmp_path, last), KEY)
    report = erasure.complete_erasure(store, prefix, rid, KEY, sinks=sinks, key_column="key")
    assert report.status == "complete"
    assert report.scan["holding"] == []  # nothing in the whole store holds it any more
    assert report.sinks["main"]  # the sink files that held rows of the key, rewritten
    assert set(report.sinks["main"]) <= set(report.objects_that_held())
    assert erasure.apply_offline(store, prefix) == []  # nothing pending
    with skc.runner(root) as again:  # a restart of the finished job runs nothing, fails nothing
        assert again.run() == []


def checkpoint_state_of_ref(tmp_path, epoch: int) -> dict:
    """The state at ``epoch`` of the same job run without an erasure."""
    with skc.runner(str(tmp_path / "ref")) as ref:
        ref.run()
        return checkpoint_state(ref.store, ref.job.prefix, epoch)


def test_request_of_an_empty_key_and_unknown_report_are_refused(tmp_path):
    store = open_object_store(str(tmp_path))
    with pytest.raises(ValueError, match="non-empty bytes"):
        erasure.request_erasure(store, "jobs/x", b"")
    with pytest.raises(KeyError, match="no erasure request or record"):
        erasure.read_report(store, "jobs/x", "nope")


def test_running_job_on_spark_serves_the_request(tmp_path, spark):
    """The same on Spark ``local[2]``: the request is served in the Spark task of the key's
    range; the state equals the in-process model's without the key."""
    with skc.runner(str(tmp_path / "ref")) as ref:
        ref.run(max_epochs=3)
        model = _without(checkpoint_state(ref.store, ref.job.prefix, 3), KEY)
    r = JobRunner(skc.job(), spark, str(tmp_path / "spark"), dkv_options=skc.OPTIONS, retain_checkpoints=2)
    with r:
        r.run(max_epochs=2)
        rid = erasure.request_erasure(r.store, r.job.prefix, KEY)
        [result] = r.run(max_epochs=1)
        store, prefix = r.store, r.job.prefix
    assert result.epoch == 3 and erasure.read_report(store, prefix, rid).applied_epoch == 3
    assert checkpoint_state(store, prefix, 3) == model
    assert scan_store(store, KEY, f"{prefix}/state/").holding == []


def test_report_names_a_savepoint_still_holding_the_key_and_how_to_drop_it(tmp_path):
    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
    savepoint(store, "small_count", "nightly", epoch=3)
    [held] = erasure.savepoints_holding(store, prefix, KEY)
    assert held["name"] == "nightly" and held["objects"]
    assert held["drop"] == (f"python -m dkvstream.operators.tools.savepoints --store {store.root_uri} "
                            "drop small_count nightly")
    assert erasure.savepoints_holding(store, prefix, b"no-such-subject") == []
    # Erased everywhere else, the savepoint still holds it (its files are pinned) until dropped.
    rid = erasure.request_erasure(store, prefix, KEY)
    erasure.apply_offline(store, prefix)
    report = erasure.complete_erasure(store, prefix, rid, KEY, sinks=erasure.job_sinks(r.job), key_column="key",
                                      scan_prefix=f"{prefix}/")
    assert [sp["name"] for sp in report.savepoints] == ["nightly"]
    assert report.status == "held"  # not "complete" while the savepoint holds it
    still = {h["key"] for h in report.scan["holding"]}
    assert still and still <= set(held["objects"])  # only the savepoint's state files
    drop_savepoint(store, "small_count", "nightly")
    cleanup_job(store, prefix, retain=1)
    assert scan_store(store, KEY, f"{prefix}/").holding == []  # dropped and swept: gone
    again = erasure.complete_erasure(store, prefix, rid, KEY, scan_prefix=f"{prefix}/")
    assert (again.status, again.savepoints, again.retention["still_present"]) == ("complete", [], [])


def test_report_names_the_fork_whose_pin_keeps_a_file_holding_the_key(tmp_path):
    """A fork's pin keeps the parent's files the erasure would delete: the report names,
    per still-present file, the fork's pin and the command that drops the fork, and the
    status is "held", not "complete"."""
    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
    fork_job(store, "small_count", "small_count_fork", epoch=3)
    rid = erasure.request_erasure(store, prefix, KEY)
    [record] = erasure.apply_offline(store, prefix)
    still = record["retention"]["still_present"]
    assert still  # the fork names the parent's files holding the key
    drop = f"python -m dkvstream.operators.tools.savepoints --store {store.root_uri} drop-fork small_count_fork"
    for k in still:
        [pin] = record["retention"]["held_by"][k]
        assert (pin["holder"], pin["what"], pin["release"]) == ("small_count_fork", "fork", drop)
        assert store.exists(pin["pin"])
    report = erasure.complete_erasure(store, prefix, rid, KEY, sinks=erasure.job_sinks(r.job), key_column="key",
                                      scan_prefix=f"{prefix}/")
    assert report.status == "held" and set(report.retention["held_by"]) == set(still)
    assert {h["key"] for h in report.scan["holding"]} <= set(still)


def test_a_rescale_epoch_serves_the_request(tmp_path):
    """The erasure epoch is also a rescale (2 -> 3 ranges): the new ranges open from the
    old ones' shared tables, and the one holding the key rewrites them as its own."""
    with skc.runner(str(tmp_path / "ref")) as ref:
        ref.run(max_epochs=4)
        model = _without(checkpoint_state(ref.store, ref.job.prefix, 4), KEY)
    with skc.runner(str(tmp_path / "job")) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
    rid = erasure.request_erasure(store, prefix, KEY)
    with skc.runner(str(tmp_path / "job"), parallelism=3) as rescaled:
        [result] = rescaled.run(max_epochs=1)
    assert erasure.read_report(store, prefix, rid).applied_epoch == result.epoch == 4
    assert checkpoint_state(store, prefix, 4) == model
    assert scan_store(store, KEY, f"{prefix}/state/").holding == []


class _Crash(Exception):
    pass


def test_a_crash_after_the_commit_has_the_next_epoch_serve_the_request_again(tmp_path):
    def crash(point, epoch):
        raise _Crash(point)

    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
    rid = erasure.request_erasure(store, prefix, KEY)
    faults.arm("after_cleanup", 1, crash, epoch=4)  # committed, the request not yet replaced
    with skc.runner(str(tmp_path)) as r, pytest.raises(_Crash):
        r.run(max_epochs=1)
    assert erasure.read_report(store, prefix, rid).status == "pending"
    with skc.runner(str(tmp_path)) as r:
        [result] = r.run(max_epochs=1)
    report = erasure.read_report(store, prefix, rid)
    assert (report.status, report.applied_epoch) == ("applied", result.epoch) and result.epoch == 5
    assert list_epochs(store, prefix) == [5]
    assert scan_store(store, KEY, f"{prefix}/state/").holding == []
    assert scan_store(store, KEY, f"{prefix}/checkpoints/").holding == []


def test_a_deferred_sweep_is_finished_by_complete_erasure(tmp_path, monkeypatch):
    """Another epoch in flight when the erasure's retention runs (a live lease): the old
    files stay and the record says so; ``complete_erasure`` sweeps again once it is over."""
    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
    rid = erasure.request_erasure(store, prefix, KEY)
    real = erasure.expire_before
    leases = []

    def with_an_epoch_in_flight(store_, prefix_, epoch, **kw):
        leases.append(acquire_lease(store_, prefix_, epoch + 1))
        return real(store_, prefix_, epoch, **kw)

    monkeypatch.setattr(erasure, "expire_before", with_an_epoch_in_flight)
    [record] = erasure.apply_offline(store, prefix)
    assert record["retention"]["deferred"] and record["retention"]["still_present"]
    monkeypatch.setattr(erasure, "expire_before", real)
    release_lease(store, prefix, leases[0])
    report = erasure.complete_erasure(store, prefix, rid, KEY, scan_prefix=f"{prefix}/state/")
    assert report.retention["still_present"] == [] and report.scan["holding"] == []


def test_malformed_request_objects_are_skipped_and_named_in_the_epoch_metrics(tmp_path, caplog):
    """Objects under the request prefix that are not requests (written by something else
    than ``request_erasure``) do not stop the job: the valid request is served, the bad
    ones are named in the epoch's metrics and a warning, and left for the user to delete."""
    with skc.runner(str(tmp_path / "job")) as r:
        r.run(max_epochs=2)
        store, prefix = r.store, r.job.prefix
        bad = {f"{prefix}/control/erase/garbage.json": b"{not json",
               f"{prefix}/control/erase/no-key.json": b'{"id": "x", "requested_at_ms": 1}'}
        for k, v in bad.items():
            store.put(k, v)
        rid = erasure.request_erasure(store, prefix, KEY)
        with caplog.at_level("WARNING"):
            [result] = r.run(max_epochs=1)
    assert erasure.read_report(store, prefix, rid).applied_epoch == result.epoch == 3
    skipped = read_checkpoint(store, prefix, 3).metrics["erasure_skipped"]
    assert set(skipped) == set(bad) and all("delete it" in why for why in skipped.values())
    assert all(k in caplog.text for k in bad)
    assert erasure.pending_erasures(store, prefix) == [] and all(store.exists(k) for k in bad)
