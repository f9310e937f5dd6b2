"""The Kafka source and sink (``dkvstream.operators.io.kafka``) against a real Kafka-compatible
broker: Tansu (the ``kafka_broker`` fixture), started on a free loopback port.

Oracles: the offsets the broker acknowledged to the producer (delivery reports), the
values produced, and the keyed-count pandas computation over the produced events.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dkvstream.examples.keyed_count import OUTPUT_SCHEMA, keyed_count_job
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.errors import KafkaIOError
from dkvstream.operators.io.kafka import KafkaSink, KafkaSource, deduplicate
from dkvstream.operators.paths import staging_prefix
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at

AMOUNT = pa.schema([pa.field("amount", pa.int64())])
HOUR_MS = 3_600_000
# Event times from 2023-11-14 on a whole hour (librdkafka takes timestamp 0 for "now").
BASE_MS = 472_222 * HOUR_MS
_names = itertools.count()


def new_topic(broker, partitions: int = 1) -> str:
    """A topic of its own for one test (the broker lives for the whole run)."""
    name = f"t{next(_names)}-{time.time_ns() % 10**9}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
        future.result(10)
    return name


def produce(broker, topic: str, records: list[dict], *, batch: bool = False, **config) -> list[int]:
    """Produces ``records`` (``Producer.produce`` keyword dicts) and returns the offset
    the broker acknowledged for each: one request per record, or (``batch``) as few
    record batches as librdkafka makes with a long linger."""
    settings = {"bootstrap.servers": broker.bootstrap, "linger.ms": 1000 if batch else 0,
                "batch.num.messages": 10_000, **config}
    producer = Producer(settings)
    offsets: list[int | None] = [None] * len(records)

    def delivered(i):
        def report(err, msg):
            assert err is None, err
            offsets[i] = msg.offset()
        return report

    for i, r in enumerate(records):
        producer.produce(topic, on_delivery=delivered(i), **r)
        if not batch:
            producer.flush(10)
    assert producer.flush(10) == 0
    return offsets


def json_record(key: bytes | None, ts: int, value: dict | bytes, partition: int = 0) -> dict:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return {"key": key, "value": raw, "timestamp": ts, "partition": partition}


# ------------------------------------------------------------------------------ source
def test_source_reads_exact_offset_ranges(kafka_broker) -> None:
    topic = new_topic(kafka_broker, partitions=2)
    records = [json_record(b"k%d" % (i % 3), BASE_MS + i, {"amount": i}, partition=i % 2)
               for i in range(40)]
    offsets = produce(kafka_broker, topic, records)
    oracle = {(r["partition"], o): r for r, o in zip(records, offsets)}
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    assert source.partitions() == [f"{topic}-0", f"{topic}-1"]
    assert source.end_offsets() == {f"{topic}-0": 20, f"{topic}-1": 20}
    assert source.start_offset(f"{topic}-0") == 0
    for p, (start, end) in itertools.product((0, 1), [(0, 20), (3, 4), (7, 15), (19, 20)]):
        t = source.read(f"{topic}-{p}", start, end)
        got = t.to_pylist()
        assert [r["_offset"] for r in got] == list(range(start, end))
        for r in got:
            want = oracle[(p, r["_offset"])]
            assert (r["key"], r["timestamp"], r["amount"]) == (
                want["key"], want["timestamp"], json.loads(want["value"])["amount"])
            assert r["_error"] is None and r["_ingest_time"] == want["timestamp"]
    # Picklable (Spark ships the job): the copy opens its own consumer.
    sink = pickle.loads(pickle.dumps(KafkaSink(kafka_broker.bootstrap, topic, AMOUNT)))
    assert sink.topic == topic
    copy = pickle.loads(pickle.dumps(source))
    assert copy._consumer is None
    assert copy.read(f"{topic}-1", 5, 8).column("amount").to_pylist() == [11, 13, 15]
    source.close()
    copy.close()


def test_tansu_watermark_quirk_every_record_read_once(kafka_broker, tmp_path) -> None:
    """Five single records, then one batch of 95: Tansu's ListOffsets says 6, the log
    ends at 100. Epochs planned the driver's way read all 100 exactly once."""
    topic = new_topic(kafka_broker)
    records = [json_record(b"k", BASE_MS + i, {"amount": i}) for i in range(100)]
    assert produce(kafka_broker, topic, records[:5]) == [0, 1, 2, 3, 4]
    assert produce(kafka_broker, topic, records[5:], batch=True) == list(range(5, 100))
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    p = f"{topic}-0"
    assert source._watermarks(p) == (0, 6)  # the quirk (a fixed Tansu would say 100)
    seen, committed, epochs = [], 0, 0
    while (end := source.end_offsets()[p]) > committed:
        upto = min(end, committed + 7)
        seen += source.read(p, committed, upto).column("amount").to_pylist()
        committed, epochs = upto, epochs + 1
    assert seen == list(range(100)) and epochs == 15
    source.close()
    # The same through the runtime: a live source, 7 events per epoch.
    job = keyed_count_job(1, 1, partitions=1, events_per_epoch=7, name="quirk")
    job.source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    results = JobRunner(job, None, str(tmp_path / "store")).run()
    assert results[-1].source_offsets == {p: 100}
    assert sum(r.events for r in results) == 100 and len(results) == 15


