"""The Delta upsert table sink (operators/io/table_sink.py) against a dict model, in-process.

Events carry a change (``insert``/``upsert``/``delete`` of an id); a pass-through
operator emits them to a ``TableSink``. The model applies the same changes in event
order. Checked: the table after the run and as of every committed epoch (time travel),
point lookups and a projected, filtered scan (pyarrow and DuckDB), a crash between
commit and publish, a publish redone after it succeeded, and an insert of an existing
key failing its epoch before the commit.
"""
from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark import cloudpickle

from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.io.sources import Source
from dkvstream.operators.io.table_sink import BUCKET_COLUMN, DELETE, INSERT, OP_COLUMN, UPSERT, TableSink
from dkvstream.operators.runtime.driver import JobFailedError, JobRunner
from tests.crashes import Crash, crash_at

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark workers cannot import tests

TABLE_SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.int64()), ("value", pa.float64()),
                          ("note", pa.string())])
BASE_MS = 1_700_000_000_000


class ChangeSource(Source):
    """One partition of change events in the given order (offset = position)."""

    name = "changes"

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def partitions(self) -> list[str]:
        return ["p0"]

    def end_offsets(self) -> dict[str, int]:
        return {"p0": len(self.rows)}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([("op", pa.string()), ("id", pa.int64()), ("day", pa.int64()),
                          ("value", pa.float64()), ("note", pa.string())])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        rows = self.rows[start:end]
        cols = {"key": pa.array([str(r["id"]).encode() for r in rows], pa.binary()),
                "timestamp": pa.array([BASE_MS + (start + i) * 1000 for i in range(len(rows))], pa.int64())}
        for f in self.value_schema:
            cols[f.name] = pa.array([r[f.name] for r in rows], f.type)
        return pa.table(cols)


class PassThrough(Operator):
    name = "changes"
    outputs = {"main": pa.schema([*TABLE_SCHEMA, pa.field(OP_COLUMN, pa.string())])}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        v = event.value
        if v["op"] == "skip":  # an event that changes nothing in the table
            return
        subject.emit({"id": v["id"], "day": v["day"], "value": v["value"], "note": v["note"], OP_COLUMN: v["op"]})

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        pass


def random_changes(n: int, keys: int, seed: int) -> list[dict]:
    """Valid change rows: an insert only where the key is absent at that point."""
    rng = np.random.default_rng(seed)
    present: set[int] = set()
    rows = []
    for i in range(n):
        k = int(rng.integers(keys))
        r = rng.random()
        op = DELETE if r < 0.2 else (UPSERT if r < 0.6 or k in present else INSERT)
        present.discard(k) if op == DELETE else present.add(k)
        rows.append({"op": op, "id": k, "day": k % 3, "value": float(i), "note": f"n{i}"})
    return rows


def model_after(rows: list[dict]) -> dict[int, tuple]:
    state: dict[int, tuple] = {}
    for r in rows:
        if r["op"] == "skip":
            continue
        if r["op"] == DELETE:
            state.pop(r["id"], None)
        else:
            state[r["id"]] = (r["day"], r["value"], r["note"])
    return state


def as_model(t: pa.Table) -> dict[int, tuple]:
    ids = t.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "duplicate primary keys in the table"
    return {i: (d, v, n) for i, d, v, n in zip(ids, t["day"].to_pylist(), t["value"].to_pylist(),
                                               t["note"].to_pylist())}


def make_job(rows: list[dict], **sink_kw) -> tuple[Job, TableSink]:
    sink = TableSink("items", TABLE_SCHEMA, primary_key=["id", "day"], hash_buckets=4, range_column="day", **sink_kw)
    job = Job(name="tbl", source=ChangeSource(rows), operators=[PassThrough()], sinks={"main": sink},
              key_groups=16, parallelism=2, events_per_epoch=40)
    return job, sink


def run_drained(rows: list[dict], root) -> tuple[Job, TableSink, JobRunner]:
    """``make_job(rows)`` run to the end in process under ``root``."""
    job, sink = make_job(rows)
    runner = JobRunner(job, None, str(root))
    runner.run()
    return job, sink, runner


