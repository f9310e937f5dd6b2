"""Dagster: the Definitions load, and materializing the flights assets records checkpoints."""
from __future__ import annotations

import re

from dagster import AssetKey, DagsterInstance, Definitions, materialize

from dkvstream.assets.checkpoints import L0_TABLES_MAX, SIZE_AMP_MAX
from dkvstream.assets.job_assets import checkpoint_asset_key, job_assets
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource, spark_resource
from dkvstream.examples.flights import flights_job


def test_definitions_are_loadable() -> None:
    from dkvstream.examples.definitions import defs

    Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"flights_replay", "route_daily_delays", "route_daily_delays_late", "flights_checkpoint"} <= keys
    assert {"aircraft", "carrier_daily", "aircraft_rotations_checkpoint"} <= keys
    assert {"flights_weather_input", "hourly_weather_delays", "hourly_weather_delays_late",
            "flights_weather_checkpoint"} <= keys
    assert {s.name for s in defs.sensors} == {
        "flights_compaction_sensor", "flights_cleanup_sensor", "flights_source_sensor",
        "aircraft_rotations_compaction_sensor", "aircraft_rotations_cleanup_sensor",
        "aircraft_rotations_source_sensor", "aircraft_rotations_table_compaction_sensor",
        "flights_weather_compaction_sensor", "flights_weather_cleanup_sensor", "flights_weather_source_sensor"}
    assert {"flights", "aircraft_rotations", "flights_weather", "compaction", "memtable_flush", "garbage_collection",
            "table_compaction"} <= {j.name for j in defs.jobs}
    assert {"flights_v2_branch", "flights_v2_diff"} <= keys
    assert {"branch_flights_v2", "diff_flights_v2", "promote_flights_v2"} <= {j.name for j in defs.jobs}


def test_materialize_records_one_checkpoint_per_epoch(spark, tmp_path) -> None:
    job = flights_job(events_per_epoch=100_000, max_watermark_drift_ms=None)  # equal shares: 100,002 an epoch
    instance = DagsterInstance.ephemeral()
    resources = {"object_store": ObjectStoreResource(root_uri=str(tmp_path / "store")),
                 "pyspark": spark_resource({"spark.master": "local[2]"}),
                 "dkv": DKVSettingsResource(memtable_bytes=1 << 20)}
    result = materialize(job_assets(job), resources=resources, instance=instance,
                         run_config={"ops": {"run_flights": {"config": {"max_epochs": 2}}}})
    assert result.success
    # The run log says what start-up does, with the Spark UI's URL (on, at a free port).
    logs = [e.user_message for e in instance.all_logs(result.run_id) if not e.is_dagster_event]
    assert any(m.startswith("starting Spark on local[2] (10-40 s)") for m in logs), logs
    [up] = [m for m in logs if m.startswith("Spark up: ")]
    assert re.fullmatch(r"Spark up: master local\[2\], application local-\d+, UI at http://[^ ]+:\d+", up), up
    events = [e for e in result.get_asset_materialization_events()
              if e.asset_key == checkpoint_asset_key(job)]
    assert len(events) == 2
    # After epoch 2 every partition has offsets 66,668 read and between one and two
    # shares of 33,334 left (EWR 120,835, JFK 111,279, LGA 104,662 flights): 2 more epochs.
    assert [e.materialization.metadata["epochs_total_estimate"].value for e in events] == [4, 4]
    assert events[-1].materialization.metadata["progress_percent"].value == round(100 * 200_004 / 336_776, 1)
    [check] = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["epoch"].value == 2
    md = events[-1].materialization.metadata
    assert md["epoch"].value == 2
    assert md["events"].value == 100_002
    assert md["source_offsets"].value == {"EWR": 66668, "JFK": 66668, "LGA": 66668}
    assert md["manifest_uri"].value.endswith("epoch-0000000002.json")
    assert md["dead_letter_total"].value == 0 and md["dead_letter_missing_key"].value == 0  # clean input
    for field in ("watermark", "tables", "table_bytes", "keys", "duration_s", "events_per_s", SIZE_AMP_MAX):
        assert field in md
    # Per-level counts add up to the total, and level 0 holds the flushed tables (no
    # inline compaction under Dagster: that is the compaction sensor's job).
    levels = sorted(k for k in md if k.startswith("L") and k.endswith("_tables"))
    assert sum(md[k].value for k in levels) == md["tables"].value > 0
    assert sum(md[k.replace("_tables", "_bytes")].value for k in levels) == md["table_bytes"].value
    assert md["L0_tables"].value == md["tables"].value and md[L0_TABLES_MAX].value > 0
    latest = instance.get_latest_materialization_event(AssetKey("route_daily_delays"))
    assert latest.asset_materialization.metadata["committed_epoch"].value == 2
    assert latest.asset_materialization.metadata["rows"].value > 0

    # A second materialization continues from the checkpoint instead of starting over.
    result = materialize(job_assets(job), resources=resources, instance=instance,
                         run_config={"ops": {"run_flights": {"config": {"max_epochs": 1}}}})
    epochs = [e.materialization.metadata["epoch"].value for e in result.get_asset_materialization_events()
              if e.asset_key == checkpoint_asset_key(job)]
    assert epochs == [3]


def test_sources_and_sinks_named_with_characters_dagster_refuses_get_valid_asset_names() -> None:
    """A ``KafkaSource`` is named ``kafka:<topic>`` and a ``KafkaSink`` after its topic
    (hyphens allowed): their assets take the name with ``_`` for each refused character."""
    import pyarrow as pa

    from dkvstream.assets.definitions import dkvstream_definitions
    from dkvstream.examples.keyed_count import KeyedWindowCount
    from dkvstream.operators import Job, ParquetSink
    from dkvstream.operators.io.kafka import KafkaSink, KafkaSource

    source = KafkaSource("127.0.0.1:1", "pay-ments", value_schema=pa.schema([("amount", pa.int64())]))
    job = Job(name="totals", source=source, operators=[KeyedWindowCount()],
              sinks={"main": KafkaSink("127.0.0.1:1", "window-counts", KeyedWindowCount.outputs["main"]),
                     "late": ParquetSink("late")})
    defs = dkvstream_definitions(job)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"kafka_pay_ments", "window_counts", "late", "totals_checkpoint", "totals_savepoints"}
