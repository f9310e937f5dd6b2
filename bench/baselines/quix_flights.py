"""The flights route-daily-delays job on Quix Streams (``quixstreams`` on PyPI, 3.28), consuming
the live flights topic (``examples/flights_producer.py``).

Quix Streams is a Kafka-native Python stream processor: a consumer group member that runs
the dataframe pipeline one record at a time, keeps window state in RocksDB (one store
per assigned partition, backed by a compacted changelog topic) and commits the consumer
offsets with the state (a checkpoint every ``commit_interval`` s, 5 s by default).

The job: key = the record key (``origin-dest``), event time = the record timestamp
(scheduled departure), ``tumbling_window(1 day, grace 1 h)`` (windows aligned to the
epoch, i.e. UTC midnight) reduced with the accumulator of
``bench/baselines/flights_window.py``, ``.final(closing_strategy="partition")``: a
window is emitted once, final, when the stream time of its partition (the largest record
timestamp seen in it) reaches window end + 1 h, the spec's watermark, tracked per
partition, not per key (with the default ``"key"`` strategy a route's window would wait
for that route's next flight). A record of an already closed window is dropped (``on_late``):
the topic is in event-time order per partition, so none is, and the run fails on one.
Emitted windows are collected in this process (no sink topic), so the output is not
part of the transaction.

Output visibility (the end of the benchmark's clocks): a record's output is visible
once the checkpoint covering it has committed (``Checkpoint.commit`` returned: state
changelog produced and acknowledged, consumer offsets committed, in the transaction
with exactly-once); the windows it closed are in the output list by then. Checkpoints
every ``commit_interval`` s: 1 s here (Quix's default is 5 s), dkvstream's trigger
interval and Bytewax's epoch.

Processing guarantee: ``exactly-once`` works on Tansu (transactional producer for the
changelog, consumer offsets committed in the transaction; the smoke test runs it);
``--guarantee at-least-once`` is Quix's default. Quix does not close windows at the end
of input (a stream has none): the run stops after ``N`` records and windows after the
complete-window cutoff stay open (``bench/baselines/flights_live.py``).

Usage::

    .venv/bin/python bench/baselines/quix_flights.py --bootstrap 127.0.0.1:9092 --records 100000 \\
        [--produce before|live] [--rate 20000] [--guarantee exactly-once]

Prints one JSON line (``flights_live.run_live_cli``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import pandas as pd

from bench.baselines.flights_live import (
    WATERMARK_DELAY_MS,
    PeakRss,
    Progress,
    add_live_arguments,
    peer_stats,
    run_live_cli,
)
from bench.baselines.flights_window import fold, new_accumulator, to_output_table
from dkvstream.examples.flights_data import DAY_MS

# With librdkafka's default session timeout (45 s) the group join timed out on Tansu; with
# 10 s the first partitions are assigned after about 5 s.
CONSUMER_CONFIG = {"session.timeout.ms": 10_000}


def ensure_retention_config(bootstrap: str, topic: str, timeout_s: float = 30) -> None:
    """Sets ``retention.ms`` = -1 (keep forever) on ``topic`` when the broker reports no
    ``retention.ms`` for it.

    Quix Streams derives its changelog topics' retention from the input topic's
    ``retention.ms`` and fails (``KeyError: 'retention.ms'``) when the broker's
    DescribeConfigs leaves it out, which Tansu does for every config the topic was not
    created or altered with. -1 is the right value for the flights topic anyway: its record
    timestamps are in 2013, so a time-based retention would delete them.

    Raises:
        confluent_kafka.KafkaException: the broker refused the describe or the alter.
    """
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic)
    if "retention.ms" in admin.describe_configs([resource])[resource].result(timeout_s):
        return
    change = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(timeout_s)


def signal_when_group_stable(bootstrap: str, group: str, progress: Progress, timeout_s: float = 120) -> None:
    """Sets ``progress.ready`` once the consumer group ``group`` is STABLE (its members have
    their partitions; Tansu's DescribeGroups lists no members, so the state is what is
    checked). Runs in a thread; gives up silently after ``timeout_s``."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while not progress.ready.is_set() and time.monotonic() < deadline:
        try:
            if admin.describe_consumer_groups([group])[group].result(10).state == ConsumerGroupState.STABLE:
                progress.ready.set()
                return
        except Exception:  # noqa: BLE001, S110 - the group does not exist yet: ask again
            pass
        time.sleep(0.2)


