"""The flights job on dkvstream against Spark 4 ``transformWithStateInPandas``, Bytewax and Flink SQL.

Usage (needs the ``bench`` extra for Bytewax, psutil and matplotlib:
``pip install -e '.[bench]'``)::

    .venv/bin/python bench/flights_throughput.py                       # --scales 1,10
    .venv/bin/python bench/flights_throughput.py --scales 1 --spark-max-events 100000
    .venv/bin/python bench/flights_throughput.py --epoch-overhead      # 10 epochs of 1 event
    .venv/bin/python bench/flights_throughput.py --plot docs/img/flights.png

Every engine runs the same events in the same micro-batches (the epoch plan and Parquet
files of ``bench/baselines/flights_input.py``: dkvstream's planning rule,
``--events-per-epoch`` events per epoch) and reads them from the same Parquet files
inside its clock (dkvstream through ``EpochFilesSource``), in its own child process, so
the peak memory measured is its own: ``psutil`` samples the child's process tree every
0.2 s, "driver" is the child Python process plus its JVM, "workers" the Python processes
the JVM starts (Spark's Python workers). Each engine's output is checked against the
oracle (``prefix_oracle``: the spec's pandas oracle for a full run) before its time
counts; an engine whose check fails is reported as FAILED, not timed.

Engines: ``dkvstream`` (``examples/flights.py``, the vectorised form
``flights_job(batch=True)``, on ``JobRunner``, local[2], long-lived tasks; the reference
row), ``dkvstream-stages`` (the same with Spark stages per epoch,
``JobRunner(long_lived_tasks=False)``),
``dkvstream-in-process`` (the same, ``JobRunner(job, spark=None)``: both key-group ranges'
stages run one after the other in the driver process, one core, no Spark; the row to
compare with Bytewax's one worker in one process), ``dkvstream-on-event`` (the
``on_event`` form on local[2]),
``spark-tws-textbook`` and ``spark-tws-batched`` (``bench/baselines/spark_tws_flights.py``:
RocksDB state store, local[2], event-time timers), ``bytewax`` (``bench/baselines/
bytewax_flights.py``: one worker, SQLite recovery snapshots each second), ``flink-sql``
(``bench/baselines/flink_sql_flights.py``: PyFlink 2.3 in its own venv ``.venv-flink``,
made by ``bash bench/flink/setup.sh``; a ``TUMBLE`` window in Flink SQL, parallelism 2,
RocksDB state backend, incremental checkpoints each second; Flink's Parquet format is not
in the PyFlink wheel, so the job copies the Parquet files to CSV inside its clock; no
micro-batches, so no s/epoch columns).

Spark runs ~1,000 events/s: a full scale-10 run would take about an hour, so
``--spark-max-events N`` (default 200,000 at scale > 1) runs Spark on the whole epochs
covering the first N events, checked against an oracle over exactly those events
(every window closed at the end, as at end of input). The reference rows (dkvstream,
dkvstream-in-process, when selected) then run that prefix too, so every ratio is taken
over the same events: a ratio column compares an engine only with the reference row of
the same run (same events, same epochs).

Two ratios per reference: whole run (events/s of the reference over the engine's, start-up
and first epoch included) and steady state (the engine's median seconds per epoch over
the reference's, epochs after the first: the first carries each engine's one-off start,
e.g. Spark's first job and its Python workers).

``--baseline-commit REV`` adds the engine ``dkvstream@REV``: the ``dkvstream`` engine of
another commit of this repository (checked out with ``git worktree`` into the run's
temporary directory, its C extension built there), run on the same input files, so a
change to the runtime is measured against the code before it in the same run; its
ratio columns against ``dkvstream`` say how much faster the current commit is.

``--epoch-overhead``: ``--epochs`` epochs of one event each (one partition, EWR), dkvstream
(on Spark and in process) against Spark TWS: the median seconds per epoch is the fixed
cost of a micro-batch (planning, a Spark stage, state commit, checkpoint).

What each engine's clock covers (wall clock, ``time.perf_counter``; events/s = events /
those seconds; ``CLOCKS`` is the text the table prints): dkvstream, from just before
``JobRunner`` is constructed (the source has not listed or read any file yet) until the
last epoch's commit and publish (its output visible); Bytewax, from ``cli_main`` (the flow
built, the recovery store initialised; no file opened) until it returns (every window
written to its sink); Spark TWS, from just before the streaming query is started (the
file source lists the files after that) until it terminates (the file sink's last batch
committed); Flink SQL, from just before the Parquet files are read (the TableEnvironment's
gateway JVM already up) until the INSERT job ends (its sink's last file committed; the
job's local MiniCluster starts inside the clock, on submission). Every clock excludes the
process's imports and the Spark session (for Flink: the gateway JVM) start-up;
none excludes an engine's first micro-batch (for dkvstream on Spark: the session's
first job, which starts Spark's Python workers, and the imports in those workers).
Columns read: dkvstream reads every column its job carries (route, event time and the 10
``EVENT_COLUMNS``), Spark the 6 its processor uses, Bytewax 4.

Output: progress lines while running, then one table per scale: engine, events, events/s,
median seconds per epoch (all epochs, and steady state), time to first output (s from the
start of the clock), peak RSS of driver and of workers (MiB), the ratio columns, the load
average at the start and end of the scale's runs, and what each clock covers.
``--plot PATH`` writes the tables as a PNG (events/s and steady-state ratios per scale).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from bench.baselines.flights_input import (
    EpochFilesSource,
    EpochPlan,
    add_run_arguments,
    check_output,
    plan_epochs,
    run_engine_cli,
    write_input_files,
)
from bench.plot import load_average

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ENGINES = ("dkvstream", "dkvstream-stages", "dkvstream-in-process", "dkvstream-on-event", "spark-tws-textbook",
           "spark-tws-batched", "bytewax", "flink-sql")
OVERHEAD_ENGINES = ("dkvstream", "dkvstream-stages", "dkvstream-in-process", "spark-tws-textbook")
MIB = 1024 * 1024
# What each engine's clock covers, printed under every table (see the module docstring).
CLOCKS = {
    "dkvstream": "wall clock from JobRunner construction (before the source lists or reads a "
                 "file) to the last epoch's commit and publish (output visible)",
    "spark-tws": "wall clock from the streaming query's start (before the file source lists "
                 "the files) to its termination (the file sink's last batch committed)",
    "bytewax": "wall clock from cli_main (no file opened yet) to its return (every window "
               "in the sink)",
    "flink-sql": "wall clock from before the Parquet files are read (gateway JVM up; their copy "
                 "to CSV inside) to the INSERT job's end (sink files committed; the job's "
                 "MiniCluster start inside)",
}
CLOCK_NOTE = ("Every clock: Spark session (Flink: gateway JVM) start-up and imports excluded, the first "
              "micro-batch included; every engine reads the same Parquet files inside it.")


# ---------------------------------------------------------------- dkvstream child
def run_dkvstream(plan: EpochPlan, input_dir: str, work_dir: str, spark, progress=print,
                  batch: bool = True, engine: str | None = None, long_lived_tasks: bool = True) -> dict:
    """The flights job on dkvstream over the plan's files, checked against the oracle.

    Args:
        plan: epochs and partition ends ``input_dir`` was written from.
        input_dir: ``write_input_files`` output; the job's source (``EpochFilesSource``)
            reads it inside the clock.
        work_dir: object-store root (a local directory), emptied first.
        spark: the SparkSession (None: stages run in this process, the
            ``dkvstream-in-process`` engine).
        progress: called with a progress line every ~10 s.
        batch: the vectorised operator (``RouteDailyDelaysBatch``); False: ``on_event``.
        engine: the row's name (default from ``batch``).
        long_lived_tasks: ``JobRunner``'s (False: Spark stages per epoch, the
            ``dkvstream-stages`` engine).

    Returns:
        ``{"engine", "events", "seconds", "epochs", "epoch_seconds", "first_output_s", "late",
        "correct": True}``; seconds from just before ``JobRunner`` is constructed (Spark
        session start-up excluded; no input file read yet) to the last epoch's end.

    Raises:
        AssertionError: output differs from the oracle, the run's epochs differ from the
            plan, or an event was late.
    """
    from dkvstream.examples.flights import flights_job
    from dkvstream.operators.runtime.driver import JobRunner

    shutil.rmtree(work_dir, ignore_errors=True)
    engine = engine or ("dkvstream" if batch else "dkvstream-on-event")
    # No watermark alignment: every engine must process the same micro-batches.
    job = flights_job(scale=plan.scale, events_per_epoch=plan.events_per_epoch, parallelism=2,
                      name="flights_bench", batch=batch, max_watermark_drift_ms=None)
    job.source = EpochFilesSource(input_dir)  # lists and reads the files inside the clock
    started = last_report = time.perf_counter()
    runner = JobRunner(job, spark, work_dir, long_lived_tasks=long_lived_tasks)
    epoch_seconds, first_output_s, events = [], None, 0
    for r in runner.epochs():
        epoch_seconds.append(r.seconds)
        events += r.events
        if first_output_s is None and r.output_rows.get("main", 0) > 0:
            first_output_s = time.perf_counter() - started
        if time.perf_counter() - last_report >= 10:
            last_report = time.perf_counter()
            progress(f"{engine}: epoch {r.epoch}/{len(plan.epochs)}, {events:,} events, "
                     f"{last_report - started:.0f} s")
    seconds = time.perf_counter() - started
    assert events == plan.events, f"{engine} read {events:,} events, the plan has {plan.events:,}"
    assert len(epoch_seconds) == len(plan.epochs), \
        f"{engine} ran {len(epoch_seconds)} epochs, the plan has {len(plan.epochs)}"
    check_output(job.sinks["main"].read(runner.store, job.prefix), plan)
    late = job.sinks["late"].read(runner.store, job.prefix).num_rows
    assert late == 0, f"{engine}: {late} late events (expected none)"
    return {"engine": engine, "events": events, "seconds": seconds, "epochs": len(epoch_seconds),
            "epoch_seconds": epoch_seconds, "first_output_s": first_output_s, "late": late, "correct": True,
            "clock_start": started, "clock_end": started + seconds}


def _dkvstream_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    add_run_arguments(ap)
    ap.add_argument("--form", choices=("batch", "event"), default="batch",
                    help="operator form: vectorised (batch) or on_event")
    ap.add_argument("--runner", choices=("spark", "stages", "in-process"), default="spark",
                    help="long-lived tasks on Spark local[2], Spark stages per epoch on local[2] "
                         "(JobRunner(long_lived_tasks=False)), or in this process (JobRunner(job, None))")
    args = ap.parse_args(argv)
    batch = args.form == "batch"
    engine = {"in-process": "dkvstream-in-process", "stages": "dkvstream-stages"}.get(
        args.runner, "dkvstream" if batch else "dkvstream-on-event")

    def run(plan: EpochPlan, input_dir: str, work_dir: str) -> dict:
        spark = None
        if args.runner != "in-process":
            from dkvstream.operators.spark.session import get_spark

            spark = get_spark({"spark.master": "local[2]"})
        return run_dkvstream(plan, input_dir, work_dir, spark,
                             progress=lambda line: print(line, file=sys.stderr, flush=True),
                             batch=batch, engine=engine, long_lived_tasks=args.runner != "stages")

    return run_engine_cli(args, engine, run)


# ------------------------------------------------------------------- the parent
class TreeMemory:
    """Peak RSS and CPU time of a process tree, sampled every ``interval_s``: driver (the
    root and its JVMs) and workers (Python processes below a JVM). ``exclude(process)``:
    True for a descendant not to count in either, with its own descendants (e.g. a load
    generator); its CPU time is kept apart as ``"excluded"``. ``extra``: ``{role: pid}`` of
    processes outside the tree whose CPU time to sample too (e.g. a broker).

    ``cpu_series``: ``[(perf_counter s, {role: CPU s since the sampler started}), ...]``,
    roles ``driver``, ``workers``, ``excluded`` and those of ``extra``; a process's CPU time
    is user + system of the process itself (threads included), kept from its last sample
    once it exits. ``cpu_between(start, end)`` reads it."""

    def __init__(self, pid: int, interval_s: float = 0.2, exclude=None, extra: dict[str, int] | None = None) -> None:
        import psutil

        self._psutil, self.root = psutil, psutil.Process(pid)
        self.interval_s = interval_s
        self.exclude = exclude
        self.driver_peak = self.workers_peak = 0
        self.cpu_series: list[tuple[float, dict[str, float]]] = []
        self._cpu: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU s at its last sample)
        self._extra = {role: psutil.Process(p) for role, p in (extra or {}).items()}
        self._extra_base = {role: self._cpu_s(p) for role, p in self._extra.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _cpu_s(self, process) -> float:
        t = process.cpu_times()
        return t.user + t.system

    def _sample(self) -> None:
        ps = self._psutil
        while not self._stop.is_set():
            try:
                driver = self.root.memory_info().rss
                self._cpu[self.root.pid] = ("driver", self._cpu_s(self.root))
                workers = 0
                for child in self.root.children(recursive=True):
                    try:
                        if self.exclude is not None and any(self.exclude(p) for p in (child, *child.parents())):
                            self._cpu[child.pid] = ("excluded", self._cpu_s(child))
                            continue
                        below_jvm = any(p.name() == "java" for p in child.parents())
                        rss = child.memory_info().rss
                        cpu = self._cpu_s(child)
                    except (ps.NoSuchProcess, ps.AccessDenied):
                        continue
                    if child.name() != "java" and below_jvm:
                        workers += rss
                        self._cpu[child.pid] = ("workers", cpu)
                    else:
                        driver += rss
                        self._cpu[child.pid] = ("driver", cpu)
                self.driver_peak = max(self.driver_peak, driver)
                self.workers_peak = max(self.workers_peak, workers)
                totals = {"driver": 0.0, "workers": 0.0, "excluded": 0.0}
                for role, cpu in self._cpu.values():
                    totals[role] += cpu
                for role, p in self._extra.items():
                    try:
                        totals[role] = self._cpu_s(p) - self._extra_base[role]
                    except ps.NoSuchProcess:
                        totals[role] = self.cpu_series[-1][1].get(role, 0.0) if self.cpu_series else 0.0
                self.cpu_series.append((time.perf_counter(), totals))
            except ps.NoSuchProcess:
                return
            self._stop.wait(self.interval_s)

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per role between two ``time.perf_counter`` instants (of any process on
        this machine: Linux's monotonic clock), from the samples nearest inside them; {} if
        fewer than two samples fall inside."""
        inside = [(t, c) for t, c in self.cpu_series if start <= t <= end]
        if len(inside) < 2:
            return {}
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return {role: c1.get(role, 0.0) - c0.get(role, 0.0) for role in c1} | {"_seconds": t1 - t0}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def prepare_baseline(rev: str, tmp: str) -> str:
    """A checkout of commit ``rev`` under ``tmp`` with its C extension built in place;
    returns its directory (``--baseline-commit``)."""
    where = os.path.join(tmp, "baseline")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", where, rev], check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=where, check=True,
                   capture_output=True)
    return where


