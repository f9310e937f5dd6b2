"""A compacted topic as a live job source: slices hold the records that survived the
cleaner, with their offsets (``_offset``) and append times (``_ingest_time``). Oracle: a
dict model of compaction (the latest record of every key, tombstones included while
``delete.retention.ms`` keeps them) and the times around each flush."""
from __future__ import annotations

import json
import time

import pandas as pd
import pyarrow as pa

from dkvstream.operators.api.columns import INGEST_TIME_COLUMN, OFFSET_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.topics import TopicSource
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.log import COMPACT, Log, TopicConfig
from dkvstream.storage.objectstore import open_object_store

SCHEMA = pa.schema([("amount", pa.int64())])
OUT = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("amount", pa.int64())])


class Echo(Operator):
    """Every event: key, timestamp and amount (null for a tombstone)."""

    name = "echo"
    outputs = {"main": OUT}  # noqa: RUF012 - the Operator API's class attribute

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        subject.emit({"key": subject.key.decode(), "ts": event.timestamp, "amount": event.value["amount"]})


class Model:
    """The topic per partition as a dict offset -> (key, timestamp, amount or None) of
    the records present: a flush adds its records; a cleaning of everything up to the
    end keeps the latest record of every key there (tombstones too: the topic keeps them
    a day). Also each record's append-time bounds (the clock around its flush)."""

    def __init__(self, log: Log) -> None:
        self.log, self.prod = log, log.producer()
        self.present: dict[int, dict[int, tuple[str, int, int | None]]] = {0: {}, 1: {}}
        self.appended: dict[tuple[int, int], tuple[int, int]] = {}  # (partition, offset) -> (lo, hi) ms
        self.ts = 1_000

    def flush(self, records: list[tuple[int, str, int | None]]) -> None:
        """Appends ``(partition, key, amount or None for a tombstone)`` in one flush."""
        for part, key, amount in records:
            value = None if amount is None else json.dumps({"amount": amount}).encode()
            self.prod.send("c", key.encode(), value, partition=part, timestamp=self.ts)
            self.ts += 1
        lo = int(time.time() * 1000)
        first = {p: a for (_, p), (a, _) in self.prod.flush().items()}
        hi = int(time.time() * 1000)
        ts = self.ts - len(records)
        for part, key, amount in records:
            self.present[part][first[part]] = (key, ts, amount)
            self.appended[(part, first[part])] = (lo, hi)
            first[part] += 1
            ts += 1

    def clean(self) -> None:
        """Cleans the topic (every record is cleanable) and the model alike."""
        self.log.clean()
        for part, records in self.present.items():
            latest = {key: off for off, (key, _, _) in sorted(records.items())}
            self.present[part] = {off: records[off] for off in latest.values()}

    def rows(self, from_offsets: dict[int, int] | None = None) -> pd.DataFrame:
        """The records present at offsets >= ``from_offsets[partition]``, as the job's rows."""
        rows = [{"key": k, "ts": ts, "amount": amount}
                for part, records in self.present.items() for off, (k, ts, amount) in records.items()
                if off >= (from_offsets or {}).get(part, 0)]
        return _sorted(pd.DataFrame(rows, columns=OUT.names))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("ts").reset_index(drop=True).astype({"amount": "Int64"})


def _topic(root: str) -> Log:
    log = Log(open_object_store(root))
    log.create_topic("c", TopicConfig(partitions=2, cleanup_policy=COMPACT, min_cleanable_dirty_ratio=0.0))
    return log


def _job(root: str) -> Job:
    return Job(name="compacted", source=TopicSource(root, "c", value_schema=SCHEMA, bounded=False),
               operators=[Echo()], sinks={"main": ParquetSink("echo", OUT)},
               key_groups=8, parallelism=2, events_per_epoch=7)


def _overwrites(round_: int, keys: int) -> list[tuple[int, str, int | None]]:
    """One record per key (a tombstone for every fifth key in odd rounds)."""
    return [(i % 2, f"k{i}", None if round_ % 2 and i % 5 == 0 else 100 * round_ + i) for i in range(keys)]


def test_compacted_topic_as_a_live_source_gives_the_surviving_records(tmp_path) -> None:
    root = str(tmp_path / "store")
    log = _topic(root)
    model = Model(log)
    for r in range(4):
        model.flush(_overwrites(r, 20))
    model.clean()
    assert sum(len(p) for p in model.present.values()) == 20
    runner = JobRunner(_job(root), None, root)
    first = runner.run()
    assert len(first) > 1 and all(not r.finished for r in first)
    got = job_rows(runner)
    pd.testing.assert_frame_equal(got, model.rows())
    ends = {int(p.rsplit("-", 1)[1]): o for p, o in runner.latest().source_offsets.items()}
    assert ends == dict(enumerate(log.end_offsets("c")))

    # More overwrites and new keys, cleaned again before the next run: it reads the
    # survivors after the offsets the first run committed.
    model.flush(_overwrites(5, 30))
    model.flush([(0, "k0", 7), (1, "k1", 8), (0, "k2", None)])
    model.clean()
    runner = JobRunner(_job(root), None, root)
    assert runner.run()
    expected = _sorted(pd.concat([got, model.rows(ends)]))
    pd.testing.assert_frame_equal(job_rows(runner), expected)


def job_rows(runner: JobRunner) -> pd.DataFrame:
    return _sorted(runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas()[OUT.names])


def test_read_returns_survivors_with_offsets_and_append_times(tmp_path) -> None:
    """Slices read after a cleaning and two more flushes: the cleaned survivors (null
    append time), then every later record (the append time of its flush), with the gaps
    in ``_offset``."""
    root = str(tmp_path / "store")
    log = _topic(root)
    model = Model(log)
    for r in range(3):
        model.flush(_overwrites(r, 10))
    model.clean()
    model.flush(_overwrites(3, 10))
    model.flush([(0, "k0", 1), (0, "k2", 2)])
    source = TopicSource(root, "c", value_schema=SCHEMA)
    cleaned_to = log.metadata().partition("c", 0).cleaned_to
    end = log.end_offsets("c")[0]
    present = model.present[0]
    assert 0 < len([o for o in present if o < cleaned_to]) < cleaned_to  # gaps in the cleaned section
    for start, stop in [(0, end), (3, end - 2), (cleaned_to - 1, cleaned_to + 3), (end, end), (1, 2)]:
        t = source.read("c-0", start, stop)
        want = sorted(off for off in present if start <= off < stop)
        assert t.column(OFFSET_COLUMN).to_pylist() == want
        assert t.column("key").to_pylist() == [present[o][0].encode() for o in want]
        assert t.column("amount").to_pylist() == [present[o][2] for o in want]
        for off, ingest in zip(want, t.column(INGEST_TIME_COLUMN).to_pylist()):
            if off < cleaned_to:
                assert ingest is None
            else:
                lo, hi = model.appended[(0, off)]
                assert lo <= ingest <= hi, (off, ingest, lo, hi)
