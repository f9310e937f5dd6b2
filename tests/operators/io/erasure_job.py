"""A small job writing one key's rows to every sink kind that can erase rows, for the
erasure tests (importable, so Spark workers can load its operator).

``PurchaseSource``: two partitions of purchases by ``USERS`` users, one of which is
``ERASED`` (a key long and unusual enough that its bytes never appear by chance in an
object); every ``BAD_EVERY``-th event and event ``BAD_AT`` have no timestamp: dead
letters that keep their key.
``PurchaseLog`` emits each purchase to a Parquet table (``events``) and the user's
running total to a Delta table sink (``totals``, primary key ``user``).

Oracle: ``expected_events`` / ``expected_totals`` compute both tables from the input.
"""
from __future__ import annotations

import json
import struct

import pyarrow as pa
import pyarrow.parquet as pq

from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.io.table_sink import TableSink
from dkvstream.storage.objectstore import ObjectStore

ERASED = "user-erase-me-7q2zx"
USERS = [ERASED, *(f"user-{i:03d}-keep" for i in range(7))]
BASE_MS = 1_700_000_000_000
EVENTS_PER_PARTITION = 120
BAD_EVERY = 29
BAD_AT = 8
EVENTS_SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("amount", pa.int64())])
TOTALS_SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64())])


def purchases(partition: int) -> list[dict]:
    """The rows of a partition: ``key`` (bytes), ``timestamp`` (ms or None), ``amount``."""
    rows = []
    for i in range(EVENTS_PER_PARTITION):
        user = USERS[(i * 3 + partition) % len(USERS)]
        bad = i % BAD_EVERY == BAD_EVERY - 1 or i == BAD_AT  # BAD_AT of p0 is ERASED's
        ts = None if bad else BASE_MS + i * 1000
        rows.append({"key": user.encode(), "timestamp": ts, "amount": i * 10 + partition})
    return rows


class PurchaseSource(Source):
    """Two bounded partitions of ``purchases``."""

    name = "purchases"

    def partitions(self) -> list[str]:
        return ["p0", "p1"]

    def end_offsets(self) -> dict[str, int]:
        return {"p0": EVENTS_PER_PARTITION, "p1": EVENTS_PER_PARTITION}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([("amount", pa.int64())])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        rows = purchases(int(partition[1:]))[start:end]
        return pa.Table.from_pylist(rows, schema=pa.schema([("key", pa.binary()), ("timestamp", pa.int64()),
                                                            ("amount", pa.int64())]))


class PurchaseLog(Operator):
    """Each purchase to ``main``; the user's running total to ``totals``."""

    name = "purchase_log"
    outputs = {"main": EVENTS_SCHEMA, "totals": TOTALS_SCHEMA}
    total = ValueSpec(IntCodec(), id="total")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        state = self.total.state_for(subject)
        amount = event.value["amount"]
        total = (state.get() or 0) + amount
        state.set(total)
        user = subject.key.decode()
        subject.emit({"user": user, "ts": event.timestamp, "amount": amount})
        subject.emit({"user": user, "total": total}, output="totals")

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        pass


def job(name: str = "erasure") -> Job:
    """The job: 60 events per epoch, so 4 epochs."""
    return Job(name=name, source=PurchaseSource(), operators=[PurchaseLog()],
               sinks={"main": ParquetSink("events", EVENTS_SCHEMA),
                      "totals": TableSink("totals", TOTALS_SCHEMA, primary_key=["user"], hash_buckets=2)},
               key_groups=16, parallelism=2, events_per_epoch=60)


def good_rows() -> list[dict]:
    return [r for p in (0, 1) for r in purchases(p) if r["timestamp"] is not None]


def expected_events() -> list[tuple]:
    """Every row of ``events``, sorted: ``(user, ts, amount)``."""
    return sorted((r["key"].decode(), r["timestamp"], r["amount"]) for r in good_rows())


def expected_totals() -> dict[str, int]:
    """``totals`` at the end: user -> sum of amounts."""
    out: dict[str, int] = {}
    for r in good_rows():
        out[r["key"].decode()] = out.get(r["key"].decode(), 0) + r["amount"]
    return out


def _decoded(data: bytes) -> list[str]:
    """The text of every value an object holds, as far as the test can decode it: a
    Parquet file's cells, a table sink's staged change object's cells, else nothing."""
    if data[:4] == b"PAR1":
        return [repr(pq.read_table(arrow_input(data)).to_pylist())]
    if data[:8] == b"DKVTCHG1":
        n = struct.unpack(">I", data[8:12])[0]
        start = 12 + n
        return [repr(pq.read_table(arrow_input(data[start + off:start + off + length])).to_pylist())
                for _, off, length, _, _ in json.loads(data[12:start])["buckets"]]
    return []


def holders(store: ObjectStore, keys: list[str], needle: str) -> list[str]:
    """The objects among ``keys`` holding ``needle``: in their raw bytes (uncompressed
    JSON, Parquet statistics) or in their decoded values (compressed Parquet pages)."""
    raw = needle.encode()
    return sorted(k for k in keys if raw in (data := store.get(k)) or any(needle in t for t in _decoded(data)))
