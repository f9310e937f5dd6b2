"""The flights job on a live Kafka topic: ``examples.flights`` reading what
``examples.flights_producer`` replays into a topic, left running.

Described in ``docs/examples.md`` ("Flights live from Kafka"); ``platform/run-live.sh``
runs it end to end (broker, producer, the job on local Spark, a drain, the oracle).
The job is ``examples.flights.flights_job``'s (operator ``route_daily_delays``, the
``route_daily_delays`` and ``route_daily_delays_late`` Parquet sinks, a watermark bound
of 1 hour, watermark alignment of one day) with a ``KafkaSource`` instead of the replay:
topic partition n carries origin ``ORIGINS[n]``, record key ``origin-dest``, value the
flight as a JSON object of ``EVENT_COLUMNS``, record timestamp the scheduled departure
(the event time). On a live source the watermark never reaches +infinity by itself: the
last windows are emitted when the job is stopped with a drain
(``JobRunner.stop(drain=True)``, ``run_job --continuous --drain-on-stop``), after which
its output equals ``examples.flights_oracle.route_daily_delays_oracle()``.
"""
from __future__ import annotations

import os

import pyarrow as pa

from examples.flights import (
    HOUR_MS,
    LATE_SCHEMA,
    OUTPUT_SCHEMA,
    RouteDailyDelays,
    RouteDailyDelaysBatch,
)
from examples.flights_data import DAY_MS
from operators.api.job import Job
from operators.io.kafka import KafkaSource
from operators.io.sinks import ParquetSink

# The value columns, as examples.flights.FlightsSource reads them from the CSV (a test
# checks they agree): the producer writes integers as JSON integers, null when missing.
VALUE_SCHEMA = pa.schema([
    ("year", pa.int64()), ("month", pa.int64()), ("day", pa.int64()),
    ("sched_dep_time", pa.int64()), ("dep_time", pa.int64()), ("dep_delay", pa.int64()),
    ("carrier", pa.string()), ("flight", pa.int64()), ("origin", pa.string()), ("dest", pa.string()),
])
# ``run_job --job examples.flights_live:flights_live_job`` takes the broker from here.
BOOTSTRAP_ENV = "DKVSTREAM_KAFKA_BOOTSTRAP"
TOPIC_ENV = "DKVSTREAM_FLIGHTS_TOPIC"


def flights_kafka_job(bootstrap: str, topic: str = "flights", *, name: str = "flights_live",
                      events_per_epoch: int = 50_000, parallelism: int = 2, key_groups: int = 256,
                      trigger_interval_ms: int = 1_000, idle_timeout_ms: int = 10_000,
                      batch: bool = False) -> Job:
    """The flights route-delays job on a Kafka topic (module docstring).

    Args:
        bootstrap: Kafka bootstrap servers, ``host:port``.
        topic: the topic ``examples.flights_producer`` writes (3 partitions).
        name: job name (its object-store prefix is ``jobs/<name>``).
        events_per_epoch: the most events one epoch reads (a backlog is read in epochs
            of this size, back to back).
        parallelism, key_groups: as ``examples.flights.flights_job``.
        trigger_interval_ms: the processing-time trigger, ms (an epoch at most once a
            second by default).
        idle_timeout_ms: a partition read to its end that got nothing for this long (wall
            clock, ms) stops holding back the watermark (Flink's ``withIdleness``). The
            producer writes every airport each 100 ms tick, so 10 s only passes when the
            feed itself stops; a partition resuming after that may have late events.
        batch: use the vectorised operator form ``RouteDailyDelaysBatch`` (same output).

    Returns:
        The ``Job`` (``bounded=False`` source: run it continuously, stop it with a drain).
    """
    source = KafkaSource(bootstrap, topic, value_format="json", value_schema=VALUE_SCHEMA, bounded=False)
    return Job(
        name=name,
        source=source,
        operators=[RouteDailyDelaysBatch() if batch else RouteDailyDelays()],
        sinks={"main": ParquetSink("route_daily_delays", OUTPUT_SCHEMA),
               "late": ParquetSink("route_daily_delays_late", LATE_SCHEMA)},
        key_groups=key_groups,
        parallelism=parallelism,
        events_per_epoch=events_per_epoch,
        max_out_of_orderness_ms=HOUR_MS,
        max_watermark_drift_ms=DAY_MS,
        trigger_interval_ms=trigger_interval_ms,
        idle_timeout_ms=idle_timeout_ms,
    )


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
