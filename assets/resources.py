"""Dagster resources: the object store jobs keep state and output in, and Spark."""
from __future__ import annotations

import os

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource

from operators.spark import ensure_python_workers_use_this_interpreter, spark_conf
from storage.objectstore import ObjectStore, open_object_store

DEFAULT_STORE_URI = ".dkvstream"


class ObjectStoreResource(ConfigurableResource):
    """Root of the object store (a local directory by default).

    Attributes:
        root_uri: path or ``file://`` URI; defaults to ``$DKVSTREAM_STORE`` or
            ``./.dkvstream``.
    """

    root_uri: str = os.environ.get("DKVSTREAM_STORE", DEFAULT_STORE_URI)

    def open(self) -> ObjectStore:
        """The object store at ``root_uri``."""
        return open_object_store(self.root_uri)


def spark_resource(conf: dict[str, str] | None = None) -> PySparkResource:
    """dagster-pyspark's resource with dkvstream's Spark defaults (``operators.spark``)."""
    ensure_python_workers_use_this_interpreter()
    return PySparkResource(spark_config=spark_conf(conf))


def default_resources() -> dict:
    """Resources for local runs: ``./.dkvstream`` and ``local[2]`` Spark."""
    return {"object_store": ObjectStoreResource(), "pyspark": spark_resource()}
