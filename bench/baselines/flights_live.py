"""The live flights benchmark's shared side: which records a run consumes, which windows
it is checked on, and what it measures. Used by the Kafka peers (``quix_flights.py``,
``bytewax_kafka_flights.py``) and meant for dkvstream's Kafka run too.

The topic is the one ``examples/flights_producer.py`` fills (3 partitions, one per
origin, record timestamp = scheduled departure, records in event-time order), freshly
created, so partition ``p`` holds offsets ``[0, n_p)`` and a run of the first ``N``
flights ends at the offsets ``partition_ends(N)``. Every engine stops after those
records (Tansu's ListOffsets high watermark is the base offset of the topic's last batch
+ 1, not its last record + 1, so "read to the high watermark" would stop early).

The complete-window rule (the windows every engine is checked on): a run over the first
``N`` flights is compared with the oracle over exactly those flights on the windows with
``window_end <= complete_window_cutoff_ms(N)``, the smallest over the partitions of the
largest event time consumed from the partition, minus the spec's 1 h watermark delay.
Every such window is final however an engine tracks its watermark (over the topic, per
partition as Quix Streams' ``closing_strategy="partition"``, or per key with a flush at
end of input as Bytewax): within a partition records come in event-time order, so no
later record of the topic falls into it. Windows after the cutoff are left out, closed
or not: an engine that flushes every window at end of input emits them, one that does
not (Quix) keeps them open.

Measures (``Progress``, ``LiveProducer``, ``peer_stats``); one clock for every engine,
start-up (group join, partition assignment, dataflow build) outside it:

- the clock runs from the first record consumed to the output of the ``N``-th record
  visible: the engine's commit covering it has completed, so its state and every output
  of the records before it are readable by a reader of its sink (``Progress.output_visible``;
  dkvstream: the epoch's publish; Quix: the checkpoint commit; Bytewax: the snapshot at
  its epoch's end). Throughput (topic filled before the engine starts): ``seconds`` =
  that clock, ``events_per_s`` = ``N / seconds``.
- live (producers at a fixed rate while the engine consumes; they start once the engine
  is ready, so its start-up is not counted). Each producer process loads its records,
  then all start at one instant (``common_start``: a barrier), so tick ``k`` (records
  ``[k r, (k + 1) r)`` of the producer's order, ``r`` = rate x ``TICK_S``) is released at
  ``start + k TICK_S`` by every producer: a producer that loaded slower does not run
  behind the others (which an engine's idleness timeout would turn into late events).
  ``LiveProducer`` samples the topic's high watermarks (their sum: records visible)
  every 50 ms. ``producer_slip_s`` is the largest amount by which the records visible
  trailed the schedule, in seconds at the rate (up to one tick, 0.1 s, of it is the time
  a tick takes to become visible).

  * record latency: per record, the commit covering it minus its tick's release
    (``record_latencies``).
  * window latency: a window ending at ``e`` is closed by the first record of the
    producer's order with event time >= ``e`` + 1 h (after it the topic's watermark, max
    event time - 1 h, has passed the window); its latency is the time the window
    reached the engine's sink minus that record's release. It includes the event time
    an engine waits before closing a window: Bytewax's per-route clock closes a route's
    window only at that route's next flight 1 h after it, or at end of input.
  * both summarised by ``latency_summary``: p50, p99 and maximum, s.
  * lag: records visible in the topic minus records whose output is visible, per
    sample, from the first record consumed to the end of the clock; median, 95th
    percentile, maximum (records) and the 95th percentile in seconds at the rate.
    Tansu's high watermark trails the records produced by up to one producer batch per
    partition, so lag is under-counted by at most that.
  * ``drain_s``: seconds from the last producer exiting (every record acknowledged) to
    the end of the clock (0 when the engine kept up).
- peak RSS of this process (``psutil``, sampled every 0.2 s while the engine runs), MiB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.baselines.flights_input import EpochPlan, prefix_oracle
from dkvstream.examples.flights_data import ORIGINS
from dkvstream.examples.flights_oracle import assert_equals_oracle
from dkvstream.examples.flights_producer import TICK_S, create_topic, produce, replay_order

WATERMARK_DELAY_MS = 3_600_000  # the spec's watermark: max event time - 1 h
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Producer rate of a pre-filled topic: every record in one producer tick.
FILL_RATE = 1e9


def partition_ends(records: int, scale: int = 1) -> dict[int, int]:
    """End offset (exclusive) of each topic partition after the first ``records`` flights
    of the producer's order, on a fresh topic: ``{partition: n}``, partitions 0..2."""
    _, partition = replay_order(scale)
    if not 0 < records <= len(partition):
        raise ValueError(f"records must be in [1, {len(partition)}] (flights at scale {scale}), got {records}")
    counts = np.bincount(partition[:records], minlength=len(ORIGINS))
    return {p: int(n) for p, n in enumerate(counts)}


