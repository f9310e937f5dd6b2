"""Erasure of a key's rows from the sinks (``Sink.erase_rows``): Parquet tables, the
dead-letter table and the Delta table sink, on a running job (``erasure_job``).

Oracles: the tables read by their directory (pyarrow, DuckDB) before the erasure, minus
the key's rows; the job's input (``erasure_job.expected_*``) for the epochs after it; and
a scan of the raw and decoded bytes of every object the sinks wrote, which held the key
before and holds it nowhere after.
"""
from __future__ import annotations

import io
from collections import Counter

import pyarrow.parquet as pq
import pytest

from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.log.segment import chunk_batches, read_directory
from tests.operators.io import erasure_job as ej
from tests.operators.io.test_sink_directories import by_duckdb, by_pyarrow, by_spark


def sink_objects(store, prefix: str, sink: str, staged_name: str) -> list[str]:
    """The published files of ``sink`` and the job's staged files of it."""
    return [k for k in store.list(prefix + "/")
            if k.startswith(f"{prefix}/sinks/{sink}/") or ("/staging/" in k and k.endswith("/" + staged_name))]


def rows_by(read, directory: str) -> Counter:
    """``(user, ts, amount, epoch)`` rows of the ``events`` table read by its directory."""
    df = read(directory)
    return Counter(zip(df["user"], df["ts"].astype("int64"), df["amount"].astype("int64"),
                       df["epoch"].astype("int64")))


def two_epochs(tmp_path, spark=None) -> tuple[str, JobRunner]:
    """``(store root, runner)`` of ``erasure_job`` after its first two epochs."""
    root = str(tmp_path / "store")
    runner = JobRunner(ej.job(), spark, root, retain_checkpoints=2)
    runner.run(max_epochs=2)
    return root, runner


def erased_rows(rows: Counter) -> Counter:
    return Counter({r: n for r, n in rows.items() if r[0] != ej.ERASED})


def test_parquet_and_dead_letter_erasure_on_a_running_job_and_its_restart(tmp_path) -> None:
    root, runner = two_epochs(tmp_path)
    job, store = runner.job, runner.store
    prefix = job.prefix
    events, dead = job.sinks["main"], job.dead_letter.sink
    directory = f"{root}/{prefix}/sinks/events"
    before = {read: rows_by(read, directory) for read in (by_pyarrow, by_duckdb)}
    assert before[by_pyarrow] == before[by_duckdb] and any(r[0] == ej.ERASED for r in before[by_pyarrow])
    held = ej.holders(store, sink_objects(store, prefix, "events", "events.parquet"), ej.ERASED)
    assert any("/sinks/" in k for k in held) and any("/staging/" in k for k in held)
    dead_held = ej.holders(store, sink_objects(store, prefix, "dead_letter", "dead_letter.parquet"), ej.ERASED)
    assert dead_held, "the key's dead letter is in the table before the erasure"
    dead_before = dead.read(store, prefix).to_pylist()

    assert events.erase_rows(store, prefix, "user", [ej.ERASED]) == held
    assert dead.erase_key(store, prefix, [ej.ERASED]) == dead_held

    for read in (by_pyarrow, by_duckdb):  # every other row exactly once, the key's rows gone
        assert rows_by(read, directory) == erased_rows(before[read])
    assert dead.read(store, prefix).to_pylist() == [r for r in dead_before if r["key"] != ej.ERASED.encode()]
    for sink, staged in (("events", "events.parquet"), ("dead_letter", "dead_letter.parquet")):
        assert ej.holders(store, sink_objects(store, prefix, sink, staged), ej.ERASED) == []
    # Idempotent.
    assert events.erase_rows(store, prefix, "user", [ej.ERASED]) == []
    assert dead.erase_key(store, prefix, [ej.ERASED.encode()]) == []
    # A restart keeps the rewritten files of the newest checkpoint (it neither copies the
    # staged file again nor refuses it), and the following epochs publish exactly once.
    ckpt = latest_checkpoint(store, prefix)
    for full in (False, True):
        assert events.check_staged(store, prefix, ckpt.epoch, ckpt.outputs["main"], ckpt.staged_checksums(),
                                   full) == []
    published = ej.holders(store, store.list(f"{prefix}/sinks/events/"), ej.ERASED)
    restarted = JobRunner(ej.job(), None, root, retain_checkpoints=2)
    assert [r.epoch for r in restarted.run()] == [3, 4]
    final = rows_by(by_duckdb, directory)
    assert Counter({r: n for r, n in final.items() if r[3] <= 2}) == erased_rows(before[by_duckdb])
    assert Counter(r[:3] for r in final.elements()) == \
        Counter(ej.expected_events()) - Counter(r[:3] for r in before[by_duckdb].elements() if r[0] == ej.ERASED)
    assert published == []
    assert all(k.split("/epoch=")[1][:8] in ("00000003", "00000004")
               for k in ej.holders(store, store.list(f"{prefix}/sinks/events/"), ej.ERASED))


