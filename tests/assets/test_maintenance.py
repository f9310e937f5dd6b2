"""The compaction, flush and cleanup jobs and the checkpoint check, against a real store
written by a real (in-process) job run. Oracles: the state and output of a run that had
no maintenance, and the set of files the retained checkpoints name."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from dkvstream.assets.checkpoints import checkpoint_check_result, verify_checkpoint
from dkvstream.assets.jobs import cleanup_job_def, compaction, flush_job, op_config
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.control import acquire_lease, pending_flush_requests
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage import faults
from dkvstream.storage.dkv.compaction import plan_compaction
from dkvstream.storage.dkv.gc import files_named_by
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.assets.small_job import NAME, SMALL_DKV, small_job, state

PREFIX = f"jobs/{NAME}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """State per epoch and final output of a run without maintenance."""
    job = small_job()
    runner = JobRunner(job, None, str(tmp_path_factory.mktemp("ref")), retain_checkpoints=None)
    epochs = [r.epoch for r in runner.run()]
    return {e: state(runner.store, e) for e in epochs}, _output(runner)


def _output(runner: JobRunner):
    table = runner.job.sinks["main"].read(runner.store, PREFIX)
    return table.sort_by([(c, "ascending") for c in table.column_names])


def _runner(root: Path, dkv: DKVSettingsResource = SMALL_DKV) -> JobRunner:
    return JobRunner(small_job(), None, str(root), dkv_options=dkv.options(), retain_checkpoints=None)


def _resources(root: Path, dkv: DKVSettingsResource = SMALL_DKV) -> dict:
    return {"object_store": ObjectStoreResource(root_uri=str(root)), "dkv": dkv}


def _named_by_retained(store) -> set[str]:
    manifests = [m for e in list_epochs(store, PREFIX)
                 for ranges in read_checkpoint(store, PREFIX, e).operators.values() for m in ranges.values()]
    return files_named_by(store, manifests)


def _op_metadata(result, op_name: str) -> dict:
    [event] = [e for e in result.all_node_events if e.step_key == op_name and e.is_successful_output]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def test_compaction_job_publishes_results_the_job_installs(tmp_path, reference) -> None:
    ref_state, ref_output = reference
    runner = _runner(tmp_path)
    runner.run(max_epochs=3)
    ckpt = runner.latest()
    l0 = {label: len(load_manifest(runner.store, m).levels.l0)
          for label, m in ckpt.operators["key_window_count"].items()}
    expected = sum(plan_compaction(load_manifest(runner.store, m).levels, SMALL_DKV.options()) is not None
                   for m in ckpt.operators["key_window_count"].values())
    assert expected == 2 and min(l0.values()) >= SMALL_DKV.l0_compaction_trigger

    result = compaction.execute_in_process(run_config=op_config("plan_compaction", NAME),
                                           resources=_resources(tmp_path), instance=DagsterInstance.ephemeral())
    assert result.success
    plan_md = _op_metadata(result, "plan_compaction")
    assert plan_md["epoch"] == 3 and plan_md["ranges_to_compact"] == expected
    keys = result.output_for_node("compact")
    assert len(keys) == expected and all(runner.store.exists(k) for k in keys)
    assert _op_metadata(result, "compact")["output_tables"] >= 2

    [after] = runner.run(max_epochs=1)
    ckpt = runner.latest()
    assert ckpt.metrics["remote_compactions"] == {"installed": expected, "discarded": 0}
    l0_after = {label: len(load_manifest(runner.store, m).levels.l0)
                for label, m in ckpt.operators["key_window_count"].items()}
    assert all(l0_after[r] < l0[r] for r in l0), (l0, l0_after)
    assert state(runner.store) == ref_state[after.epoch]
    assert verify_checkpoint(runner.store, PREFIX, ckpt).ok
    runner.run()
    assert _output(runner).equals(ref_output)


def test_cleanup_job_frees_expired_checkpoints_and_unreferenced_files(tmp_path, reference) -> None:
    ref_state, ref_output = reference
    runner = _runner(tmp_path)
    runner.run(max_epochs=4)
    store = runner.store
    sizes = {k: store.size(k) for k in store.list(PREFIX + "/")}
    # What two puts killed before their rename left: one hours ago, one just now.
    table_dir = next(iter(_named_by_retained(store))).rsplit("/", 1)[0]
    abandoned, recent = store._write_temp(f"{table_dir}/a.sst", b"x"), store._write_temp(f"{table_dir}/b.sst", b"x")
    os.utime(abandoned, (time.time() - 7200, time.time() - 7200))

    result = cleanup_job_def.execute_in_process(run_config=op_config("cleanup", NAME), resources=_resources(tmp_path),
                                                instance=DagsterInstance.ephemeral())
    assert result.success
    md = _op_metadata(result, "cleanup")
    gone = set(sizes) - set(store.list(PREFIX + "/"))
    assert list_epochs(store, PREFIX) == [3, 4] and md["checkpoints_deleted"] == 2
    assert md["deferred"] == "no"
    assert md["abandoned_writes_removed"] == 1 and not abandoned.exists() and recent.exists()
    assert md["bytes_freed"] > 0
    assert md["bytes_freed"] == sum(sizes[k] for k in gone if "/checkpoints/" not in k)
    assert set(store.list(f"{PREFIX}/state/")) == _named_by_retained(store)
    for e in (3, 4):
        assert state(store, e) == ref_state[e]
    runner.run()
    assert _output(runner).equals(ref_output)


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent-safe", "unsafe-inline-mode"])
def test_cleanup_during_an_epoch_in_flight(tmp_path, concurrent) -> None:
    """The known hazard: cleanup between a task's flush and the commit. The concurrent mode
    must keep the in-flight files; the inline mode (for the driver only) shows the hazard
    is real: the committed checkpoint then names deleted files."""
    runner = _runner(tmp_path)
    runner.run(max_epochs=2)
    reports = []

    def cleanup_mid_epoch(point: str, epoch: int) -> None:
        reports.append(cleanup_job(runner.store, PREFIX, 1, concurrent=concurrent))

    faults.arm("after_tasks", action=cleanup_mid_epoch, epoch=3)
    _runner(tmp_path).run(max_epochs=1)
    [report] = reports
    newest = latest_checkpoint(runner.store, PREFIX)
    verified = verify_checkpoint(runner.store, PREFIX, newest)
    if concurrent:
        assert report.deferred.startswith("epoch 3 in flight") and report.files_deleted == 0
        assert report.checkpoints_deleted == 1  # expired checkpoints may still go
        assert verified.ok, verified.errors
    else:
        assert report.files_deleted > 0
        assert not verified.ok


class _HookedStore(LocalObjectStore):
    """Runs ``hook`` once, right after the first listing of the job's state files."""

    def __init__(self, root, hook) -> None:
        super().__init__(root)
        self._hook = hook

    def list(self, prefix: str) -> list[str]:
        keys = super().list(prefix)
        if prefix == f"{PREFIX}/state/" and self._hook is not None:
            hook, self._hook = self._hook, None
            hook(self)
        return keys


