"""The flights job consuming a live Kafka topic: dkvstream next to Quix Streams and Bytewax.

Usage (needs the ``bench`` extra: Quix Streams, Bytewax, psutil, matplotlib, tabulate)::

    .venv/bin/python bench/live_throughput.py                      # rates 10k,50k,100k,200k, 60 s each
    .venv/bin/python bench/live_throughput.py --rates 20000,50000 --duration-s 300 \\
        --plot docs/img/live-lag.png
    .venv/bin/python bench/live_throughput.py --engines dkvstream,dkvstream-in-process --no-live

Every run starts its own Tansu broker (``dkvstream.operators.io.kafka_broker.TansuBroker``, in
memory) unless ``--bootstrap`` names one, and gives each engine run a fresh topic with the
same content: the first ``N`` flights of ``examples/flights_producer.py``'s order (3
partitions, one per origin, record timestamp = scheduled departure), ``N`` = rate x
``--duration-s`` (at most the flights of ``--scale``; the scale is raised to fit by
default). Each engine runs in its own child process (``psutil`` samples its process
tree: "driver" is the engine's process and its JVM, "workers" Spark's Python workers;
the producer processes are not counted),
through the live harness every peer uses (``bench/baselines/flights_live.py``), which
checks the engine's complete windows against the oracle before any of its numbers count.

Two measurements per engine:

- **live**, per rate in ``--rates`` (ascending): producer processes (``--producers``, each
  its own partitions; one Python producer tops out near 25,000-30,000 records/s) start
  once the engine is ready, load their records, then start together (a barrier) and
  release rate x 0.1 s records every 0.1 s. Reported, with the harness's clock for every
  engine (first record consumed to the output of the N-th visible: the engine's commit
  covering it done): ``events/s`` (N over that clock, at most the rate when the engine
  keeps up), the producers' achieved rate, lag (records visible minus records whose
  output is visible, sampled every 50 ms), ``drain s`` (producers done to the clock's
  end), the record latency (the commit covering a record minus its production time)
  and the window latency (a window reaching the sink minus the production time of the
  record that closed it), p50 / p99, and peak RSS. An engine that does not sustain a
  rate is not run at the higher ones.
- **throughput** (``--no-throughput`` skips it): the topic filled before the engine
  starts (``--throughput-records``, default all flights of scale 1); ``events/s`` = N
  over the same clock: the engine's maximum rate, as no live producer on this machine
  reaches it.

Sustained: the offered rate of a live run is what its producers achieved (records over
first tick to last acknowledgement; on 2 busy cores they fall short of high nominal
rates). A run sustains it when the engine processed >= 95% of it (events/s) and drained
the input within 2 s of the producers' end (``drain s`` <= 2: the lag at the end was at
most 2 s of input). An engine's highest sustained rate is the largest offered rate it
sustained.

dkvstream's job: ``dkvstream.examples.flights_live.flights_kafka_job``, the vectorised form of
``examples/flights.py``'s job on a ``KafkaSource`` (JSON values, record key and
timestamp), 1-s trigger (``--trigger-ms``), continuous run, local[2] on long-lived tasks
(``dkvstream-stages``: Spark stages per epoch; ``--in-process`` form:
``JobRunner(job, None)``). Spark's Python workers are started before the producers (one
trivial job): start-up is outside every engine's clock, but for the long-lived tasks'
start (about a second, in the first epoch). The peers: ``quix_flights.py`` (exactly-once, a checkpoint every second) and
``bytewax_kafka_flights.py`` (recovery snapshots every second).

``--baseline-commit REV`` adds the engine ``dkvstream@REV``: the ``dkvstream`` engine of
another commit of this repository (a ``git worktree`` checkout with its C extension
built), run right after ``dkvstream`` at every rate, over the same kind of topic: a
change measured against the code before it in one run.

``--decode per-record`` runs dkvstream with ``dkvstream.operators.io.topics.decode_json_values_per_record``
in place of the Arrow JSON fast path (the engine ``dkvstream-per-record-decode``), to
measure the fast path in the same run.

Output: progress lines, then the table of every run, the ratios (dkvstream's highest
sustained rate over each peer's, dkvstream's pre-filled events/s over each peer's), the
load average and what each clock covers. ``--plot PATH``: lag over time per live run (PNG).
``--json PATH``: every run's stats.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import numpy as np
import pyarrow as pa

from bench.baselines.flights_live import (
    PeakRss,
    Progress,
    add_live_arguments,
    peer_stats,
    run_live_cli,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ENGINES = ("dkvstream", "dkvstream-stages", "dkvstream-in-process", "dkvstream-per-record-decode", "quix",
           "bytewax")
DEFAULT_ENGINES = ("dkvstream", "quix", "bytewax")
PEERS = ("quix", "bytewax")
BASELINE = ""  # the checkout of --baseline-commit, set by main
FLIGHTS_PER_SCALE = 336_776
SUSTAIN_FRACTION = 0.95  # events/s and producer rate >= 95% of the rate
SUSTAIN_DRAIN_S = 2.0  # input drained within 2 s of the producers' end
MIB = 2**20
CLOCKS = (
    ("events/s: N over the time from the first record consumed to the output of the N-th visible, "
     "every engine: the commit covering it completed (dkvstream: the publish of the epoch that read it; "
     "Quix: the checkpoint commit, every 1 s; Bytewax: the snapshot at its 1-s epoch's end)."),
    ("record latency: that commit minus the record's production time (its tick on the producers' common "
     "schedule); window latency: a window reaching the engine's sink (dkvstream: its epoch's publish) minus "
     "the production time of the first record with event time >= window end + 1 h. p50/p99: numpy percentiles."),
    ("lag: records visible in the topic minus records whose output is visible, every 50 ms; drain s: last "
     "producer exit to the output of the N-th record visible. Start-up (Spark session and its Python "
     "workers, Quix's group join, Bytewax's dataflow build, the producers' loading) is outside every clock."),
)


# ------------------------------------------------------------- dkvstream's job
def flights_kafka_job(bootstrap: str, topic: str, *, events_per_epoch: int = 1_000_000,
                      trigger_interval_ms: int = 1_000, name: str = "flights_live"):
    """``dkvstream.examples.flights_live.flights_kafka_job`` (the flights job on a ``KafkaSource``,
    one-day watermark alignment, 10-s idleness) in its vectorised form, local[2]'s 2 tasks.

    Args:
        bootstrap, topic: the flights topic (3 partitions).
        events_per_epoch: the most events an epoch reads (a continuous run that fell
            behind catches up in epochs of this size).
        trigger_interval_ms: the processing-time trigger, ms.
        name: job name (its object-store prefix).

    Returns:
        ``dkvstream.operators.api.job.Job``.
    """
    from dkvstream.examples.flights_live import flights_kafka_job as job

    return job(bootstrap, topic, name=name, events_per_epoch=events_per_epoch, parallelism=2,
               trigger_interval_ms=trigger_interval_ms, batch=True)


def run_dkvstream(bootstrap: str, topic: str, progress: Progress, spark, work_dir: str, *,
                  events_per_epoch: int = 1_000_000, trigger_interval_ms: int = 1_000,
                  long_lived_tasks: bool = True) -> tuple:
    """A continuous run of ``flights_kafka_job`` until ``progress.records`` records are read.

    Args:
        bootstrap, topic: the flights topic.
        progress: ``ready`` is set once the runner is built (and Spark's Python workers
            are up), ``first_consumed`` is the plan of the first epoch that read a record,
            ``processed`` counts each epoch's events and ``output_visible`` gets its
            source offsets at its publish, ``emitted`` gets each window with its epoch's
            publish time.
        spark: SparkSession (local[2]) or None (stages in this process).
        work_dir: object-store root (a local directory), emptied first.
        events_per_epoch, trigger_interval_ms: the job's.
        long_lived_tasks: ``JobRunner``'s (False: Spark stages per epoch, the
            ``dkvstream-stages`` engine).

    Returns:
        ``(output, stats, epochs)``: the emitted windows (pandas), ``peer_stats`` plus
        ``epochs`` and ``epoch_s_p50``, and per epoch ``(publish perf_counter s, next
        offset per partition "<topic>-<p>")``.

    Raises:
        AssertionError: an event was late (the topic is in event-time order per partition).
    """
    import io

    import pyarrow.parquet as pq

    from dkvstream.operators.runtime.driver import JobRunner

    shutil.rmtree(work_dir, ignore_errors=True)
    job = flights_kafka_job(bootstrap, topic, events_per_epoch=events_per_epoch,
                            trigger_interval_ms=trigger_interval_ms)
    if spark is not None:  # start the Python workers outside the clock
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x).collect()
    runner = JobRunner(job, spark, work_dir, long_lived_tasks=long_lived_tasks)
    main_prefix = job.sinks["main"].table_prefix(job.prefix)
    published: list[tuple[float, list[str]]] = []
    epochs: list[tuple[float, dict[str, int]]] = []
    seconds: list[float] = []
    rss = PeakRss()
    progress.ready.set()
    try:
        for r in runner.epochs(continuous=True):
            now = time.perf_counter()
            if r.events and progress.first_consumed is None:
                progress.first_consumed = now - r.seconds
            epochs.append((now, dict(r.source_offsets)))
            seconds.append(r.seconds)
            # The publish makes the epoch's output files (and its state) visible to readers.
            progress.output_visible({int(name.rpartition("-")[2]): end for name, end in r.source_offsets.items()},
                                    at=now)
            published.append((now, [k for k in r.published if k.startswith(main_prefix)]))
            if progress.processed(r.events):
                runner.stop()
    finally:
        peak = rss.stop()
        runner.close()
    frames = []
    for at, keys in published:
        for k in keys:
            t = pq.read_table(io.BytesIO(runner.store.get(k)))
            frames.append(t)
            progress.emitted += [(end, at) for end in t.column("window_end").cast(pa.int64()).to_pylist()]
    late = job.sinks["late"].read(runner.store, job.prefix).num_rows
    assert late == 0, f"dkvstream: {late} late events (the topic is in event-time order per partition)"
    output = pa.concat_tables(frames) if frames else job.sinks["main"].read(runner.store, job.prefix)
    stats = peer_stats(progress, peak, output.num_rows, epochs=len(seconds),
                       epoch_s_p50=round(float(np.median(seconds)), 3) if seconds else None)
    return output.to_pandas(), stats, epochs


def _dkvstream_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    add_live_arguments(ap)
    ap.add_argument("--runner", choices=("spark", "stages", "in-process"), default="spark",
                    help="spark: long-lived tasks on local[2]; stages: Spark stages per epoch")
    ap.add_argument("--decode", choices=("fast", "per-record"), default="fast",
                    help="per-record: decode JSON with decode_json_values_per_record (the reference path)")
    ap.add_argument("--trigger-ms", type=int, default=1_000)
    ap.add_argument("--events-per-epoch", type=int, default=1_000_000)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--profile", metavar="PATH", help="write a cProfile of the run (this process's main "
                                                      "thread: the whole job with --runner in-process)")
    args = ap.parse_args(argv)
    if args.decode == "per-record":
        from dkvstream.operators.io import kafka
        from dkvstream.operators.io.topics import decode_json_values_per_record

        kafka.decode_json_values = decode_json_values_per_record  # this process only: the comparison row
    engine = {"in-process": "dkvstream-in-process", "spark": "dkvstream", "stages": "dkvstream-stages"}[args.runner]
    if args.decode == "per-record":
        engine = "dkvstream-per-record-decode"
    spark = None
    if args.runner != "in-process":
        from dkvstream.operators.spark.session import get_spark

        spark = get_spark({"spark.master": "local[2]"})

    def run(progress: Progress):
        import cProfile

        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        try:
            output, stats, _ = run_dkvstream(args.bootstrap, args.topic, progress, spark, args.work_dir,
                                             events_per_epoch=args.events_per_epoch,
                                             trigger_interval_ms=args.trigger_ms,
                                             long_lived_tasks=args.runner != "stages")
        finally:
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
        return output, stats

    return run_live_cli(args, engine, run)


# ------------------------------------------------------------------- the parent
def offered(row: dict) -> float:
    """The rate a live run's producers achieved, events/s (``producer_rate``: records over
    first tick to last acknowledgement), at most the nominal ``rate``."""
    return min(row["rate"], row.get("producer_rate") or 0.0)


def sustained(row: dict) -> bool:
    """Whether a live run kept up with its input (module docstring): events/s >= 95% of
    the offered rate and drained within 2 s of the producers' end."""
    if "error" in row or row.get("mode") != "live":
        return False  # failed, wrong, or stopped while far behind
    return (row["events_per_s"] or 0) >= SUSTAIN_FRACTION * offered(row) and row["drain_s"] <= SUSTAIN_DRAIN_S


