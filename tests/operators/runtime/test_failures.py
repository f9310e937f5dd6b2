"""A failed epoch leaves the last checkpoint intact; bad files are named in errors."""
from __future__ import annotations

import sys

import pytest
from pyspark import cloudpickle

from dkvstream.examples.flights import RouteDailyDelays, flights_job
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.driver import JobFailedError, JobRunner
from dkvstream.storage.errors import CorruptionError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark workers cannot import tests


class FailsInSecondEpoch(RouteDailyDelays):
    """Raises on the first event after the watermark passed 2013-03-01."""

    def on_event(self, subject, event) -> None:
        if subject.watermark > 1362096000000 and event.key == b"JFK-LAX":
            raise ValueError("boom on JFK-LAX")
        super().on_event(subject, event)


def _job(operator):
    job = flights_job(events_per_epoch=50_000)
    job.operators = [operator]
    return job


@pytest.mark.parametrize("use_spark", [False, True], ids=["in-process", "spark"])
def test_failed_epoch_keeps_last_checkpoint(use_spark, request, tmp_path, check_flights_output) -> None:
    spark = request.getfixturevalue("spark") if use_spark else None
    root = str(tmp_path / "store")
    runner = JobRunner(_job(FailsInSecondEpoch()), spark, root)
    with pytest.raises(JobFailedError, match="boom on JFK-LAX") as err:
        runner.run()
    assert "epoch 3" in str(err.value)
    assert runner.latest().epoch == 2
    # Fixed code resumes from the intact checkpoint and the output is exactly-once.
    fixed = JobRunner(_job(RouteDailyDelays()), spark, root)
    assert fixed.run()[0].epoch == 3
    check_flights_output(fixed.job.sinks["main"].read(fixed.store, fixed.job.prefix))


def test_corrupt_job_checkpoint_is_named(tmp_path) -> None:
    root = tmp_path / "store"
    job = flights_job(events_per_epoch=100_000)
    JobRunner(job, None, str(root)).run(max_epochs=1)
    path = root / checkpoint_key(job.prefix, 1)
    data = bytearray(path.read_bytes())
    data[data.index(b'"watermark"') + 14] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match="epoch-0000000001.json"):
        JobRunner(job, None, str(root)).run()
