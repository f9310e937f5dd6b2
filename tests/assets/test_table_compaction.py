"""Delta table compaction: the sensor fires on small files, once per table version; the
``table_compaction`` job rewrites them without changing the table or its history, and
the stream job keeps merging into the compacted table."""
from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import DagsterInstance

from dkvstream.assets.jobs import TableCompactionConfig, op_config, table_compaction_job
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.assets.sensors import make_table_compaction_sensor
from dkvstream.operators.io.table_sink import SnapshotVacuumedError, small_files
from dkvstream.operators.runtime.driver import JobRunner
from tests.assets.test_sensors import Ticker, reset
from tests.operators.io.test_table_sink import (
    as_model,
    make_job,
    model_after,
    random_changes,
    run_drained,
)


def test_sensor_and_compaction_of_a_table_sink(tmp_path) -> None:
    rows = random_changes(400, keys=3000, seed=21)  # mostly new keys: each MERGE adds files
    job, sink = make_job(rows)
    runner = JobRunner(job, None, str(tmp_path))
    resources = {"object_store": ObjectStoreResource(root_uri=str(tmp_path))}
    threshold = 24
    ticker = Ticker(make_table_compaction_sensor(job, min_small_files=threshold), DagsterInstance.ephemeral(),
                    resources)
    store, prefix = runner.store, job.prefix
    uri = sink.table_uri(store, prefix)
    target = TableCompactionConfig(job=job.name).target_bytes

    fired_at = None
    for result in runner.epochs(max_epochs=8):
        n = small_files(uri, target)
        requests = ticker.tick()
        assert bool(requests) == (n >= threshold), f"epoch {result.epoch}: {n} small files"
        if requests:
            fired_at = result.epoch
            assert ticker.tick() == []  # same table version: not twice
            break
    assert fired_at is not None, "the table never reached the small-file threshold"

    before = sink.open(store, prefix).version()
    run = table_compaction_job.execute_in_process(run_config=requests[0].run_config,
                                                  resources=resources, instance=DagsterInstance.ephemeral())
    assert run.success
    done = run.output_for_node("compact_tables")
    assert len(done) == 1 and done[0]["files_removed"] > done[0]["files_added"] > 0
    assert small_files(uri, target) < threshold
    assert sink.open(store, prefix).version() == before + 1
    assert as_model(sink.read(store, prefix)) == model_after(rows[:40 * fired_at])
    assert as_model(sink.scan(store, prefix, as_of_epoch=fired_at - 1)) == model_after(rows[:40 * (fired_at - 1)])
    assert ticker.tick() == []

    JobRunner(job, None, str(tmp_path)).run()  # merges into the compacted table
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    assert as_model(sink.scan(store, prefix, as_of_epoch=fired_at)) == model_after(rows[:40 * fired_at])


def test_table_compaction_sensor_fires_again_after_the_job_is_reset(tmp_path) -> None:
    """A reset job recreates its tables at version 0: the same versions as before are a
    new table (another Delta table id), and the sensor requests a compaction again."""
    rows = random_changes(120, keys=3000, seed=21)
    job, _ = make_job(rows)
    ticker = Ticker(make_table_compaction_sensor(job, min_small_files=2), DagsterInstance.ephemeral(),
                    {"object_store": ObjectStoreResource(root_uri=str(tmp_path))})
    JobRunner(job, None, str(tmp_path)).run()
    [first] = ticker.tick()
    assert ticker.tick() == []
    reset(tmp_path, job.name)
    assert ticker.tick() == []  # no table
    JobRunner(job, None, str(tmp_path)).run()  # the same versions again
    [again] = ticker.tick()
    assert again.run_config == first.run_config


def test_definitions_of_a_job_with_a_table_sink_load() -> None:
    from dagster import Definitions

    from dkvstream.assets.definitions import dkvstream_definitions
    from dkvstream.examples.aircraft_rotations import aircraft_job
    from dkvstream.examples.flights import flights_job

    defs = dkvstream_definitions(flights_job(), aircraft_job())
    Definitions.validate_loadable(defs)
    sensors = {s.name for s in defs.sensors}
    assert "aircraft_rotations_table_compaction_sensor" in sensors
    assert "flights_table_compaction_sensor" not in sensors  # no TableSink in the flights job
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"aircraft", "carrier_daily", "aircraft_rotations_checkpoint"} <= keys
    assert "table_compaction" in {j.name for j in defs.jobs}


def test_compaction_with_vacuum_deletes_superseded_files(tmp_path) -> None:
    import os

    from deltalake import DeltaTable

    rows = random_changes(240, keys=3000, seed=23)
    job, sink, runner = run_drained(rows, tmp_path)
    store, prefix = runner.store, job.prefix
    uri = sink.table_uri(store, prefix)
    path = uri.removeprefix("file://")

    def on_disk() -> int:
        return sum(1 for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet") and "_delta_log" not in d)

    before = on_disk()
    run = table_compaction_job.execute_in_process(
        run_config=op_config("compact_tables", job.name, min_small_files=1, retention_hours=0),
        resources={"object_store": ObjectStoreResource(root_uri=str(tmp_path))}, instance=DagsterInstance.ephemeral())
    assert run.success
    done = run.output_for_node("compact_tables")[0]
    live = len(DeltaTable(uri).file_uris())
    assert done["files_vacuumed"] == before + done["files_added"] - live > 0
    assert on_disk() == live
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    # Time travel to a version whose files the vacuum deleted fails with a clear error
    # (without the check: pyarrow's FileNotFoundError naming a Parquet file) ...
    for epoch in (1, 6):
        with pytest.raises(SnapshotVacuumedError, match=f"epoch {epoch} reads version .* VACUUM at version"):
            sink.scan(store, prefix, as_of_epoch=epoch)
    # ... and so do lookups.
    with pytest.raises(SnapshotVacuumedError):
        sink.lookup(store, prefix, pa.table({"id": [1], "day": [0]}), as_of_epoch=3)


def test_vacuum_horizon_from_the_log_history() -> None:
    """A version is refused only if the commit after it is older than the vacuum's
    start minus its retention."""
    _, sink = make_job([])
    hour = 3_600_000
    history = [{"version": 0, "timestamp": 0}, {"version": 1, "timestamp": 10 * hour},
               {"version": 2, "timestamp": 20 * hour},
               {"version": 3, "timestamp": 30 * hour, "operation": "VACUUM START",
                "operationParameters": {"specifiedRetentionMillis": str(15 * hour)}}]
    sink._check_not_vacuumed("t", history, 1, "epoch 1")  # superseded at 20 h > 30 - 15 h
    sink._check_not_vacuumed("t", history, 3, "epoch 3")  # the newest version
    with pytest.raises(SnapshotVacuumedError, match="epoch 0 reads version 0 of t"):
        sink._check_not_vacuumed("t", history, 0, "epoch 0")  # superseded at 10 h < 15 h
    sink._check_not_vacuumed("t", history[:3], 0, "epoch 0")  # no vacuum