def engine_command(engine: str, work_dir: str, trigger_ms: int = 1_000, profile: str | None = None) -> list[str]:
    """The child process's command line (without the harness's arguments); ``trigger_ms``:
    dkvstream's processing-time trigger."""
    if engine.startswith("dkvstream@"):  # another commit's dkvstream engine (--baseline-commit)
        return [sys.executable, os.path.join(BASELINE, "bench", "live_throughput.py"), "--child", "dkvstream",
                "--work-dir", work_dir, "--runner", "spark", "--trigger-ms", str(trigger_ms)]
    if engine.startswith("dkvstream"):
        runner = {"dkvstream-in-process": "in-process", "dkvstream-stages": "stages"}.get(engine, "spark")
        return [sys.executable, os.path.abspath(__file__), "--child", "dkvstream", "--work-dir", work_dir,
                "--runner", runner, "--trigger-ms", str(trigger_ms),
                "--decode", "per-record" if engine == "dkvstream-per-record-decode" else "fast"] + \
            (["--profile", profile] if profile and engine == "dkvstream-in-process" else [])
    if engine == "quix":
        return [sys.executable, os.path.join(ROOT, "bench", "baselines", "quix_flights.py")]
    if engine == "bytewax":
        return [sys.executable, os.path.join(ROOT, "bench", "baselines", "bytewax_kafka_flights.py")]
    raise ValueError(f"unknown engine {engine!r}; known: {ENGINES}")