def test_restart_refuses_an_erased_file_whose_footer_names_another_checksum(tmp_path) -> None:
    """The footer check is what lets a restart keep an erased file: a rewrite that does not
    name the recorded checksum is damage, as before."""
    root = str(tmp_path / "store")
    job = ej.job()
    runner = JobRunner(job, None, root)
    runner.run(max_epochs=1)
    store, prefix = runner.store, job.prefix
    events: ParquetSink = job.sinks["main"]
    ckpt = latest_checkpoint(store, prefix)
    staged = ckpt.outputs["main"]
    events.erase_rows(store, prefix, "user", [ej.ERASED])
    # Another rewrite of the staged file, dropping the footer record, and the published
    # copy lost: nothing vouches for the staged bytes any more.
    key = staged[0]
    table = pq.read_table(arrow_input(store.get(key))).replace_schema_metadata(None)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(key, buf.getvalue())
    store.delete(events.published_key(prefix, ckpt.epoch, key))
    problems = events.check_staged(store, prefix, ckpt.epoch, staged, ckpt.staged_checksums(), False)
    assert len(problems) == 1 and "cannot be published" in problems[0]
    with pytest.raises(RecoveryRefusedError):
        events.republish(store, prefix, ckpt.epoch, staged, ckpt.staged_checksums(), False,
                         lambda fn, items: [fn(i) for i in items])


def test_erase_rows_names_a_missing_column(tmp_path) -> None:
    root = str(tmp_path / "store")
    job = ej.job()
    runner = JobRunner(job, None, root)
    runner.run(max_epochs=1)
    with pytest.raises(ValueError, match="no file of .* has a column 'usr'"):
        job.sinks["main"].erase_rows(runner.store, job.prefix, "usr", [ej.ERASED])


def totals_of(sink, store, prefix) -> dict[str, int]:
    t = sink.read(store, prefix)
    users = t.column("user").to_pylist()
    assert len(users) == len(set(users)), "a primary key twice in the table"
    return dict(zip(users, t.column("total").to_pylist()))


def test_delta_table_erasure_leaves_no_byte_and_keeps_exactly_once(tmp_path) -> None:
    import duckdb

    root, runner = two_epochs(tmp_path)
    job, store = runner.job, runner.store
    prefix = job.prefix
    sink = job.sinks["totals"]
    before = totals_of(sink, store, prefix)
    assert ej.ERASED in before
    held = ej.holders(store, sink_objects(store, prefix, "totals", "totals.changes"), ej.ERASED)
    # The key is in data files, in the log's statistics and in staged change objects.
    dirs = {k.split("/")[4] for k in held if "/sinks/" in k}
    assert "_delta_log" in dirs and any(d.startswith("_bucket=") for d in dirs)
    assert any("/staging/" in k for k in held)
    app = sink.app_id(prefix)
    assert sink.open(store, prefix).transaction_version(app) == 2

    assert sink.erase_rows(store, prefix, "user", [ej.ERASED]) == held
    assert ej.holders(store, sink_objects(store, prefix, "totals", "totals.changes"), ej.ERASED) == []
    want = {u: t for u, t in before.items() if u != ej.ERASED}
    assert totals_of(sink, store, prefix) == want
    con = duckdb.connect()
    con.register("totals", sink.dataset(store, prefix))
    assert dict(con.execute("SELECT user, total FROM totals").fetchall()) == want
    dt = sink.open(store, prefix)
    assert dt.transaction_version(app) == 2  # the checkpoint kept the job's epoch
    version = dt.version()
    assert sink.erase_rows(store, prefix, "user", [ej.ERASED]) == []  # idempotent: no commit either
    assert sink.open(store, prefix).version() == version
    # Publishing epoch 2 again (a restart after its publish) applies nothing.
    ckpt = latest_checkpoint(store, prefix)
    assert sink.publish(store, prefix, 2, ckpt.outputs["totals"]) == []
    assert totals_of(sink, store, prefix) == want
    # A restart: epochs 3 and 4 publish once each (their totals build on the job's state,
    # which the sink's erasure does not touch).
    assert [r.epoch for r in JobRunner(ej.job(), None, root, retain_checkpoints=2).run()] == [3, 4]
    assert totals_of(sink, store, prefix) == ej.expected_totals()
    assert sink.open(store, prefix).transaction_version(app) == 4


