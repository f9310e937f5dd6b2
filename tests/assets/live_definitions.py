"""``Definitions`` of the live test job for ``dagster dev`` (test_dagster_dev_continuous):
input for 6 epochs, one epoch at most every 500 ms, the store at ``$DKVSTREAM_STORE``,
no Spark."""
import os

from dkvstream.assets.definitions import dkvstream_definitions
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from tests.assets.live_job import NoSpark, live_job

defs = dkvstream_definitions(
    live_job(visible=3_000, trigger_interval_ms=500),
    resources={"object_store": ObjectStoreResource(root_uri=os.environ["DKVSTREAM_STORE"]),
               "pyspark": NoSpark(spark_config={}), "dkv": DKVSettingsResource(memtable_bytes=64 << 10)})