def test_table_equals_model_now_and_as_of_every_epoch(tmp_path) -> None:
    rows = random_changes(240, keys=30, seed=3)
    job, sink = make_job(rows)
    runner = JobRunner(job, None, str(tmp_path))
    results = runner.run()
    assert len(results) == 6
    store, prefix = runner.store, job.prefix
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    for e in range(1, 7):
        snap = sink.scan(store, prefix, as_of_epoch=e)
        assert as_model(snap) == model_after(rows[:40 * e]), f"as of epoch {e}"
    # By wall-clock time: the instant of epoch 3's commit reads epoch 3's snapshot.
    import datetime as dt_mod

    commits = {int(h["dkvstream.epoch"]): h["timestamp"] for h in sink.open(store, prefix).history()
               if "dkvstream.epoch" in h}
    at = dt_mod.datetime.fromtimestamp(commits[3] / 1000, tz=dt_mod.timezone.utc)
    assert as_model(sink.scan(store, prefix, as_of_time=at)) == model_after(rows[:120])
    # Hash buckets plus the range column are the Delta partitions.
    dt = sink.open(store, prefix)
    assert dt.metadata().partition_columns == [BUCKET_COLUMN, "day"]
    # One MERGE per epoch, each carrying its epoch as the app transaction version.
    assert dt.transaction_version(sink.app_id(prefix)) == 6
    assert dt.version() == 6  # version 0 = table creation
    # What a restart's fallback asks: is output of epochs after e visible?
    assert sink.published_after(store, prefix, 6) == []
    assert "epoch 6 applied" in sink.published_after(store, prefix, 3)[0]


def test_point_lookup_and_scan_with_pyarrow_and_duckdb(tmp_path) -> None:
    rows = random_changes(240, keys=30, seed=5)
    job, sink, runner = run_drained(rows, tmp_path)
    store, prefix = runner.store, job.prefix
    model = model_after(rows)
    probe = [(k, k % 3) for k in range(0, 40, 3)]  # some present, some not
    found = sink.lookup(store, prefix, pa.table({"id": [p[0] for p in probe], "day": [p[1] for p in probe]}))
    assert as_model(found) == {k: model[k] for k, _ in probe if k in model}
    mid = model_after(rows[:120])
    found_old = sink.lookup(store, prefix, pa.table({"id": [p[0] for p in probe], "day": [p[1] for p in probe]}),
                            as_of_epoch=3)
    assert as_model(found_old) == {k: mid[k] for k, _ in probe if k in mid}

    scan = sink.scan(store, prefix, columns=["id", "value"], filter=pc.field("value") > 100.0)
    assert scan.column_names == ["id", "value"]
    assert sorted(scan.column("id").to_pylist()) == sorted(k for k, v in model.items() if v[1] > 100.0)

    import duckdb

    ds = sink.dataset(store, prefix, as_of_epoch=3)
    con = duckdb.connect()
    con.register("items", ds)
    got = con.execute("SELECT id, value FROM items WHERE value > 50 ORDER BY id").fetchall()
    assert got == sorted((k, v[1]) for k, v in mid.items() if v[1] > 50)


def test_crash_between_commit_and_publish_then_redone_publish(tmp_path) -> None:
    rows = random_changes(240, keys=30, seed=11)
    job, sink = make_job(rows)
    with crash_at("after_commit", 3), pytest.raises(Crash):
        JobRunner(job, None, str(tmp_path), retain_checkpoints=2).run()
    runner = JobRunner(job, None, str(tmp_path), retain_checkpoints=2)  # retention collects staged files
    assert runner.latest().epoch == 3
    assert sink.open(runner.store, job.prefix).transaction_version(sink.app_id(job.prefix)) == 2
    runner.run()  # publishes epoch 3 on restart, then runs 4..6
    store, prefix = runner.store, job.prefix
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    assert as_model(sink.scan(store, prefix, as_of_epoch=3)) == model_after(rows[:120])
    # Publishing the newest checkpoint again (a crash after publish) applies nothing:
    # without the app-transaction check the epoch's inserts would conflict or add a version.
    dt = sink.open(store, prefix)
    ckpt = runner.latest()
    assert sink.publish(store, prefix, ckpt.epoch, ckpt.outputs["main"]) == []
    assert sink.open(store, prefix).version() == dt.version()
    assert as_model(sink.read(store, prefix)) == model_after(rows)


