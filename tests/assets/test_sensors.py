"""Sensors evaluated tick by tick with build_sensor_context: they fire at the threshold, not
below it, and not twice for the same checkpoint (or input)."""
from __future__ import annotations

import pytest
from dagster import AssetMaterialization, DagsterInstance, build_sensor_context

from dkvstream.assets.checkpoints import L0_TABLES_MAX, SIZE_AMP_MAX, checkpoint_asset_key
from dkvstream.assets.jobs import compaction
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.assets.sensors import (
    STREAM_JOB_TAG,
    make_cleanup_sensor,
    make_compaction_sensor,
    make_source_sensor,
)
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.driver import JobRunner
from tests.assets.small_job import NAME, SMALL_DKV, small_job
from tests.operators.io.test_file_source import (
    ROWS_PER_FILE,
    _encode,
    _job,
    _log_key,
    _rows,
    _source,
    _two_waves,
    _write,
)

TRIGGERS = DKVSettingsResource(l0_compaction_trigger=4, size_amp_threshold=0.5)


class Ticker:
    """Evaluates one sensor tick after tick as the daemon does: carries the cursor, and
    drops a run request whose run key an earlier request of this sensor had (the daemon
    launches no run for it)."""

    def __init__(self, sensor_def, instance: DagsterInstance, resources: dict) -> None:
        self.sensor_def, self.instance, self.resources = sensor_def, instance, resources
        self.cursor: str | None = None
        self.run_keys: set[str] = set()

    def tick(self):
        with build_sensor_context(instance=self.instance, cursor=self.cursor, resources=self.resources) as ctx:
            data = self.sensor_def.evaluate_tick(ctx)
        if data.cursor is not None:
            self.cursor = data.cursor
        launched = [r for r in data.run_requests if r.run_key not in self.run_keys]
        self.run_keys.update(r.run_key for r in data.run_requests)
        return launched


def reset(root, job_name: str = NAME) -> None:
    """A job reset: everything under its prefix deleted."""
    store = ObjectStoreResource(root_uri=str(root)).open()
    for key in store.list(f"jobs/{job_name}/"):
        store.delete(key)


def _checkpoint(instance: DagsterInstance, epoch: int, l0: int, amp: float) -> None:
    instance.report_runless_asset_event(AssetMaterialization(
        checkpoint_asset_key(small_job()), metadata={"epoch": epoch, L0_TABLES_MAX: l0, SIZE_AMP_MAX: amp}))


@pytest.fixture
def compaction_ticker():
    instance = DagsterInstance.ephemeral()
    return Ticker(make_compaction_sensor(small_job()), instance, {"dkv": TRIGGERS})


def test_compaction_sensor_fires_at_the_l0_trigger_once_per_checkpoint(compaction_ticker) -> None:
    t = compaction_ticker
    assert t.tick() == []  # no checkpoint yet
    _checkpoint(t.instance, 1, l0=3, amp=0.0)
    assert t.tick() == []  # below
    _checkpoint(t.instance, 2, l0=4, amp=0.0)
    [request] = t.tick()  # at the trigger
    assert request.run_config == {"ops": {"plan_compaction": {"config": {"job": NAME}}}}
    assert request.tags[STREAM_JOB_TAG] == NAME and request.tags["dkvstream/epoch"] == "2"
    assert t.tick() == []  # same checkpoint: not twice
    _checkpoint(t.instance, 3, l0=6, amp=0.0)
    assert len(t.tick()) == 1  # a new checkpoint still over the trigger fires again


def test_compaction_sensor_fires_above_the_size_amplification_threshold(compaction_ticker) -> None:
    t = compaction_ticker
    _checkpoint(t.instance, 1, l0=0, amp=0.5)
    assert t.tick() == []  # at the threshold is not above it
    _checkpoint(t.instance, 2, l0=0, amp=0.51)
    [request] = t.tick()
    assert "size amplification 0.510" in request.tags["dkvstream/trigger"]
    assert t.tick() == []


def test_compaction_sensor_skips_a_checkpoint_while_a_compaction_runs(compaction_ticker) -> None:
    t = compaction_ticker
    _checkpoint(t.instance, 1, l0=5, amp=0.0)
    [request] = t.tick()
    t.instance.create_run_for_job(compaction, run_config=request.run_config, tags=request.tags)  # queued
    _checkpoint(t.instance, 2, l0=5, amp=0.0)
    assert t.tick() == []  # the queued run compacts these very tables
    assert t.tick() == []  # and the checkpoint is not judged again


@pytest.fixture(scope="module")
def four_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    JobRunner(small_job(), None, str(root), dkv_options=SMALL_DKV.options(), retain_checkpoints=None).run(
        max_epochs=4)
    return root