def run(bootstrap: str, topic: str, progress: Progress, guarantee: str = "exactly-once",
        state_dir: str | None = None, group: str | None = None,
        commit_interval_s: float = 1.0) -> tuple[pd.DataFrame, dict]:
    """Consume ``topic`` from its beginning until ``progress.records`` records are processed.

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: the flights topic (``examples/flights_producer.py``).
        progress: counts the records (its ``records`` is N); ``LiveProducer`` samples it.
        guarantee: Quix's ``processing_guarantee``, ``"exactly-once"`` or ``"at-least-once"``.
        state_dir: RocksDB state directory (default: a temporary one, removed after).
        group: consumer group (default: a new one, so the run starts at offset 0).
        commit_interval_s: Quix's ``commit_interval``, s between checkpoints.

    Returns:
        ``(output, stats)``: the emitted windows (``flights_window.to_output_table``
        columns, pandas) and ``peer_stats`` plus ``guarantee``.

    Raises:
        RuntimeError: the application stopped before its checkpoints covered N records.
        AssertionError: a record was late (its window already closed).
    """
    from unittest import mock

    from quixstreams import Application
    from quixstreams.checkpointing.checkpoint import Checkpoint

    ensure_retention_config(bootstrap, topic)
    tmp = None
    if state_dir is None:
        state_dir = tmp = tempfile.mkdtemp(prefix="quix-flights-")
    rows: list = []

    def on_processed(_topic: str, _partition: int, _offset: int) -> None:
        if progress.processed():
            app.stop()

    def initializer(value: dict) -> list:
        progress.consumed()
        return fold(new_accumulator(), value["dep_time"], value["dep_delay"])

    def reducer(acc: list, value: dict) -> list:
        return fold(acc, value["dep_time"], value["dep_delay"])

    def emit(window: dict, key: bytes, _timestamp: int, _headers) -> None:
        rows.append((key.decode(), window["start"], window["value"]))
        progress.window_emitted(window["end"])

    late: list[tuple] = []

    def on_late(value, key, timestamp_ms, late_by_ms, start, end, *_args, **_kwargs) -> bool:
        late.append((key, timestamp_ms, late_by_ms))
        return True  # Quix logs it too

    commit = Checkpoint.commit

    def commit_and_report(checkpoint, *args, **kwargs):
        # _tp_offsets: the last processed offset per (topic, partition) of this checkpoint.
        covered = {p: offset + 1 for (t, p), offset in checkpoint._tp_offsets.items() if t == topic}
        commit(checkpoint, *args, **kwargs)
        if covered:
            progress.output_visible(covered)

    group = group or f"quix-flights-{uuid.uuid4().hex[:8]}"
    threading.Thread(target=signal_when_group_stable, args=(bootstrap, group, progress), daemon=True).start()
    app = Application(broker_address=bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", processing_guarantee=guarantee, state_dir=state_dir,
                      consumer_extra_config=CONSUMER_CONFIG, on_message_processed=on_processed,
                      commit_interval=commit_interval_s, loglevel="WARNING")
    sdf = app.dataframe(app.topic(topic, value_deserializer="json"))
    sdf = (sdf.tumbling_window(timedelta(milliseconds=DAY_MS), grace_ms=timedelta(milliseconds=WATERMARK_DELAY_MS),
                               name="route_daily_delays", on_late=on_late)
           .reduce(reducer, initializer)
           .final(closing_strategy="partition"))
    sdf.update(emit, metadata=True)
    rss = PeakRss()
    try:
        with mock.patch.object(Checkpoint, "commit", commit_and_report):
            app.run()
    finally:
        peak = rss.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    assert not late, f"quix: {len(late)} late events, the first (key, timestamp ms, late by ms) {late[0]} " \
                     "(the topic is in event-time order per partition)"
    stats = peer_stats(progress, peak, len(rows), guarantee=guarantee, commit_interval_s=commit_interval_s)
    return to_output_table(rows).to_pandas(), stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_live_arguments(ap)
    ap.add_argument("--guarantee", choices=["exactly-once", "at-least-once"], default="exactly-once")
    ap.add_argument("--commit-interval-s", type=float, default=1.0, help="s between checkpoints (Quix's default: 5)")
    args = ap.parse_args(argv)
    return run_live_cli(args, f"quix-{args.guarantee}",
                        lambda progress: run(args.bootstrap, args.topic, progress, args.guarantee,
                                             commit_interval_s=args.commit_interval_s))


if __name__ == "__main__":
    sys.exit(main())