def run_child(engine: str, harness_args: list[str], tmp: str, timeout_s: float, log_prefix: str,
              trigger_ms: int = 1_000, broker_pid: int | None = None, profile_dir: str | None = None) -> dict:
    """One engine run in a child process: its JSON line plus ``engine``, ``driver_rss``,
    ``workers_rss`` (peak bytes), ``lag_series`` and ``cpu`` (cores busy per role over the
    engine's clock: CPU s / clock s of ``driver``, ``workers``, ``producers`` and
    ``broker`` when ``broker_pid`` is given); ``{"engine", "error"}`` when it
    failed, was wrong or took longer than ``timeout_s``."""
    from bench.flights_throughput import TreeMemory

    series = os.path.join(tmp, f"lag-{uuid.uuid4().hex[:8]}.json")
    profile = os.path.join(profile_dir, f"{engine}-{uuid.uuid4().hex[:6]}.pstats") if profile_dir else None
    cmd = engine_command(engine, os.path.join(tmp, "dkv-" + uuid.uuid4().hex[:8]), trigger_ms, profile)
    cmd += harness_args + ["--lag-series", series]
    root = BASELINE if engine.startswith("dkvstream@") else ROOT
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "platform", "conf"))
    print(f"{log_prefix}: starting {engine}", flush=True)
    out_path = os.path.join(tmp, f"out-{uuid.uuid4().hex[:8]}.txt")
    with open(out_path, "w") as out:
        # Its own process group, so a run stopped while behind takes its producers, JVM
        # and Spark workers with it.
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        # The producers are the harness's load, not the engine's memory.
        memory = TreeMemory(proc.pid, exclude=lambda p: "dkvstream.examples.flights_producer" in p.cmdline(),
                            extra={"broker": broker_pid} if broker_pid else None)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"killed after {timeout_s:.0f} s: still behind its input"
        finally:
            memory.stop()
    with open(out_path) as f:
        lines = f.read().splitlines()
    result = None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    if rc != 0 or result is None or not result.get("correct"):
        reason = rc if isinstance(rc, str) else next(
            (t for t in reversed(lines) if t.startswith(("AssertionError", "RuntimeError", "KafkaIOError"))),
            f"exit status {rc}")
        print(f"{log_prefix}: {engine} FAILED: {reason}; its last output lines:", flush=True)
        for t in lines[-15:]:
            print(f"{log_prefix}:   {t}", flush=True)
        return {"engine": engine, "error": str(reason)}
    result.update(engine=engine, driver_rss=memory.driver_peak, workers_rss=memory.workers_peak)
    if profile and os.path.exists(profile):
        import pstats

        print(f"{log_prefix}: {engine} under cProfile ({profile}), top 25 by own time:", flush=True)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    # A baseline commit's harness may not report its clock's instants.
    cpu = memory.cpu_between(result["clock_start"], result["clock_end"]) if "clock_start" in result else {}
    if cpu:
        span = cpu.pop("_seconds")
        cpu["producers"] = cpu.pop("excluded")
        result["cpu"] = {role: round(s / span, 2) for role, s in cpu.items()}
    if os.path.exists(series):
        with open(series) as f:
            result["lag_series"] = json.load(f)
    return result


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_tables(rows: list[dict], load: str) -> None:
    """The live runs' table, the pre-filled runs' table, the ratios and the clocks."""
    from tabulate import tabulate

    live = [r for r in rows if r.get("mode") == "live" or ("error" in r and r.get("rate"))]
    body = []
    for r in live:
        if "error" in r:
            behind = r["error"].startswith("killed")
            body.append([r["engine"], f"{r['rate']:,.0f}", "", "", "", "no" if behind else "FAILED",
                         "stopped, behind" if behind else r["error"][:60]] + [""] * 6)
            continue
        body.append([
            r["engine"], f"{r['rate']:,.0f}", f"{r['records']:,}", _fmt(r.get("producer_rate"), ",.0f"),
            _fmt(r["events_per_s"], ",.0f"), "yes" if sustained(r) else "no",
            _fmt(r.get("lag_p95_s"), ".2f"), _fmt(r.get("drain_s"), ".1f"),
            f"{_fmt(r.get('latency_p50_s'), '.2f')} / {_fmt(r.get('latency_p99_s'), '.2f')}",
            f"{_fmt(r.get('record_latency_p50_s'), '.2f')} / {_fmt(r.get('record_latency_p99_s'), '.2f')}",
            f"{r['driver_rss'] / MIB:,.0f}", f"{r['workers_rss'] / MIB:,.0f}", r.get("producers", 1)])
    if body:
        print("\nLive: producers at a fixed rate while the engine consumes")
        print(tabulate(body, headers=["engine", "rate", "records", "offered/s", "events/s", "sustained",
                                      "lag p95 s", "drain s", "window lat. p50/p99 s",
                                      "record lat. p50/p99 s", "driver RSS MiB", "workers RSS MiB",
                                      "producers"], disable_numparse=True))
    filled = [r for r in rows if r.get("mode") == "throughput" or ("error" in r and not r.get("rate"))]
    body = []
    for r in filled:
        if "error" in r:
            body.append([r["engine"], "FAILED: " + r["error"][:60], "", "", "", ""])
            continue
        body.append([r["engine"], f"{r['records']:,}", _fmt(r["events_per_s"], ",.0f"), _fmt(r["seconds"], ".1f"),
                     f"{r['driver_rss'] / MIB:,.0f}", f"{r['workers_rss'] / MIB:,.0f}"])
    if body:
        print("\nThroughput: the topic filled before the engine starts")
        print(tabulate(body, headers=["engine", "records", "events/s", "seconds", "driver RSS MiB",
                                      "workers RSS MiB"], disable_numparse=True))
    body = [[r["engine"], r.get("mode"), f"{r['rate']:,.0f}" if r.get("mode") == "live" else "-",
             _fmt(r["events_per_s"], ",.0f")]
            + [_fmt(r["cpu"].get(role), ".2f") for role in ("driver", "workers", "producers", "broker")]
            + [_fmt(1e6 * (r["cpu"].get("driver", 0) + r["cpu"].get("workers", 0)) / r["events_per_s"], ".3f")
               if r["events_per_s"] else "-"]
            for r in rows if "cpu" in r]
    if body:
        print("\nWhere the cores go over each engine's clock (CPU s / clock s; the machine has "
              f"{os.cpu_count()}): engine driver (with its JVM), Spark's Python workers, producers, broker")
        print(tabulate(body, headers=["engine", "run", "rate", "events/s", "driver", "workers", "producers",
                                      "broker", "engine CPU ms / 1k events"], disable_numparse=True))
    print()
    for line in ratio_lines(rows):
        print(line)
    print(f"offered/s: the producers' achieved rate; sustained: events/s >= {SUSTAIN_FRACTION:.0%} of it "
          f"and drain <= {SUSTAIN_DRAIN_S:.0f} s; highest sustained rate: the largest offered/s sustained")
    for line in CLOCKS:
        print(line)
    print(f"load average (1 / 5 / 15 min): {load}; machine: {os.cpu_count()} cores, shared")