def test_delta_erasure_of_an_epoch_committed_but_not_yet_published(tmp_path) -> None:
    """A crash between an epoch's commit and its publish, then the erasure: the restart
    publishes the epoch from its staged changes, without the key."""
    from tests.crashes import Crash, crash_at

    root = str(tmp_path / "store")
    with crash_at("after_commit", 2), pytest.raises(Crash):
        JobRunner(ej.job(), None, root, retain_checkpoints=2).run()
    runner = JobRunner(ej.job(), None, root, retain_checkpoints=2)
    store, prefix, sink = runner.store, runner.job.prefix, runner.job.sinks["totals"]
    assert sink.open(store, prefix).transaction_version(sink.app_id(prefix)) == 1
    sink.erase_rows(store, prefix, "user", [ej.ERASED])
    runner.job.sinks["main"].erase_rows(store, prefix, "user", [ej.ERASED])
    runner.run(max_epochs=0)  # the restart publishes epoch 2
    got = totals_of(sink, store, prefix)
    assert ej.ERASED not in got and sink.open(store, prefix).transaction_version(sink.app_id(prefix)) == 2
    assert ej.holders(store, sink_objects(store, prefix, "totals", "totals.changes"), ej.ERASED) == []
    assert ej.holders(store, sink_objects(store, prefix, "events", "events.parquet"), ej.ERASED) == []


def test_topic_sink_erasure_from_the_topic_and_staged_segments(tmp_path) -> None:
    from dkvstream.storage.log import Log
    from dkvstream.storage.objectstore import open_object_store
    from tests.operators.io.test_topic_operators import make_input, make_job, oracle, output
    from tests.storage.log.test_log_erasure import topics_holding

    root = str(tmp_path / "store")
    expected = oracle(make_input(root))
    job = make_job(root)
    runner = JobRunner(job, None, root, retain_checkpoints=2)
    runner.run(max_epochs=2)
    store, prefix, sink = runner.store, job.prefix, job.sinks["main"]
    before = output(root)
    erased = "k5"
    staged = [k for k in store.list(prefix + "/") if k.endswith("/out.seg")]
    log = Log(open_object_store(root))
    assert "out" in topics_holding(log, erased.encode()) and (before["key"] == erased).any()
    assert any(erased.encode() in b.keys() for k in staged for c in read_directory(store, k, store.get(k))
               for _, b in chunk_batches(store.get(k), c, 0, k))

    held = sink.erase_rows(store, prefix, "key", [erased])
    assert held and set(staged) & set(held)
    assert topics_holding(log, erased.encode()) == {"in"}  # the job's input topic is not the sink's
    assert not any(erased.encode() in b.keys() for k in staged for c in read_directory(store, k, store.get(k))
                   for _, b in chunk_batches(store.get(k), c, 0, k))
    assert output(root).equals(before[before["key"] != erased].reset_index(drop=True))
    assert sink.erase_rows(store, prefix, "key", [erased]) == []
    with pytest.raises(ValueError, match="erased by their key"):
        sink.erase_rows(store, prefix, "seq", [1])
    # A restart: the newest epoch is not published again, the next ones once.
    JobRunner(make_job(root), None, root, retain_checkpoints=2).run()
    gone = before[before["key"] == erased]
    want = expected.merge(gone, how="left", indicator=True)
    want = want[want["_merge"] == "left_only"].drop(columns="_merge").reset_index(drop=True)
    assert output(root).equals(want)


