"""A running count initialised by bootstrap, its input, and the pandas oracle of its
output; and an operator declaring a state of each kind, for the state writer's round
trips. In an importable module so that Spark tasks can unpickle the operators."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from dkvstream.operators.api.codecs import FloatCodec, IntCodec, JsonCodec, RecordCodec, StrCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ListSpec, MapSpec, StateTtl, ValueSpec
from dkvstream.operators.io.sinks import ParquetSink
from tests.operators.table_sources import TableSource

OUTPUT = pa.schema([("key", pa.string()), ("timestamp", pa.int64()), ("count", pa.int64()),
                    ("kind", pa.string())])
KEYS = [f"k{i}" for i in range(12)]


class RunningCount(Operator):
    """Per key: the number of events so far, counted on from the bootstrapped ``count``;
    each event emits it. A timer (only bootstrapped ones) emits a ``timer`` row."""

    name = "running_count"
    outputs = {"main": OUTPUT}
    count = ValueSpec(IntCodec())

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        count = self.count.state_for(subject)
        n = count.get(0) + 1
        count.set(n)
        subject.emit({"key": subject.key.decode(), "timestamp": event.timestamp, "count": n, "kind": "event"})

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        subject.emit({"key": subject.key.decode(), "timestamp": timestamp, "count": None, "kind": "timer"})


REC = RecordCodec({"n": pa.int64(), "name": pa.string()})


class EveryKind(Operator):
    """Declares a state of each kind (never runs: the round trips only write and read)."""

    name = "every_kind"
    outputs = {"main": OUTPUT}
    total = ValueSpec(IntCodec())
    record = ValueSpec(REC)
    doc = ValueSpec(JsonCodec())
    names = ListSpec(StrCodec())
    scores = MapSpec(IntCodec(), FloatCodec())
    recent = ValueSpec(IntCodec(), ttl=StateTtl(60_000))
    seen = MapSpec(StrCodec(), IntCodec(), ttl=StateTtl(5_000, time="processing"))

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:  # pragma: no cover - never run
        pass


def source(events: int = 400, partitions: int = 2, seed: int = 7) -> TableSource:
    """``events`` per partition, timestamps rising by 1..5 ms; partition p holds the keys
    ``KEYS[p::partitions]`` only, so each key's events are counted in offset order
    whatever the epochs' cuts (the oracle's order)."""
    import random

    rng = random.Random(seed)
    tables = {}
    for p in range(partitions):
        ts, keys, stamps = 0, [], []
        for _ in range(events):
            ts += rng.randint(1, 5)
            keys.append(rng.choice(KEYS[p::partitions]).encode())
            stamps.append(ts)
        tables[f"p{p}"] = pa.table({"key": pa.array(keys, pa.binary()), "timestamp": pa.array(stamps, pa.int64())})
    return TableSource("counts", tables)


def count_job(name: str = "boot_count", parallelism: int = 2, events_per_epoch: int = 200) -> Job:
    """The running-count job over ``source()``, 16 key groups."""
    return Job(name=name, source=source(), operators=[RunningCount()], sinks={"main": ParquetSink("counts", OUTPUT)},
               key_groups=16, parallelism=parallelism, events_per_epoch=events_per_epoch)


def every_kind_job(name: str = "boot_kinds", parallelism: int = 3) -> Job:
    return Job(name=name, source=source(1, 1), operators=[EveryKind()],
               sinks={"main": ParquetSink("kinds", OUTPUT)}, key_groups=32, parallelism=parallelism)


def count_oracle(src: TableSource, initial: dict[str, int], timers: dict[str, list[int]] | None = None
                 ) -> pd.DataFrame:
    """What ``RunningCount`` emits from ``initial`` counts: per event, its key's count
    (each key's events in offset order: ``source`` keeps a key in one partition), and
    one row per timer;
    sorted by (kind, key, timestamp, count)."""
    frames = []
    for i, (_, t) in enumerate(src.tables.items()):
        df = t.to_pandas()
        df["part"], df["offset"] = i, range(len(df))
        frames.append(df)
    ev = pd.concat(frames).sort_values(["part", "offset"])
    ev["key"] = ev["key"].map(bytes.decode)
    ev["count"] = ev.groupby("key").cumcount() + 1 + ev["key"].map(lambda k: initial.get(k, 0))
    out = ev[["key", "timestamp", "count"]].assign(kind="event")
    rows = [{"key": k, "timestamp": ts, "count": None, "kind": "timer"}
            for k, stamps in (timers or {}).items() for ts in stamps]
    if rows:
        out = pd.concat([out, pd.DataFrame(rows)])
    return sort_output(out)


def sort_output(df: pd.DataFrame) -> pd.DataFrame:
    df = df[["key", "timestamp", "count", "kind"]].copy()
    df["count"] = df["count"].astype("Int64")
    df["timestamp"] = df["timestamp"].astype("int64")
    return df.sort_values(["kind", "key", "timestamp", "count"]).reset_index(drop=True)