def remove_baseline(where: str) -> None:
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", where], check=False, capture_output=True)


def run_child(engine: str, plan_args: list[str], input_dir: str, log_prefix: str,
              baseline: str | None = None) -> dict:
    """Run one engine in a child process; returns its result dict with peak RSS added
    (``{"engine", "error"}`` when it failed). ``baseline``: the checkout the
    ``dkvstream@<rev>`` engine runs from (``prepare_baseline``)."""
    fd, json_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cwd = ROOT
    if engine.startswith("dkvstream@"):
        cwd = baseline
        cmd = [sys.executable, os.path.join(baseline, "bench", "flights_throughput.py"), "--child", "dkvstream",
               "--form", "batch", "--runner", "spark"]
    elif engine in ("dkvstream", "dkvstream-stages", "dkvstream-in-process", "dkvstream-on-event"):
        runner = {"dkvstream-in-process": "in-process", "dkvstream-stages": "stages"}.get(engine, "spark")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "dkvstream",
               "--form", "event" if engine == "dkvstream-on-event" else "batch", "--runner", runner]
    elif engine.startswith("spark-tws-"):
        cmd = [sys.executable, os.path.join(ROOT, "bench", "baselines", "spark_tws_flights.py"),
               "--variant", engine.removeprefix("spark-tws-")]
    elif engine == "bytewax":
        cmd = [sys.executable, os.path.join(ROOT, "bench", "baselines", "bytewax_flights.py")]
    elif engine == "flink-sql":
        cmd = [sys.executable, os.path.join(ROOT, "bench", "baselines", "flink_sql_flights.py")]
    else:
        raise ValueError(f"unknown engine {engine!r}; known: {ENGINES}")
    cmd += plan_args + ["--input-dir", input_dir, "--json", json_path]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "platform", "conf"))
    if cwd != ROOT:  # the baseline's own packages first, for the driver and Spark's workers
        env["PYTHONPATH"] = cwd + os.pathsep + env.get("PYTHONPATH", "")
    print(f"{log_prefix}: starting {engine}", flush=True)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    memory = TreeMemory(proc.pid)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        # Engines' own progress and result lines; Spark's log noise stays out.
        if line.startswith(("dkvstream", "spark-tws", "bytewax", "flink-sql")):
            print(f"{log_prefix}: {line}", flush=True)
    rc = proc.wait()
    memory.stop()
    try:
        with open(json_path) as f:
            result = json.load(f) if os.path.getsize(json_path) else {}
    finally:
        os.unlink(json_path)
    if rc != 0 or not result or "error" in result:
        reason = result.get("error") if result else None
        reason = reason or next((t for t in reversed(tail) if t.startswith(("AssertionError", "RuntimeError"))),
                                f"exit status {rc}")
        print(f"{log_prefix}: {engine} FAILED: {reason}; its last output lines:", flush=True)
        for t in tail:
            print(f"{log_prefix}:   {t}", flush=True)
        return {"engine": engine, "error": reason}
    result.update(driver_rss=memory.driver_peak, workers_rss=memory.workers_peak)
    if "clock_start" in result:  # where the cores went over the clock: CPU s / clock s per role
        cpu = memory.cpu_between(result["clock_start"], result["clock_end"])
        span = cpu.pop("_seconds", 0)
        if span:
            result["cpu"] = {role: round(v / span, 2) for role, v in cpu.items() if role != "excluded"}
    if engine.startswith("dkvstream@"):
        result["engine"] = engine
    return result


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


