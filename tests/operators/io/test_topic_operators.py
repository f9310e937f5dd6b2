"""A job reading a topic and writing a topic: exactly-once across driver crashes,
in-process and on Spark, checked against a pandas oracle."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.topics import TopicSink, TopicSource
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.log import COMPACT, Log, TopicConfig
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at

EVENTS = 600


class RunningTotal(Operator):
    """Per key: the running count and amount total, emitted with every event."""

    name = "running_total"
    outputs = {"main": pa.schema([("key", pa.string()), ("seq", pa.int64()), ("amount", pa.int64()),
                                  ("total", pa.int64()), ("ts", pa.int64())])}
    count = ValueSpec(IntCodec())
    total = ValueSpec(IntCodec())

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        n = (self.count.state_for(subject).get() or 0) + 1
        t = (self.total.state_for(subject).get() or 0) + event.value["amount"]
        self.count.state_for(subject).set(n)
        self.total.state_for(subject).set(t)
        subject.emit({"key": subject.key.decode(), "seq": n, "amount": event.value["amount"], "total": t,
                      "ts": event.timestamp})


def make_input(root: str) -> pd.DataFrame:
    log = Log(open_object_store(root))
    log.create_topic("in", TopicConfig(partitions=3))
    log.create_topic("out", TopicConfig(partitions=2))
    prod = log.producer()
    rows = []
    for i in range(EVENTS):
        key, amount = f"k{(i * 7) % 23}", i % 11
        prod.send("in", key.encode(), json.dumps({"amount": amount}).encode(), timestamp=1_000 * i)
        rows.append((key, amount, 1_000 * i))
        if i % 97 == 0:
            prod.flush()
    prod.flush()
    return pd.DataFrame(rows, columns=["key", "amount", "ts"])


def oracle(inp: pd.DataFrame) -> pd.DataFrame:
    df = inp.sort_values("ts").copy()
    df["seq"] = df.groupby("key").cumcount() + 1
    df["total"] = df.groupby("key")["amount"].cumsum()
    return df[["key", "seq", "amount", "total", "ts"]].sort_values(["key", "seq"]).reset_index(drop=True)


def make_job(root: str, events_per_epoch: int = 120) -> Job:
    source = TopicSource(root, "in", value_schema=pa.schema([("amount", pa.int64())]), bounded=True)
    return Job(name="topics", source=source, operators=[RunningTotal()],
               sinks={"main": TopicSink("out", timestamp_column="ts")},
               key_groups=16, parallelism=2, events_per_epoch=events_per_epoch)


def output(root: str) -> pd.DataFrame:
    table = TopicSink("out").read(open_object_store(root), "jobs/topics")
    rows = [{"key": k.decode(), **json.loads(v)} for k, v in zip(table.column("key").to_pylist(),
                                                                table.column("value").to_pylist())]
    df = pd.DataFrame(rows, columns=["key", "seq", "amount", "total", "ts"])
    return df.sort_values(["key", "seq"]).reset_index(drop=True)


@pytest.mark.parametrize("point,epoch", [("after_commit", 2), ("after_tasks", 3)])
def test_topic_to_topic_exactly_once_across_a_crash(tmp_path, point, epoch) -> None:
    root = str(tmp_path / "store")
    expected = oracle(make_input(root))
    with crash_at(point, epoch), pytest.raises(Crash):
        JobRunner(make_job(root), None, root).run()
    visible = len(output(root))
    # an unpublished epoch is invisible: only the epochs before the crashed one are out
    assert visible == (epoch - 1) * 120
    JobRunner(make_job(root), None, root).run()
    got = output(root)
    assert not got.duplicated(["key", "seq"]).any()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    # publishing the newest checkpoint again adds nothing
    JobRunner(make_job(root), None, root).run()
    assert len(output(root)) == EVENTS


def test_topic_to_topic_on_spark(spark, tmp_path) -> None:
    import sys

    from pyspark import cloudpickle

    # This module is not importable in Spark's Python workers: ship its classes by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    root = str(tmp_path / "store")
    expected = oracle(make_input(root))
    # Two epochs of 300 events, a crash before publishing the first.
    with crash_at("after_commit", 1), pytest.raises(Crash):
        JobRunner(make_job(root, 300), spark, root).run()
    assert len(output(root)) == 0
    JobRunner(make_job(root, 300), spark, root).run()
    pd.testing.assert_frame_equal(output(root), expected, check_dtype=False)


def test_source_offsets_are_topic_offsets(tmp_path) -> None:
    root = str(tmp_path / "store")
    make_input(root)
    runner = JobRunner(make_job(root), None, root)
    runner.run(max_epochs=2)
    offsets = runner.latest().source_offsets
    assert sum(offsets.values()) == 240 and set(offsets) == {"in-0", "in-1", "in-2"}


# -- values a value_schema cannot represent are dead letters ---------------------------------

VALUE_SCHEMA = pa.schema([("amount", pa.int64()), ("price", pa.float64()), ("ratio", pa.float32()),
                          ("flag", pa.bool_())])
BASE_MS = 1_700_000_000_000


def _value(amount="1", price="1.5", ratio="0.5", flag="true") -> bytes:
    """A raw JSON value, each field as written."""
    return (f'{{"amount": {amount}, "price": {price}, "ratio": {ratio}, "flag": {flag}}}').encode()


# offset -> (raw value, the column its error names); every other offset holds a good value.
UNREPRESENTABLE = {
    3: (_value(price="true"), "price"),            # a bool is no number: was 1.0
    5: (_value(amount="6.5"), "amount"),           # was truncated to 6
    7: (_value(amount="6.0"), "amount"),           # a float literal in an int column: was 6
    9: (_value(price="NaN"), "price"),             # not JSON, though Python reads it
    11: (_value(price="1e400"), "price"),          # overflows to inf
    13: (_value(price="-Infinity"), "price"),
    15: (_value(ratio="1e39"), "ratio"),           # inf as float32
    17: (_value(flag="1"), "flag"),                # refused before too
    19: (_value(amount="false"), "amount"),        # refused before too
    21: (_value(price="9007199254740993"), "price"),  # > 2**53: refused before too
}


def _good_value(i: int) -> dict:
    # price as a JSON integer on even offsets: an int a float64 holds exactly is fine
    return {"amount": i, "price": i if i % 2 == 0 else i + 0.25, "ratio": 0.5, "flag": i % 3 == 0}


class Echo(Operator):
    """Every event with its value columns."""

    name = "echo"
    outputs = {"main": pa.schema([("key", pa.string()), ("ts", pa.int64()), *VALUE_SCHEMA])}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        subject.emit({"key": subject.key.decode(), "ts": event.timestamp, **event.value})


def test_values_the_schema_cannot_represent_are_dead_letters(tmp_path) -> None:
    """Before: true became 1.0, 6.5 and 6.0 became 6, NaN, 1e400 and -Infinity became NaN
    or infinity, 1e39 became inf as float32; all reached the operator."""
    from dkvstream.operators.io.sinks import ParquetSink

    root = str(tmp_path / "store")
    log = Log(open_object_store(root))
    log.create_topic("in", TopicConfig(partitions=1))
    prod = log.producer()
    good = []
    for i in range(30):
        key, ts = f"k{i % 4}", BASE_MS + 1_000 * i
        if i in UNREPRESENTABLE:
            prod.send("in", key.encode(), UNREPRESENTABLE[i][0], timestamp=ts)
        else:
            prod.send("in", key.encode(), json.dumps(_good_value(i)).encode(), timestamp=ts)
            good.append({"key": key, "ts": ts, **_good_value(i)})
    prod.flush()
    source = TopicSource(root, "in", value_schema=VALUE_SCHEMA, bounded=True)
    job = Job(name="repr", source=source, operators=[Echo()],
              sinks={"main": ParquetSink("echo", Echo.outputs["main"])},
              key_groups=8, parallelism=2, events_per_epoch=12)
    runner = JobRunner(job, None, root)
    runner.run()

    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pandas()
    dead = dead.set_index("offset").sort_index()
    assert list(dead.index) == sorted(UNREPRESENTABLE)
    assert set(dead["reason"]) == {"unparseable_value"}
    assert dict(zip(dead.index, dead["value"])) == {i: v for i, (v, _) in UNREPRESENTABLE.items()}
    for i, (_, column) in UNREPRESENTABLE.items():
        assert dead.loc[i, "error"].startswith(f"field {column!r}: "), (i, dead.loc[i, "error"])

    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    got = got.sort_values("ts").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pd.DataFrame(good), check_dtype=False)


def test_decode_json_values_strictness() -> None:
    from dkvstream.operators.io.topics import decode_json_values

    raw = [v for v, _ in UNREPRESENTABLE.values()]
    raw += [json.dumps(_good_value(4)).encode(), b'{"amount": null}', b'{"price": 2}', b"[1]"]
    columns, errors = decode_json_values(raw, VALUE_SCHEMA)
    n = len(UNREPRESENTABLE)
    errs = errors.to_pylist()
    assert [e.split(":")[0] for e in errs[:n]] == [f"field {c!r}"
                                                   for _, c in UNREPRESENTABLE.values()]
    assert errs[n:n + 3] == [None, None, None]
    assert errs[n + 3].startswith("ValueError: value is a JSON list")
    assert {c: a.to_pylist()[n:] for c, a in columns.items()} == {
        "amount": [4, None, None, None], "price": [4.0, None, 2.0, None],
        "ratio": [0.5, None, None, None], "flag": [False, None, None, None]}
    assert all(a.null_count >= n for a in columns.values())  # a bad row keeps no value


# -- a keyless sink into a compacted topic ---------------------------------------------------

class MaybeKeyed(RunningTotal):
    """``RunningTotal`` with an ``owner`` column: null where the amount is 0."""

    outputs = {"main": pa.schema([*RunningTotal.outputs["main"], ("owner", pa.string())])}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        n = (self.count.state_for(subject).get() or 0) + 1
        t = (self.total.state_for(subject).get() or 0) + event.value["amount"]
        self.count.state_for(subject).set(n)
        self.total.state_for(subject).set(t)
        key, amount = subject.key.decode(), event.value["amount"]
        subject.emit({"key": key, "seq": n, "amount": amount, "total": t, "ts": event.timestamp,
                      "owner": None if amount == 0 else key})


@pytest.mark.parametrize("key_column,operator", [(None, RunningTotal), ("owner", MaybeKeyed)],
                         ids=["key_column=None", "null-keys"])
def test_keyless_records_into_a_compacted_topic_are_refused(tmp_path, key_column, operator) -> None:
    """Before: accepted; the log cleaner then kept one null-keyed record per partition."""
    from dkvstream.operators.errors import JobFailedError

    root = str(tmp_path / "store")
    make_input(root)
    Log(open_object_store(root)).create_topic("compacted",
                                              TopicConfig(partitions=2, cleanup_policy=COMPACT))
    job = make_job(root)
    job.operators = [operator()]
    job.sinks = {"main": TopicSink("compacted", key_column=key_column, timestamp_column="ts")}
    runner = JobRunner(job, None, root)
    with pytest.raises(JobFailedError, match=r"topic 'compacted' is compacted.* (key_column=None|"
                                             r"null in column 'owner').* give every record a key"):
        runner.run()
    assert runner.latest() is None
    assert Log(open_object_store(root)).end_offsets("compacted") == [0, 0]  # nothing written


def test_keyless_records_into_a_plain_topic_are_spread(tmp_path) -> None:
    root = str(tmp_path / "store")
    expected = oracle(make_input(root))
    job = make_job(root)
    job.sinks = {"main": TopicSink("out", key_column=None, timestamp_column="ts")}
    JobRunner(job, None, root).run()
    table = TopicSink("out").read(open_object_store(root), "jobs/topics")
    assert set(table.column("key").to_pylist()) == {None}
    assert set(table.column("partition").to_pylist()) == {0, 1}  # round-robin over both
    got = pd.DataFrame([json.loads(v) for v in table.column("value").to_pylist()])
    got = got.sort_values(["key", "seq"]).reset_index(drop=True)[expected.columns]
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_prepare_and_publish_refuse_keyless_records_for_a_compacted_topic(tmp_path) -> None:
    """The driver's checks before the commit and before the log append: a topic made
    compacted after the tasks ran still gets no keyless record."""
    from dkvstream.storage.log.errors import InvalidRecordError

    store = open_object_store(str(tmp_path / "store"))
    log = Log(store)
    log.create_topic("compacted", TopicConfig(partitions=2, cleanup_policy=COMPACT))
    sink = TopicSink("compacted", key_column=None)
    with pytest.raises(InvalidRecordError, match="give every record a key"):
        sink.prepare(store, "jobs/j", 1, [])
    with pytest.raises(InvalidRecordError, match="give every record a key"):
        sink.publish(store, "jobs/j", 1, [])
    assert sink.producer_id("jobs/j") not in log.metadata().producers  # nothing committed
    TopicSink("compacted").prepare(store, "jobs/j", 1, [])  # keyed: fine


def test_end_offsets_and_schema_read_no_record(tmp_path, monkeypatch) -> None:
    """What the driver asks of a topic source each epoch comes from the log's metadata:
    no segment file (``files/``) is read for it."""
    from dkvstream.storage.objectstore.local import LocalObjectStore

    root = str(tmp_path)
    make_input(root)
    source = TopicSource(root, "in", value_schema=pa.schema([("amount", pa.int64())]), bounded=True)
    reads: list[str] = []
    for name in ("get", "get_range", "get_range_immutable"):
        real = getattr(LocalObjectStore, name)

        def watched(self, key, *args, _real=real):
            reads.append(key)
            return _real(self, key, *args)
        monkeypatch.setattr(LocalObjectStore, name, watched)
    ends = source.end_offsets()
    assert sum(ends.values()) == EVENTS
    assert source.value_schema.names == ["amount"]
    assert not [k for k in reads if "/files/" in k], reads
