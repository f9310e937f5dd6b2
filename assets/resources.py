"""Dagster resources: the object store, Spark, and DKV settings.

``default_resources()`` picks the set by environment (like the Dagster examples' per-
deployment resource dicts): ``DKVSTREAM_STORE`` is a local directory (``.dkvstream`` by
default) or ``s3://bucket/prefix``; for S3 the store is configured through dagster-aws's
``S3Resource`` whose endpoint, region and credentials come from ``EnvVar`` (never from
code or YAML).

One store for the epochs and the maintenance ops: both open it with
``ObjectStoreResource.open()``; a job run hands that store to ``JobRunner``, whose Spark
tasks receive it pickled (its endpoint, region and credentials), so the driver and every
executor use the configured store whatever their own environment.
"""
from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

from dagster import ConfigurableResource, EnvVar, get_dagster_logger
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import Field

from dkvstream.operators.spark.session import describe_session, ensure_python_workers_use_this_interpreter, spark_conf
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.objectstore import ObjectStore, open_object_store

DEFAULT_STORE_URI = ".dkvstream"


class ObjectStoreResource(ConfigurableResource):
    """The object store jobs keep state, checkpoints and output in.

    Attributes:
        root_uri: a path, ``file://`` URI or ``s3://bucket/prefix``; defaults to
            ``$DKVSTREAM_STORE`` or ``./.dkvstream``.
        s3: dagster-aws ``S3Resource`` configuring the S3 client (endpoint, region,
            credentials) for an ``s3://`` root; None takes them from the AWS environment.
    """

    root_uri: str = Field(default_factory=lambda: os.environ.get("DKVSTREAM_STORE", DEFAULT_STORE_URI))
    s3: S3Resource | None = None

    def open(self) -> ObjectStore:
        """The object store at ``root_uri``.

        Raises:
            ValueError: unknown URI scheme.
        """
        if self.s3 is not None and self.root_uri.startswith(("s3://", "s3a://")):
            from dkvstream.storage.objectstore.s3 import S3ObjectStore, parse_s3_uri

            bucket, prefix = parse_s3_uri(self.root_uri)
            return S3ObjectStore.from_s3_resource(self.s3, bucket, prefix)
        return open_object_store(self.root_uri)


def _env_default(name: str, default):
    """A field default read from ``DKVSTREAM_DKV_<NAME>`` (typed like ``default``)."""
    raw = os.environ.get(f"DKVSTREAM_DKV_{name.upper()}")
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes")
    return type(default)(raw)


_DKV_DEFAULTS = {f.name: f.default for f in fields(DKVOptions)}