def test_insert_of_existing_key_fails_the_epoch_before_commit(tmp_path) -> None:
    rows = [{"op": INSERT, "id": i, "day": 0, "value": float(i), "note": "a"} for i in range(40)]
    rows += [{"op": UPSERT, "id": i, "day": 0, "value": 1.0, "note": "b"} for i in range(39)]
    rows += [{"op": INSERT, "id": 7, "day": 0, "value": 9.0, "note": "dup"}]  # epoch 2: key exists
    job, sink = make_job(rows)
    runner = JobRunner(job, None, str(tmp_path))
    with pytest.raises(JobFailedError, match=r"epoch 2 .*primary key \{'id': 7, 'day': 0\}"):
        runner.run()
    assert runner.latest().epoch == 1
    assert as_model(sink.read(runner.store, job.prefix)) == model_after(rows[:40])


def test_insert_after_delete_in_one_epoch_is_accepted() -> None:
    sink = TableSink("items", TABLE_SCHEMA, primary_key=["id"])
    ch = sink.changes_of(pa.table({"id": [1, 1, 1], "day": [0, 0, 0], "value": [1.0, 2.0, 3.0],
                                   "note": ["x", "y", "z"], OP_COLUMN: [DELETE, INSERT, UPSERT]}))
    net = sink.net_changes(ch, {(1,)}, 1, "the table")
    assert net.to_pylist()[0]["value"] == 3.0 and net.column(OP_COLUMN).to_pylist() == [UPSERT]
    ch2 = sink.changes_of(pa.table({"id": [1, 1], "day": [0, 0], "value": [1.0, 2.0], "note": ["x", "y"],
                                    OP_COLUMN: [INSERT, INSERT]}))
    with pytest.raises(Exception, match="primary key"):
        sink.net_changes(ch2, set(), 1, "the table")


class CompactingSink(TableSink):
    """Runs a compaction of the table between the merge tasks' reads and the driver's
    commit of their files (once), as the ``table_compaction`` op may while the job runs."""

    raced = 0

    def _commit(self, dt, uri, actions, app, epoch):
        if epoch == 4 and not self.raced:
            from dkvstream.operators.io.table_sink import compact_table

            CompactingSink.raced += 1
            compact_table(uri, 32 << 20)
        return super()._commit(dt, uri, actions, app, epoch)


def test_compaction_racing_a_publish_loses_no_change(tmp_path) -> None:
    rows = random_changes(240, keys=400, seed=13)
    job, _ = make_job(rows)
    sink = CompactingSink("items", TABLE_SCHEMA, primary_key=["id", "day"], hash_buckets=4, range_column="day")
    job.sinks = {"main": sink}
    runner = JobRunner(job, None, str(tmp_path))
    runner.run()
    assert CompactingSink.raced == 1
    store, prefix = runner.store, job.prefix
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    for e in range(1, 7):
        assert as_model(sink.scan(store, prefix, as_of_epoch=e)) == model_after(rows[:40 * e]), f"as of epoch {e}"


def test_table_on_s3_equals_model_with_time_travel(s3_server) -> None:
    """The same job on a SeaweedFS S3 store: delta-rs commits through the store's
    endpoint and credentials, a crash between commit and publish is redone once."""
    import uuid

    root = f"s3://{s3_server.bucket}/tests/table-sink-{uuid.uuid4().hex[:8]}"
    rows = random_changes(160, keys=30, seed=17)
    job, sink = make_job(rows)
    with crash_at("after_commit", 2), pytest.raises(Crash):
        JobRunner(job, None, root).run()
    runner = JobRunner(job, None, root)
    runner.run()
    store, prefix = runner.store, job.prefix
    assert sink.table_uri(store, prefix).startswith(f"s3://{s3_server.bucket}/")
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    for e in range(1, 5):
        assert as_model(sink.scan(store, prefix, as_of_epoch=e)) == model_after(rows[:40 * e]), f"as of epoch {e}"
    assert sink.open(store, prefix).transaction_version(sink.app_id(prefix)) == 4


def test_spark_reads_the_table_now_and_as_of_an_epoch(spark, tmp_path) -> None:
    """The job on Spark (its prepare and merge tasks run in Spark's Python workers), read
    back with Spark."""
    rows = random_changes(240, keys=30, seed=19)
    job, sink = make_job(rows)
    runner = JobRunner(job, spark, str(tmp_path))
    runner.run()
    store, prefix = runner.store, job.prefix
    now = sink.to_spark(spark, store, prefix).toArrow()
    assert now.schema.names == TABLE_SCHEMA.names
    assert as_model(now) == model_after(rows)
    old = sink.to_spark(spark, store, prefix, as_of_epoch=3).filter("value >= 0").toArrow()
    assert as_model(old) == model_after(rows[:120])


