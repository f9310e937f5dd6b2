"""The flights job on a live Kafka topic: ``dkvstream.examples.flights`` reading what
``dkvstream.examples.flights_producer`` replays into a topic, left running.

Described in ``docs/examples.md`` ("Flights live from Kafka"); ``platform/run-live.sh``
runs it end to end (broker, producer, the job on local Spark, a drain, the oracle).
The job is ``dkvstream.examples.flights.flights_job``'s (operator ``route_daily_delays``, the
``route_daily_delays`` and ``route_daily_delays_late`` Parquet sinks, a watermark bound
of 1 hour, watermark alignment of one day) with a ``KafkaSource`` instead of the replay:
topic partition n carries origin ``ORIGINS[n]``, record key ``origin-dest``, value the
flight as a JSON object of ``EVENT_COLUMNS``, record timestamp the scheduled departure
(the event time). On a live source the watermark never reaches +infinity by itself: the
last windows are emitted when the job is stopped with a drain
(``JobRunner.stop(drain=True)``, ``run_job --continuous --drain-on-stop``), after which
its output equals ``dkvstream.examples.flights_oracle.route_daily_delays_oracle()``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

from dkvstream.examples.flights import route_delays_job
from dkvstream.examples.flights_data import DAY_MS, ORIGINS
from dkvstream.examples.flights_producer import TICK_S, replay_order
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN
from dkvstream.operators.io.kafka import KafkaSource
from dkvstream.storage.local_server import pid_alive

# The value columns, as dkvstream.examples.flights.FlightsSource reads them from the CSV (a test
# checks they agree): the producer writes integers as JSON integers, null when missing.
VALUE_SCHEMA = pa.schema([
    ("year", pa.int64()), ("month", pa.int64()), ("day", pa.int64()),
    ("sched_dep_time", pa.int64()), ("dep_time", pa.int64()), ("dep_delay", pa.int64()),
    ("carrier", pa.string()), ("flight", pa.int64()), ("origin", pa.string()), ("dest", pa.string()),
])
# ``run_job --job dkvstream.examples.flights_live:flights_live_job`` takes the broker from here.
BOOTSTRAP_ENV = "DKVSTREAM_KAFKA_BOOTSTRAP"
TOPIC_ENV = "DKVSTREAM_FLIGHTS_TOPIC"


def flights_kafka_job(bootstrap: str, topic: str = "flights", *, name: str = "flights_live",
                      events_per_epoch: int = 50_000, parallelism: int = 2, key_groups: int = 256,
                      trigger_interval_ms: int = 1_000, idle_timeout_ms: int = 10_000,
                      batch: bool = False) -> Job:
    """The flights route-delays job on a Kafka topic (module docstring).

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: the topic ``dkvstream.examples.flights_producer`` writes (3 partitions).
        name: job name (its object-store prefix is ``jobs/<name>``).
        events_per_epoch: the most events one epoch reads (a backlog is read in epochs
            of this size, back to back).
        parallelism, key_groups: as ``dkvstream.examples.flights.flights_job``.
        trigger_interval_ms: the processing-time trigger, ms (an epoch at most once a
            second by default).
        idle_timeout_ms: a partition read to its end that got nothing for this long (wall
            clock, ms, counted once the job has read a flight) stops holding back the
            watermark (Flink's ``withIdleness``). The producer writes every airport each
            100 ms tick, so 10 s only passes when the feed itself stops; a partition
            resuming after that may have late events.
        batch: use the vectorised operator form ``RouteDailyDelaysBatch`` (same output).

    Returns:
        The ``Job`` (``bounded=False`` source: run it continuously, stop it with a drain).
    """
    source = KafkaSource(bootstrap, topic, value_format="json", value_schema=VALUE_SCHEMA, bounded=False)
    return route_delays_job(source, name=name, batch=batch, key_groups=key_groups, parallelism=parallelism,
                            events_per_epoch=events_per_epoch, max_watermark_drift_ms=DAY_MS,
                            trigger_interval_ms=trigger_interval_ms, idle_timeout_ms=idle_timeout_ms)


def flights_live_job() -> Job:
    """``flights_kafka_job`` on the broker named by ``$DKVSTREAM_KAFKA_BOOTSTRAP`` and the
    topic ``$DKVSTREAM_FLIGHTS_TOPIC`` (default ``flights``), for ``run_job --job``.

    Raises:
        RuntimeError: ``DKVSTREAM_KAFKA_BOOTSTRAP`` is not set (the message says what to set).
    """
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise RuntimeError(f"set {BOOTSTRAP_ENV} to the Kafka bootstrap address (host:port) of the "
                           f"broker holding the flights topic, e.g. the output of "
                           f"platform/kafka-broker.sh start")
    return flights_kafka_job(bootstrap, os.environ.get(TOPIC_ENV, "flights"))


# ------------------------------------------------------- platform/run-live.sh's helpers
def newest_positions(partition_of_row: np.ndarray) -> list[np.ndarray]:
    """For each topic partition n, the replay-order index (``dkvstream.examples.flights_producer``)
    of its records: ``positions[n][o]`` is the index of the record at offset o (the
    producer writes each partition in replay order, so offsets are contiguous from 0)."""
    return [np.flatnonzero(partition_of_row == n) for n in range(len(ORIGINS))]


def progress_line(record: dict, positions: list[np.ndarray] | None, first_tick: float | None,
                  rate: float) -> str:
    """One human line for one ``run_job`` committed-epoch record: events, lag per
    partition, dead letters (if any), the newest event's latency and the watermark.

    The latency is the epoch's publish (``live.at_ms``) minus when the producer handed
    the newest event read to its client, from the producer's schedule: record i at
    ``first_tick + (i // (rate * TICK_S)) * TICK_S`` (a producer running behind hands it
    later, so this overstates). The job's own metrics cannot give it: the records'
    timestamps are the 2013 departures, not when they were produced, and the runtime
    reports now minus them as ``live.event_time_lag_ms``, not as latency.

    Args:
        record: a ``{"event": "committed", ...}`` line of ``run_job``.
        positions: ``newest_positions`` of the replay, or None (no latency).
        first_tick: the producer's first tick, s since the Unix epoch, or None (not started).
        rate: the producer's rate, events/s.
    """
    live = record["live"]
    lag = "/".join(f"{live['lag_events'][p]:,}" for p in sorted(live["lag_events"]))
    line = f"epoch {record['epoch']}: {record['events']:,} events in {record['seconds']:.2f} s, lag {lag} events"
    dead = record.get("dead_letter", {}).get("total", 0)
    if dead:
        line += f", {dead:,} dead letters"
    newest = [positions[int(p.rsplit("-", 1)[1])][o - 1]
              for p, o in record["source_offsets"].items() if o > 0] if positions is not None else []
    if newest and first_tick is not None:
        per_tick = max(1, int(rate * TICK_S))
        handed = first_tick + (max(newest) // per_tick) * TICK_S
        line += f", latency {live['at_ms'] / 1000 - handed:.1f} s"
    if record.get("drained"):
        return line + ", drained: watermark +inf, every window emitted"
    if WATERMARK_MIN < record["watermark"] < WATERMARK_MAX:
        stamp = datetime.datetime.fromtimestamp(record["watermark"] / 1000, datetime.timezone.utc)
        line += f", watermark {stamp:%Y-%m-%d %H:%M} UTC"
    return line


class _Lines:
    """The complete JSON lines appended to a file since the last call."""

    def __init__(self, path: str) -> None:
        self.path, self.offset = path, 0

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # not one of the JSON records (a library printing to stdout)
        return out


def watch(job_out: str, producer_out: str, job_pid: int, producer_pid: int, rate: float,
          poll_s: float = 0.2) -> int:
    """Follows a continuous ``run_job`` and the producer (``platform/run-live.sh``):
    prints a progress line per committed epoch (``progress_line``) and returns once the
    job has read everything produced.

    Caught up: the producer printed its final line (every record acknowledged) and an
    epoch committed offsets summing to the records produced, with lag 0 on every
    partition. (The producer is not transactional, so a partition's offsets have no
    gaps: offsets read = records read.)

    Args:
        job_out, producer_out: files the two processes' stdout goes to.
        job_pid, producer_pid: their pids.
        rate: the producer's rate, events/s (for the latency estimate).

    Returns:
        0 once caught up; 1 if the job exited first, or the producer exited without
        its final line (the reason is printed to stderr).
    """
    jobs, producer = _Lines(job_out), _Lines(producer_out)
    first_tick = produced = None
    positions = None
    while True:
        job_alive, producer_alive = pid_alive(job_pid), pid_alive(producer_pid)
        for r in producer.new():
            first_tick = r.get("first_tick", first_tick)
            if "produced" in r:
                produced = r["produced"]
                print(f"producer: {produced:,} flights in {r['seconds']:.1f} s ({r['rate']:,.0f}/s)", flush=True)
            if positions is None:  # the producer started: worth the 2 s it takes
                positions = newest_positions(replay_order()[1])
        for r in jobs.new():
            if r.get("event") == "started":
                ui = f", UI {r['ui']}" if r.get("ui") else ""
                print(f"job: Spark {r['master']} up ({r['app_id']}{ui})", flush=True)
            elif r.get("event") == "failed":
                print(f"job: failed: {r['error']}", flush=True)
            elif r.get("event") == "committed":
                print(progress_line(r, positions, first_tick, rate), flush=True)
                if (produced is not None and sum(r["source_offsets"].values()) >= produced
                        and not any(r["live"]["lag_events"].values())):
                    print(f"job: caught up, all {produced:,} flights read", flush=True)
                    return 0
        if not job_alive:
            print("run-live: the job exited before reading everything produced", file=sys.stderr)
            return 1
        # The flags were taken before reading: the lines a process wrote before it
        # exited have been read above.
        if not producer_alive and produced is None:
            print("run-live: the producer exited without producing every flight", file=sys.stderr)
            return 1
        time.sleep(poll_s)


def has_checkpoints(store: str, name: str = "flights_live") -> bool:
    """True if ``store`` holds a committed checkpoint of the job ``name``."""
    from dkvstream.operators.paths import job_prefix
    from dkvstream.operators.runtime.checkpoints import latest_checkpoint
    from dkvstream.storage.objectstore import open_object_store

    return latest_checkpoint(open_object_store(store), job_prefix(name)) is not None


def main(argv: list[str] | None = None) -> int:
    """The helpers of ``platform/run-live.sh``: ``python -m dkvstream.examples.flights_live watch
    ...`` (``watch``), ``last-epoch --job-out F`` (prints the progress line of the last
    committed epoch in ``F``) and ``has-run --store S`` (exit 0 if the store holds a run
    of ``flights_live``, else 1)."""
    p = argparse.ArgumentParser(prog="python -m dkvstream.examples.flights_live", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch", help="print progress until the job has read everything produced")
    w.add_argument("--job-out", required=True)
    w.add_argument("--producer-out", required=True)
    w.add_argument("--job-pid", type=int, required=True)
    w.add_argument("--producer-pid", type=int, required=True)
    w.add_argument("--rate", type=float, required=True)
    last = sub.add_parser("last-epoch", help="print the last committed epoch of a run_job output")
    last.add_argument("--job-out", required=True)
    h = sub.add_parser("has-run", help="exit 0 if the store holds a run of flights_live")
    h.add_argument("--store", required=True)
    a = p.parse_args(argv)
    if a.command == "watch":
        try:
            return watch(a.job_out, a.producer_out, a.job_pid, a.producer_pid, a.rate)
        except KeyboardInterrupt:  # Ctrl-C reaches the whole script: it stops the rest
            return 130
    if a.command == "last-epoch":
        committed = [r for r in _Lines(a.job_out).new() if r.get("event") == "committed"]
        if committed:
            print(progress_line(committed[-1], None, None, 1.0))
        return 0
    return 0 if has_checkpoints(a.store) else 1


if __name__ == "__main__":
    sys.exit(main())
