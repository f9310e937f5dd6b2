"""A stream job on a live source as one long-running Dagster run, terminated as Dagster
terminates a run; and the short-run mode, the source asset and the sensor defaults.

In process (``materialize`` on a file-backed test instance, the in-process job runner).
Termination is what the run launcher and the run worker do: ``report_run_canceling``,
then SIGINT to the process (``dagster_shared.ipc.send_interrupt``). It is sent from
the source at a chosen point of an epoch, so where it lands is deterministic.
Oracles: a separate ``JobRunner`` run of the same input for the same number of epochs
(sink rows and DKV state), and the store (newest checkpoint, epoch lease).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    FloatMetadataValue,
    IntMetadataValue,
    in_process_executor,
    instance_for_test,
    materialize,
)

import dkvstream.assets.job_assets as job_assets_module
from dkvstream.assets.checkpoints import LIVE_METRICS, checkpoint_asset_key, live_metadata, verify_checkpoint
from dkvstream.assets.definitions import dkvstream_definitions, stream_job_definitions
from dkvstream.assets.job_assets import job_assets
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.control import read_lease
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import checkpoint_entries
from dkvstream.storage.objectstore import open_object_store
from tests.assets.live_job import NAME, PREFIX, NoSpark, live_job
from tests.assets.small_job import small_job


class StopRecordingRunner(JobRunner):
    """``JobRunner`` that also records that ``stop()`` was called (from the signal
    handler on the main thread; the event is never waited on there)."""

    stopped = threading.Event()

    def stop(self) -> None:
        StopRecordingRunner.stopped.set()
        super().stop()


@pytest.fixture
def recording_runner(monkeypatch):
    StopRecordingRunner.stopped = threading.Event()
    monkeypatch.setattr(job_assets_module, "JobRunner", StopRecordingRunner)
    return StopRecordingRunner


@pytest.fixture
def instance():
    with instance_for_test() as inst:  # file-backed: the epochs' thread uses it too
        yield inst


def _resources(root) -> dict:
    return {"object_store": ObjectStoreResource(root_uri=str(root)), "pyspark": NoSpark(spark_config={}),
            "dkv": DKVSettingsResource(memtable_bytes=64 << 10)}


def _terminate(instance: DagsterInstance) -> None:
    """What terminating the (only) run does: the run launcher marks it CANCELING, the
    run worker interrupts itself."""
    [run] = instance.get_runs(limit=1)
    instance.report_run_canceling(run)
    os.kill(os.getpid(), signal.SIGINT)


def _reported_epochs(instance: DagsterInstance, run_id: str) -> list[int]:
    """Epochs of the checkpoint materializations Dagster recorded for the run, in order."""
    records = instance.fetch_materializations(checkpoint_asset_key(live_job(0)), limit=100).records
    return [r.asset_materialization.metadata["epoch"].value for r in reversed(records) if r.run_id == run_id]


def _reference(tmp_path, epochs: int):
    """Sink rows and DKV state after ``epochs`` epochs of the same input, run directly."""
    job = live_job(visible=3_000)
    with JobRunner(job, None, str(tmp_path / "reference"), retain_checkpoints=None) as runner:
        assert len(runner.run(max_epochs=epochs)) == epochs
        return _rows(runner.store, job), _state(runner.store)


def _rows(store, job: Job) -> list:
    return sorted(tuple(r.values()) for r in job.sinks["main"].read(store, PREFIX).to_pylist())


def _state(store) -> Counter:
    return Counter((op, k, v) for op, _, k, v in checkpoint_entries(store, PREFIX))


def test_terminating_a_continuous_run_finishes_the_epoch_in_flight(tmp_path, instance, recording_runner) -> None:
    """Input for 6 epochs; the termination comes while epoch 3 reads: epoch 3 commits and
    is reported, no epoch 4 starts, the run ends SUCCESS with its sinks materialized."""
    job = live_job(visible=3_000)
    sigint_handler = signal.getsignal(signal.SIGINT)

    def on_read(start: int) -> None:
        if start == 1_000 and not recording_runner.stopped.is_set():  # epoch 3's first slice
            _terminate(instance)
            assert recording_runner.stopped.wait(60), "the termination never reached JobRunner.stop()"

    job.source.on_read = on_read
    job.source.ingest_time_ms = int(time.time() * 1000)
    result = materialize(job_assets(job), resources=_resources(tmp_path / "store"), instance=instance)

    assert result.success
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.SUCCESS  # was CANCELING
    assert _reported_epochs(instance, result.run_id) == [1, 2, 3]
    store = open_object_store(str(tmp_path / "store"))
    newest = latest_checkpoint(store, PREFIX)
    assert newest.epoch == 3 and newest.source_offsets == {"p0": 1_500, "p1": 1_500}
    assert read_lease(store, PREFIX) is None  # the epoch in flight went through to its end
    rows, state = _reference(tmp_path, 3)
    assert _rows(store, job) == rows and _state(store) == state
    sink_md = {e.asset_key.to_user_string(): e.materialization.metadata
               for e in result.get_asset_materialization_events()}["live_window_counts"]
    assert sink_md["committed_epoch"].value == 3 and sink_md["epochs_this_run"].value == 3
    assert sink_md["rows"].value == len(rows)
    # The sink is materialized by every epoch that published rows to it, as it commits,
    # then once more at the end.
    sink_events = instance.fetch_materializations(AssetKey(job.sinks["main"].name), limit=10).records
    metadata = [r.asset_materialization.metadata for r in sink_events]
    per_epoch = {md["epoch"].value: md["rows_published"].value for md in metadata if "epoch" in md}
    assert sum(per_epoch.values()) == len(rows) > 0 and set(per_epoch) <= {1, 2, 3}
    assert len(sink_events) == len(per_epoch) + 1
    # Lag and latency per epoch, as numbers the UI plots: after epoch e, 3,000 - 500 e
    # events of each partition are left.
    records = instance.fetch_materializations(checkpoint_asset_key(job), limit=10).records
    md = {r.asset_materialization.metadata["epoch"].value: r.asset_materialization.metadata for r in records}
    assert [md[e]["lag_events"].value for e in (1, 2, 3)] == [5_000, 4_000, 3_000]
    assert md[3]["lag_events_by_partition"].value == {"p0": 1_500, "p1": 1_500}
    for e in (2, 3):  # the input rate needs a previous epoch in this run
        assert set(LIVE_METRICS) <= set(md[e]), sorted(set(LIVE_METRICS) - set(md[e]))
        assert all(isinstance(md[e][k], (FloatMetadataValue, IntMetadataValue)) for k in LIVE_METRICS)
        assert 0 <= md[e]["latency_p50_ms"].value <= md[e]["latency_p99_ms"].value <= md[e]["latency_max_ms"].value
    assert "input_events_per_s" not in md[1]
    # The step's handler is gone (Dagster itself leaves SIGTERM mapped to SIGINT's handler).
    assert signal.getsignal(signal.SIGINT) is sigint_handler
    assert job.source.attached == (store.uri(""), PREFIX)


def test_terminating_a_continuous_run_waiting_for_input(tmp_path, instance, recording_runner) -> None:
    """Input for 2 epochs; the run commits them, then waits for input; the termination
    ends the wait at once, without another epoch."""
    job = live_job(visible=1_000)
    store = open_object_store(str(tmp_path / "store"))

    sent = []

    def on_end_offsets() -> None:
        # The epochs' thread planning after epoch 2: nothing new from here on. Once only:
        # a second signal before the first one's handler ran would abandon the run.
        if threading.current_thread() is not threading.main_thread() and not sent:
            ckpt = latest_checkpoint(store, PREFIX)
            if ckpt is not None and ckpt.epoch == 2:
                sent.append(True)
                _terminate(instance)

    job.source.on_end_offsets = on_end_offsets
    result = materialize(job_assets(job), resources=_resources(tmp_path / "store"), instance=instance)

    assert result.success and recording_runner.stopped.is_set()
    assert _reported_epochs(instance, result.run_id) == [1, 2]
    assert latest_checkpoint(store, PREFIX).epoch == 2 and read_lease(store, PREFIX) is None
    assert _rows(store, job) == _reference(tmp_path, 2)[0]


def test_a_second_termination_signal_abandons_the_epoch_in_flight(tmp_path, instance, recording_runner) -> None:
    """Epoch 3 hangs after the termination; a second SIGINT ends the run at once,
    CANCELED, with epoch 3 still in flight (its lease held, nothing of it committed)."""
    job = live_job(visible=3_000)
    release = threading.Event()

    def on_read(start: int) -> None:
        if start == 1_000 and not recording_runner.stopped.is_set():
            _terminate(instance)
            assert recording_runner.stopped.wait(60), "the termination never reached JobRunner.stop()"
            os.kill(os.getpid(), signal.SIGINT)  # the impatient second one
            assert release.wait(60)

    job.source.on_read = on_read
    store = open_object_store(str(tmp_path / "store"))
    try:
        result = materialize(job_assets(job), resources=_resources(tmp_path / "store"), instance=instance,
                             raise_on_error=False)
        assert not result.success
        assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
        assert _reported_epochs(instance, result.run_id) == [1, 2]
        assert latest_checkpoint(store, PREFIX).epoch == 2
        assert read_lease(store, PREFIX).epoch == 3
    finally:
        release.set()
        for worker in [t for t in threading.enumerate() if t.name == f"dkvstream-epochs-{NAME}"]:
            worker.join(60)
    # Here the process lived on, so the abandoned epoch went on to commit whole (a process
    # that exits first leaves epoch 2 newest): the store is consistent either way.
    newest = latest_checkpoint(store, PREFIX)
    assert newest.epoch == 3 and verify_checkpoint(store, PREFIX, newest).ok and read_lease(store, PREFIX) is None


def test_short_run_on_a_live_source_ends_when_caught_up(tmp_path, instance) -> None:
    """``continuous: false``: the run processes the input there is and ends by itself."""
    job = live_job(visible=1_000)
    result = materialize(job_assets(job), resources=_resources(tmp_path / "store"), instance=instance,
                         run_config={"ops": {f"run_{NAME}": {"config": {"continuous": False}}}})
    assert result.success and _reported_epochs(instance, result.run_id) == [1, 2]
    job.source.visible = 1_500  # new input: the next short run continues from epoch 2
    result = materialize(job_assets(job, continuous=False), resources=_resources(tmp_path / "store"),
                         instance=instance)
    assert _reported_epochs(instance, result.run_id) == [3]


def test_a_failing_epoch_fails_the_run_after_reporting_the_committed_ones(tmp_path, instance) -> None:
    job = live_job(visible=3_000)

    def on_read(start: int) -> None:
        if start == 1_000:
            raise OSError("disk gone")

    job.source.on_read = on_read
    result = materialize(job_assets(job), resources=_resources(tmp_path / "store"), instance=instance,
                         raise_on_error=False)
    assert not result.success
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.FAILURE
    assert _reported_epochs(instance, result.run_id) == [1, 2]
    assert latest_checkpoint(open_object_store(str(tmp_path / "store")), PREFIX).epoch == 2


def test_source_asset_attaches_the_source_to_the_store(tmp_path) -> None:
    job = live_job(visible=700)
    source_asset = job_assets(job)[0]
    result = materialize([source_asset], resources={"object_store": ObjectStoreResource(root_uri=str(tmp_path))},
                         instance=DagsterInstance.ephemeral())
    assert job.source.attached == (open_object_store(str(tmp_path)).uri(""), PREFIX)
    [event] = result.get_asset_materialization_events()
    md = event.materialization.metadata
    assert md["end_offsets"].value == {"p0": 700, "p1": 700} and md["bounded"].value is False


def test_source_sensor_is_on_by_default_only_for_short_runs_on_a_live_source() -> None:
    def sensor_status(job: Job, continuous: bool | None) -> DefaultSensorStatus:
        [sensor] = [s for s in stream_job_definitions(job, continuous)["sensors"] if s.name.endswith("_source_sensor")]
        return sensor.default_status

    assert sensor_status(live_job(0), None) == DefaultSensorStatus.STOPPED  # live: continuous by default
    assert sensor_status(live_job(0), False) == DefaultSensorStatus.RUNNING
    assert sensor_status(small_job(), None) == DefaultSensorStatus.STOPPED  # bounded: nothing will arrive
    [epochs_job] = stream_job_definitions(live_job(0))["jobs"]
    assert epochs_job.executor_def is in_process_executor
    with pytest.raises(ValueError, match="not defined here: \\['nope'\\]"):
        dkvstream_definitions(live_job(0), resources={}, continuous={"nope": True})


def test_live_metadata_is_one_number_per_measured_metric() -> None:
    live = {"at_ms": 1_700_000_000_000, "input_rate": 1234.56, "read_rate": 99.04, "processing_rate": None,
            "lag_events": {"p0": 3, "p1": 4}, "lag_ms": {"p0": 250, "p1": None, "p2": 90},
            "latency_ms": {"p50": 5, "p99": 9, "max": 12}, "event_time_lag_ms": {"p50": 60, "p99": 70, "max": 80},
            "watermark_delay_ms": None}
    assert {k: v.value for k, v in live_metadata(live).items()} == {
        "input_events_per_s": 1234.6, "read_events_per_s": 99.0, "lag_events": 7,
        "lag_events_by_partition": {"p0": 3, "p1": 4},
        "lag_ms_max": 250, "latency_p50_ms": 5, "latency_p99_ms": 9, "latency_max_ms": 12,
        "event_time_lag_p50_ms": 60, "event_time_lag_p99_ms": 70, "event_time_lag_max_ms": 80}
    assert live_metadata({}) == {}