REFERENCES = ("dkvstream", "dkvstream-stages", "dkvstream-in-process")  # ratio columns each, when run


def median_epoch(r: dict) -> float | None:
    """Median seconds per epoch over all of the row's epochs (None without epochs)."""
    return statistics.median(r["epoch_seconds"]) if r.get("epoch_seconds") else None


def steady_epoch(r: dict) -> float | None:
    """Median seconds per epoch after the first (the first carries the engine's one-off
    start); the only epoch's time when the run has one."""
    e = r.get("epoch_seconds") or []
    return statistics.median(e[1:] if len(e) > 1 else e) if e else None


def ratio_columns(rows: list[dict]) -> tuple[list[str], dict[int, list[float | None]]]:
    """Ratio headers and, per row index, its ratios against each reference present.

    A row is compared only with the reference row over the same events (same plan):
    a prefix row with the reference's prefix row, a full row with the full one. Per
    reference two ratios: whole run (reference events/s over the engine's) and steady
    state (the engine's steady s/epoch over the reference's).
    """
    ok = [r for r in rows if "error" not in r]
    names = [n for n in REFERENCES if any(r["engine"] == n for r in ok)]
    headers = [h for n in names
               for h in (f"{n} / engine, whole run", f"{n} / engine, steady s/epoch")]
    out: dict[int, list[float | None]] = {}
    for i, r in enumerate(rows):
        if "error" in r:
            continue
        ratios: list[float | None] = []
        for n in names:
            ref = next((x for x in ok if x["engine"] == n and x["events"] == r["events"]), None)
            if ref is None:
                ratios += [None, None]
                continue
            mine, theirs = steady_epoch(r), steady_epoch(ref)
            ratios += [ref["events"] / ref["seconds"] / (r["events"] / r["seconds"]),
                       mine / theirs if mine and theirs else None]
        out[i] = ratios
    return headers, out