def test_hash_buckets_are_stable() -> None:
    """The bucket of a key is part of the table's layout: it must never change across
    versions (xxh3_64 of the key columns' text joined by 0x1f, mod buckets)."""
    import xxhash

    sink = TableSink("t", TABLE_SCHEMA, primary_key=["id", "day"], hash_buckets=16)
    keys = pa.table({"id": [1, 2, 3, 12345], "day": [0, 0, 1, 7]})
    assert sink.buckets_of(keys).to_pylist() == [7, 1, 15, 11]
    assert sink.buckets_of(keys).to_pylist() == [
        xxhash.xxh3_64_intdigest(f"{i}\x1f{d}".encode()) % 16 for i, d in zip([1, 2, 3, 12345], [0, 0, 1, 7])]
    tails = TableSink("a", pa.schema([("tailnum", pa.string())]), primary_key=["tailnum"], hash_buckets=8)
    assert tails.buckets_of(pa.table({"tailnum": ["N14228", "N24211", "a"]})).to_pylist() == [6, 5, 7]


def test_epoch_without_changes_reads_as_the_previous_one(tmp_path) -> None:
    rows = random_changes(120, keys=30, seed=29)
    rows[40:80] = [{**r, "op": "skip"} for r in rows[40:80]]  # epoch 2 changes nothing
    rows[80:] = [{**r, "op": UPSERT if r["op"] == INSERT else r["op"]} for r in rows[80:]]  # skipped deletes
    job, sink, runner = run_drained(rows, tmp_path)
    store, prefix = runner.store, job.prefix
    assert sink.open(store, prefix).version() == 2  # creation, epoch 1, epoch 3: no commit for epoch 2
    assert as_model(sink.scan(store, prefix, as_of_epoch=2)) == model_after(rows[:40])
    assert as_model(sink.scan(store, prefix, as_of_epoch=3)) == model_after(rows)


def test_restart_fallback_with_a_table_sink(tmp_path) -> None:
    """Epoch 3 is committed but not applied to the table (crash), then its checkpoint is
    truncated: the restart falls back to epoch 2 and the table, now and as of every
    epoch, equals the model. Once the table holds epoch 6, a truncated epoch-6
    checkpoint is refused: the table already shows it."""
    from dkvstream.operators.paths import checkpoint_key
    from dkvstream.operators.runtime.recovery import RecoveryRefusedError

    rows = random_changes(240, keys=30, seed=5)
    job, sink = make_job(rows)
    with crash_at("after_commit", 3), pytest.raises(Crash):
        JobRunner(job, None, str(tmp_path)).run()
    runner = JobRunner(job, None, str(tmp_path))
    store, prefix = runner.store, job.prefix
    key = checkpoint_key(prefix, 3)
    store.put(key, store.get(key)[:50])
    assert [r.epoch for r in runner.run()] == [3, 4, 5, 6]
    assert as_model(sink.read(store, prefix)) == model_after(rows)
    for epoch in range(1, 7):
        assert as_model(sink.scan(store, prefix, as_of_epoch=epoch)) == model_after(rows[:40 * epoch])

    key = checkpoint_key(prefix, 6)
    store.put(key, store.get(key)[:50])
    with pytest.raises(RecoveryRefusedError, match=r"already visible.*Delta table .*epoch 6 applied"):
        JobRunner(job, None, str(tmp_path)).run()


