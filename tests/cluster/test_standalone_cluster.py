"""The flights job on a real Spark standalone cluster (``platform/spark-cluster.sh``: a
master and two one-core workers on loopback) with state and output on S3 (SeaweedFS).

Each driver is its own process (``python -m dkvstream.operators.tools.run_job``), so stopping and
restarting the job is stopping and starting a driver. The cluster's daemons start
without any AWS variable: executors can reach the store only through the job's Spark
configuration, never through anything on the local disk.

Oracles: the spec's pandas oracle for the output; for state and per-epoch output after
each rescale, what a run that never rescaled had at the same epoch (the epoch plan does
not depend on parallelism). Checked to fail: a rescale that opens only the first parent
range loses state, and the test fails on the output (missing rows).
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dkvstream.examples.flights import OUTPUT_SCHEMA, flights_job
from dkvstream.examples.flights_oracle import KEY_COLUMNS
from dkvstream.operators.api.keygroups import key_group_ranges
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.spark.session import OBJECT_STORE_ENV
from dkvstream.operators.tools.state_reader import checkpoint_entries, read_state
from dkvstream.storage.local_server import pid_alive
from dkvstream.storage.objectstore import open_object_store

pytestmark = pytest.mark.slow("starts a Spark cluster")

ROOT = Path(__file__).resolve().parents[2]
JOB_SPEC = "dkvstream.examples.flights:flights_job"
EPOCH_EVENTS = 120_000  # 4 epochs over the full data set (the last one has 1,751 events)
EPOCHS = list(range(1, 5))
KILL_EPOCH_EVENTS = 15_000  # the executor-kill test: ~25 epochs
DRIVER_TIMEOUT_S = 600


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


class Cluster:
    """A running ``platform/spark-cluster.sh`` cluster: ``url``, ``dir``, daemon pids."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url, self.dir = url, directory

    def pids(self) -> dict[str, int]:
        return {f.stem: int(f.read_text()) for f in sorted((self.dir / "pids").glob("*.pid"))}

    def worker_pids(self) -> list[int]:
        return [pid for name, pid in self.pids().items() if name.startswith("worker-")]