def complete_window_cutoff_ms(records: int, scale: int = 1) -> int:
    """The complete-window rule's cutoff (module docstring), ms since the epoch: windows
    ending at or before it are compared. It is 1 ms below the spec's watermark: with
    Flink's rule (dkvstream's), the watermark is max event time - 1 h - 1 ms, so a window
    ending exactly at max - 1 h closes only at the next record."""
    table, partition = replay_order(scale)
    ms = table.column("event_time_ms").to_numpy()[:records]
    part = partition[:records]
    return int(min(ms[part == p].max() for p in np.unique(part))) - WATERMARK_DELAY_MS - 1


def complete_windows(frame: pd.DataFrame, cutoff_ms: int) -> pd.DataFrame:
    """The rows of an output or oracle frame whose ``window_end`` is <= ``cutoff_ms``."""
    end_ms = frame["window_end"].astype("datetime64[ms, UTC]").astype("int64")
    return frame[end_ms <= cutoff_ms].reset_index(drop=True)


def oracle(records: int, scale: int = 1) -> pd.DataFrame:
    """The oracle over the first ``records`` flights (every window, complete or not)."""
    ends = partition_ends(records, scale)
    plan = EpochPlan(scale, records, [], {origin: ends[i] for i, origin in enumerate(ORIGINS)})
    return prefix_oracle(plan)


def check_complete_windows(output: pd.DataFrame, records: int, scale: int = 1) -> int:
    """Assert an engine's complete windows equal the oracle's (``assert_equals_oracle``).

    Returns:
        The number of windows compared.

    Raises:
        AssertionError: naming the first difference.
    """
    cutoff = complete_window_cutoff_ms(records, scale)
    expected = complete_windows(oracle(records, scale), cutoff)
    assert_equals_oracle(pa.Table.from_pandas(complete_windows(output, cutoff), preserve_index=False), expected)
    return len(expected)


