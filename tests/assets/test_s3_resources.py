"""The Dagster resources on a real S3-compatible server (SeaweedFS on loopback):
``DKVSTREAM_STORE=s3://...`` picks dagster-aws's ``S3Resource`` with its endpoint and
credentials from ``EnvVar``; compaction, cleanup and the checkpoint check run through it
against a store a real job run wrote; and the job's own run (driver and Spark tasks) uses
the store that resource configures, whatever the process environment says."""
from __future__ import annotations

import uuid

from dagster import AssetCheckKey, AssetSelection, DagsterInstance, EnvVar, materialize
from dagster_aws.s3 import S3Resource

from dkvstream.assets.checkpoints import VERIFIED, checkpoint_asset_key, verify_checkpoint
from dkvstream.assets.job_assets import job_assets
from dkvstream.assets.jobs import cleanup_job_def, compaction, op_config
from dkvstream.assets.resources import ObjectStoreResource, default_resources, spark_resource
from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore import open_object_store
from tests.assets.live_job import NoSpark
from tests.assets.small_job import NAME, SMALL_DKV, small_job, state


def test_maintenance_jobs_on_s3_through_s3resource(s3_server, monkeypatch) -> None:
    uri = f"s3://{s3_server.bucket}/tests/dagster-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DKVSTREAM_STORE", uri)
    resources = default_resources()
    s3 = resources["object_store"].s3
    assert isinstance(s3, S3Resource)
    assert s3.aws_secret_access_key == EnvVar("AWS_SECRET_ACCESS_KEY")  # a reference, not the secret
    resources["dkv"] = SMALL_DKV
    del resources["pyspark"]

    runner = JobRunner(small_job(), None, uri, dkv_options=SMALL_DKV.options(), retain_checkpoints=None)
    runner.run(max_epochs=4)
    instance = DagsterInstance.ephemeral()
    compacted = compaction.execute_in_process(run_config=op_config("plan_compaction", NAME), resources=resources,
                                              instance=instance)
    assert compacted.success and len(compacted.output_for_node("compact")) == 2
    cleaned = cleanup_job_def.execute_in_process(run_config=op_config("cleanup", NAME), resources=resources,
                                                 instance=instance)
    assert cleaned.success and cleaned.output_for_node("cleanup")["bytes_freed"] > 0

    store = open_object_store(uri)
    assert list_epochs(store, f"jobs/{NAME}") == [3, 4]
    assert verify_checkpoint(store, f"jobs/{NAME}", latest_checkpoint(store, f"jobs/{NAME}")).ok
    [after] = runner.run(max_epochs=1)
    assert latest_checkpoint(store, f"jobs/{NAME}").metrics["remote_compactions"]["installed"] == 2
    # The check alone, as the UI's "Execute check" runs it: through the S3Resource.
    checked = materialize(job_assets(small_job()), resources={**resources, "pyspark": NoSpark(spark_config={})},
                          instance=instance,
                          selection=AssetSelection.checks(AssetCheckKey(checkpoint_asset_key(small_job()), VERIFIED)))
    [result] = checked.get_asset_check_evaluations()
    assert result.passed and result.metadata["epoch"].value == after.epoch


def test_job_run_uses_the_configured_s3_resource(spark, s3_server, monkeypatch, tmp_path) -> None:
    """The S3Resource names the server and its credentials; the process environment, and
    the environment Spark gives its Python tasks, name a closed port and other keys. The
    epochs' run (driver and Spark tasks) and the maintenance ops all reach the server:
    state and output equal an in-process run's on a local directory."""
    from dkvstream.storage.local_server import free_ports

    [closed] = free_ports(1)
    elsewhere = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{closed}", "AWS_ACCESS_KEY_ID": "nobody",
                 "AWS_SECRET_ACCESS_KEY": "wrong", "AWS_MAX_ATTEMPTS": "2"}
    for name, value in elsewhere.items():
        monkeypatch.setenv(name, value)
        monkeypatch.setitem(spark.sparkContext.environment, name, value)
    uri = f"s3://{s3_server.bucket}/tests/dagster-run-{uuid.uuid4().hex[:8]}"
    s3 = S3Resource(endpoint_url=s3_server.endpoint_url, region_name=s3_server.region,
                    aws_access_key_id=s3_server.access_key, aws_secret_access_key=s3_server.secret_key,
                    max_attempts=5)
    resources = {"object_store": ObjectStoreResource(root_uri=uri, s3=s3), "dkv": SMALL_DKV,
                 "pyspark": spark_resource({"spark.master": "local[2]"})}
    instance = DagsterInstance.ephemeral()
    job = small_job()
    result = materialize(job_assets(job), resources=resources, instance=instance,
                         selection=["key_window_counts"],
                         run_config={"ops": {f"run_{NAME}": {"config": {"max_epochs": 4}}}})
    assert result.success
    epochs = [e.materialization.metadata["epoch"].value for e in result.get_asset_materialization_events()
              if e.asset_key == checkpoint_asset_key(job)]
    assert epochs == [1, 2, 3, 4]
    assert spark.sparkContext.environment["AWS_ENDPOINT_URL_S3"] == elsewhere["AWS_ENDPOINT_URL_S3"]  # restored

    oracle = JobRunner(small_job(), None, str(tmp_path), dkv_options=SMALL_DKV.options(), retain_checkpoints=None)
    oracle.run(max_epochs=4)
    store = resources["object_store"].open()
    assert state(store) == state(oracle.store)
    sink = job.sinks["main"]
    rows = sorted(sink.read(store, job.prefix).to_pylist(), key=repr)
    assert rows and rows == sorted(sink.read(oracle.store, job.prefix).to_pylist(), key=repr)

    compacted = compaction.execute_in_process(run_config=op_config("plan_compaction", NAME), resources=resources,
                                              instance=instance)
    assert compacted.success and compacted.output_for_node("compact")
    cleaned = cleanup_job_def.execute_in_process(run_config=op_config("cleanup", NAME), resources=resources,
                                                 instance=instance)
    assert cleaned.success and list_epochs(store, f"jobs/{NAME}") == [3, 4]
    assert state(store) == state(oracle.store)
