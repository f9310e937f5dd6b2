"""Soak: continuous input, the Dagster compaction and cleanup sensors, an S3 server
restarted twice; afterwards the store's files are bounded and the output is exact.

For ``DKVSTREAM_SOAK_SECONDS`` (default 1800) a source grows at ``DKVSTREAM_SOAK_RATE``
events per second per partition (default 300); the driver (``JobRunner``, in-process tasks,
no inline compaction or retention, as under Dagster) runs an epoch whenever input is
pending and reports each checkpoint as a materialization of the job's checkpoint asset.
After every epoch the compaction and cleanup sensors are evaluated with Dagster's own
``build_sensor_context`` and each run they request (``compaction``,
``garbage_collection``) is executed in-process on the same instance. The SeaweedFS server
is stopped at one third and two thirds of the run, from another thread, at whatever the
job or maintenance is doing, and started again 2 s later; failed epochs and runs are
retried. At the end the
source is closed, the job runs to its end and a last cleanup runs; then:

* the output equals the pandas oracle over every event the source produced, exactly;
* the newest checkpoint's files all exist and verify;
* the objects the job keeps besides its published output (state, staging, checkpoints,
  control) stay bounded: the most seen in the last third of the run is at most 1.5 times
  (plus 50 objects) the most seen in the second third.

Progress is printed every 15 s (run with ``-s`` to see it). Verify with e.g.
``DKVSTREAM_SOAK_SECONDS=120``.
"""
from __future__ import annotations

import os
import threading
import time

import pytest
from dagster import AssetMaterialization, DagsterInstance, build_sensor_context

from assets.checkpoints import checkpoint_asset_key, checkpoint_metadata, level_stats
from assets.jobs import cleanup_job_def, compaction
from assets.resources import DKVSettingsResource, ObjectStoreResource
from assets.sensors import make_cleanup_sensor, make_compaction_sensor
from examples.keyed_count import keyed_count_job, keyed_count_oracle
from examples.synthetic import SyntheticSource
from operators.runtime.cleanup import cleanup_job
from operators.runtime.driver import JobRunner
from tests.reliability import harness

RETAIN = 3
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # keeps progress readable
DKV = DKVSettingsResource(memtable_bytes=16 << 10, l0_compaction_trigger=3, size_amp_threshold=0.5,
                          max_inline_compaction_bytes=0, wal_flush_bytes=64 << 10, target_file_bytes=64 << 10,
                          retain_checkpoints=RETAIN)


class GrowingSource(SyntheticSource):
    """``SyntheticSource`` whose partitions grow at ``rate`` events/s from construction
    until ``close()``; unbounded until then."""

    def __init__(self, rate: float, capacity: int, **kw) -> None:
        super().__init__(capacity, 500, **kw)
        self.rate, self.started, self.limit = rate, time.monotonic(), None

    @property
    def bounded(self) -> bool:
        return self.limit is not None

    def end_offsets(self) -> dict[str, int]:
        n = self.limit if self.limit is not None else int((time.monotonic() - self.started) * self.rate)
        return {p: min(n, self.events) for p in self.partitions()}

    def close(self) -> None:
        """Stops the growth: the events produced so far are all there is."""
        self.limit = min(self.events, int((time.monotonic() - self.started) * self.rate))

    def full_partition(self, partition: str):
        table = super().full_partition(partition)
        return table if self.limit is None else table.slice(0, self.limit)


class Ticker:
    """One sensor evaluated tick after tick, carrying its cursor as the daemon does."""

    def __init__(self, sensor_def, instance: DagsterInstance, resources: dict) -> None:
        self.sensor_def, self.instance, self.resources, self.cursor = sensor_def, instance, resources, None

    def tick(self) -> list:
        with build_sensor_context(instance=self.instance, cursor=self.cursor, resources=self.resources) as ctx:
            data = self.sensor_def.evaluate_tick(ctx)
        if data.cursor is not None:
            self.cursor = data.cursor
        return data.run_requests


def _kept_objects(store, prefix: str) -> tuple[int, int]:
    """Objects and bytes under the job prefix, published output excluded."""
    keys = [k for k in store.list(prefix + "/") if "/sinks/" not in k]
    return len(keys), sum(store.size(k) for k in keys)