def test_transaction_markers_are_offset_gaps(kafka_broker) -> None:
    topic = new_topic(kafka_broker)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": topic})
    producer.init_transactions(10)
    acked: list[int] = []

    def report(err, msg):
        assert err is None, err
        acked.append(msg.offset())

    def transaction(values):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, key=b"k", value=json.dumps({"amount": v}).encode(),
                             timestamp=BASE_MS + v, on_delivery=report)
        producer.commit_transaction(10)

    transaction([0, 1, 2])                   # offsets 0-2, commit marker 3
    acked += produce(kafka_broker, topic, [json_record(b"k", BASE_MS + 3, {"amount": 3})])  # 4
    transaction([4, 5])                      # offsets 5-6, commit marker 7
    assert acked == [0, 1, 2, 4, 5, 6]
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    p = f"{topic}-0"
    assert source.end_offsets() == {p: 8}
    for start, end, want in [(0, 8, [0, 1, 2, 4, 5, 6]), (0, 4, [0, 1, 2]), (3, 4, []),
                             (3, 5, [4]), (5, 8, [5, 6]), (7, 8, [])]:
        assert source.read(p, start, end).column("_offset").to_pylist() == want, (start, end)
    source.close()


def test_missing_topic_and_undelivered_range_raise_naming_them(kafka_broker) -> None:
    with pytest.raises(KafkaIOError, match="topic 'no-such-topic' not found.*create it"):
        KafkaSource(kafka_broker.bootstrap, "no-such-topic", value_format="bytes").partitions()
    topic = new_topic(kafka_broker)
    produce(kafka_broker, topic, [json_record(b"k", BASE_MS, b"x")])
    source = KafkaSource(kafka_broker.bootstrap, topic, value_format="bytes", timeout_s=0.5)
    with pytest.raises(IndexError, match=f"{topic}-0: offsets \\[0, 3\\) outside \\[0, 1\\]"):
        source.read(f"{topic}-0", 0, 3)
    # A range the broker does not deliver (on Kafka, deleted by retention): named, in time.
    source._final_ends = {f"{topic}-0": 3}
    with pytest.raises(KafkaIOError, match=f"{topic}-0 offsets \\[1, 3\\).*offsets from 1 did not arrive"):
        source.read(f"{topic}-0", 1, 3)
    source.close()


def test_tansu_read_committed_does_not_hide_aborted_records(kafka_broker) -> None:
    """What docs/kafka.md says of Tansu: an aborted transaction's records are read
    under read_committed (Kafka would skip them)."""
    topic = new_topic(kafka_broker)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": topic})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b'{"amount": 1}', timestamp=BASE_MS)
    producer.flush(10)
    producer.abort_transaction(10)
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    p = f"{topic}-0"
    end = source.end_offsets()[p]
    assert source.read(p, 0, end).column("amount").to_pylist() == [1]
    source.close()