def test_cleanup_sensor_fires_when_retention_has_something_to_delete(tmp_path, four_checkpoints) -> None:
    import shutil

    root = tmp_path / "store"
    shutil.copytree(four_checkpoints, root)
    store = ObjectStoreResource(root_uri=str(root))

    def ticker(retain: int) -> Ticker:
        return Ticker(make_cleanup_sensor(small_job()), DagsterInstance.ephemeral(),
                      {"object_store": store, "dkv": DKVSettingsResource(retain_checkpoints=retain)})

    assert ticker(4).tick() == []  # 4 checkpoints, keep 4: nothing expired
    t = ticker(3)
    [request] = t.tick()  # one over retention
    assert request.run_config == {"ops": {"cleanup": {"config": {"job": NAME}}}}
    assert t.tick() == []  # not twice for the same newest epoch
    cleanup_job(store.open(), f"jobs/{NAME}", 3, concurrent=True)
    assert t.tick() == []  # retention applied: nothing left to do
    JobRunner(small_job(), None, str(root), dkv_options=SMALL_DKV.options(), retain_checkpoints=None).run(
        max_epochs=1)
    assert len(t.tick()) == 1  # the next commit expires the next checkpoint


def test_cleanup_sensor_fires_again_after_the_job_is_reset(tmp_path) -> None:
    """After a reset the epochs start from 1 again: the sensor still fires when the new
    checkpoints reach the old epochs, with run keys no earlier run had."""
    store = ObjectStoreResource(root_uri=str(tmp_path))
    t = Ticker(make_cleanup_sensor(small_job()), DagsterInstance.ephemeral(),
               {"object_store": store, "dkv": DKVSettingsResource(retain_checkpoints=2)})

    def run(epochs: int) -> None:
        JobRunner(small_job(), None, str(tmp_path), dkv_options=SMALL_DKV.options(),
                  retain_checkpoints=None).run(max_epochs=epochs)

    run(3)
    assert len(t.tick()) == 1  # 3 checkpoints, keep 2
    cleanup_job(store.open(), f"jobs/{NAME}", 2, concurrent=True)
    assert t.tick() == []
    reset(tmp_path)
    assert t.tick() == []  # no checkpoint: nothing to delete
    run(3)  # epochs 1..3 again
    assert list_epochs(store.open(), f"jobs/{NAME}") == [1, 2, 3]
    [request] = t.tick()
    assert request.run_config == {"ops": {"cleanup": {"config": {"job": NAME}}}}
    cleanup_job(store.open(), f"jobs/{NAME}", 2, concurrent=True)
    assert t.tick() == []
    run(1)
    assert len(t.tick()) == 1  # and on


def test_source_sensor_starts_a_run_when_new_input_arrives(tmp_path) -> None:
    job = small_job(events=1_000)
    t = Ticker(make_source_sensor(job, compaction), DagsterInstance.ephemeral(),
               {"object_store": ObjectStoreResource(root_uri=str(tmp_path))})
    [request] = t.tick()  # input and no checkpoint
    assert request.tags["dkvstream/new_events"] == "2000"
    assert t.tick() == []  # same input: not twice
    JobRunner(job, None, str(tmp_path), retain_checkpoints=None).run()
    assert t.tick() == []  # all input processed
    job.source.events = 1_500  # the source grows
    [request] = t.tick()
    assert request.tags["dkvstream/new_events"] == "1000"


def test_source_sensor_starts_a_run_again_after_the_job_is_reset(tmp_path) -> None:
    """A reset job has all its input to process again: the sensor starts a run for the
    same end offsets it started the first run for (the Dagster run logged checkpoints)."""
    job = small_job(events=1_000)
    t = Ticker(make_source_sensor(job, compaction), DagsterInstance.ephemeral(),
               {"object_store": ObjectStoreResource(root_uri=str(tmp_path))})
    [first] = t.tick()
    for result in JobRunner(job, None, str(tmp_path), retain_checkpoints=None).run():
        _checkpoint(t.instance, result.epoch, l0=0, amp=0.0)  # what the run's asset logs
    assert t.tick() == []
    reset(tmp_path)
    [again] = t.tick()
    assert again.tags["dkvstream/new_events"] == first.tags["dkvstream/new_events"] == "2000"
    assert t.tick() == []  # once


def test_source_sensor_checks_a_file_log_before_discovering(tmp_path) -> None:
    """A file source's newest log object is lost after its files were moved away and new
    files landed: the sensor's tick fails with the restart's refusal and logs nothing
    (it would log the new files under offsets the checkpoint says were read)."""
    inbox, root = tmp_path / "in", tmp_path / "store"
    inbox.mkdir()
    _two_waves(inbox, str(root))
    store = ObjectStoreResource(root_uri=str(root)).open()
    store.delete(_log_key("files", "batch-0000000002.json"))
    for i in range(4):
        (inbox / f"f{i}.csv").unlink()
    _write(inbox, "f4.csv", _encode(_rows(4 * ROWS_PER_FILE, ROWS_PER_FILE), "csv"), 1e9 + 4)
    t = Ticker(make_source_sensor(_job(_source(str(inbox), "csv")), compaction),
               DagsterInstance.ephemeral(), {"object_store": ObjectStoreResource(root_uri=str(root))})
    with pytest.raises(RecoveryRefusedError) as refused:
        t.tick()
    assert "checkpoint of epoch 2" in str(refused.value)
    assert "batch-0000000002.json" in str(refused.value)
    assert not store.exists(_log_key("files", "batch-0000000002.json"))
