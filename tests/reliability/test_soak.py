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
job or maintenance is doing, and started again 2 s after the stop ended; an iteration
that fails in such an outage is retried (any other failure fails the test). At the end
the source's input ends, the job runs to its end and a last cleanup runs, both without
retries; then:

* the output equals the pandas oracle over every event the source produced, exactly;
* the newest checkpoint's files all exist and verify;
* the objects the job keeps besides its published output (state, staging, checkpoints,
  control) stay bounded: the most seen in the last third of the run is at most 1.5 times
  (plus 50 objects) the most seen in the second third;
* every failure is one of the injected outages: an epoch or maintenance run fails only
  between a stop of the server and the first iteration that succeeds after its restart,
  only because the store is unreachable (``S3RequestError``), and at most
  ``MAX_FAILED_EPOCHS_PER_OUTAGE`` epochs and ``MAX_FAILED_RUNS_PER_OUTAGE`` maintenance
  runs per outage; any other failure fails the test at once;
* the job keeps pace: the first third of the run, before any outage, is the warm-up
  that measures how many epochs this machine commits in a third; each later third
  commits at least ``MIN_PACE`` of that (an outage costs seconds of a third, a stall or
  a retry loop costs most of it). No absolute speed is assumed.

Progress is printed every 15 s (run with ``-s`` to see it). CI runs 300 s
(``.ci/run``); verify a change with e.g. ``DKVSTREAM_SOAK_SECONDS=120``.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import pytest
from dagster import AssetMaterialization, DagsterInstance, build_sensor_context

from dkvstream.assets.checkpoints import checkpoint_asset_key, checkpoint_metadata, level_stats
from dkvstream.assets.jobs import cleanup_job_def, compaction
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.assets.sensors import make_cleanup_sensor, make_compaction_sensor
from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore.s3 import S3RequestError
from tests.reliability import harness

RETAIN = 3
# An outage interrupts the iteration it stops the server in; the next one waits for the
# stop to end and restarts the server, which is ready when it took a put and a get, so
# at most one more fails (a server slow to serve the job's first requests). The
# maintenance runs of the interrupted iteration fail together (each sensor's requests).
MAX_FAILED_EPOCHS_PER_OUTAGE = 2
MAX_FAILED_RUNS_PER_OUTAGE = 4
# Each later third of the run commits at least this fraction of the warm-up third's epochs.
MIN_PACE = 0.25
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # keeps progress readable
DKV = DKVSettingsResource(memtable_bytes=16 << 10, l0_compaction_trigger=3, size_amp_threshold=0.5,
                          max_inline_compaction_bytes=0, wal_flush_bytes=64 << 10, target_file_bytes=64 << 10,
                          retain_checkpoints=RETAIN)


class GrowingSource(SyntheticSource):
    """``SyntheticSource`` whose partitions grow at ``rate`` events/s from construction
    until ``end_input()``; unbounded until then (not ``close()``: the runtime calls
    ``Source.close()`` at the end of every run to release a source's clients)."""

    def __init__(self, rate: float, capacity: int, **kw) -> None:
        super().__init__(capacity, 500, **kw)
        self.rate, self.started, self.limit = rate, time.monotonic(), None

    @property
    def bounded(self) -> bool:
        return self.limit is not None

    def end_offsets(self) -> dict[str, int]:
        n = self.limit if self.limit is not None else int((time.monotonic() - self.started) * self.rate)
        return {p: min(n, self.events) for p in self.partitions()}

    def end_input(self) -> None:
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


@dataclass
class Outage:
    """One stop of the S3 server (seconds since the start of the run) and the failures it
    caused: until the first iteration that succeeds after the restart."""

    stopped: float
    restarted: float | None = None
    recovered: float | None = None
    failed_epochs: list[str] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)