def test_bad_records_go_to_dead_letter_table(kafka_broker, tmp_path) -> None:
    topic = new_topic(kafka_broker)
    future = int(time.time() * 1000) + 10 * 86_400_000
    records = [
        json_record(b"a", BASE_MS, {"amount": 1}),
        json_record(b"b", BASE_MS + 1, b"not json"),
        json_record(b"c", BASE_MS + 2, {"amount": "seven"}),
        json_record(b"d", BASE_MS + 3, {"amount": 6.5}),
        json_record(None, BASE_MS + 4, {"amount": 2}),
        json_record(b"e", future, {"amount": 3}),
        json_record(b"a", BASE_MS + 5, {"amount": 4}),
    ]
    produce(kafka_broker, topic, records)
    job = keyed_count_job(1, 1, partitions=1, events_per_epoch=3, name="kafka_dead_letter")
    job.source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT, bounded=True)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    results = runner.run()
    assert results[-1].finished
    dead = job.dead_letter.sink.read(runner.store, job.prefix).sort_by("offset").to_pylist()
    assert [(d["partition"], d["offset"], d["reason"]) for d in dead] == [
        (f"{topic}-0", 1, "unparseable_value"), (f"{topic}-0", 2, "unparseable_value"),
        (f"{topic}-0", 3, "unparseable_value"), (f"{topic}-0", 4, "missing_key"),
        (f"{topic}-0", 5, "timestamp_in_future")]
    assert all(d["source"] == f"kafka:{topic}" for d in dead)
    assert dead[0]["value"] == b"not json" and dead[1]["value"] == b'{"amount": "seven"}'
    assert "field 'amount'" in dead[2]["error"]
    # The good records were counted: key a, amounts 1 and 4, in the window at BASE_MS.
    out = job.sinks["main"].read(runner.store, job.prefix).to_pylist()
    assert out == [{"key": "a", "window_start": BASE_MS, "count": 2, "amount": 5}]


def test_value_formats_key_timestamp_and_headers(kafka_broker) -> None:
    topic = new_topic(kafka_broker)
    produce(kafka_broker, topic, [
        {"key": b"r", "value": b"\xc3\xa9t\xc3\xa9", "timestamp": BASE_MS, "headers": [("trace", b"x1")]},
        {"key": b"r", "value": b"\xff", "timestamp": BASE_MS + 1},
    ])
    p = f"{topic}-0"
    as_bytes = KafkaSource(kafka_broker.bootstrap, topic, value_format="bytes")
    assert as_bytes.read(p, 0, 2).column("value").to_pylist() == [b"\xc3\xa9t\xc3\xa9", b"\xff"]
    as_text = KafkaSource(kafka_broker.bootstrap, topic, value_format="utf8", headers={"trace": "trace"})
    t = as_text.read(p, 0, 2).to_pylist()
    assert [r["value"] for r in t] == ["été", None] and t[1]["_error"].startswith("UnicodeDecodeError")
    assert [r["trace"] for r in t] == [b"x1", None]
    schema = pa.schema([("user", pa.string()), ("at", pa.int64())])
    custom = KafkaSource(kafka_broker.bootstrap, topic, value_schema=schema, key="user", timestamp="at",
                         value_format=lambda v: {"user": v.decode(), "at": 5})
    t = custom.read(p, 0, 2).to_pylist()
    assert (t[0]["key"], t[0]["timestamp"], t[0]["_error"]) == ("été".encode(), 5, None)
    assert t[1]["key"] is None and t[1]["_error"].startswith("UnicodeDecodeError")
    for s in (as_bytes, as_text, custom):
        s.close()
    with pytest.raises(ValueError, match="leave value_schema unset"):
        KafkaSource(kafka_broker.bootstrap, topic, value_format="bytes", value_schema=schema)
    with pytest.raises(ValueError, match="needs a value_schema"):
        KafkaSource(kafka_broker.bootstrap, topic)


# ------------------------------------------------------------------------ jobs
EVENTS, KEYS = 300, 20


