"""The flights job on S3 (a real SeaweedFS server): output equal to the pandas oracle
and to the same job's output on the local store, request counts in every checkpoint,
and a server that stops in the middle of the job: the epoch fails with an error naming
the S3 object, and once the server is back the job resumes from its last checkpoint
with exactly-once output."""
from __future__ import annotations

import re
import uuid

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.examples.flights_oracle import KEY_COLUMNS
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobFailedError, JobRunner
from dkvstream.storage import faults
from dkvstream.storage.objectstore.s3 import S3RequestError

EPOCH_EVENTS = 120_000  # 3 epochs over the full data set


@pytest.fixture(scope="module")
def local_output(tmp_path_factory) -> pa.Table:
    """The main sink of one in-process run on the local directory store."""
    job = flights_job(events_per_epoch=EPOCH_EVENTS)
    runner = JobRunner(job, None, str(tmp_path_factory.mktemp("local")))
    runner.run()
    return job.sinks["main"].read(runner.store, job.prefix)


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    """Same rows in any order (floats to 1e-9 relative: sums may add in another order)."""
    g, e = (t.to_pandas().sort_values(KEY_COLUMNS).reset_index(drop=True) for t in (got, expected))
    pd.testing.assert_frame_equal(g, e, check_exact=False, rtol=1e-9)


def _first_in_chain(error: BaseException, kind: type) -> BaseException:
    """``error`` or the first exception of type ``kind`` it was raised while handling."""
    seen = error
    while seen is not None and not isinstance(seen, kind):
        seen = seen.__cause__ or seen.__context__
    assert seen is not None, f"no {kind.__name__} behind {error!r}"
    return seen


def _s3_root(s3_server) -> str:
    return f"s3://{s3_server.bucket}/flights-{uuid.uuid4().hex[:8]}"


def _assert_requests_recorded(runner: JobRunner) -> None:
    for epoch in list_epochs(runner.store, runner.job.prefix):
        requests = read_checkpoint(runner.store, runner.job.prefix, epoch).metrics["requests"]
        tasks = requests["tasks"]
        # Each range task reads its previous manifest and writes WAL/tables, a manifest
        # and staged output: a handful of requests, never one per key.
        assert 0 < tasks["PUT"] < 50 and tasks["bytes_written"] > 0, (epoch, requests)
        assert requests["driver"]["LIST"] >= 0 and set(tasks) >= {"GET", "PUT", "LIST", "DELETE", "HEAD"}


@pytest.fixture
def spark_with_s3_env(spark, s3_server):
    """The session's Python workers get the server's AWS variables (the session may
    predate the server) and 2 attempts per request, so a stopped server fails fast."""
    env = {**s3_server.env(), "AWS_MAX_ATTEMPTS": "2"}
    environment = spark.sparkContext.environment
    saved = {k: environment.get(k) for k in env}
    environment.update(env)
    yield spark
    for k, v in saved.items():
        if v is None:
            environment.pop(k, None)
        else:
            environment[k] = v


def _stop_server_after_reading_epoch_2(runner: JobRunner, server) -> None:
    """Stops the S3 server once the driver has the read tasks' summaries of epoch 2 (the
    tasks read the flights from memory): the epoch's operator tasks then find it gone."""
    read = runner._read_events

    def read_then_stop(plan, epoch):
        summaries = read(plan, epoch)
        if epoch == 2:
            server.stop()
        return summaries

    runner._read_events = read_then_stop


def test_flights_on_s3_spark_survives_a_stopped_server(spark_with_s3_env, s3_server, local_output,
                                                       check_flights_output) -> None:
    job = flights_job(events_per_epoch=EPOCH_EVENTS)
    root = _s3_root(s3_server)
    faulty = JobRunner(job, spark_with_s3_env, root)
    _stop_server_after_reading_epoch_2(faulty, s3_server)
    try:
        with pytest.raises((JobFailedError, S3RequestError)) as failed:
            faulty.run()
    finally:
        s3_server.start()
    # The task's error, naming the object it could not reach (an error raised while the
    # driver cleans up after it may sit on top of it: look down the chain): a GET of the
    # range's state if the task opens DKV, its first LIST or PUT if its Spark worker kept
    # the range open since epoch 1 (operators/runtime/open_state.py).
    task_error = _first_in_chain(failed.value, JobFailedError)
    assert re.search(r"epoch 2 failed in operator route_daily_delays: .*S3RequestError: S3 "
                     r"(GetObject|ListObjectsV2|PutObject|HeadObject)\S* "
                     rf"{root}/jobs/flights/\S+ failed after 2 attempts: Could not connect",
                     str(task_error)), str(task_error)

    resumed = JobRunner(job, spark_with_s3_env, root)
    assert resumed.latest().epoch == 1
    results = resumed.run()
    assert [r.epoch for r in results] == list(range(2, 2 + len(results)))
    output = job.sinks["main"].read(resumed.store, job.prefix)
    check_flights_output(output)  # every flight counted once: exactly-once across the fault
    assert_same_rows(output, local_output)
    _assert_requests_recorded(resumed)


@pytest.mark.slow  # a second full in-process run (~30 s); CI runs it in its slow step
def test_commit_fails_clearly_when_server_stops_then_resumes_exactly_once(
        s3_server, monkeypatch, local_output) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    job = flights_job(events_per_epoch=EPOCH_EVENTS)
    root = _s3_root(s3_server)

    try:
        with pytest.raises(S3RequestError, match=rf"{root}/jobs/flights/\S+ failed after 2 attempts: "
                                                 r"Could not connect"):
            # After epoch 2's tasks wrote state and output; nothing committed.
            faults.arm("after_tasks", action=lambda point, epoch: s3_server.stop(), epoch=2)
            JobRunner(job, None, root).run()
        with pytest.raises(S3RequestError, match=rf"{root}/jobs/flights/"):
            JobRunner(job, None, root).run()  # still down: fails at once, clearly
    finally:
        s3_server.start()

    resumed = JobRunner(job, None, root)
    assert resumed.latest().epoch == 1
    resumed.run()
    assert_same_rows(job.sinks["main"].read(resumed.store, job.prefix), local_output)
    _assert_requests_recorded(resumed)
