"""The README's first job (a running maximum per key over six events in memory) as a
self-contained module, for tests that run it in a fresh interpreter or copy it into a
project of their own: it imports only ``dkvstream`` and pyarrow, never ``tests``.
``running_maxima`` is its pandas oracle."""
from __future__ import annotations

import pyarrow as pa

from dkvstream import IntCodec, Job, Operator, ParquetSink, Source, ValueSpec

EVENTS = pa.table({"key": [b"a", b"b", b"a", b"c", b"a", b"b"], "amount": [5, 7, 2, 9, 8, 1],
                   "timestamp": [1_000, 2_000, 3_000, 4_000, 5_000, 6_000]})  # ms since 1970, UTC


class TableSource(Source):
    """One partition, ``p0``, holding the rows of ``EVENTS``."""

    name = "events"
    value_schema = pa.schema([("amount", pa.int64())])

    def partitions(self):
        return ["p0"]

    def end_offsets(self):
        return {"p0": EVENTS.num_rows}

    def read(self, partition, start, end):
        return EVENTS.slice(start, end - start)


class RunningMax(Operator):
    """Per key: emits each new maximum amount."""

    name = "running_max"
    outputs = {"main": pa.schema([("key", pa.string()), ("max", pa.int64())])}
    best = ValueSpec(IntCodec())

    def on_event(self, subject, event):
        best, amount = self.best.state_for(subject), event.value["amount"]
        if amount > best.get(default=-1):
            best.set(amount)
            subject.emit({"key": subject.key.decode(), "max": amount})


def running_max_job(name: str = "first") -> Job:
    """The job: ``TableSource`` -> ``RunningMax`` -> Parquet sink ``maxima``, 2 events an epoch."""
    return Job(name=name, source=TableSource(), operators=[RunningMax()],
               sinks={"main": ParquetSink("maxima")}, events_per_epoch=2)


def running_maxima() -> list[tuple[str, int]]:
    """The oracle, in pandas: (key, amount) of each event above its key's earlier maximum, sorted."""
    ev = EVENTS.to_pandas()
    earlier = ev.groupby("key")["amount"].transform(lambda s: s.cummax().shift(fill_value=-1))
    new = ev[ev["amount"] > earlier]
    return sorted((key.decode(), int(amount)) for key, amount in zip(new["key"], new["amount"]))