def synthetic_topic(broker) -> tuple[str, pd.DataFrame]:
    """A two-partition topic of ``SyntheticSource`` events (a minute apart from
    ``BASE_MS``; in each partition five single records, then one batch: Tansu's
    quirk), and the keyed-count pandas oracle over them."""
    topic = new_topic(broker, partitions=2)
    synthetic = SyntheticSource(EVENTS, KEYS, partitions=2, step_ms=60_000)
    frames = []
    for n, p in enumerate(synthetic.partitions()):
        df = synthetic.full_partition(p).to_pandas()
        df["timestamp"] += BASE_MS
        records = [json_record(k, int(ts), {"amount": int(a)}, partition=n)
                   for k, ts, a in zip(df["key"], df["timestamp"], df["amount"])]
        produce(broker, topic, records[:5])
        produce(broker, topic, records[5:], batch=True)
        frames.append(df)
    df = pd.concat(frames)
    df["window_start"] = df["timestamp"] - df["timestamp"] % HOUR_MS
    df["key"] = df["key"].map(bytes.decode)
    oracle = df.groupby(["key", "window_start"], as_index=False).agg(
        count=("amount", "size"), amount=("amount", "sum")).astype({"count": np.int64, "amount": np.int64})
    return topic, _sorted(oracle)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["key", "window_start"]).reset_index(drop=True)[
        ["key", "window_start", "count", "amount"]]


class RecordingKafkaSource(KafkaSource):
    """Records the ranges read."""

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        self.reads.append((partition, start, end))
        return super().read(partition, start, end)


def kafka_job(broker, topic: str, name: str, sink=None):
    job = keyed_count_job(1, KEYS, partitions=2, step_ms=60_000, events_per_epoch=150, name=name)
    job.source = RecordingKafkaSource(broker.bootstrap, topic, value_schema=AMOUNT, bounded=True)
    job.source.reads = []
    if sink is not None:
        job.sinks["main"] = sink
    return job


def test_job_from_kafka_equals_oracle_and_restart_rereads_committed_offsets(kafka_broker, tmp_path) -> None:
    topic, oracle = synthetic_topic(kafka_broker)
    store = str(tmp_path / "store")
    first = JobRunner(kafka_job(kafka_broker, topic, "kafka_count"), None, store)
    done = first.run(max_epochs=2)
    committed = done[-1].source_offsets
    assert committed == {f"{topic}-0": 150, f"{topic}-1": 150}
    first.close()
    job = kafka_job(kafka_broker, topic, "kafka_count")  # a new driver: a new source object
    second = JobRunner(job, None, store)
    rest = second.run()
    assert rest[-1].finished and rest[-1].source_offsets == {f"{topic}-0": EVENTS, f"{topic}-1": EVENTS}
    # The restart read exactly from the committed offsets, each offset once.
    starts = {}
    for p, start, _ in job.source.reads:
        starts.setdefault(p, start)
    assert starts == committed
    for p in committed:
        ranges = [(s, e) for q, s, e in job.source.reads if q == p]
        assert [s for s, _ in ranges[1:]] == [e for _, e in ranges[:-1]] and ranges[-1][1] == EVENTS
    got = _sorted(job.sinks["main"].read(second.store, job.prefix).to_pandas())
    assert got.equals(oracle)
    second.close()


class CrashAfterProduce(KafkaSink):
    """Produces epoch ``crash_epoch`` and crashes before writing its marker, once."""

    crash_epoch = 2

    def publish_in_tasks(self, store, job_prefix, epoch, staged, map_in_tasks):
        if epoch == self.crash_epoch and not getattr(self, "crashed", False):
            self.crashed = True
            self.produce(store, epoch, staged)
            raise Crash("driver crash between produce and marker")
        return super().publish_in_tasks(store, job_prefix, epoch, staged, map_in_tasks)


def sink_output(sink: KafkaSink, store, prefix: str) -> tuple[pd.DataFrame, int]:
    """The sink's topic, deduplicated, as keyed-count rows (the key from the record key,
    or from the value of a keyless record); and the raw record count."""
    records = sink.read(store, prefix).to_pylist()
    rows = [{**({"key": r["key"].decode()} if r["key"] is not None else {}), **json.loads(r["value"])}
            for r in records]
    return _sorted(pd.DataFrame(rows).astype({"count": np.int64, "amount": np.int64})), len(records)


def raw_count(broker, topic: str) -> int:
    source = KafkaSource(broker.bootstrap, topic, value_format="bytes")
    n = sum(source.read(p, 0, e).num_rows for p, e in source.end_offsets().items())
    source.close()
    return n