def clock_lines(rows: list[dict]) -> list[str]:
    """What each engine's clock in ``rows`` covers (``CLOCKS``), one line per engine family."""
    seen = []
    for r in rows:
        family = next((f for f in CLOCKS if r["engine"].startswith(f)), None)
        if family is not None and family not in seen:
            seen.append(family)
    return [f"clock, {f}: {CLOCKS[f]}" for f in seen] + [CLOCK_NOTE]


def print_table(title: str, rows: list[dict], per_epoch: bool = False, load: str = "") -> None:
    """One table, with ratio columns per reference row present (``REFERENCES``: dkvstream
    on Spark, dkvstream in process; see ``ratio_columns``), or with ``per_epoch`` one
    column per reference: the engine's median s/epoch over the reference's (how many times
    the reference's fixed cost per epoch fits in the engine's). ``load``: the load
    averages to print under the table."""
    from tabulate import tabulate

    if per_epoch:
        refs = [r for name in REFERENCES for r in rows if r["engine"] == name and "error" not in r]
        headers = [f"{ref['engine']} / engine, s/epoch" for ref in refs]
        ratios = {i: [median_epoch(r) / median_epoch(ref) if median_epoch(r) and median_epoch(ref)
                      else None for ref in refs]
                  for i, r in enumerate(rows) if "error" not in r}
    else:
        headers, ratios = ratio_columns(rows)
    body = []
    for i, r in enumerate(rows):
        if "error" in r:
            body.append([r["engine"], "FAILED: " + r["error"][:60]] + [""] * (6 + len(headers)))
            continue
        rate = r["events"] / r["seconds"]
        events = f"{r['events']:,}" + ("" if r.get("full") else " (prefix)")
        body.append([
            r["engine"], events, f"{rate:,.0f}" if rate >= 100 else f"{rate:.2f}",
            _fmt(median_epoch(r), ".3f"), _fmt(steady_epoch(r), ".3f"),
            _fmt(r.get("first_output_s"), ".1f"),
            f"{r['driver_rss'] / MIB:,.0f}", f"{r['workers_rss'] / MIB:,.0f}",
            *(_fmt(x, ",.1f" if x is None or x >= 0.1 else ".2f") + ("x" if x is not None else "")
              for x in ratios[i])])
    print(f"\n{title}")
    print(tabulate(body, headers=["engine", "events", "events/s", "s/epoch (median)",
                                  "s/epoch (steady)", "first output s", "driver RSS MiB",
                                  "workers RSS MiB", *headers], disable_numparse=True))
    if per_epoch:
        print("(ratio columns: the engine's median s/epoch over the reference's)")
    else:
        print("(ratios compare rows over the same events only; '-': no reference row over "
              "those events. steady s/epoch: median of the epochs after the first)")
    for line in clock_lines(rows):
        print(line)
    cpu = [[r["engine"], *(_fmt(r["cpu"].get(role), ".2f") for role in ("driver", "workers")),
            _fmt(sum(r["cpu"].values()), ".2f")] for r in rows if "cpu" in r]
    if cpu:
        print(f"cores busy over the clock (CPU s / clock s; {os.cpu_count()} cores): driver = the Python driver "
              "with its JVM, workers = Spark's Python workers (the tasks)")
        print(tabulate(cpu, headers=["engine", "driver", "workers", "total"], disable_numparse=True))
    if load:
        print(f"load average (1 / 5 / 15 min): {load}; machine: {os.cpu_count()} cores, shared")


