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

Measures (``Progress``, ``LagSampler``, ``peer_stats``):

- throughput (topic filled before the engine starts): ``seconds`` from the first record
  consumed to the ``N``-th record processed (folded into its window's state), and
  ``events_per_s`` = ``N / seconds``; start-up (group join, partition assignment) and
  shutdown (the last commit) are outside this clock.
- live (the producer runs at a fixed rate while the engine consumes): lag = records in
  the topic (sum of the partitions' high watermarks) minus records the engine has
  processed, sampled every ``interval_s`` from the first record consumed until the
  ``N``-th is processed; reported as its median, 95th percentile and maximum, in records
  and in seconds at the producer's rate. Tansu's high watermark trails the records
  produced by up to one producer batch per partition (``linger.ms`` = 20 ms of records),
  so lag is under-counted by at most that. Also ``drain_s``: seconds from the producer
  process exiting (every record acknowledged) to the ``N``-th record processed (0 when
  the engine kept up). Lag counts records, not windows: it does not include the event
  time an engine waits before closing a window (Bytewax's per-route watermark closes a
  route's window only at that route's next flight after it).
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
from examples.flights_data import ORIGINS
from examples.flights_oracle import assert_equals_oracle
from examples.flights_producer import create_topic, produce, replay_order

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
    ending at or before it are compared."""
    table, partition = replay_order(scale)
    ms = table.column("event_time_ms").to_numpy()[:records]
    part = partition[:records]
    return int(min(ms[part == p].max() for p in np.unique(part))) - WATERMARK_DELAY_MS


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


class Progress:
    """What an engine reports while it runs: when it is ready to consume (``ready``, set
    once its partitions are assigned), when it consumed its first record, how many it has
    processed, when it processed the last one (``time.perf_counter`` s).

    Engine callbacks call ``consumed()`` when records reach the engine and ``processed(k)``
    once ``k`` records are folded into their windows; ``processed`` returns True once all
    ``records`` are (the engine then stops). Counters are plain ints read by the lag
    sampler thread (a torn read is impossible under the GIL)."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.ready = threading.Event()
        self.count = 0
        self.first_consumed: float | None = None
        self.last_processed: float | None = None

    def consumed(self) -> None:
        if self.first_consumed is None:
            self.first_consumed = time.perf_counter()
            self.ready.set()

    def processed(self, k: int = 1) -> bool:
        self.count += k
        if self.count >= self.records and self.last_processed is None:
            self.last_processed = time.perf_counter()
        return self.count >= self.records


class LagSampler:
    """Samples lag (module docstring) every ``interval_s`` in a thread: the topic's
    high watermarks (a separate consumer, ``get_watermark_offsets(cached=False)``) minus
    ``progress.count``. ``stop()`` ends it; ``lags`` holds the samples, records."""

    def __init__(self, bootstrap: str, topic: str, progress: Progress, interval_s: float = 0.5) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "flights-lag-sampler"})
        self.topic, self.progress, self.interval_s = topic, progress, interval_s
        self.lags: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        from confluent_kafka import TopicPartition

        while not self._stop.wait(self.interval_s):
            if self.progress.first_consumed is None:
                continue
            if self.progress.last_processed is not None:
                return
            processed = self.progress.count
            high = sum(self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5,
                                                            cached=False)[1] for p in range(len(ORIGINS)))
            self.lags.append(max(0, high - processed))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


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
    last processed), ``events_per_s``, ``peak_rss_mib``, ``windows_emitted`` and ``extra``.

    Raises:
        RuntimeError: the engine stopped before processing every record.
    """
    if progress.last_processed is None:
        raise RuntimeError(f"the engine processed {progress.count} of {progress.records} records")
    seconds = progress.last_processed - progress.first_consumed
    return {"records": progress.records, "seconds": round(seconds, 3),
            "events_per_s": round(progress.records / seconds, 1) if seconds > 0 else None,
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


def run_live_cli(args, engine: str, run) -> int:
    """Fill the topic as ``--produce`` says, ``run(progress) -> (output frame, stats)``,
    sample lag when producing live, check the complete windows against the oracle and
    print one JSON line: the stats plus ``engine``, ``mode``, ``windows_compared`` and
    ``correct: true`` (an ``AssertionError`` from the check propagates); when producing
    live also ``rate``, ``lag_samples``, ``lag_p50``, ``lag_p95``, ``lag_max`` (records),
    ``lag_p95_s`` (s at ``rate``), ``drain_s`` and ``ready_s`` (s from the engine's start
    to the producer's: the engine's start-up, e.g. its group join).

    Returns:
        Exit status 0.
    """
    producer = sampler = None
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
        sampler = LagSampler(args.bootstrap, args.topic, progress)
    started = time.perf_counter()
    output, stats = run(progress)
    stats.update(engine=engine, mode={"before": "throughput", "live": "live", None: "pre-filled"}[args.produce])
    if producer is not None:
        sampler.stop()
        producer.join()
        lags = sorted(sampler.lags)
        stats.update(rate=args.rate, lag_samples=len(lags), drain_s=round(max(0.0, progress.last_processed
                                                                              - producer.exited_at), 3),
                     ready_s=round(producer.started_at - started, 3))
        if lags:
            p95 = lags[min(len(lags) - 1, int(0.95 * len(lags)))]
            stats.update(lag_p50=int(statistics.median(lags)), lag_p95=p95, lag_max=lags[-1],
                         lag_p95_s=round(p95 / args.rate, 3))
    stats["windows_compared"] = check_complete_windows(output, args.records, args.scale)
    stats["correct"] = True
    print(json.dumps(stats), flush=True)
    return 0


class LiveProducer:
    """``python -m examples.flights_producer`` in a child process, started once the engine
    is ready (``progress.ready``, so its group join is not counted as lag), run from a
    thread; ``started_at`` and ``exited_at`` are ``time.perf_counter`` s."""

    def __init__(self, args, progress: Progress, ready_timeout_s: float = 120) -> None:
        self.args, self.progress, self.ready_timeout_s = args, progress, ready_timeout_s
        self.started_at = self.exited_at = None
        self.returncode: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        a = self.args
        self.progress.ready.wait(self.ready_timeout_s)  # not ready in time: produce anyway
        self.started_at = time.perf_counter()
        self.returncode = subprocess.call(
            [sys.executable, "-m", "examples.flights_producer", "--bootstrap", a.bootstrap, "--topic", a.topic,
             "--rate", str(a.rate), "--scale", str(a.scale), "--limit", str(a.records)],
            stdout=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])})
        self.exited_at = time.perf_counter()

    def join(self) -> None:
        """Waits for the producer to exit.

        Raises:
            RuntimeError: it exited with an error.
        """
        self._thread.join()
        if self.returncode != 0:
            raise RuntimeError(f"the flights producer exited with status {self.returncode}")
