"""The Dagster resources on a real S3-compatible server (SeaweedFS on loopback):
``DKVSTREAM_STORE=s3://...`` picks dagster-aws's ``S3Resource`` with its endpoint and
credentials from ``EnvVar``; compaction, cleanup and the checkpoint check run through it
against a store a real job run wrote."""
from __future__ import annotations

import uuid

from dagster import DagsterInstance, EnvVar
from dagster_aws.s3 import S3Resource

from assets.checkpoints import make_checkpoint_check, verify_checkpoint
from assets.jobs import cleanup_job_def, compaction, op_config
from assets.resources import default_resources
from operators.runtime.checkpoints import latest_checkpoint, list_epochs
from operators.runtime.driver import JobRunner
from storage.objectstore import open_object_store
from tests.assets.small_job import NAME, SMALL_DKV, small_job


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
    check = make_checkpoint_check(small_job())
    result = check(object_store=resources["object_store"])
    assert result.passed and result.metadata["epoch"].value == after.epoch
