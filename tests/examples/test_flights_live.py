"""The flights job live from Kafka (``dkvstream.examples.flights_live``): the producer replays the
2013 flights into a 3-partition topic of a real broker (Tansu) while the job runs
continuously; once the job has read everything produced it is stopped with a drain, and
its output must equal the pandas oracle over every flight, the last windows included."""
from __future__ import annotations

import threading
import time

import pytest

from dkvstream.examples.flights import FlightsSource
from dkvstream.examples.flights_live import VALUE_SCHEMA, flights_kafka_job, flights_live_job
from dkvstream.examples.flights_producer import create_topic, produce
from dkvstream.operators.runtime.driver import JobRunner


def test_value_schema_is_the_replay_sources() -> None:
    assert VALUE_SCHEMA == FlightsSource().value_schema


def test_job_from_env_names_the_variable_to_set(monkeypatch) -> None:
    monkeypatch.delenv("DKVSTREAM_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(RuntimeError, match="set DKVSTREAM_KAFKA_BOOTSTRAP"):
        flights_live_job()
    monkeypatch.setenv("DKVSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    job = flights_live_job()
    assert job.name == "flights_live" and job.source.topic == "flights" and not job.source.bounded


def test_live_flights_drained_equal_the_oracle(kafka_broker, tmp_path, check_flights_output) -> None:
    topic = f"flights-{time.time_ns() % 10**9}"
    create_topic(kafka_broker.bootstrap, topic)
    job = flights_kafka_job(kafka_broker.bootstrap, topic, trigger_interval_ms=100)
    runner = JobRunner(job, None, str(tmp_path))
    produced: list[int] = []

    def run_producer() -> None:
        try:
            produced.append(produce(kafka_broker.bootstrap, topic, rate=200_000))
        finally:
            if not produced:
                runner.stop()  # the producer failed: end the run (asserted below)

    producer = threading.Thread(target=run_producer)
    results = []
    with runner:
        producer.start()
        for result in runner.epochs(continuous=True):
            results.append(result)
            if produced and sum(result.source_offsets.values()) == produced[0]:
                runner.stop(drain=True)  # everything produced was read
        producer.join(60)
    assert produced, "the producer failed"
    assert [r.drained for r in results] == [False] * (len(results) - 1) + [True]
    assert sum(r.events for r in results) == produced[0] == 336_776
    assert all(r.dead_letter.get("total", 0) == 0 for r in results)
    check_flights_output(job.sinks["main"].read(runner.store, job.prefix))
    assert job.sinks["late"].read(runner.store, job.prefix).num_rows == 0