@pytest.mark.parametrize("during_listing", ["file-written", "epoch-started"])
def test_concurrent_cleanup_never_deletes_what_appears_after_its_listing(tmp_path, during_listing) -> None:
    _runner(tmp_path).run(max_epochs=2)
    orphan = f"{PREFIX}/state/key_window_count/kg-0000-0031/sst/orphan-000001.sst"
    late = f"{PREFIX}/state/key_window_count/kg-0000-0031/sst/late-000001.sst"
    LocalObjectStore(tmp_path).put(orphan, b"failed attempt")

    def hook(store) -> None:
        store.put(late, b"in flight")
        if during_listing == "epoch-started":
            acquire_lease(store, PREFIX, 3)

    store = _HookedStore(tmp_path, hook)
    report = cleanup_job(store, PREFIX, 1, concurrent=True)
    assert store.exists(late)
    if during_listing == "epoch-started":
        assert report.deferred.startswith("epoch 3 in flight") and store.exists(orphan)
    else:
        assert report.deferred == "" and not store.exists(orphan)


def test_flush_job_flushes_memtables_at_the_next_epoch(tmp_path, reference) -> None:
    ref_state, _ = reference
    roomy = DKVSettingsResource(memtable_bytes=64 << 20, l0_compaction_trigger=4, size_amp_threshold=0.5,
                                max_inline_compaction_bytes=0, wal_flush_bytes=8 << 20,
                                target_file_bytes=8 << 20, retain_checkpoints=2)
    runner = _runner(tmp_path, roomy)
    runner.run(max_epochs=2)
    assert runner.latest().metrics["tables"] == 0  # everything still in memtables and WAL

    result = flush_job.execute_in_process(run_config=op_config("flush", NAME), resources=_resources(tmp_path, roomy),
                                          instance=DagsterInstance.ephemeral())
    assert result.success
    assert pending_flush_requests(runner.store, PREFIX) == [result.output_for_node("flush")]

    runner.run(max_epochs=1)
    ckpt = runner.latest()
    assert ckpt.metrics["flushed"] is True and pending_flush_requests(runner.store, PREFIX) == []
    for m in ckpt.operators["key_window_count"].values():
        manifest = load_manifest(runner.store, m)
        assert len(manifest.levels.l0) == 1 and manifest.wal == ()
    assert state(runner.store) == ref_state[3]
    runner.run(max_epochs=1)
    assert runner.latest().metrics["flushed"] is False  # one request, one flush


def test_checkpoint_check_verifies_the_newest_checkpoint(tmp_path) -> None:
    runner = _runner(tmp_path)
    runner.run(max_epochs=2)
    store = ObjectStoreResource(root_uri=str(tmp_path)).open()
    ok = checkpoint_check_result(store, small_job())
    assert ok.passed and ok.metadata["epoch"].value == 2 and ok.metadata["tables"].value > 0

    table = sorted(k for k in _named_by_retained(runner.store) if k.endswith(".sst"))[-1]
    path = Path(runner.store.uri(table).removeprefix("file://"))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    bad = checkpoint_check_result(store, small_job())
    assert not bad.passed
    assert any(runner.store.uri(table) in e for e in bad.metadata["errors"].value)