def highest_sustained(rows: list[dict], engine: str) -> float | None:
    """The highest offered rate ``engine`` sustained in ``rows`` (None: none)."""
    rates = [offered(r) for r in rows if r.get("engine") == engine and r.get("mode") == "live" and sustained(r)]
    return max(rates, default=None)


def ratio_lines(rows: list[dict]) -> list[str]:
    """dkvstream over each peer: highest sustained rate, and pre-filled events/s."""
    out = []
    mine = highest_sustained(rows, "dkvstream")
    for peer in PEERS:
        if not any(r.get("engine") == peer for r in rows):
            continue
        theirs = highest_sustained(rows, peer)
        ratio = f"{mine / theirs:.1f}x" if mine and theirs else "-"
        out.append(f"highest sustained rate: dkvstream {_fmt(mine, ',.0f')} / {peer} {_fmt(theirs, ',.0f')} "
                   f"events/s = {ratio}")
    filled = {r["engine"]: r["events_per_s"] for r in rows if r.get("mode") == "throughput" and "error" not in r}
    for peer in PEERS:
        if "dkvstream" in filled and peer in filled:
            out.append(f"pre-filled throughput: dkvstream {filled['dkvstream']:,.0f} / {peer} "
                       f"{filled[peer]:,.0f} events/s = {filled['dkvstream'] / filled[peer]:.1f}x")
    return out