def test_driver_reads_no_change_row_and_no_table_row(tmp_path, monkeypatch) -> None:
    """The driver's part of prepare and publish reads only the staged objects' indexes
    (a ranged GET at offset 0, at most the index probe long) and the Delta log: every
    change row and every table row is read in a task (here: inside ``map_in_tasks``)."""
    import dkvstream.operators.io.table_reader as table_reader
    import dkvstream.operators.io.table_sink as table_sink
    from dkvstream.storage.objectstore import open_object_store

    store, prefix = open_object_store(str(tmp_path)), "jobs/t"
    sink = TableSink("items", TABLE_SCHEMA, primary_key=["id", "day"], hash_buckets=4, range_column="day")
    in_task = [False]
    driver_reads: list[tuple] = []

    def map_in_tasks(fn, items):
        in_task[0] = True
        try:
            return [fn(item) for item in items]
        finally:
            in_task[0] = False

    def watch(name, real):
        def call(*args, **kwargs):
            if not in_task[0]:
                driver_reads.append((name, *args[:3]))
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(store, "get", watch("get", store.get))
    monkeypatch.setattr(store, "get_range", watch("get_range", store.get_range))
    monkeypatch.setattr(table_reader, "delta_dataset", watch("table rows", table_reader.delta_dataset))
    monkeypatch.setattr(table_sink, "delta_dataset", watch("table rows", table_sink.delta_dataset))
    rows = random_changes(3000, keys=500, seed=31)
    model: dict[int, tuple] = {}
    for epoch, chunk in enumerate([rows[:1000], rows[1000:]], start=1):
        staged = []
        for r in range(2):  # two key-group ranges, each with its own keys
            part = [x for x in chunk if x["id"] % 2 == r]
            table = pa.table({f.name: pa.array([x[f.name] for x in part], f.type) for f in TABLE_SCHEMA})
            table = table.append_column(OP_COLUMN, pa.array([x["op"] for x in part]))
            staged.append(sink.write_staged(store, f"{prefix}/staging/{epoch}/{r}", table))
        sink.prepare_in_tasks(store, prefix, epoch, staged, map_in_tasks)
        assert sink.publish_in_tasks(store, prefix, epoch, staged, map_in_tasks)
        model = model_after([*({"op": UPSERT, "id": k, "day": v[0], "value": v[1], "note": v[2]}
                               for k, v in model.items()), *chunk])
    assert [r for r in driver_reads if r[0] != "get_range"] == []
    assert all(start == 0 and length <= table_sink._INDEX_PROBE for _, _, start, length in driver_reads)
    assert len(driver_reads) == 8  # the index of each of 2 staged objects, by prepare and publish, 2 epochs
    assert as_model(sink.read(store, prefix)) == model


def test_change_file_staged_by_an_older_version_is_published(tmp_path) -> None:
    """A checkpoint written before change objects had an index names one Parquet file of
    every bucket's change rows: a restart still publishes it, exactly once."""
    import pyarrow.parquet as pq

    from dkvstream.storage.objectstore import open_object_store

    store, prefix = open_object_store(str(tmp_path)), "jobs/t"
    sink = TableSink("items", TABLE_SCHEMA, primary_key=["id", "day"], hash_buckets=4, range_column="day")
    rows = random_changes(200, keys=40, seed=37)
    table = pa.table({f.name: pa.array([x[f.name] for x in rows], f.type) for f in TABLE_SCHEMA})
    table = table.append_column(OP_COLUMN, pa.array([x["op"] for x in rows]))
    key = f"{prefix}/staging/1/items.changes.parquet"
    buf = pa.BufferOutputStream()
    pq.write_table(sink.changes_of(table), buf)
    store.put(key, buf.getvalue().to_pybytes())
    sink.prepare(store, prefix, 1, [key])
    assert sink.publish(store, prefix, 1, [key])
    assert sink.publish(store, prefix, 1, [key]) == []
    assert as_model(sink.read(store, prefix)) == model_after(rows)


def test_vacuum_deletes_old_uncommitted_files_only(tmp_path) -> None:
    """Files a merge task wrote for a publish that never committed are not in the table;
    a vacuum deletes them once ``UNCOMMITTED_FILE_HOURS`` old, and never a younger one (a
    publish in flight may be about to commit it)."""
    import os
    import time

    from dkvstream.operators.io.table_maintenance import UNCOMMITTED_FILE_HOURS
    from dkvstream.operators.io.table_sink import vacuum_table

    rows = random_changes(80, keys=30, seed=41)
    job, sink, runner = run_drained(rows, tmp_path)
    store, prefix = runner.store, job.prefix
    base = sink.table_prefix(prefix)
    for name, age_h in [("old", UNCOMMITTED_FILE_HOURS + 1), ("young", 1)]:
        key = f"{base}/_bucket=0/day=0/part-{name}.zstd.parquet"
        store.put(key, b"never committed")
        path = os.path.join(str(tmp_path), key)
        os.utime(path, (time.time() - age_h * 3600,) * 2)
    vacuum_table(sink.table_uri(store, prefix), 0)
    assert not store.exists(f"{base}/_bucket=0/day=0/part-old.zstd.parquet")
    assert store.exists(f"{base}/_bucket=0/day=0/part-young.zstd.parquet")
    assert as_model(sink.read(store, prefix)) == model_after(rows)
