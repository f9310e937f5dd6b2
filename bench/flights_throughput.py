"""The flights job on dkvstream against Spark 4 ``transformWithStateInPandas`` and Bytewax.

Usage (needs the ``bench`` extra for Bytewax and psutil: ``pip install -e '.[bench]'``)::

    .venv/bin/python bench/flights_throughput.py                       # --scales 1,10
    .venv/bin/python bench/flights_throughput.py --scales 1 --spark-max-events 100000
    .venv/bin/python bench/flights_throughput.py --epoch-overhead      # 10 epochs of 1 event

Every engine runs the same events in the same micro-batches (the epoch plan and Parquet
files of ``bench/baselines/flights_input.py``: dkvstream's planning rule,
``--events-per-epoch`` events per epoch) in its own child process, so the peak memory
measured is its own: ``psutil`` samples the child's process tree every 0.2 s, "driver" is
the child Python process plus its JVM, "workers" the Python processes the JVM starts
(Spark's Python workers). Each engine's output is checked against the oracle
(``prefix_oracle``: the spec's pandas oracle for a full run) before its time counts; an
engine whose check fails is reported as FAILED, not timed.

Engines: ``dkvstream`` (``examples/flights.py``, the vectorised form
``flights_job(batch=True)``, on ``JobRunner``, local[2]; the reference row),
``dkvstream-in-process`` (the same, ``JobRunner(job, spark=None)``: both key-group ranges'
stages run one after the other in the driver process, one core, no Spark; the row to
compare with Bytewax's one worker in one process), ``dkvstream-on-event`` (the
``on_event`` form on local[2]),
``spark-tws-textbook`` and ``spark-tws-batched`` (``bench/baselines/spark_tws_flights.py``:
RocksDB state store, local[2], event-time timers), ``bytewax`` (``bench/baselines/
bytewax_flights.py``: one worker, SQLite recovery snapshots each second).

Spark runs ~1,000 events/s: a full scale-10 run would take about an hour, so
``--spark-max-events N`` (default 200,000 at scale > 1) runs Spark on the whole epochs
covering the first N events, checked against an oracle over exactly those events
(every window closed at the end, as at end of input). The table says when a row is a
prefix; events/s of a prefix and of a full run are compared as rates.

``--epoch-overhead``: ``--epochs`` epochs of one event each (one partition, EWR), dkvstream
(on Spark and in process) against Spark TWS: the median seconds per epoch is the fixed
cost of a micro-batch (planning, a Spark stage, state commit, checkpoint).

What each engine's clock covers (events/s = events / those seconds): dkvstream, from
just before ``JobRunner`` is constructed (its start-up counts; the Spark session is up,
the source's replay tables are built) until the last epoch's commit and publish;
Bytewax, from ``cli_main`` (the flow built, the recovery store initialised) until it
returns; Spark TWS, from just before the streaming query is started until it terminates.
Every clock excludes the process's imports and the Spark session start-up; none excludes
an engine's first micro-batch (for dkvstream on Spark: the session's first job, which
starts Spark's Python workers, and the imports in those workers).
One difference in what is timed: dkvstream's source serves the replay tables it built in
memory before its clock starts, while Bytewax and Spark read each epoch's Parquet files
(``bench/baselines/flights_input.py``) inside theirs (about 10 ms per file, one file per
partition and epoch).

Output: progress lines while running, then one table per scale: engine, events, events/s,
median seconds per epoch, time to first output (s from the start of the clock), peak
RSS of driver and of workers (MiB), and per dkvstream row run (on Spark, in process) its
events/s divided by the engine's.
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
    EpochPlan,
    add_run_arguments,
    check_output,
    plan_epochs,
    run_engine_cli,
    write_input_files,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ENGINES = ("dkvstream", "dkvstream-in-process", "dkvstream-on-event", "spark-tws-textbook", "spark-tws-batched",
           "bytewax")
OVERHEAD_ENGINES = ("dkvstream", "dkvstream-in-process", "spark-tws-textbook")
MIB = 1024 * 1024


# ---------------------------------------------------------------- dkvstream child
def run_dkvstream(plan: EpochPlan, work_dir: str, spark, progress=print, batch: bool = True,
                  engine: str | None = None) -> dict:
    """The flights job on dkvstream over the plan's rows, checked against the oracle.

    Args:
        plan: epochs and partition ends (the source is cut at ``plan.ends``).
        work_dir: object-store root (a local directory), emptied first.
        spark: the SparkSession (None: stages run in this process, the
            ``dkvstream-in-process`` engine).
        progress: called with a progress line every ~10 s.
        batch: the vectorised operator (``RouteDailyDelaysBatch``); False: ``on_event``.
        engine: the row's name (default from ``batch``).

    Returns:
        ``{"engine", "events", "seconds", "epochs", "epoch_seconds", "first_output_s", "late",
        "correct": True}``; seconds from just before ``JobRunner`` is constructed (Spark
        session start-up excluded) to the last epoch's end.

    Raises:
        AssertionError: output differs from the oracle, the run's epochs differ from the
            plan, or an event was late.
    """
    from examples.flights import FlightsSource, flights_job
    from operators.runtime.driver import JobRunner
    class PrefixFlightsSource(FlightsSource):
        """The flights replay cut at ``plan.ends`` (a bounded source that ends there)."""

        def end_offsets(self) -> dict[str, int]:
            return dict(plan.ends)

    shutil.rmtree(work_dir, ignore_errors=True)
    engine = engine or ("dkvstream" if batch else "dkvstream-on-event")
    job = flights_job(scale=plan.scale, events_per_epoch=plan.events_per_epoch, parallelism=2,
                      name="flights_bench", batch=batch)
    job.source = PrefixFlightsSource(plan.scale)
    job.source.read(job.source.partitions()[0], 0, 0)  # build the replay tables before timing
    started = last_report = time.perf_counter()
    runner = JobRunner(job, spark, work_dir)
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
            "epoch_seconds": epoch_seconds, "first_output_s": first_output_s, "late": late, "correct": True}


def _dkvstream_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    add_run_arguments(ap)
    ap.add_argument("--form", choices=("batch", "event"), default="batch",
                    help="operator form: vectorised (batch) or on_event")
    ap.add_argument("--runner", choices=("spark", "in-process"), default="spark",
                    help="stages on Spark local[2], or in this process (JobRunner(job, None))")
    args = ap.parse_args(argv)
    batch = args.form == "batch"
    engine = "dkvstream-in-process" if args.runner == "in-process" else (
        "dkvstream" if batch else "dkvstream-on-event")

    def run(plan: EpochPlan, _input_dir: str, work_dir: str) -> dict:
        spark = None
        if args.runner == "spark":
            from operators.spark.session import get_spark

            spark = get_spark({"spark.master": "local[2]"})
        return run_dkvstream(plan, work_dir, spark, progress=lambda line: print(line, file=sys.stderr, flush=True),
                             batch=batch, engine=engine)

    return run_engine_cli(args, engine, run)


# ------------------------------------------------------------------- the parent
class TreeMemory:
    """Peak RSS of a process tree, sampled every ``interval_s``: driver (the root and
    its JVMs) and workers (Python processes below a JVM)."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        import psutil

        self._psutil, self.root = psutil, psutil.Process(pid)
        self.interval_s = interval_s
        self.driver_peak = self.workers_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        ps = self._psutil
        while not self._stop.is_set():
            try:
                driver = self.root.memory_info().rss
                workers = 0
                for child in self.root.children(recursive=True):
                    try:
                        below_jvm = any(p.name() == "java" for p in child.parents())
                        rss = child.memory_info().rss
                    except (ps.NoSuchProcess, ps.AccessDenied):
                        continue
                    if child.name() != "java" and below_jvm:
                        workers += rss
                    else:
                        driver += rss
                self.driver_peak = max(self.driver_peak, driver)
                self.workers_peak = max(self.workers_peak, workers)
            except ps.NoSuchProcess:
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(engine: str, plan_args: list[str], input_dir: str, log_prefix: str) -> dict:
    """Run one engine in a child process; returns its result dict with peak RSS added
    (``{"engine", "error"}`` when it failed)."""
    fd, json_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    if engine in ("dkvstream", "dkvstream-in-process", "dkvstream-on-event"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "dkvstream",
               "--form", "event" if engine == "dkvstream-on-event" else "batch",
               "--runner", "in-process" if engine == "dkvstream-in-process" else "spark"]
    elif engine.startswith("spark-tws-"):
        cmd = [sys.executable, os.path.join(ROOT, "bench", "baselines", "spark_tws_flights.py"),
               "--variant", engine.removeprefix("spark-tws-")]
    elif engine == "bytewax":
        cmd = [sys.executable, os.path.join(ROOT, "bench", "baselines", "bytewax_flights.py")]
    else:
        raise ValueError(f"unknown engine {engine!r}; known: {ENGINES}")
    cmd += plan_args + ["--input-dir", input_dir, "--json", json_path]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "platform", "conf"))
    print(f"{log_prefix}: starting {engine}", flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    memory = TreeMemory(proc.pid)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        # Engines' own progress and result lines; Spark's log noise stays out.
        if line.startswith(("dkvstream", "spark-tws", "bytewax")):
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
    return result


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


REFERENCES = ("dkvstream", "dkvstream-in-process")  # a ratio column each, when run


def print_table(title: str, rows: list[dict], per_epoch: bool = False) -> None:
    """One table, with a ratio column per reference row present (``REFERENCES``: dkvstream
    on Spark, dkvstream in process): the reference's events/s over the engine's, or with
    ``per_epoch`` the engine's median s/epoch over the reference's (how many times the
    reference's fixed cost per epoch fits in the engine's)."""
    from tabulate import tabulate

    def median_epoch(r: dict) -> float | None:
        return statistics.median(r["epoch_seconds"]) if r.get("epoch_seconds") else None

    refs = [r for name in REFERENCES for r in rows if r["engine"] == name and "error" not in r]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["engine"], "FAILED: " + r["error"][:60]] + [""] * (5 + len(refs)))
            continue
        rate = r["events"] / r["seconds"]
        events = f"{r['events']:,}" + ("" if r.get("full") else " (prefix)")
        ratios = []
        for ref in refs:
            if per_epoch:
                mine, theirs = median_epoch(r), median_epoch(ref)
                ratios.append(mine / theirs if mine and theirs else None)
            else:
                ratios.append(ref["events"] / ref["seconds"] / rate)
        body.append([
            r["engine"], events, f"{rate:,.0f}" if rate >= 100 else f"{rate:.2f}", _fmt(median_epoch(r), ".3f"),
            _fmt(r.get("first_output_s"), ".1f"), f"{r['driver_rss'] / MIB:,.0f}",
            f"{r['workers_rss'] / MIB:,.0f}", *(_fmt(x, ",.1f" if x is None or x >= 0.1 else ".2f") + "x"
                                                for x in ratios)])
    print(f"\n{title}")
    print(tabulate(body, headers=["engine", "events", "events/s", "s/epoch (median)", "first output s",
                                  "driver RSS MiB", "workers RSS MiB", *(f"{ref['engine']} / engine" for ref in refs)],
                   disable_numparse=True))
    if per_epoch:
        print("(ratio columns: the engine's median s/epoch over the reference's)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--child", "dkvstream"]:
        return _dkvstream_main(argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,10", help="comma-separated --scale values")
    ap.add_argument("--events-per-epoch", type=int, default=50_000)
    ap.add_argument("--max-events", type=int, help="cut every engine's run to a prefix")
    ap.add_argument("--spark-max-events", type=int, default=None,
                    help="cut the Spark runs (default: 200,000 at scale > 1, all at scale 1)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--epoch-overhead", action="store_true", help="epochs of one event instead")
    ap.add_argument("--epochs", type=int, default=10, help="epochs in --epoch-overhead mode")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="flights-bench-")
    try:
        return _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args, tmp: str) -> int:
    if args.epoch_overhead:
        plan = plan_epochs(1, 1, partitions=("EWR",), max_per_partition=args.epochs)
        input_dir = os.path.join(tmp, "overhead")
        write_input_files(plan, input_dir)
        plan_args = ["--scale", "1", "--events-per-epoch", "1", "--partitions", "EWR",
                     "--max-per-partition", str(args.epochs)]
        rows = [run_child(engine, plan_args, input_dir, "overhead")
                for engine in [e for e in args.engines.split(",") if e in OVERHEAD_ENGINES] or OVERHEAD_ENGINES]
        print_table(f"Per-epoch overhead: {args.epochs} epochs of 1 event (median s/epoch is the fixed cost)",
                    rows, per_epoch=True)
        return 0

    failed = False
    for scale in [int(s) for s in args.scales.split(",")]:
        rows = []
        inputs: dict[int | None, str] = {}
        for engine in args.engines.split(","):
            limit = args.max_events
            if engine.startswith("spark-tws") and limit is None:
                limit = args.spark_max_events if args.spark_max_events is not None else (
                    200_000 if scale > 1 else None)
            if limit not in inputs:
                inputs[limit] = os.path.join(tmp, f"scale{scale}-{limit or 'all'}")
                print(f"scale {scale}: writing input files ({'all' if limit is None else f'first {limit:,}'} "
                      f"events, {args.events_per_epoch:,} per epoch)", flush=True)
                write_input_files(plan_epochs(scale, args.events_per_epoch, limit), inputs[limit])
            plan_args = ["--scale", str(scale), "--events-per-epoch", str(args.events_per_epoch)]
            if limit is not None:
                plan_args += ["--max-events", str(limit)]
            rows.append(run_child(engine, plan_args, inputs[limit], f"scale {scale}"))
        failed |= any("error" in r for r in rows)
        print_table(f"Flights route daily delays, --scale {scale}, {args.events_per_epoch:,} events per epoch",
                    rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