def write_plot(path: str, rows: list[dict], caption: str) -> None:
    """Lag (s of input at the rate) over time, one panel per rate, one line per engine."""
    from bench.plot import _pyplot

    plt = _pyplot()
    live = [r for r in rows if r.get("mode") == "live" and r.get("lag_series")]
    rates = sorted({r["rate"] for r in live})
    if not rates:
        print("no live run to plot")
        return
    fig, axes = plt.subplots(1, len(rates), figsize=(4.6 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for r in live:
            if r["rate"] == rate:
                t = [s[0] for s in r["lag_series"]]
                lag = [max(0, s[1] - s[2]) / rate for s in r["lag_series"]]
                ax.plot(t, lag, label=f"{r['engine']} ({r['events_per_s']:,.0f}/s)", linewidth=1,
                        color=f"C{ENGINES.index(r['engine'])}")  # one colour per engine in every panel
        ax.axhline(SUSTAIN_DRAIN_S, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(f"{rate:,.0f} events/s offered", fontsize=9)
        ax.set_xlabel("s since the first record consumed", fontsize=8)
        ax.set_ylabel("lag, s of input", fontsize=8)
        ax.set_yscale("symlog", linthresh=1)
        ax.legend(fontsize=7)
    fig.suptitle("Flights on a live Kafka topic: lag over time", fontsize=10)
    fig.text(0.01, 0.01, caption, fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


def _caption(load: str) -> str:
    return (f"Lag = records visible - records whose output is visible, in s of input at the rate; dashed: "
            f"{SUSTAIN_DRAIN_S:.0f} s. Load average {load}; {os.cpu_count()} cores, shared.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--child", "dkvstream"]:
        return _dkvstream_main(argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="an existing broker, host:port (default: start a Tansu broker)")
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"comma-separated, of {ENGINES}")
    ap.add_argument("--in-process", action="store_true", help="add dkvstream-in-process to the engines")
    ap.add_argument("--rates", default="10000,50000,100000,200000", help="live rates, events/s")
    ap.add_argument("--duration-s", type=float, default=60, help="seconds of input per live run")
    ap.add_argument("--scale", type=int, help="copies of the flights (default: enough for the longest run)")
    ap.add_argument("--producers", type=int, choices=(1, 2, 3),
                    help="producer processes (default: 1 up to 20,000 events/s, else 3)")
    ap.add_argument("--trigger-ms", type=int, default=1_000, help="dkvstream's processing-time trigger, ms")
    ap.add_argument("--no-live", action="store_true", help="only the pre-filled throughput runs")
    ap.add_argument("--no-throughput", action="store_true", help="only the live runs")
    ap.add_argument("--throughput-records", type=int, default=FLIGHTS_PER_SCALE,
                    help="records of the pre-filled runs")
    ap.add_argument("--keep-going", default="", metavar="ENGINES",
                    help="comma-separated engines to run at every rate, even after one they did not sustain")
    ap.add_argument("--plot", metavar="PATH", help="write the lag over time as a PNG")
    ap.add_argument("--json", metavar="PATH", help="write every run's stats as JSON")
    ap.add_argument("--baseline-commit", metavar="REV",
                    help="also run the dkvstream engine of commit REV of this repository (engine "
                         "dkvstream@REV, checked out with git worktree), next to dkvstream in the same run")
    ap.add_argument("--profile", metavar="DIR", help="run dkvstream-in-process under cProfile, write its "
                                                     "profiles to DIR and print the top functions")
    ap.add_argument("--tables-from", metavar="PATH",
                    help="print the tables (and --plot) of a run saved with --json, run nothing")
    args = ap.parse_args(argv)
    if args.tables_from:
        with open(args.tables_from) as f:
            saved = json.load(f)
        print_tables(saved["rows"], saved["load"])
        if args.plot:
            write_plot(args.plot, saved["rows"], _caption(saved["load"]))
        return 0
    engines = args.engines.split(",") + (["dkvstream-in-process"] if args.in_process else [])
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")
    if args.baseline_commit:
        engines.insert(engines.index("dkvstream") + 1 if "dkvstream" in engines else 0,
                       f"dkvstream@{args.baseline_commit}")
    rates = sorted(float(x) for x in args.rates.split(",")) if not args.no_live else []
    longest = max([int(r * args.duration_s) for r in rates] + [0 if args.no_throughput else args.throughput_records])
    scale = args.scale or max(1, -(-longest // FLIGHTS_PER_SCALE))
    tmp = tempfile.mkdtemp(prefix="live-bench-")
    broker = None
    global BASELINE
    try:
        if args.baseline_commit:
            from bench.flights_throughput import prepare_baseline

            BASELINE = prepare_baseline(args.baseline_commit, tmp)
        bootstrap = args.bootstrap
        if bootstrap is None:
            from dkvstream.operators.io.kafka_broker import TansuBroker

            broker = TansuBroker(os.path.join(tmp, "tansu"), stop_timeout_s=3.0).start()
            bootstrap = broker.bootstrap
        from bench.plot import load_average

        load_start = load_average()
        rows = _run(args, engines, rates, scale, bootstrap, tmp, broker.pid if broker is not None else None)
        load = f"{load_start} at start, {load_average()} at end"
        print_tables(rows, load)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"load": load, "scale": scale, "rows": rows}, f)
        if args.plot:
            write_plot(args.plot, rows, _caption(load))
        # A run stopped while behind is a result (not sustained); a failed or wrong one is not.
        return 1 if any("error" in r and not r["error"].startswith("killed") for r in rows) else 0
    finally:
        if broker is not None:
            broker.stop()
        if BASELINE:
            from bench.flights_throughput import remove_baseline

            remove_baseline(BASELINE)
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args, engines: list[str], rates: list[float], scale: int, bootstrap: str, tmp: str,
         broker_pid: int | None = None) -> list[dict]:
    rows: list[dict] = []
    behind: set[str] = set()
    for rate in rates:
        records = min(int(rate * args.duration_s), scale * FLIGHTS_PER_SCALE)
        producers = args.producers or (1 if rate <= 20_000 else 3)
        for engine in engines:
            if engine in behind:
                print(f"rate {rate:,.0f}: {engine} skipped (did not sustain a lower rate)", flush=True)
                continue
            harness = ["--bootstrap", bootstrap, "--topic", f"live-{uuid.uuid4().hex[:10]}", "--records",
                       str(records), "--scale", str(scale), "--produce", "live", "--rate", str(rate),
                       "--producers", str(producers)]
            # Start-up, the input's duration and half as long again to drain: an engine still
            # not done is far behind (not sustained) and is stopped.
            row = run_child(engine, harness, tmp, 90 + 1.5 * args.duration_s, f"rate {rate:,.0f}",
                            args.trigger_ms, broker_pid, args.profile)
            row.setdefault("rate", rate)
            rows.append(row)
            if not sustained(row) and engine not in args.keep_going.split(","):
                behind.add(engine)
            if "error" not in row:
                print(f"rate {rate:,.0f}: {engine}: {row['events_per_s']:,.0f} events/s, producers "
                      f"{_fmt(row.get('producer_rate'), ',.0f')}/s, drain {row['drain_s']} s, window latency "
                      f"p99 {row.get('latency_p99_s')} s", flush=True)
    if not args.no_throughput:
        records = min(args.throughput_records, scale * FLIGHTS_PER_SCALE)
        for engine in engines:
            harness = ["--bootstrap", bootstrap, "--topic", f"filled-{uuid.uuid4().hex[:10]}", "--records",
                       str(records), "--scale", str(scale), "--produce", "before"]
            row = run_child(engine, harness, tmp, 600, "pre-filled", args.trigger_ms, broker_pid, args.profile)
            rows.append(row)
            if "error" not in row:
                print(f"pre-filled: {engine}: {row['events_per_s']:,.0f} events/s", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