def write_plot(path: str, tables: list[tuple[str, list[dict], str]]) -> None:
    """The tables as one PNG: per scale, events/s of every row (prefix rows hatched) and
    each row's steady-state and whole-run ratio against dkvstream over the same events.
    ``tables``: ``(title, rows, load average text)`` per scale."""
    from bench.plot import bar_panels

    panels = []
    for title, rows, _load in tables:
        ok = [r for r in rows if "error" not in r]
        labels = [r["engine"] + ("" if r.get("full") else f" ({r['events']:,} prefix)") for r in ok]
        headers, ratios = ratio_columns(ok)
        panels.append({"title": title, "labels": labels, "log": True, "xlabel": "events/s (log)",
                       "values": [r["events"] / r["seconds"] for r in ok],
                       "hatched": [lab for lab, r in zip(labels, ok) if not r.get("full")]})
        for col in (1, 0)[:len(headers)]:  # the first reference: steady state, whole run
            panels.append({"title": f"{title}: {headers[col]}", "labels": labels, "log": True,
                           "ref": 1.0, "fmt": "{:,.2f}x", "xlabel": "ratio (log)",
                           "values": [ratios[i][col] for i in range(len(ok))]})
    bar_panels(path, "Flights route daily delays: dkvstream, Spark TWS, Bytewax, Flink SQL", panels,
               columns=max(1, len(panels) // len(tables)),
               caption="Wall clock, source open to last output visible, session start excluded; "
                       "ratios over the same events. Load average "
                       + "; ".join(f"{t}: {load}" for t, _, load in tables) + "; "
                       f"{os.cpu_count()} cores, shared.")
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--child", "dkvstream"]:
        return _dkvstream_main(argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,10", help="comma-separated --scale values")
    ap.add_argument("--events-per-epoch", type=int, default=50_000)
    ap.add_argument("--max-events", type=int, help="cut every engine's run to a prefix")
    ap.add_argument("--spark-max-events", type=int, default=None,
                    help="cut the Spark runs (default: 200,000 at scale > 1, all at scale 1); "
                         "the reference rows run the same prefix too")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--epoch-overhead", action="store_true", help="epochs of one event instead")
    ap.add_argument("--epochs", type=int, default=10, help="epochs in --epoch-overhead mode")
    ap.add_argument("--plot", metavar="PATH", help="write the tables as a PNG")
    ap.add_argument("--baseline-commit", metavar="REV",
                    help="also run the dkvstream engine of commit REV (engine dkvstream@REV)")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="flights-bench-")
    try:
        return _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_list(engines: list[str], scale: int, max_events: int | None,
             spark_max_events: int | None) -> list[tuple[str, int | None]]:
    """``[(engine, event limit)]`` in run order: each engine at its limit (Spark at
    ``spark_max_events``, default 200,000 at scale > 1), then the reference engines
    again at every other limit in use, so each ratio has a reference over the same events.
    """
    plan = []
    for engine in engines:
        limit = max_events
        if engine.startswith("spark-tws"):
            cut = spark_max_events if spark_max_events is not None else (
                200_000 if scale > 1 else None)
            limit = min(x for x in (limit, cut) if x is not None) if cut is not None else limit
        plan.append((engine, limit))
    limits = list(dict.fromkeys(limit for _, limit in plan))
    for ref in REFERENCES:
        if ref in engines:
            plan += [(ref, limit) for limit in limits if (ref, limit) not in plan]
    return plan


def _run(args, tmp: str) -> int:
    engines = args.engines.split(",")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")
    baseline = None
    if args.baseline_commit:
        baseline = prepare_baseline(args.baseline_commit, tmp)
        engines.append(f"dkvstream@{args.baseline_commit}")
    try:
        return _run_engines(args, tmp, engines, baseline)
    finally:
        if baseline:
            remove_baseline(baseline)


def _run_engines(args, tmp: str, engines: list[str], baseline: str | None) -> int:
    load_start = load_average()
    if args.epoch_overhead:
        plan = plan_epochs(1, 1, partitions=("EWR",), max_per_partition=args.epochs)
        input_dir = os.path.join(tmp, "overhead")
        write_input_files(plan, input_dir)
        plan_args = ["--scale", "1", "--events-per-epoch", "1", "--partitions", "EWR",
                     "--max-per-partition", str(args.epochs)]
        rows = [run_child(engine, plan_args, input_dir, "overhead")
                for engine in [e for e in engines if e in OVERHEAD_ENGINES] or OVERHEAD_ENGINES]
        title = (f"Per-epoch overhead: {args.epochs} epochs of 1 event "
                 "(median s/epoch is the fixed cost)")
        load = f"{load_start} at start, {load_average()} at end"
        print_table(title, rows, per_epoch=True, load=load)
        if args.plot:
            from bench.plot import bar_panels

            ok = [r for r in rows if "error" not in r]
            bar_panels(args.plot, title, [{"labels": [r["engine"] for r in ok], "fmt": "{:.3f} s",
                                           "values": [median_epoch(r) for r in ok], "log": True,
                                           "xlabel": "median s per epoch (log)"}],
                       caption=f"Wall clock per epoch. Load average {load}; "
                               f"{os.cpu_count()} cores, shared.")
            print(f"plot written to {args.plot}")
        return 0

    failed = False
    tables = []
    for scale in [int(s) for s in args.scales.split(",")]:
        rows = []
        inputs: dict[int | None, str] = {}
        load_start = load_average()
        for engine, limit in run_list(engines, scale, args.max_events, args.spark_max_events):
            if limit not in inputs:
                inputs[limit] = os.path.join(tmp, f"scale{scale}-{limit or 'all'}")
                print(f"scale {scale}: writing input files ({'all' if limit is None else f'first {limit:,}'} "
                      f"events, {args.events_per_epoch:,} per epoch)", flush=True)
                write_input_files(plan_epochs(scale, args.events_per_epoch, limit), inputs[limit])
            plan_args = ["--scale", str(scale), "--events-per-epoch", str(args.events_per_epoch)]
            if limit is not None:
                plan_args += ["--max-events", str(limit)]
            rows.append(run_child(engine, plan_args, inputs[limit], f"scale {scale}", baseline))
        failed |= any("error" in r for r in rows)
        title = (f"Flights route daily delays, --scale {scale}, "
                 f"{args.events_per_epoch:,} events per epoch")
        load = f"{load_start} at start, {load_average()} at end"
        print_table(title, rows, load=load)
        tables.append((f"--scale {scale}", rows, load))
    if args.plot:
        write_plot(args.plot, tables)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
