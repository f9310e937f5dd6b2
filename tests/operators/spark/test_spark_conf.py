"""The session configuration: on a cluster master, executors get the driver's object-store
variables through ``spark.executorEnv.*``; in local mode only the Python daemon's
thread settings are added (the Python workers inherit the driver's environment there)."""
from __future__ import annotations

import pytest

from dkvstream.operators.spark.session import DAEMON_ENV, OBJECT_STORE_ENV, spark_conf

S3_ENV = {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
          "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}


@pytest.fixture
def s3_environment(monkeypatch):
    for name in OBJECT_STORE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DKVSTREAM_SPARK_MASTER", raising=False)
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)


def _executor_env(conf: dict[str, str]) -> dict[str, str]:
    prefix = "spark.executorEnv."
    return {k[len(prefix):]: v for k, v in conf.items() if k.startswith(prefix)}


def test_cluster_master_passes_object_store_env_to_executors(s3_environment) -> None:
    conf = spark_conf({"spark.master": "spark://127.0.0.1:7077"})
    assert conf["spark.master"] == "spark://127.0.0.1:7077"
    assert _executor_env(conf) == {**DAEMON_ENV, **S3_ENV}


def test_master_from_environment_counts_too(s3_environment, monkeypatch) -> None:
    monkeypatch.setenv("DKVSTREAM_SPARK_MASTER", "spark://10.0.0.1:7077")
    assert _executor_env(spark_conf()) == {**DAEMON_ENV, **S3_ENV}


def test_local_master_adds_nothing_and_explicit_conf_wins(s3_environment) -> None:
    assert _executor_env(spark_conf()) == DAEMON_ENV
    conf = spark_conf({"spark.master": "spark://h:7077", "spark.executorEnv.AWS_REGION": "us-east-2"})
    assert _executor_env(conf)["AWS_REGION"] == "us-east-2"
