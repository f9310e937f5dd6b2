"""The flights job end to end on local Spark, against the spec's pandas oracle."""
from __future__ import annotations

import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.examples.flights_data import FLIGHT_COUNT
from dkvstream.operators.api.operator import WATERMARK_MAX
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.driver import JobRunner


@pytest.mark.parametrize("long_lived_tasks", [True, False], ids=["long-lived", "stages-per-epoch"])
def test_flights_job_on_spark_equals_oracle(spark, tmp_path, check_flights_output, long_lived_tasks) -> None:
    job = flights_job(events_per_epoch=60_000)
    runner = JobRunner(job, spark, str(tmp_path / "store"), long_lived_tasks=long_lived_tasks)
    results = runner.run()

    assert sum(r.events for r in results) == FLIGHT_COUNT
    assert len(results) >= 5, "the job must run several epochs"
    assert [r.epoch for r in results] == list(range(1, len(results) + 1))
    assert results[-1].finished and results[-1].watermark == WATERMARK_MAX
    watermarks = [r.watermark for r in results]
    assert watermarks == sorted(watermarks), "watermarks never go back"
    assert list_epochs(runner.store, job.prefix) == [r.epoch for r in results]

    check_flights_output(job.sinks["main"].read(runner.store, job.prefix))
    assert job.sinks["late"].read(runner.store, job.prefix).num_rows == 0  # spec: none with this replay order
    # A finished job has nothing left to do.
    assert runner.run() == []


def test_sink_directory_is_plain_parquet(spark, tmp_path, flights_oracle) -> None:
    """Readers that know nothing of checkpoints (pyarrow.dataset) see exactly the committed rows."""
    import pyarrow.dataset as ds

    job = flights_job(events_per_epoch=120_000)
    store_root = tmp_path / "store"
    JobRunner(job, spark, str(store_root)).run()
    table = ds.dataset(store_root / job.prefix / "sinks" / "route_daily_delays", format="parquet",
                       partitioning="hive").to_table()
    assert table.num_rows == len(flights_oracle)
    assert sum(table.column("flights").to_pylist()) == FLIGHT_COUNT
