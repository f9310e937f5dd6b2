"""What a Dagster run of a job reports: the checkpoint's ``verified`` check after every run
(and alone, without running epochs), the progress per epoch in the checkpoint's metadata
and the run log, and the run log's start-up lines (Spark's UI URL: ``test_definitions``)."""
from __future__ import annotations

from dagster import AssetCheckKey, AssetSelection, materialize
from dagster._core.test_utils import instance_for_test

from dkvstream.assets.checkpoints import VERIFIED, checkpoint_asset_key
from dkvstream.assets.job_assets import job_assets
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource, spark_resource
from tests.assets.live_job import NoSpark
from tests.assets.small_job import small_job


def _resources(root) -> dict:
    return {"object_store": ObjectStoreResource(root_uri=str(root)), "pyspark": NoSpark(spark_config={}),
            "dkv": DKVSettingsResource(memtable_bytes=64 << 10)}


def test_every_run_ends_with_the_checkpoint_check(tmp_path) -> None:
    job = small_job()  # 2 partitions x 3,000 events, 1,000 an epoch
    with instance_for_test() as instance:
        result = materialize(job_assets(job), resources=_resources(tmp_path), instance=instance,
                             run_config={"ops": {"run_small": {"config": {"max_epochs": 2}}}})
        assert result.success
        [check] = result.get_asset_check_evaluations()
        assert (check.asset_key, check.check_name, check.passed) == (checkpoint_asset_key(job), VERIFIED, True)
        assert check.metadata["epoch"].value == 2 and check.metadata["manifests"].value > 0

        # Progress per epoch, by hand: 500 per partition an epoch, so after epoch 1 each
        # has 2,500 left (5 more epochs: 6 in all), 1,000 of 6,000 read (16.7%).
        md = {e.materialization.metadata["epoch"].value: e.materialization.metadata
              for e in result.get_asset_materialization_events() if e.asset_key == checkpoint_asset_key(job)}
        assert sorted(md) == [1, 2]
        assert [md[e]["epochs_total_estimate"].value for e in (1, 2)] == [6, 6]
        assert [md[e]["progress_percent"].value for e in (1, 2)] == [16.7, 33.3]
        assert all(md[e]["time_left_s"].value >= 0 for e in (1, 2))
        logs = [e.user_message for e in instance.all_logs(result.run_id) if not e.is_dagster_event]
        assert any(m.startswith("epoch 2 of ~6 (33%, ~") and m.endswith("offsets p0=1,000 p1=1,000")
                   for m in logs), logs

        # The check alone (the UI's "Execute check"): verifies, runs no epoch, and does
        # not start Spark (the real resource: it starts on first use).
        resources = {**_resources(tmp_path), "pyspark": spark_resource({"spark.master": "local[2]"})}
        alone = materialize(job_assets(job), resources=resources, instance=instance,
                            selection=AssetSelection.checks(AssetCheckKey(checkpoint_asset_key(job), VERIFIED)))
        assert alone.success
        [check] = alone.get_asset_check_evaluations()
        assert check.passed and check.metadata["epoch"].value == 2
        assert alone.get_asset_materialization_events() == []
        logs = [e.user_message for e in instance.all_logs(alone.run_id) if not e.is_dagster_event]
        assert not any("Spark" in m for m in logs), logs