def window_latencies(progress: Progress, records: int, scale: int, rate: float, produce_start: float) -> list[float]:
    """End-to-end latency of each compared window of a live run, s (module docstring:
    emission time minus the production time of the record that closed the window).

    Args:
        progress: the run's ``Progress`` (``emitted``).
        records: N; scale, rate: the producer's.
        produce_start: ``time.perf_counter`` s of the producer's first tick
            (``LiveProducer.schedule_start``).

    Returns:
        One latency per emitted window with ``window_end <= complete_window_cutoff_ms``.
    """
    table, _ = replay_order(scale)
    ms = table.column("event_time_ms").to_numpy()[:records]
    cutoff = complete_window_cutoff_ms(records, scale)
    per_tick = max(1, int(rate * TICK_S))
    out = []
    for end_ms, at in progress.emitted:
        if end_ms <= cutoff:
            closing = int(np.searchsorted(ms, end_ms + WATERMARK_DELAY_MS, side="left"))
            out.append(at - (produce_start + (closing // per_tick) * TICK_S))
    return out


def record_latencies(commits: list[tuple[float, dict[int, int]]], records: int, scale: int, rate: float,
                     schedule_start: float) -> np.ndarray:
    """Per record of a live run: the time its engine's output covering it became visible
    minus its production time, s.

    A record's production time is its producer tick's release (tick ``k`` = records
    ``[k r, (k + 1) r)`` of the producer's order, ``r`` = rate x ``TICK_S``, released at
    ``schedule_start + k TICK_S``); the ``i``-th record of partition ``p`` is the ``i``-th
    of the order with partition ``p``. A record counts at the first commit covering it.

    Args:
        commits: ``Progress.commits``: ``(perf_counter s, next offset per partition)``.
        records, scale, rate: the run's N, scale and producer rate.
        schedule_start: ``perf_counter`` s of the producers' first tick.

    Returns:
        One latency per record covered by a commit, in commit order.
    """
    _, partition = replay_order(scale)
    partition = partition[:records]
    positions = {int(p): np.flatnonzero(partition == p) for p in np.unique(partition)}
    per_tick = max(1, int(rate * TICK_S))
    done = dict.fromkeys(positions, 0)
    out = []
    for at, offsets in commits:
        for p, end in offsets.items():
            if p in positions and end > done[p]:
                idx = positions[p][done[p]:end]
                out.append(at - (schedule_start + (idx // per_tick) * TICK_S))
                done[p] = end
    return np.concatenate(out) if out else np.array([])


def latency_summary(values, prefix: str) -> dict:
    """``{prefix}p50_s``, ``{prefix}p99_s``, ``{prefix}max_s`` of latencies in s (numpy's
    linear-interpolation percentiles, rounded to ms); ``{}`` for no values. Every latency
    of the benchmark is summarised by this one function."""
    v = np.asarray(values, dtype=float)
    if not v.size:
        return {}
    p50, p99, top = np.percentile(v, [50, 99, 100])
    return {f"{prefix}p50_s": round(float(p50), 3), f"{prefix}p99_s": round(float(p99), 3),
            f"{prefix}max_s": round(float(top), 3)}


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """(median, 95th percentile, maximum) of a non-empty list (the lag's)."""
    v = sorted(values)
    return statistics.median(v), v[min(len(v) - 1, int(0.95 * len(v)))], v[-1]


class Progress:
    """What an engine reports while it runs: when it is ready to consume (``ready``, set
    once its partitions are assigned), when it consumed its first record, how many it has
    processed, when it processed the last one, when its output became visible for which
    records, and when it emitted each window (``time.perf_counter`` s).

    Engine callbacks call ``consumed()`` when records reach the engine, ``processed(k)``
    once ``k`` records are folded into their windows (it returns True once all ``records``
    are: the engine then stops), ``output_visible(next_offsets)`` when the engine's commit
    covering the records below those offsets has completed (its state and every output
    of those records readable by a reader of its sink) and ``window_emitted(window_end_ms)``
    per window output. ``visible_count`` is read by ``LiveProducer``'s sampling thread."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.ready = threading.Event()
        self.count = 0
        self.first_consumed: float | None = None
        self.last_processed: float | None = None
        self.last_visible: float | None = None
        # Per commit: (perf_counter s, next offset of every partition covered so far).
        self.commits: list[tuple[float, dict[int, int]]] = []
        self.visible_count = 0
        self._visible_offsets: dict[int, int] = {}
        self.emitted: list[tuple[int, float]] = []  # (window end ms, perf_counter s)

    def output_visible(self, next_offsets: dict[int, int], at: float | None = None) -> None:
        """Records that the engine's output covers offsets ``[0, next_offsets[p])`` of each
        partition ``p`` named (others keep what they had) from ``at`` (default: now) on.
        Once it covers all ``records``, ``last_visible`` is set: the end of every clock."""
        at = time.perf_counter() if at is None else at
        for p, end in next_offsets.items():
            self._visible_offsets[p] = max(end, self._visible_offsets.get(p, 0))
        self.commits.append((at, dict(self._visible_offsets)))
        self.visible_count = sum(self._visible_offsets.values())
        if self.visible_count >= self.records and self.last_visible is None:
            self.last_visible = at

    def window_emitted(self, window_end_ms: int) -> None:
        self.emitted.append((window_end_ms, time.perf_counter()))

    def consumed(self) -> None:
        if self.first_consumed is None:
            self.first_consumed = time.perf_counter()
            self.ready.set()

    def processed(self, k: int = 1) -> bool:
        self.count += k
        if self.count >= self.records and self.last_processed is None:
            self.last_processed = time.perf_counter()
        return self.count >= self.records


class PeakRss:
    """Peak RSS of this process, sampled every ``interval_s`` by ``psutil`` in a thread."""

    def __init__(self, interval_s: float = 0.2) -> None:
        import psutil

        self._process = psutil.Process(os.getpid())
        self.interval_s = interval_s
        self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        """Stops sampling; returns the peak, bytes."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        return self.peak


def peer_stats(progress: Progress, peak_rss: int, windows: int, **extra) -> dict:
    """The stats dict of a run: ``records``, ``seconds`` (first record consumed to the
    output of the last one visible; ``clock_start``/``clock_end`` are those instants,
    ``time.perf_counter`` s, comparable across processes on Linux), ``events_per_s``, ``visible_after_fold_s`` (the
    last record folded into its window to its output visible), ``peak_rss_mib``,
    ``windows_emitted`` and ``extra``.

    Raises:
        RuntimeError: the engine stopped before its output covered every record.
    """
    if progress.last_visible is None:
        raise RuntimeError(f"the engine's output covers {progress.visible_count} of {progress.records} records "
                           f"({progress.count} processed)")
    seconds = progress.last_visible - progress.first_consumed
    return {"records": progress.records, "seconds": round(seconds, 3),
            "clock_start": progress.first_consumed, "clock_end": progress.last_visible,
            "events_per_s": round(progress.records / seconds, 1) if seconds > 0 else None,
            "visible_after_fold_s": (round(max(0.0, progress.last_visible - progress.last_processed), 3)
                                     if progress.last_processed is not None else None),
            "peak_rss_mib": round(peak_rss / 2**20, 1), "windows_emitted": windows, **extra}


def add_live_arguments(ap: argparse.ArgumentParser) -> None:
    """The command-line options of every Kafka peer."""
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port")
    ap.add_argument("--topic", default="flights")
    ap.add_argument("--records", type=int, required=True,
                    help="flights to consume: the first N of the producer's order (the producer's --limit)")
    ap.add_argument("--scale", type=int, default=1, help="the producer's --scale")
    ap.add_argument("--produce", choices=["before", "live"],
                    help="create the topic and produce the N flights: 'before' the engine starts "
                         "(throughput), or 'live' at --rate while it runs (lag); default: the topic is "
                         "already filled")
    ap.add_argument("--rate", type=float, default=20_000, help="producer rate with --produce live, events/s")
    ap.add_argument("--producers", type=int, default=1, choices=(1, 2, 3),
                    help="producer processes with --produce live, each with its own partitions")
    ap.add_argument("--lag-series", metavar="PATH",
                    help="with --produce live, write the lag samples as JSON: [[s since the first "
                         "record consumed, records visible, records processed], ...]")


def run_live_cli(args, engine: str, run) -> int:
    """Fill the topic as ``--produce`` says, ``run(progress) -> (output frame, stats)``,
    sample lag when producing live, check the complete windows against the oracle and
    print one JSON line: the stats plus ``engine``, ``mode``, ``windows_compared`` and
    ``correct: true`` (an ``AssertionError`` from the check propagates); when producing
    live also ``rate``, ``lag_samples``, ``lag_p50``, ``lag_p95``, ``lag_max`` (records),
    ``lag_p95_s`` (s at ``rate``), ``drain_s``, ``ready_s`` (s from the engine's start
    to the producers' common start: the engine's start-up, e.g. its group join, plus the
    producers' loading), ``producers``, the window latency (``windows_measured``,
    ``latency_p50_s``, ``latency_p99_s``, ``latency_max_s``) and the record latency
    (``record_latency_p50_s``, ``record_latency_p99_s``, ``record_latency_max_s``).

    Returns:
        Exit status 0.
    """
    producer = None
    if args.produce:
        create_topic(args.bootstrap, args.topic)
    if args.produce == "before":
        produce(args.bootstrap, args.topic, FILL_RATE, args.scale, args.records)
    # Every engine's process holds the flights (oracle, partition ends) while it runs, so
    # their peak RSS compare alike; loaded now, outside the clocks.
    replay_order(args.scale)
    progress = Progress(args.records)
    if args.produce == "live":
        producer = LiveProducer(args, progress)
    started = time.perf_counter()
    try:
        output, stats = run(progress)
    finally:
        if producer is not None:
            producer.join()
    stats.update(engine=engine, mode={"before": "throughput", "live": "live", None: "pre-filled"}[args.produce])
    if producer is not None:
        start = producer.schedule_start()
        stats.update(producer.stats(), ready_s=round(start - started, 3), producers=producer.producers)
        latencies = window_latencies(progress, args.records, args.scale, args.rate, start)
        stats.update(windows_measured=len(latencies), **latency_summary(latencies, "latency_"))
        stats["commits"] = len(progress.commits)
        stats.update(latency_summary(record_latencies(progress.commits, args.records, args.scale, args.rate, start),
                                     "record_latency_"))
        if getattr(args, "lag_series", None) and progress.first_consumed is not None:
            with open(args.lag_series, "w") as f:
                json.dump([[round(t - progress.first_consumed, 3), h, done] for t, h, done in producer.samples
                           if t >= progress.first_consumed], f)
    stats["windows_compared"] = check_complete_windows(output, args.records, args.scale)
    stats["correct"] = True
    print(json.dumps(stats), flush=True)
    return 0


def common_start(loaded_at: float, margin_s: float = 0.2) -> tuple[float, float]:
    """The producers' common first tick, once the last of them has loaded its records.

    Args:
        loaded_at: ``time.time()`` s when the last producer reported it had loaded.
        margin_s: time for the start line to reach every producer, s.

    Returns:
        ``(wall s, perf_counter s)`` of the first tick: the wall clock (``time.time()``)
        to send to the producers (``flights_producer --barrier``) and the same instant on
        this process's ``time.perf_counter`` clock, which every measure uses.
    """
    wall = loaded_at + margin_s
    return wall, time.perf_counter() + (wall - time.time())


class LiveProducer:
    """``python -m dkvstream.examples.flights_producer --barrier`` in child processes
    (``args.producers`` of them, default 1, each producing the records of its own
    partitions on the common schedule: one Python producer tops out at about
    25,000-30,000 records/s), started from a thread once the engine is ready
    (``progress.ready``), on a fresh topic. Each producer loads its records first; once
    all have, they get one start time (``common_start``), so their schedules are one
    schedule however long each took to load. While they run, and until the engine's
    output covers every record, the thread samples the topic's high watermarks every
    ``interval_s``.

    Attributes:
        samples: ``(perf_counter s, records visible in the topic, records whose output is
            visible)`` per sample.
        started_at: ``perf_counter`` s of the producers' common first tick.
        exited_at: ``perf_counter`` s the last producer exited.
        report: the producers' JSON lines (``produced``, ``first_tick``, ``seconds``,
            ``rate``), all producers together.
    """

    def __init__(self, args, progress: Progress, ready_timeout_s: float = 120, interval_s: float = 0.05,
                 load_timeout_s: float = 300) -> None:
        self.args, self.progress = args, progress
        self.producers = getattr(args, "producers", 1)
        self.ready_timeout_s, self.interval_s, self.load_timeout_s = ready_timeout_s, interval_s, load_timeout_s
        self.started_at = self.exited_at = None
        self.returncode: int | None = None
        self.report: dict = {}
        self.samples: list[tuple[float, int, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        a = self.args
        watcher = Consumer({"bootstrap.servers": a.bootstrap, "group.id": "flights-producer-watch"})
        parts = [TopicPartition(a.topic, p) for p in range(len(ORIGINS))]

        def visible() -> int:
            return sum(watcher.get_watermark_offsets(tp, timeout=5, cached=False)[1] for tp in parts)

        procs: list[subprocess.Popen] = []
        try:
            if visible():
                raise RuntimeError(f"topic {a.topic} is not empty: a live run needs a fresh topic")
            self.progress.ready.wait(self.ready_timeout_s)  # not ready in time: produce anyway
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])}
            k = self.producers
            procs = [subprocess.Popen(
                [sys.executable, "-m", "dkvstream.examples.flights_producer", "--bootstrap", a.bootstrap, "--topic",
                 a.topic, "--rate", str(a.rate), "--scale", str(a.scale), "--limit", str(a.records), "--barrier",
                 *(["--partitions", ",".join(str(p) for p in range(len(ORIGINS)) if p % k == i)] if k > 1 else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, env=env, text=True)
                for i in range(k)]
            # The barrier: every producer has loaded its records before any starts.
            for i, proc in enumerate(procs):
                line = proc.stdout.readline()
                if not line.startswith('{"loaded"'):
                    raise RuntimeError(f"producer {i} exited before loading its records "
                                       f"(status {proc.wait()}); its first line: {line!r}")
            wall, self.started_at = common_start(time.time())
            for proc in procs:
                proc.stdin.write(f"{wall!r}\n")
                proc.stdin.close()
            outs: list[str] = [""] * k
            readers = [threading.Thread(target=lambda i=i, p=p: outs.__setitem__(i, p.stdout.read()), daemon=True)
                       for i, p in enumerate(procs)]
            for r in readers:
                r.start()
            while not self._stop.is_set() and self.progress.last_visible is None:
                done = self.progress.visible_count
                self.samples.append((time.perf_counter(), visible(), done))
                if self.exited_at is None and all(p.poll() is not None for p in procs):
                    self.exited_at = time.perf_counter()
                time.sleep(self.interval_s)
            codes = [p.wait() for p in procs]
            self.returncode = next((c for c in codes if c != 0), 0)
            if self.exited_at is None:
                self.exited_at = time.perf_counter()
            for r in readers:
                r.join()
            reports = [json.loads(lines[-1]) for lines in (o.strip().splitlines() for o in outs) if lines]
            if reports:
                # The producers together: from the first one's first tick to the last one's end.
                first = min(r["first_tick"] for r in reports)
                seconds = max(r["first_tick"] + r["seconds"] for r in reports) - first
                produced = sum(r["produced"] for r in reports)
                self.report = {"produced": produced, "first_tick": first, "seconds": round(seconds, 3),
                               "rate": round(produced / seconds, 1) if seconds > 0 else None}
        except BaseException as e:  # noqa: BLE001 - handed to join()
            self.error = e
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        finally:
            watcher.close()

    def join(self) -> None:
        """Stops sampling (the engine is done or failed) and waits for the producers to exit.

        Raises:
            RuntimeError: a producer failed or the topic was not fresh.
        """
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"live producer: {self.error}") from self.error
        if self.returncode != 0:
            raise RuntimeError(f"the flights producer exited with status {self.returncode}")

    def _per_tick(self) -> int:
        return max(1, int(self.args.rate * TICK_S))

    def schedule_start(self) -> float:
        """``perf_counter`` s of the producers' common first tick (``common_start``).

        Raises:
            RuntimeError: the producers never started.
        """
        if self.started_at is None:
            raise RuntimeError("the live producers never started (see the error of join())")
        return self.started_at

    def stats(self) -> dict:
        """``rate``, ``producer_rate`` (the producers' own: first tick to last
        acknowledgement), ``producer_slip_s``, ``drain_s`` and the lag figures (module
        docstring)."""
        a, r, start = self.args, self._per_tick(), self.schedule_start()
        # Records the schedule had released by each sample minus those visible.
        slips = [(min(a.records, (int((t - start) / TICK_S) + 1) * r) - h) / a.rate
                 for t, h, _ in self.samples if t >= start]
        slip = max([0.0, *slips])
        first = self.progress.first_consumed
        lags = [max(0, h - done) for t, h, done in self.samples if first is not None and t >= first]
        out = {"rate": a.rate, "producer_rate": self.report.get("rate"), "producer_slip_s": round(slip, 3),
               "drain_s": round(max(0.0, self.progress.last_visible - self.exited_at), 3),
               "lag_samples": len(lags)}
        if lags:
            p50, p95, top = _percentiles(lags)
            out.update(lag_p50=int(p50), lag_p95=p95, lag_max=top, lag_p95_s=round(p95 / a.rate, 3))
        return out