def _script(action: str, directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "platform/spark-cluster.sh"), action], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DKVSTREAM_SPARK_CLUSTER_DIR": str(directory)})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, stopped at teardown (even when a test failed); teardown checks that
    every process it started, executors and Python workers included, is gone."""
    directory = tmp_path_factory.mktemp("spark-cluster")
    started = _script("start", directory)
    try:
        assert started.returncode == 0, f"cluster did not start: {started.stderr}"
        url = started.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", url), started.stdout
        c = Cluster(url, directory)
        status = _script("status", directory)
        assert status.returncode == 0 and url in status.stdout, status.stdout + status.stderr
        yield c
    finally:
        daemons = {int(f.read_text()) for f in (directory / "pids").glob("*.pid")} \
            if (directory / "pids").exists() else set()
        spawned = set().union(*(_descendants(p) for p in daemons)) if daemons else set()
        stopped = _script("stop", directory)
        assert stopped.returncode == 0, stopped.stderr
        left = sorted(p for p in daemons | spawned if pid_alive(p))
        assert not left, f"processes left running after stop: {left}"
        assert _script("status", directory).returncode == 1


class Driver:
    """A driver process: ``python -m dkvstream.operators.tools.run_job`` against the cluster and S3."""

    def __init__(self, cluster: Cluster, s3_server, store_uri: str, *args: str, ui: bool = False) -> None:
        conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "true" if ui else "false", "spark.ui.port": "0",
                # One executor per one-core worker, within the worker's 2g.
                "spark.executor.memory": "1g"}
        cmd = [sys.executable, "-m", "dkvstream.operators.tools.run_job", "--job", JOB_SPEC, "--store", store_uri,
               "--master", cluster.url, "--events-per-epoch", str(EPOCH_EVENTS), "--retain-checkpoints", "0", "--json",
               *args, *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}"))]
        env = {**os.environ, **s3_server.env(), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_CONF_DIR": str(ROOT / "platform/conf"), "PYSPARK_PYTHON": sys.executable}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.records: list[dict] = []
        self.stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.records.append(json.loads(line))

    def _read_stderr(self) -> None:
        self.stderr.extend(self.proc.stderr)

    def committed(self) -> list[dict]:
        return [r for r in self.records if r["event"] == "committed"]

    def started(self) -> dict | None:
        return next((r for r in self.records if r["event"] == "started"), None)

    def wait(self) -> list[dict]:
        """Waits for the driver to exit; returns its committed-epoch records.

        Raises:
            AssertionError: it failed (its stderr tail in the message) or timed out.
        """
        try:
            rc = self.proc.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        for t in self._threads:
            t.join(timeout=30)
        assert rc == 0, f"driver exited with {rc}:\n{''.join(self.stderr[-40:])}"
        return self.committed()


def _store_uri(s3_server, name: str) -> str:
    return f"s3://{s3_server.bucket}/cluster-{name}-{uuid.uuid4().hex[:8]}"


def _state(store, epoch: int) -> Counter:
    """Live DKV entries of the checkpoint, whichever range holds them."""
    return Counter((op, k, v) for op, _, k, v in checkpoint_entries(store, flights_job().prefix, epoch))


def _output(store):
    job = flights_job()
    return job.sinks["main"].read(store, job.prefix)


def _epoch_output(store, epoch: int) -> pd.DataFrame:
    """The rows published for one epoch, sorted."""
    job = flights_job()
    prefix = f"{job.sinks['main'].table_prefix(job.prefix)}epoch={epoch:08d}/"
    tables = [pq.read_table(io.BytesIO(store.get(k))) for k in store.list(prefix) if k.endswith(".parquet")]
    rows = pa.concat_tables(tables).to_pandas() if tables else OUTPUT_SCHEMA.empty_table().to_pandas()
    return rows.sort_values(KEY_COLUMNS).reset_index(drop=True)


@pytest.fixture(scope="module")
def clean_run(cluster, s3_server):
    """One run to the end with parallelism 2, every checkpoint kept: its records and
    store, and its state at each epoch (the oracle of the rescaled run)."""
    uri = _store_uri(s3_server, "clean")
    records = Driver(cluster, s3_server, uri, "--parallelism", "2").wait()
    store = open_object_store(uri)
    return records, store, {r["epoch"]: _state(store, r["epoch"]) for r in records}


def test_flights_on_cluster_equals_oracle(cluster, clean_run, check_flights_output) -> None:
    records, store, _ = clean_run
    for pid in cluster.worker_pids():  # the executors' only way to S3 is the job's configuration
        names = {v.split(b"=", 1)[0].decode() for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")}
        assert not names & set(OBJECT_STORE_ENV), f"worker {pid} has {names & set(OBJECT_STORE_ENV)}"
    assert [r["epoch"] for r in records] == EPOCHS and records[-1]["finished"]
    assert list_epochs(store, flights_job().prefix) == EPOCHS
    check_flights_output(_output(store))
    print("\nper-epoch object-store requests on the cluster (parallelism 2, 120,000 events):")
    for r in records:
        print(r["epoch"], r["events"], json.dumps(r["requests"]))
        assert r["requests"]["tasks"]["PUT"] > 0  # the tasks, on the executors, wrote to S3


def _assert_each_key_once(store, epoch: int, parallelism: int) -> None:
    """The state reader: no (key, window) twice, every entry in the range owning its key group."""
    job = flights_job()
    windows = read_state(store, job, "windows", epoch=epoch).to_pandas()
    dupes = windows.duplicated(["subject_key", "map_key"])
    assert not dupes.any(), f"epoch {epoch}: {int(dupes.sum())} keys twice, e.g. {windows[dupes].head(2)}"
    ranges = {r.label: r for r in key_group_ranges(job.key_groups, parallelism)}
    for _, label, key, _ in checkpoint_entries(store, job.prefix, epoch):
        kg = int.from_bytes(key[:2], "big")
        assert ranges[label].start <= kg < ranges[label].end, f"epoch {epoch}: key group {kg} in range {label}"


def test_rescale_2_4_3_while_running(cluster, s3_server, clean_run, check_flights_output) -> None:
    _, clean_store, clean_state = clean_run
    uri = _store_uri(s3_server, "rescale")
    store = open_object_store(uri)
    epochs: list[int] = []
    for parallelism, max_epochs in ((2, 1), (4, 1), (3, None)):
        args = ["--parallelism", str(parallelism)] + (["--max-epochs", str(max_epochs)] if max_epochs else [])
        records = Driver(cluster, s3_server, uri, *args).wait()
        epochs += [r["epoch"] for r in records]
        for epoch in (r["epoch"] for r in records):  # every checkpoint is kept
            ckpt = read_checkpoint(store, flights_job().prefix, epoch)
            assert ckpt.parallelism == parallelism and len(ckpt.operators["route_daily_delays"]) == parallelism
            assert _state(store, epoch) == clean_state[epoch], \
                f"state after rescaling to {parallelism} differs at epoch {epoch}"
            _assert_each_key_once(store, epoch, parallelism)
            # Flights windows are one day and an epoch is months of events, so state lost
            # by a rescale has been emitted (or not) by the next checkpoint: the epoch's
            # output is where it shows first.
            pd.testing.assert_frame_equal(_epoch_output(store, epoch), _epoch_output(clean_store, epoch),
                                          check_exact=False, rtol=1e-9, obj=f"output of epoch {epoch}")
    assert clean_state[3], "epoch 3 (parallelism 3) must hold open windows for the check to mean something"
    assert epochs == EPOCHS
    check_flights_output(_output(store))


def _executor_pid(cluster: Cluster, app_id: str, executor_id: str) -> int:
    """The JVM of executor ``executor_id`` of ``app_id``, a child of one of our workers."""
    for worker in cluster.worker_pids():
        for pid in _descendants(worker):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args and \
                    args[args.index(b"--executor-id") + 1].decode() == executor_id and \
                    args[args.index(b"--app-id") + 1].decode() == app_id:
                return pid
    raise LookupError(f"no executor {executor_id} of {app_id} under workers {cluster.worker_pids()}")


def _task_lost(driver: Driver, executor: str, deadline: float) -> bool:
    """Whether the driver logged a task lost with killed ``executor``: it logs the
    executor lost first and, in the same handler, each task that was running on it."""
    lost_executor = re.compile(rf"Lost executor {executor} on ")
    lost_task = re.compile(rf"Lost task \S+ in stage \S+ \(TID \d+\) \(\S+ executor {executor}\): ExecutorLostFailure")
    seen_at = None
    while time.monotonic() < deadline:
        log = "".join(driver.stderr)
        if lost_task.search(log):
            return True
        if seen_at is None and (lost_executor.search(log) or driver.proc.poll() is not None):
            seen_at = time.monotonic()
        if seen_at is not None and time.monotonic() - seen_at > 5:
            return False
        time.sleep(0.1)
    return False


def _busy_executor(ui: str, app_id: str) -> str | None:
    """An executor of the app running a task now, from the driver's REST API (None also
    when the driver, busy on a loaded machine, does not answer in time)."""
    try:
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app_id}/executors", timeout=10) as r:
            executors = json.load(r)
    except (OSError, ValueError):  # URLError, timeouts and refused connections are OSErrors
        return None
    return next((e["id"] for e in executors if e["id"] != "driver" and e["activeTasks"] > 0), None)


def test_executor_killed_mid_run_commits_once(cluster, s3_server, check_flights_output) -> None:
    """An executor killed with SIGKILL while the run's long-lived tasks run on it (after
    epoch 1): Spark restarts the barrier stage on a replacement executor, the epoch in
    flight runs again from the last checkpoint, and every epoch commits once."""
    uri = _store_uri(s3_server, "kill")
    # Small epochs: many epochs left after the kill.
    driver = Driver(cluster, s3_server, uri, "--parallelism", "2", "--events-per-epoch",
                    str(KILL_EPOCH_EVENTS), ui=True)
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while not driver.committed() and driver.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert driver.committed(), f"epoch 1 did not commit:\n{''.join(driver.stderr[-40:])}"
    started = driver.started()
    # The long-lived tasks run from the first epoch to the last, so an executor of the app
    # is busy until the run ends; a kill lands when Spark logs the task lost.
    landed, kills = None, []
    while landed is None and driver.proc.poll() is None and time.monotonic() < deadline:
        executor = _busy_executor(started["ui"], started["app_id"])
        if executor is None or executor in kills:
            time.sleep(0.1)
            continue
        in_flight = driver.committed()[-1]["epoch"] + 1
        os.kill(_executor_pid(cluster, started["app_id"], executor), signal.SIGKILL)
        kills.append(executor)
        if _task_lost(driver, executor, deadline):
            landed = executor
    assert landed is not None, f"no kill ({kills}) lost a running task before the driver finished"
    records = driver.wait()

    epochs = [r["epoch"] for r in records]
    # Each epoch committed once, none lost, the one in flight among them.
    assert epochs == list(range(1, len(epochs) + 1)) and records[-1]["finished"] and in_flight in epochs
    store = open_object_store(uri)
    assert list_epochs(store, flights_job().prefix) == epochs
    # The kill restarted the tasks (a kill that restarted nothing tested nothing).
    assert read_checkpoint(store, flights_job().prefix, epochs[-1]).metrics["long_lived_tasks"]["restarts"] >= 1
    ckpt = read_checkpoint(store, flights_job().prefix, in_flight)
    # One attempt per range is named: the killed attempt's files are garbage, never output.
    assert len(ckpt.outputs["main"]) == 2 and len(set(ckpt.operators["route_daily_delays"])) == 2
    check_flights_output(_output(store))  # exactly-once: every route and window once, counts exact
