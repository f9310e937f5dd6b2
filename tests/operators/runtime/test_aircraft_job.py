"""The aircraft rotations job (examples/aircraft_rotations.py) against its pandas
oracle, in-process: the Delta table after the run and as of a middle epoch (time
travel), and the carrier daily totals."""
from __future__ import annotations

import pandas as pd

from dkvstream.examples import aircraft_oracle
from dkvstream.examples.aircraft_rotations import aircraft_job
from dkvstream.operators.runtime.driver import JobRunner

DAYS = 4
ROLLING = 3  # a short window so that 4 days of data overflow it


def assert_frames_equal(got: pd.DataFrame, exp: pd.DataFrame, keys: list[str], floats: list[str]) -> None:
    diff = aircraft_oracle.frame_differences(got, exp, keys, floats)
    assert diff is None, diff


def test_aircraft_table_and_carrier_totals_equal_the_oracle(tmp_path) -> None:
    job = aircraft_job(days=DAYS, events_per_epoch=700, rolling=ROLLING)
    runner = JobRunner(job, None, str(tmp_path))
    results = runner.run()
    epochs = len(results)
    assert epochs >= 4
    flights = aircraft_oracle.with_epochs(aircraft_oracle.replay(DAYS), [r.source_offsets for r in results])
    assert (flights["epoch"] > 0).all()
    table = job.sinks["aircraft"]
    store, prefix = runner.store, job.prefix
    floats = ["rolling_arr_delay", "arr_delay_sum"]
    assert_frames_equal(table.read(store, prefix).to_pandas(), aircraft_oracle.aircraft_rows(flights, epochs, ROLLING),
                        ["tailnum"], floats)
    mid = epochs // 2
    assert_frames_equal(table.scan(store, prefix, as_of_epoch=mid).to_pandas(),
                        aircraft_oracle.aircraft_rows(flights, mid, ROLLING), ["tailnum"], floats)
    daily = job.sinks["carrier_daily"].read(store, prefix).to_pandas()
    assert_frames_equal(daily, aircraft_oracle.carrier_daily_rows(flights), ["carrier", "day"], floats)


def test_aircraft_job_on_spark_through_dagster(spark, tmp_path) -> None:
    """The job's Dagster assets materialized on real Spark (operators in Spark tasks,
    the table's MERGE in the driver): one checkpoint materialization per epoch, and the
    Delta table now and as of a middle epoch equal the oracle."""
    from dagster import DagsterInstance, materialize

    from dkvstream.assets.job_assets import checkpoint_asset_key, job_assets
    from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource, spark_resource

    job = aircraft_job(days=DAYS, events_per_epoch=1_200, rolling=ROLLING)
    root = str(tmp_path / "store")
    result = materialize(job_assets(job), instance=DagsterInstance.ephemeral(), resources={
        "object_store": ObjectStoreResource(root_uri=root), "pyspark": spark_resource({"spark.master": "local[2]"}),
        "dkv": DKVSettingsResource(memtable_bytes=1 << 20)})
    assert result.success
    checkpoints = [e.materialization.metadata for e in result.get_asset_materialization_events()
                   if e.asset_key == checkpoint_asset_key(job)]
    epochs = len(checkpoints)
    assert epochs >= 3 and [md["epoch"].value for md in checkpoints] == list(range(1, epochs + 1))
    flights = aircraft_oracle.with_epochs(aircraft_oracle.replay(DAYS),
                                          [md["source_offsets"].value for md in checkpoints])
    runner = JobRunner(job, None, root)  # a reader of the same store: no epoch is run
    table, store, prefix = job.sinks["aircraft"], runner.store, job.prefix
    floats = ["rolling_arr_delay", "arr_delay_sum"]
    assert_frames_equal(table.read(store, prefix).to_pandas(),
                        aircraft_oracle.aircraft_rows(flights, epochs, ROLLING), ["tailnum"], floats)
    mid = epochs // 2
    assert_frames_equal(table.scan(store, prefix, as_of_epoch=mid).to_pandas(),
                        aircraft_oracle.aircraft_rows(flights, mid, ROLLING), ["tailnum"], floats)
    assert_frames_equal(job.sinks["carrier_daily"].read(store, prefix).to_pandas(),
                        aircraft_oracle.carrier_daily_rows(flights), ["carrier", "day"], floats)