@pytest.mark.slow
def test_soak_with_sensors_and_s3_restarts(s3_server, s3_store) -> None:
    seconds = float(os.environ.get("DKVSTREAM_SOAK_SECONDS", "1800"))
    rate = float(os.environ.get("DKVSTREAM_SOAK_RATE", "300"))
    job = keyed_count_job(1, 500, partitions=2, step_ms=1_000, events_per_epoch=int(rate * 20), name="soak")
    source = job.source = GrowingSource(rate, int(rate * seconds * 1.2) + 1_000, partitions=2, step_ms=1_000)
    uri = s3_store.root_uri
    store = s3_store
    instance = DagsterInstance.ephemeral()
    resources = {"object_store": ObjectStoreResource(root_uri=uri), "dkv": DKV}
    sensors = {"compaction": (Ticker(make_compaction_sensor(job), instance, {"dkv": DKV}), compaction),
               "cleanup": (Ticker(make_cleanup_sensor(job), instance, resources), cleanup_job_def)}
    restarts: list[float] = []
    down = threading.Event()

    def stop() -> None:  # at whatever the job or maintenance is doing
        s3_server.stop()
        down.set()

    def start_again_if_down(now: float) -> None:
        # Started from the main thread: the server dies with the thread that started it
        # (PR_SET_PDEATHSIG), so a timer thread may stop it but not start it.
        if down.is_set():
            time.sleep(2.0)
            s3_server.start()
            down.clear()
            restarts.append(round(time.monotonic() - started, 1))
            print(f"{restarts[-1]:7.1f} s: S3 server restarted (stopped at {now:.1f} s or before)", flush=True)

    started = time.monotonic()
    timers = [threading.Timer(seconds * f, stop) for f in (1 / 3, 2 / 3)]
    for t in timers:
        t.start()
    counts: list[tuple[float, int, int]] = []
    stats = {"epochs": 0, "failed_epochs": 0, "maintenance_runs": 0, "failed_runs": 0}
    next_report = 0.0
    try:
        while (now := time.monotonic() - started) < seconds:
            start_again_if_down(now)
            try:
                runner = JobRunner(job, None, uri, dkv_options=DKV.options(), retain_checkpoints=None)
                results = runner.run(max_epochs=1)
                for res in results:
                    ckpt = runner.latest()
                    instance.report_runless_asset_event(AssetMaterialization(
                        checkpoint_asset_key(job), metadata=checkpoint_metadata(res, level_stats(runner.store, ckpt))))
                stats["epochs"] += len(results)
                if not results:
                    time.sleep(0.5)
                for ticker, job_def in sensors.values():
                    for req in ticker.tick():
                        result = job_def.execute_in_process(run_config={**req.run_config, **QUIET}, resources=resources,
                                                            instance=instance, tags=req.tags, raise_on_error=False)
                        stats["maintenance_runs"] += 1
                        stats["failed_runs"] += not result.success
                counts.append((now, *_kept_objects(store, job.prefix)))
            except Exception as e:  # noqa: BLE001 - the store is down during a restart: retry
                stats["failed_epochs"] += 1
                print(f"{now:7.1f} s: retrying after {type(e).__name__}: {str(e)[:120]}", flush=True)
                time.sleep(1.0)
            if now >= next_report:
                latest = counts[-1] if counts else (0, 0, 0)
                print(f"{now:7.1f} s: {stats}, {latest[1]} objects / {latest[2]} bytes kept, "
                      f"restarts at {[round(r) for r in restarts]}", flush=True)
                next_report = now + 15
    finally:
        for t in timers:
            t.cancel()
            t.join()
        start_again_if_down(seconds)
    assert len(restarts) == 2, restarts
    source.close()
    for attempt in range(5):
        try:
            runner = JobRunner(job, None, uri, dkv_options=DKV.options(), retain_checkpoints=None)
            runner.run()
            break
        except Exception as e:  # noqa: BLE001
            print(f"final run retry {attempt}: {e}", flush=True)
            time.sleep(2)
    report = cleanup_job(store, job.prefix, RETAIN, concurrent=True)
    print(f"done: {stats}, final cleanup {report}", flush=True)

    assert runner.latest().finished
    got = harness.sorted_frame(job.sinks["main"].read(store, job.prefix).to_pandas())
    harness.assert_frames_equal(got, harness.sorted_frame(keyed_count_oracle(source)), "soak output")
    assert job.sinks["late"].read(store, job.prefix).num_rows == 0
    harness.assert_named_files_exist(store, job.prefix)
    assert stats["maintenance_runs"] > 0 and stats["epochs"] > 10, stats
    middle = [c for t, c, _ in counts if seconds / 3 <= t < 2 * seconds / 3]
    last = [c for t, c, _ in counts if t >= 2 * seconds / 3]
    print(f"kept objects: middle third max {max(middle)}, last third max {max(last)}", flush=True)
    assert max(last) <= 1.5 * max(middle) + 50, (max(middle), max(last))
