"""The flights route-daily-delays job on Bytewax (0.21) reading the live flights topic with
``bytewax.connectors.kafka.KafkaSource``.

The dataflow is ``bytewax_flights.py``'s (``EventClock`` with the watermark = max event
time - 1 h and its system time frozen, ``TumblingWindower`` of one day aligned to UTC
midnight, ``fold_window`` with the accumulator of ``flights_window.py``); only the input
differs: Kafka records, event time = the record timestamp, key = the record key, value
JSON. ``KafkaSource`` assigns every partition of the topic to the worker (Bytewax's own
partition assignment, no consumer group) and starts at the beginning of the topic.

Stopping: ``KafkaSource(tail=False)`` stops at librdkafka's partition EOF, i.e. at the
broker's high watermark, which Tansu reports as the base offset of the last batch + 1, so
each partition is wrapped to stop after its end offset of the first ``N`` flights
(``flights_live.partition_ends``) instead. At the end of input Bytewax closes every
window (its end-of-input watermark is +infinity), so it emits the windows after the
complete-window cutoff too; they are not compared (``flights_live``).

Bytewax's windowing keeps one clock per key: a route's window closes when that route's
next flight is at least 1 h past the window's end (or at the end of input), not when the
topic's watermark passes it as in dkvstream or Quix (``closing_strategy="partition"``).

Late events: ``fold_window``'s ``late`` stream is counted and the run fails on one (the
topic is in event-time order per partition, so none is).

Output visibility (the end of the benchmark's clocks): a record's output is visible once
the epoch holding it has closed, i.e. the source's offsets were snapshotted with the
window state at the epoch's end (Bytewax writes that snapshot to its recovery store
there); windows go to the output list as they close. The records of the last epoch are
covered when the dataflow returns (end of input: every window flushed, the last
snapshot written).

Guarantee: with recovery (default) Bytewax snapshots the source's offsets and the window
state together to its SQLite recovery store at the end of every epoch (``epoch_interval_s``
of system time), exactly-once state on resume; the in-process output list is not part
of it. ``--no-recovery``: nothing persisted.

Usage::

    .venv/bin/python bench/baselines/bytewax_kafka_flights.py --bootstrap 127.0.0.1:9092 --records 100000 \\
        [--produce before|live] [--rate 20000] [--no-recovery]

Prints one JSON line (``flights_live.run_live_cli``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import pandas as pd

from bench.baselines.bytewax_flights import ALIGN, ALIGN_MS, FROZEN_NOW, bytewax_import_error
from bench.baselines.flights_live import (
    WATERMARK_DELAY_MS,
    PeakRss,
    Progress,
    add_live_arguments,
    partition_ends,
    peer_stats,
    run_live_cli,
)
from bench.baselines.flights_window import fold, merge, new_accumulator, to_output_table
from dkvstream.examples.flights_data import DAY_MS


def build_flow(bootstrap: str, topic: str, ends: dict[int, int], progress: Progress, sink: list,
               late: list | None = None):
    """The dataflow over ``topic``'s offsets ``[0, ends[p])`` of each partition ``p``.

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: the flights topic.
        ends: end offset (exclusive) per partition; a partition not in it is not read.
        progress: ``consumed()`` at the first record, ``processed()`` per record folded.
        sink: closed windows are appended as ``(route, window_start_ms, accumulator)``.
        late: late events are appended as ``(route, item)`` (default: dropped).

    Returns:
        ``bytewax.dataflow.Dataflow``.
    """
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import StatefulSourcePartition
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class UpToPartition(StatefulSourcePartition):
        """A ``KafkaSource`` partition that ends after offset ``end - 1``."""

        def __init__(self, inner, partition: int, end: int) -> None:
            self.inner, self.partition, self.end = inner, partition, end
            self.done = end <= 0

        def next_batch(self) -> list:
            progress.ready.set()  # the dataflow runs: every partition is built
            if self.done:
                raise StopIteration
            batch = [m for m in self.inner.next_batch() if m.offset < self.end]
            if batch:
                progress.consumed()
                self.done = batch[-1].offset >= self.end - 1
            return batch

        def snapshot(self):
            # Called at the end of each epoch: the records below it are in the snapshot.
            offset = self.inner.snapshot()
            progress.output_visible({self.partition: min(offset, self.end)})
            return offset

        def close(self) -> None:
            self.inner.close()

    class UpToKafkaSource(KafkaSource):
        def build_part(self, step_id, for_part, resume_state):
            inner = super().build_part(step_id, for_part, resume_state)
            p = int(for_part.split("-", 1)[0])
            return UpToPartition(inner, p, ends.get(p, 0))

    class ListSinkPartition(StatelessSinkPartition):
        def write_batch(self, items) -> None:
            for route, (window_id, acc) in items:
                start_ms = ALIGN_MS + window_id * DAY_MS
                sink.append((route, start_ms, acc))
                progress.window_emitted(start_ms + DAY_MS)

    class ListSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return ListSinkPartition()

    class LateSinkPartition(StatelessSinkPartition):
        def write_batch(self, items) -> None:
            if late is not None:
                late.extend(items)

    class LateSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return LateSinkPartition()

    def parse(msg) -> tuple[str, int, object, object]:
        value = json.loads(msg.value)
        return msg.key.decode(), msg.timestamp[1], value["dep_time"], value["dep_delay"]

    def folder(acc: list, item) -> list:
        fold(acc, item[2], item[3])
        progress.processed()
        return acc

    flow = Dataflow("flights_route_daily_delays_kafka")
    # tail=True: a partition's end is UpToPartition's, never librdkafka's EOF.
    messages = op.input("kafka", flow, UpToKafkaSource([bootstrap], [topic], tail=True))
    keyed = op.key_on("route", op.map("parse", messages, parse), lambda item: item[0])
    clock = EventClock(lambda item: datetime.fromtimestamp(item[1] / 1000, timezone.utc),
                       wait_for_system_duration=timedelta(milliseconds=WATERMARK_DELAY_MS),
                       now_getter=lambda: FROZEN_NOW, to_system_utc=lambda ts: None)
    windows = fold_window("daily", keyed, clock, TumblingWindower(length=timedelta(days=1), align_to=ALIGN),
                          builder=new_accumulator, folder=folder, merger=merge, ordered=False)
    op.output("windows", windows.down, ListSink())
    op.output("late", windows.late, LateSink())
    return flow


def run(bootstrap: str, topic: str, progress: Progress, scale: int = 1, recovery: bool = True,
        epoch_interval_s: float = 1.0, work_dir: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Consume the first ``progress.records`` flights of ``topic`` (one worker, this thread).

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: the flights topic, filled by ``examples/flights_producer.py`` at ``scale``.
        progress: counts the records (its ``records`` is N); ``LiveProducer`` samples it.
        scale: the producer's scale (gives each partition's end offset).
        recovery: snapshot to Bytewax's SQLite recovery store every epoch.
        epoch_interval_s: Bytewax epoch length, s of system time.
        work_dir: recovery store directory (default: a temporary one, removed after).

    Returns:
        ``(output, stats)``: the emitted windows (``flights_window.to_output_table``
        columns, pandas) and ``peer_stats`` plus ``recovery``.

    Raises:
        RuntimeError: the dataflow ended before processing N records.
        AssertionError: a record was late (its window already closed).
    """
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import run_main

    tmp = None
    recovery_config = None
    if recovery:
        if work_dir is None:
            work_dir = tmp = tempfile.mkdtemp(prefix="bytewax-kafka-flights-")
        init_db_dir(Path(work_dir), 1)
        recovery_config = RecoveryConfig(Path(work_dir))
    sink: list = []
    late: list = []
    ends = partition_ends(progress.records, scale)
    flow = build_flow(bootstrap, topic, ends, progress, sink, late)
    rss = PeakRss()
    try:
        run_main(flow, epoch_interval=timedelta(seconds=epoch_interval_s), recovery_config=recovery_config)
        if progress.count >= progress.records:  # the last epoch's records: covered at the dataflow's end
            progress.output_visible(ends)
    finally:
        peak = rss.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    assert not late, f"bytewax: {len(late)} late events, the first {late[0]} (the topic is in event-time order " \
                     "per partition)"
    stats = peer_stats(progress, peak, len(sink), recovery=recovery)
    return to_output_table(sink).to_pandas(), stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_live_arguments(ap)
    ap.add_argument("--no-recovery", action="store_true", help="no state snapshots (in-memory only)")
    ap.add_argument("--epoch-interval-s", type=float, default=1.0, help="Bytewax epoch length, s")
    args = ap.parse_args(argv)
    error = bytewax_import_error()
    if error is not None:
        print(json.dumps({"engine": "bytewax-kafka", "error": error}), flush=True)
        return 2
    engine = "bytewax-kafka" + ("" if args.no_recovery else "-recovery")
    return run_live_cli(args, engine, lambda progress: run(args.bootstrap, args.topic, progress, args.scale,
                                                           not args.no_recovery, args.epoch_interval_s))


if __name__ == "__main__":
    sys.exit(main())