def _store_unreachable(e: BaseException) -> bool:
    """The exception, or one it was raised from, is the S3 store not answering."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, S3RequestError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _run_errors(result) -> list[str]:
    """The errors of a failed in-process Dagster run, as text (class names included)."""
    errors = []
    for ev in result.all_events:
        error = getattr(ev.event_specific_data, "error", None)
        if ev.is_failure and error is not None:
            errors.append(error.to_string())
    return errors or [f"run {result.run_id} failed without an error event"]


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
    outages: list[Outage] = []
    down, stopped = threading.Event(), threading.Event()

    def stop() -> None:  # at whatever the job or maintenance is doing
        outages.append(Outage(round(time.monotonic() - started, 1)))  # before the first failure
        down.set()
        s3_server.stop()  # SIGTERM, then SIGKILL after 3 s
        stopped.set()

    def start_again_if_down(now: float) -> None:
        # Started from the main thread: the server dies with the thread that started it
        # (PR_SET_PDEATHSIG), so a timer thread may stop it but not start it.
        if down.is_set():
            stopped.wait()
            time.sleep(2.0)
            s3_server.start()  # returns once the bucket takes a put and a get
            down.clear()
            stopped.clear()
            outages[-1].restarted = round(time.monotonic() - started, 1)
            print(f"{outages[-1].restarted:7.1f} s: S3 server restarted "
                  f"(stopped at {outages[-1].stopped} s)", flush=True)

    def open_outage() -> Outage | None:
        """The outage a failure now belongs to: stopped and not yet recovered from."""
        return outages[-1] if outages and outages[-1].recovered is None else None

    started = time.monotonic()
    timers = [threading.Timer(seconds * f, stop) for f in (1 / 3, 2 / 3)]
    for t in timers:
        t.start()
    counts: list[tuple[float, int, int]] = []
    epoch_times: list[float] = []  # when each epoch committed (seconds since the start)
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
                epoch_times += [time.monotonic() - started] * len(results)
                if not results:
                    time.sleep(0.5)
                failed_runs = []
                for ticker, job_def in sensors.values():
                    for req in ticker.tick():
                        result = job_def.execute_in_process(run_config={**req.run_config, **QUIET}, resources=resources,
                                                            instance=instance, tags=req.tags, raise_on_error=False)
                        stats["maintenance_runs"] += 1
                        if not result.success:
                            failed_runs.append("\n".join(_run_errors(result)))
                counts.append((now, *_kept_objects(store, job.prefix)))
            except Exception as e:
                outage = open_outage()
                if outage is None or not _store_unreachable(e):
                    raise  # not an injected outage: a real failure, never retried
                stats["failed_epochs"] += 1
                failed_at = time.monotonic() - started
                outage.failed_epochs.append(f"{failed_at:.1f} s (iteration from {now:.1f} s): "
                                            f"{type(e).__name__}: {str(e)[:200]}")
                print(f"{failed_at:7.1f} s: retrying after {type(e).__name__}: {str(e)[:120]}",
                      flush=True)
                assert len(outage.failed_epochs) <= MAX_FAILED_EPOCHS_PER_OUTAGE, outage
                time.sleep(1.0)
                continue
            finally:
                if now >= next_report:
                    latest = counts[-1] if counts else (0, 0, 0)
                    print(f"{now:7.1f} s: {stats}, {latest[1]} objects / {latest[2]} bytes kept, "
                          f"outages {[(o.stopped, o.restarted) for o in outages]}", flush=True)
                    next_report = now + 15
            if failed_runs:
                stats["failed_runs"] += len(failed_runs)
                outage = open_outage()
                assert outage is not None, (
                    f"maintenance runs failed outside an outage: {failed_runs}")
                assert all("S3RequestError" in f for f in failed_runs), failed_runs
                outage.failed_runs += failed_runs
                assert len(outage.failed_runs) <= MAX_FAILED_RUNS_PER_OUTAGE, outage
            elif outages and outages[-1].restarted is not None and outages[-1].recovered is None:
                # A whole iteration succeeded after the restart: the outage is over.
                outages[-1].recovered = round(time.monotonic() - started, 1)
    finally:
        for t in timers:
            t.cancel()
            t.join()
        start_again_if_down(seconds)
    assert len(outages) == 2 and all(o.restarted for o in outages), outages
    source.end_input()
    # The server is up: the rest of the job and the last cleanup must succeed at once.
    runner = JobRunner(job, None, uri, dkv_options=DKV.options(), retain_checkpoints=None)
    runner.run()
    report = cleanup_job(store, job.prefix, RETAIN, concurrent=True)
    print(f"done: {stats}, final cleanup {report}", flush=True)
    for o in outages:
        print(f"outage {o}", flush=True)

    assert runner.latest().finished
    got = harness.sorted_frame(job.sinks["main"].read(store, job.prefix).to_pandas())
    harness.assert_frames_equal(got, harness.sorted_frame(keyed_count_oracle(source)), "soak output")
    assert job.sinks["late"].read(store, job.prefix).num_rows == 0
    harness.assert_named_files_exist(store, job.prefix)
    assert stats["maintenance_runs"] > 0, stats
    # Every failure belonged to an outage (checked as it happened); each outage ended.
    assert all(o.recovered for o in outages), outages
    # The pace: epochs per third of the run against the fault-free first third.
    per_third = [sum(1 for t in epoch_times if k * seconds / 3 <= t < (k + 1) * seconds / 3)
                 for k in range(3)]
    print(f"epochs per third of the run: {per_third} (warm-up: the first)", flush=True)
    assert per_third[0] >= 10, f"the warm-up third committed only {per_third[0]} epochs: run longer"
    assert min(per_third[1:]) >= MIN_PACE * per_third[0], (
        f"epochs per third {per_third}: a later third committed less than {MIN_PACE} "
        f"of the warm-up's")
    middle = [c for t, c, _ in counts if seconds / 3 <= t < 2 * seconds / 3]
    last = [c for t, c, _ in counts if t >= 2 * seconds / 3]
    print(f"kept objects: middle third max {max(middle)}, last third max {max(last)}", flush=True)
    assert max(last) <= 1.5 * max(middle) + 50, (max(middle), max(last))