def test_erasure_on_spark_then_the_job_goes_on(spark, tmp_path) -> None:
    """The job on Spark local[2]: the sinks' erasure between its epochs, then a restart on
    Spark; Spark reads the Parquet table by its directory."""
    root, runner = two_epochs(tmp_path, spark)
    store, job = runner.store, runner.job
    prefix = job.prefix
    directory = f"{root}/{prefix}/sinks/events"
    before = rows_by(by_pyarrow, directory)
    for sink, column in ((job.sinks["main"], "user"), (job.sinks["totals"], "user"), (job.dead_letter.sink, "key")):
        assert sink.erase_rows(store, prefix, column, [ej.ERASED])
    for sink, staged in (("events", "events.parquet"), ("totals", "totals.changes"),
                         ("dead_letter", "dead_letter.parquet")):
        assert ej.holders(store, sink_objects(store, prefix, sink, staged), ej.ERASED) == []
    assert [r.epoch for r in JobRunner(ej.job(), spark, root, retain_checkpoints=2).run()] == [3, 4]
    final = rows_by(lambda d: by_spark(spark, d), directory)
    assert Counter({r: n for r, n in final.items() if r[3] <= 2}) == erased_rows(before)
    assert Counter(r[:3] for r in final.elements()) == \
        Counter(ej.expected_events()) - Counter(r[:3] for r in before.elements() if r[0] == ej.ERASED)
    assert totals_of(job.sinks["totals"], store, prefix) == ej.expected_totals()


@pytest.mark.parametrize("policy", ["compact", "delete"])
def test_kafka_sink_erasure_rewrites_staged_files_and_tombstones_a_compacted_topic(
        kafka_broker, tmp_path, policy) -> None:
    import time

    import pyarrow as pa
    from confluent_kafka.admin import AdminClient, NewTopic

    from dkvstream.operators.io.kafka import KafkaSink, KafkaSource
    from dkvstream.operators.paths import staging_prefix
    from dkvstream.storage.objectstore.local import LocalObjectStore

    topic = f"erase-{policy}-{time.time_ns() % 10**9}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 1, config={"cleanup.policy": policy})]).values():
        future.result(10)
    store, prefix = LocalObjectStore(str(tmp_path)), "jobs/kafka_erasure"
    sink = KafkaSink(kafka_broker.bootstrap, topic, ej.EVENTS_SCHEMA, key_column="user")
    rows = pa.Table.from_pylist([{"user": u, "ts": i, "amount": i} for i, u in enumerate(ej.USERS * 2)],
                                schema=ej.EVENTS_SCHEMA)
    staged = [sink.write_staged(store, staging_prefix(prefix, 1, "op", label, "a1"), rows)
              for label in ("kg-0000-0007", "kg-0008-0015")]
    sink.publish(store, prefix, 1, staged)

    held = sink.erase_rows(store, prefix, "user", [ej.ERASED])
    assert held == sorted(staged) + [f"kafka://{kafka_broker.bootstrap}/{topic}"]
    for key in staged:
        users = pq.read_table(arrow_input(store.get(key))).column("user").to_pylist()
        assert ej.ERASED not in users and len(users) == len(rows) - 2
    source = KafkaSource(kafka_broker.bootstrap, topic, value_format="bytes")
    records = [r for p, end in source.end_offsets().items() for r in source.read(p, 0, end).to_pylist()]
    source.close()
    erased = [r["value"] for r in records if r["key"] == ej.ERASED.encode()]
    # Four records of the key, then a tombstone in the compacted topic only.
    assert None not in erased[:4] and erased[4:] == ([None] if policy == "compact" else [])
    assert sink.erase_rows(store, prefix, "user", [ej.ERASED]) == [f"kafka://{kafka_broker.bootstrap}/{topic}"]
    with pytest.raises(ValueError, match="erased by their key"):
        sink.erase_rows(store, prefix, "amount", [1])