class DKVSettingsResource(ConfigurableResource):
    """DKV tuning of the jobs Dagster runs, and the triggers of its compaction sensor.

    Every field defaults to ``$DKVSTREAM_DKV_<FIELD>`` when set. Under Dagster the
    compaction sensor compacts (``max_inline_compaction_bytes`` 0: tasks never compact
    inline) and the cleanup sensor applies retention, so epochs do not pay for it (unless
    ``inline_retention``).
    The sensor fires when a range's level-0 table count reaches ``l0_compaction_trigger``
    or its size amplification exceeds ``size_amp_threshold``, the same triggers the
    planner of the ``compact`` op uses, so a fired sensor always finds work.

    Attributes:
        memtable_bytes: memtable size before a flush to a level-0 SSTable, bytes.
        wal_flush_bytes: WAL bytes a manifest may list before a checkpoint flushes.
        l0_compaction_trigger: level-0 tables of one range that trigger compaction.
        size_amp_threshold: size amplification (bytes above the last level / bytes of
            the last level) that triggers a full compaction.
        max_inline_compaction_bytes: input bytes a task may compact inline per call.
        target_file_bytes: compaction output table size, bytes (uncompressed).
        retain_checkpoints: job checkpoints the cleanup keeps.
        inline_retention: the job itself applies retention after each epoch (for runs
            without the Dagster daemon, e.g. ``dagster asset materialize``).
    """

    memtable_bytes: int = Field(default_factory=lambda: _env_default("memtable_bytes", 4 << 20))
    wal_flush_bytes: int = Field(default_factory=lambda: _env_default(
        "wal_flush_bytes", _DKV_DEFAULTS["wal_flush_bytes"]))
    l0_compaction_trigger: int = Field(default_factory=lambda: _env_default(
        "l0_compaction_trigger", _DKV_DEFAULTS["l0_compaction_trigger"]))
    size_amp_threshold: float = Field(default_factory=lambda: _env_default(
        "size_amp_threshold", float(_DKV_DEFAULTS["size_amp_threshold"])))
    max_inline_compaction_bytes: int = Field(default_factory=lambda: _env_default(
        "max_inline_compaction_bytes", 0))
    target_file_bytes: int = Field(default_factory=lambda: _env_default(
        "target_file_bytes", _DKV_DEFAULTS["target_file_bytes"]))
    retain_checkpoints: int = Field(default_factory=lambda: _env_default("retain_checkpoints", 10))
    inline_retention: bool = Field(default_factory=lambda: _env_default("inline_retention", False))

    def options(self) -> DKVOptions:
        """These settings as ``DKVOptions`` (other options keep their defaults).

        Raises:
            ValueError: an inconsistent setting (from ``DKVOptions``).
        """
        return DKVOptions(
            memtable_bytes=self.memtable_bytes, wal_flush_bytes=self.wal_flush_bytes,
            l0_compaction_trigger=self.l0_compaction_trigger, size_amp_threshold=self.size_amp_threshold,
            max_inline_compaction_bytes=self.max_inline_compaction_bytes,
            target_file_bytes=self.target_file_bytes,
        )


class SparkResource(PySparkResource):
    """dagster-pyspark's resource, started on first use and saying so in the run log:
    ``starting Spark on <master> (10-40 s)...``, then the master, the application id and
    the Spark UI's URL (``spark.ui.enabled``: on by default, at a free port,
    ``dkvstream.operators.spark.session``). A run that does not use Spark (the checkpoint check
    executed alone) never starts it."""

    def setup_for_execution(self, context) -> None:
        pass  # started by the first ``spark_session`` (dagster-pyspark's LazyPySparkResource does the same)

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            log = get_dagster_logger()
            log.info(f"starting Spark on {self.spark_config.get('spark.master', 'local')} (10-40 s)...")
            super().setup_for_execution(None)
            log.info(describe_session(self._spark_session))
        return self._spark_session


def spark_resource(conf: dict[str, str] | None = None) -> PySparkResource:
    """dagster-pyspark's resource with dkvstream's Spark defaults (``dkvstream.operators.spark.session``)
    that logs its start-up (``SparkResource``)."""
    ensure_python_workers_use_this_interpreter()
    return SparkResource(spark_config=spark_conf(conf))


def s3_resource() -> S3Resource:
    """dagster-aws's ``S3Resource`` with everything secret or site-specific from ``EnvVar``.

    Reads ``AWS_ENDPOINT_URL_S3`` (unset: AWS S3), ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``
    and ``AWS_SECRET_ACCESS_KEY`` when the resource is initialized (at run time).
    """
    def env(name: str):
        return EnvVar(name) if os.environ.get(name) else None

    return S3Resource(endpoint_url=env("AWS_ENDPOINT_URL_S3"), region_name=env("AWS_REGION"),
                      aws_access_key_id=env("AWS_ACCESS_KEY_ID"),
                      aws_secret_access_key=env("AWS_SECRET_ACCESS_KEY"))


def default_resources() -> dict:
    """Resources picked by environment: ``object_store`` (local, or S3 when
    ``$DKVSTREAM_STORE`` is ``s3://...``), ``pyspark`` (``local[2]`` unless
    ``$DKVSTREAM_SPARK_MASTER``) and ``dkv`` (``DKVSettingsResource``)."""
    store = ObjectStoreResource()
    if store.root_uri.startswith(("s3://", "s3a://")):
        store = ObjectStoreResource(root_uri=store.root_uri, s3=s3_resource())
    return {"object_store": store, "pyspark": spark_resource(), "dkv": DKVSettingsResource()}