@pytest.mark.parametrize("crash,key_column", [("after_commit", "key"), ("after_produce", "key"),
                                              ("after_produce", None)])
def test_sink_exactly_once_after_a_crash(kafka_broker, tmp_path, crash, key_column) -> None:
    """A driver crash after the commit of epoch 2 or after producing it (before its
    marker): the restart publishes epoch 2 again; deduplicated, the topic equals the
    oracle. Keyless records too: their copies land in their first copy's partition."""
    topic, oracle = synthetic_topic(kafka_broker)
    out = new_topic(kafka_broker, partitions=4)
    store = str(tmp_path / "store")
    sink_type = CrashAfterProduce if crash == "after_produce" else KafkaSink

    job = kafka_job(kafka_broker, topic, "kafka_sink", sink_type(
        kafka_broker.bootstrap, out, OUTPUT_SCHEMA, key_column=key_column))
    with crash_at("after_commit", 2) if crash == "after_commit" else contextlib.nullcontext(), \
            pytest.raises(Crash):
        JobRunner(job, None, store).run()
    job = kafka_job(kafka_broker, topic, "kafka_sink", KafkaSink(
        kafka_broker.bootstrap, out, OUTPUT_SCHEMA, key_column=key_column))
    runner = JobRunner(job, None, store)
    assert runner.run()[-1].finished
    got, kept = sink_output(job.sinks["main"], runner.store, job.prefix)
    assert got.equals(oracle)
    raw = raw_count(kafka_broker, out)
    if crash == "after_commit":
        assert raw == kept  # nothing was produced before the crash
    else:
        assert raw > kept  # epoch 2 is in the topic twice; deduplicate dropped the copy
    runner.close()


def test_keyless_epoch_published_again_lands_where_it_did(kafka_broker, tmp_path) -> None:
    """Three ranges' keyless rows of epoch 1, produced twice by crashed publishes (one
    partly) and then published: every copy is in its first copy's partition, at the
    same place in the order of its range's records there, so the topic deduplicated
    holds each row once (the oracle: the staged rows)."""
    out = new_topic(kafka_broker, partitions=4)
    store = open_object_store(str(tmp_path / "store"))
    sink = KafkaSink(kafka_broker.bootstrap, out, OUTPUT_SCHEMA)
    staged, rows = [], []
    for r, label in enumerate(["kg-0000-0004", "kg-0005-0009", "kg-0010-0015"]):
        n = 40 + 7 * r
        t = pa.table({"key": [f"{label}/{i}" for i in range(n)], "window_start": [BASE_MS] * n,
                      "count": list(range(n)), "amount": [r] * n}, schema=OUTPUT_SCHEMA)
        staged.append(sink.write_staged(store, staging_prefix("jobs/k", 1, "main", label, "a1"), t))
        rows += t.to_pylist()
    assert sink.produce(store, 1, staged[1:]) == 47 + 54       # a crashed attempt: two ranges
    assert sink.produce(store, 1, staged) == len(rows)         # a crashed attempt: all of them
    assert sink.publish(store, "jobs/k", 1, staged) == [f"kafka://{kafka_broker.bootstrap}/{out}#epoch=1"]
    assert raw_count(kafka_broker, out) == 2 * len(rows) + 47 + 54
    got = sink.read(store, "jobs/k").to_pylist()
    assert sorted(json.loads(r["value"])["key"] for r in got) == sorted(r["key"] for r in rows)
    assert {r["partition"] for r in got} == {0, 1, 2, 3}     # spread over the partitions
    assert all(r["key"] is None for r in got)


def test_deduplicate_keeps_the_first_copy_of_each_record() -> None:
    def rec(p, e, r, s):
        return {"partition": p, "epoch": e, "range": r, "seq": s}
    # Epoch 2 of range a was produced partly (seq 0 and 2, not 1, in partition 0), then
    # again in full; a copy of epoch 1 after epoch 2 is a duplicate too.
    stream = [rec(0, 1, "a", 0), rec(0, 2, "a", 0), rec(0, 2, "a", 2), rec(0, 2, "a", 0),
              rec(0, 2, "a", 1), rec(0, 2, "a", 2), rec(0, 2, "a", 3), rec(0, 2, "b", 0),
              rec(1, 2, "a", 1), rec(0, 1, "a", 0), rec(0, 3, "a", 0),
              {"partition": 0, "epoch": None, "range": None, "seq": None}]
    kept = list(deduplicate(stream))
    assert kept == [stream[i] for i in (0, 1, 2, 4, 6, 7, 8, 10, 11)]


