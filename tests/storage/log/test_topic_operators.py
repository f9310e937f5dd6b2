"""A job reading a topic and writing a topic: exactly-once across driver crashes,
in-process and on Spark, checked against a pandas oracle."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from operators.api.codecs import IntCodec
from operators.api.job import Job
from operators.api.operator import KeyedEvent, Operator, Subject
from operators.api.state import ValueSpec
from operators.io.topics import TopicSink, TopicSource
from operators.runtime.driver import JobRunner
from storage.log import COMPACT, Log, TopicConfig
from storage.objectstore import open_object_store
from tests.operators.test_restart import Crash, crash_at

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
    with pytest.raises(Crash):
        JobRunner(make_job(root), None, root, failpoint=crash_at(point, epoch)).run()
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
    with pytest.raises(Crash):  # two epochs of 300 events, a crash before publishing the first
        JobRunner(make_job(root, 300), spark, root, failpoint=crash_at("after_commit", 1)).run()
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
    log = Log(open_object_store(root))
    log.create_topic("compacted", TopicConfig(cleanup_policy=COMPACT))
    with pytest.raises(ValueError, match="compacted"):
        TopicSource(root, "compacted")
