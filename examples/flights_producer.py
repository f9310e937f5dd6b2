"""Replays the 2013 New York flights into a Kafka topic at a steady rate, as a live feed.

One partition per origin (EWR, JFK, LGA: partition 0, 1, 2), record key ``origin-dest``,
value the flight as a JSON object of ``dkvstream.examples.flights.EVENT_COLUMNS``, record timestamp
the scheduled departure (the event time of ``dkvstream.examples.flights.FlightsSource``). Records
are produced in event-time order over all origins, in ticks of 100 ms, so the topic
fills like a live feed: ``rate`` events per second of wall time, not as fast as possible.

Usage::

    python -m dkvstream.examples.flights_producer --bootstrap 127.0.0.1:9092 --topic flights \\
        [--rate 20000] [--scale 1] [--limit N] [--partitions 0,2]

Prints a JSON line ``{"first_tick": t}`` when it starts producing, ``t`` the wall clock
(s since the Unix epoch) when the first record is handed to the client (record i of the
replay order is handed over ``i // (rate * 0.1)`` ticks of 100 ms later), and one when
done: ``{"produced": n, "first_tick": t, "seconds": s, "rate": events/s}``, ``seconds``
the time from the first tick to the last acknowledgement (preparing the records is
outside that clock).

``--barrier``: prepare the records, print ``{"loaded": true}``, then read one line from
stdin, the wall clock to release the first tick at: a harness starting several producers
loads them all, then starts them on one schedule.

``--partitions``: produce only the records of these partitions, on the same schedule (tick
``k`` releases the records of ``[k r, (k + 1) r)`` of the replay order that belong to
them). One Python process produces about 25,000-30,000 records/s; several processes, each
with its own partitions, together fill the topic as one producer at a higher rate would.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa

from dkvstream.examples.flights import EVENT_COLUMNS
from dkvstream.examples.flights_data import ORIGINS, replay_partitions

TICK_S = 0.1  # the producer releases rate * TICK_S records per tick


def replay_order(scale: int = 1) -> tuple[pa.Table, np.ndarray]:
    """Every flight in the order a live feed would carry them.

    Returns:
        ``(table, partitions)``: the flights (``EVENT_COLUMNS`` plus ``event_time_ms``)
        sorted by event time (stable: each origin keeps its replay order), and the topic
        partition of each row (the index of its origin in ``ORIGINS``), int32.
    """
    parts = replay_partitions(scale)
    table = pa.concat_tables([parts[o].select([*EVENT_COLUMNS, "event_time_ms"]) for o in ORIGINS])
    partition = np.concatenate([np.full(parts[o].num_rows, i, np.int32) for i, o in enumerate(ORIGINS)])
    order = np.argsort(table.column("event_time_ms").to_numpy(), kind="stable")
    return table.take(order), partition[order]


def create_topic(bootstrap: str, topic: str, partitions: int = len(ORIGINS), timeout_s: float = 30) -> None:
    """Creates ``topic`` with ``partitions`` partitions and no time-based retention (the
    records' timestamps are from 2013: a broker's default 7-day retention would delete
    them); an existing topic is kept.

    Raises:
        confluent_kafka.KafkaException: the broker refused or did not answer.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                            config={"retention.ms": "-1"})])[topic]
    try:
        future.result(timeout=timeout_s)
    except Exception as e:
        err = e.args[0] if e.args else None
        if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def produce(bootstrap: str, topic: str, rate: float = 20_000, scale: int = 1, limit: int | None = None,
            log=None, started=None, partitions: list[int] | None = None, start_at=None) -> int:
    """Produces the flights into ``topic`` (see module docstring) at ``rate`` events/s.

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: an existing topic with at least ``len(ORIGINS)`` partitions.
        rate: events per second of wall time (> 0).
        scale: copies of the year (``dkvstream.examples.flights_data.replay_partitions``).
        limit: produce only the first ``limit`` flights of the replay order.
        log: called with a progress line about every 10 s (default: nothing).
        started: called with the wall clock (``time.time()``) of the first record handed
            to the client, before it is produced.
        partitions: produce only the records of these topic partitions, on the schedule
            of all of them (module docstring); None: every partition.
        start_at: called once the records are prepared, returns the wall clock
            (``time.time()`` s) to release the first tick at: several producers loaded at
            different speeds then share one schedule (None: start at once).

    Returns:
        Records produced (all acknowledged by the broker).

    Raises:
        RuntimeError: the broker failed to acknowledge a record (its error in the message).
    """
    from confluent_kafka import Producer

    if rate <= 0:
        raise ValueError(f"rate must be > 0 events/s, got {rate}")
    table, partition = replay_order(scale)
    if limit is not None:
        table, partition = table.slice(0, limit), partition[:limit]
    total = table.num_rows
    # Global positions of the records this process produces, in the replay order.
    mine = (np.arange(total) if partitions is None
            else np.flatnonzero(np.isin(partition, np.asarray(partitions, np.int32))))
    table = table.take(mine) if partitions is not None else table
    # Nullable integers stay integers in JSON (a cancelled flight's dep_time is null, not NaN).
    rows = table.drop_columns(["event_time_ms"]).to_pandas(
        types_mapper=lambda t: pd.Int64Dtype() if pa.types.is_integer(t) else None)
    values = [v.encode() for v in rows.to_json(orient="records", lines=True).splitlines()]
    keys = [k.encode() for k in rows["origin"] + "-" + rows["dest"]]
    timestamps = table.column("event_time_ms").to_pylist()
    parts = partition[mine].tolist()
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    per_tick = max(1, int(rate * TICK_S))
    if start_at is not None:
        # Connected before the common start, so the first tick is not spent on metadata.
        producer.list_topics(topic, timeout=30)
        time.sleep(max(0.0, start_at() - time.time()))
    if started is not None:
        started(time.time())
    begun = time.monotonic()
    last_log = begun
    for tick, lo in enumerate(range(0, total, per_tick)):
        # i: this process's own index of each record of the tick.
        for i in range(int(np.searchsorted(mine, lo)), int(np.searchsorted(mine, lo + per_tick))):
            while True:
                try:
                    producer.produce(topic, values[i], keys[i], partition=parts[i],
                                     timestamp=timestamps[i], on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let librdkafka send
                    producer.poll(0.05)
        producer.poll(0)
        if failed:
            raise RuntimeError(f"topic {topic}: the broker did not acknowledge a record: {failed[0]}")
        now = time.monotonic()
        if log is not None and now - last_log >= 10:
            log(f"produced {min(lo + per_tick, total):,} of {total:,} flights")
            last_log = now
        # Steady rate: tick k ends at begun + (k + 1) * TICK_S.
        time.sleep(max(0.0, begun + (tick + 1) * TICK_S - now))
    left = producer.flush(60)
    if left or failed:
        raise RuntimeError(f"topic {topic}: {left} records unacknowledged after 60 s"
                           + (f"; first error: {failed[0]}" if failed else ""))
    return len(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dkvstream.examples.flights_producer",
                                description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port")
    p.add_argument("--topic", default="flights")
    p.add_argument("--rate", type=float, default=20_000, help="events per second (default 20,000)")
    p.add_argument("--scale", type=int, default=1, help="copies of the 2013 data")
    p.add_argument("--limit", type=int, help="produce only the first N flights")
    p.add_argument("--partitions", help="comma-separated partitions: produce only their records "
                                        "(on the schedule of all)")
    p.add_argument("--create", action="store_true", help=f"create the topic ({len(ORIGINS)} partitions) first")
    p.add_argument("--barrier", action="store_true",
                   help='once the records are prepared, print {"loaded": true} and read the first '
                        "tick's wall clock (s since the Unix epoch) from a line of stdin")
    args = p.parse_args(argv)
    if args.create:
        create_topic(args.bootstrap, args.topic)
    first: list[float] = []

    def started(t: float) -> None:
        first.append(t)
        print(json.dumps({"first_tick": round(t, 3)}), flush=True)

    def start_at() -> float:
        print(json.dumps({"loaded": True}), flush=True)
        line = sys.stdin.readline()
        try:
            return float(line)
        except ValueError:
            raise SystemExit(f"--barrier: expected the start time (s since the Unix epoch) on stdin, "
                             f"got {line!r}") from None

    n = produce(args.bootstrap, args.topic, args.rate, args.scale, args.limit,
                log=lambda line: print(line, file=sys.stderr, flush=True), started=started,
                partitions=[int(x) for x in args.partitions.split(",")] if args.partitions else None,
                start_at=start_at if args.barrier else None)
    seconds = time.time() - first[0]
    print(json.dumps({"produced": n, "first_tick": round(first[0], 3), "seconds": round(seconds, 3),
                      "rate": round(n / seconds, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