def test_broker_command_line_start_status_stop(tmp_path) -> None:
    """``platform/kafka-broker.sh`` runs this module: start prints the bootstrap
    address, status finds the broker, stop ends its process."""
    import subprocess
    import sys

    from dkvstream.storage.local_server import pid_alive

    def cli(action):
        return subprocess.run([sys.executable, "-m", "dkvstream.operators.io.kafka_broker", action,
                               "--dir", str(tmp_path)], check=False, capture_output=True, text=True,
                              timeout=60)

    started = cli("start")
    info = json.loads((tmp_path / "broker.json").read_text())
    try:
        assert started.returncode == 0 and started.stdout.strip() == info["bootstrap"]
        assert AdminClient({"bootstrap.servers": info["bootstrap"]}).list_topics(timeout=10) is not None
        status = cli("status")
        assert status.returncode == 0 and status.stdout.strip() == info["bootstrap"]
    finally:
        assert cli("stop").returncode == 0
    assert not pid_alive(info["pid"])
    assert cli("status").returncode == 1


def test_sink_produces_in_tasks_on_spark(kafka_broker, tmp_path, spark, monkeypatch) -> None:
    """On Spark the sink's records are produced by tasks, never by the driver (its own
    ``produce`` raises here; the tasks' copies are the real one); the topic, deduplicated,
    equals the oracle."""
    topic, oracle = synthetic_topic(kafka_broker)
    out = new_topic(kafka_broker, partitions=2)
    sink = KafkaSink(kafka_broker.bootstrap, out, OUTPUT_SCHEMA, key_column="key")

    def not_in_the_driver(*args, **kwargs):
        raise AssertionError("the driver produced records")

    job = kafka_job(kafka_broker, topic, "kafka_sink_tasks", sink=sink)
    job.source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT, bounded=True)
    monkeypatch.setattr(KafkaSink, "produce", not_in_the_driver)
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    results = runner.run()
    monkeypatch.undo()
    assert results[-1].finished
    got, _ = sink_output(sink, runner.store, job.prefix)
    assert got.equals(oracle)


def test_end_offsets_read_one_record_per_partition_at_most(kafka_broker, monkeypatch) -> None:
    """The driver's end offsets come from ListOffsets; the end probe (module docstring)
    fetches from the last record only, whatever the partition holds. It runs at the
    source's first call, then only once a partition's ListOffsets answer stops moving:
    while records arrive an unbounded source takes ListOffsets' answer (every offset
    below it readable), the next call with nothing new finds the exact end, and later
    ones probe no more."""
    topic = new_topic(kafka_broker, partitions=2)
    records = [json_record(b"k", BASE_MS + i, {"amount": i}, partition=i % 2) for i in range(120)]
    produce(kafka_broker, topic, records[:60])
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    probed: list[dict] = []
    real = source._probe_ends

    def probe(starts):
        if starts:  # an empty request fetches nothing
            probed.append(dict(starts))
        return real(starts)
    monkeypatch.setattr(source, "_probe_ends", probe)
    ends = source.end_offsets()
    assert ends == {f"{topic}-0": 30, f"{topic}-1": 30} and len(probed) == 1
    assert all(ends[p] - start <= 1 for p, start in probed[0].items()), probed
    produce(kafka_broker, topic, records[60:])
    moving = source.end_offsets()
    assert len(probed) == 1, "a moving ListOffsets answer needs no probe"
    assert all(30 < moving[p] <= 60 for p in ends), moving
    exact = {f"{topic}-0": 60, f"{topic}-1": 60}
    assert source.end_offsets() == exact and len(probed) == 2
    assert all(exact[p] - start <= 1 for p, start in probed[1].items()), probed
    assert source.end_offsets() == exact and len(probed) == 2, "nothing new: no other probe"
    assert source.value_schema.names == ["amount"]
    source.close()


class CountingConsumer:
    """A consumer that counts its ``assign`` calls (confluent_kafka's type is sealed)."""

    def __init__(self, consumer) -> None:
        self._consumer, self.assigns = consumer, 0

    def assign(self, partitions) -> None:
        self.assigns += 1
        self._consumer.assign(partitions)

    def __getattr__(self, name):
        return getattr(self._consumer, name)


@pytest.mark.parametrize("pooled", [False, True])
def test_reads_continue_without_assigning_again(kafka_broker, monkeypatch, pooled) -> None:
    """A read from where the partition's previous read ended takes the prefetched records
    without a new assignment; a read from anywhere else (a rerun epoch, a restart)
    assigns again. Every read returns exactly its offsets (the oracle: the records
    produced), also when records arrive between reads, in the driver's source and in a
    read task's copy (its worker's readers)."""
    import dkvstream.operators.io.kafka as kafka

    topic = new_topic(kafka_broker, partitions=2)
    records = [json_record(b"k%d" % i, BASE_MS + i, {"amount": i}, partition=i % 2) for i in range(200)]
    produce(kafka_broker, topic, records[:100])
    counters: list[CountingConsumer] = []
    real_init = kafka._PartitionReader.__init__

    def counting_init(self, consumer):
        real_init(self, CountingConsumer(consumer))
        counters.append(self.consumer)
    monkeypatch.setattr(kafka._PartitionReader, "__init__", counting_init)
    source = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    if pooled:
        source = pickle.loads(pickle.dumps(source))
    p0, p1 = f"{topic}-0", f"{topic}-1"

    def amounts(p, start, end):
        return source.read(p, start, end).column("amount").to_pylist()
    want = {p0: [i for i in range(200) if i % 2 == 0], p1: [i for i in range(200) if i % 2 == 1]}
    assert amounts(p0, 0, 20) == want[p0][0:20]
    assert amounts(p1, 0, 30) == want[p1][0:30]
    assert amounts(p0, 20, 50) == want[p0][20:50]
    assert amounts(p1, 30, 50) == want[p1][30:50]
    assert sorted(c.assigns for c in counters) == [1, 1], "continuing reads assign once per partition"
    produce(kafka_broker, topic, records[100:])
    source.end_offsets()
    assert amounts(p0, 50, 100) == want[p0][50:100]
    assert sum(c.assigns for c in counters) == 2
    assert amounts(p0, 10, 60) == want[p0][10:60]  # a rerun from an earlier offset
    assert amounts(p0, 60, 100) == want[p0][60:100]
    assert sum(c.assigns for c in counters) == 3
    source.close()
    kafka._close_task_consumers()


def test_a_read_task_trusts_the_planned_ends(kafka_broker, monkeypatch) -> None:
    """A read task's copy of the source (pickled after the driver's plan) reads the
    planned ranges without asking the broker for the ends again: no ListOffsets, no end
    probe per task and epoch. A range beyond what the driver found still asks."""
    topic = new_topic(kafka_broker, partitions=2)
    produce(kafka_broker, topic, [json_record(b"k", BASE_MS + i, {"amount": i}, partition=i % 2)
                                  for i in range(40)])
    driver = KafkaSource(kafka_broker.bootstrap, topic, value_schema=AMOUNT)
    ends = driver.end_offsets()
    task = pickle.loads(pickle.dumps(driver))
    asked: list[str] = []
    real = task._watermarks

    def watermarks(p):
        asked.append(p)
        return real(p)
    monkeypatch.setattr(task, "_watermarks", watermarks)
    for p, end in ends.items():
        assert task.read(p, 0, end).column("amount").to_pylist() == list(range(int(p[-1]), 40, 2))
    assert asked == [], "a read within the planned ends asks the broker nothing"
    with pytest.raises(IndexError, match="outside"):
        task.read(f"{topic}-0", 0, ends[f"{topic}-0"] + 5)
    assert asked, "a range beyond the planned ends asks"
    task.close()
    driver.close()
    import dkvstream.operators.io.kafka as kafka
    kafka._close_task_consumers()
