"""The live soak's job: per key, the running count and sum of ``amount``, emitted for
every event, on a ``KafkaSource`` (run by ``test_live_soak.py`` as
``python -m dkvstream.operators.tools.run_job --job tests.reliability.live_soak_job:job``).

Records: key ``k<nnnn>`` (the record key), value ``{"seq": s, "amount": a}`` where
``seq`` numbers the producer's records from 0 and ``amount = amount_of(seq)``; the event
time is the record timestamp. Each event becomes one output row ``{key, seq, amount,
count, sum}``: the key's event count and amount sum up to and including this event, in
``seq`` order within the key (the producer's order; a key's records all go to one
partition, in that order). No windows, no timers: the state is one ``(count, sum)`` per
key, so it is bounded by the number of keys however long the job runs.

The broker and topic come from ``DKVSTREAM_LIVE_SOAK_BOOTSTRAP`` and
``DKVSTREAM_LIVE_SOAK_TOPIC`` (``run_job`` loads a job by name, without arguments).
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import RecordCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.kafka import KafkaSource
from dkvstream.operators.io.sinks import ParquetSink

VALUE_SCHEMA = pa.schema([pa.field("seq", pa.int64()), pa.field("amount", pa.int64())])
OUTPUT_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("seq", pa.int64()),
                           pa.field("amount", pa.int64()), pa.field("count", pa.int64()),
                           pa.field("sum", pa.int64())])
TOTALS = RecordCodec({"count": pa.int64(), "sum": pa.int64()})
SINK_TABLE = "live_soak_running"


def amount_of(seq: np.ndarray | int) -> np.ndarray | int:
    """The amount of record ``seq`` (1..97), so an output row's amount is checkable."""
    return seq % 97 + 1


class RunningTotals(BatchOperator):
    """Per key: the running event count and amount sum, one output row per event."""

    name = "running_totals"
    outputs = {"main": OUTPUT_SCHEMA}  # noqa: RUF012 - the Operator API's class attribute
    totals = ValueSpec(TOTALS, id="totals")

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        # Late events (at or below the watermark) count as any other: no windows here.
        events = events.sort_by([("key", "ascending"), ("seq", "ascending")])
        keys = events.column("key").to_pylist()
        kgs = events.column("key_group").to_numpy()
        amounts = events.column("amount").to_numpy()
        n = len(keys)
        if n == 0:
            return
        # The first row of each key's run of rows, and each row's run.
        first = np.flatnonzero(np.r_[True, np.array(keys[1:], dtype=object) != np.array(keys[:-1], dtype=object)])
        run = np.repeat(np.arange(len(first)), np.diff(np.r_[first, n]))
        run_keys = [keys[i] for i in first]
        run_kgs = kgs[first].tolist()
        state = ctx.state(self.totals)
        olds = state.get(run_keys, run_kgs)
        base_count = np.array([0 if o is None else o["count"] for o in olds], dtype=np.int64)
        base_sum = np.array([0 if o is None else o["sum"] for o in olds], dtype=np.int64)
        position = np.arange(n) - first[run]  # 0, 1, ... within the key's rows
        cum = np.cumsum(amounts)
        before_run = np.r_[0, cum][first][run]  # the sum of the rows before the key's first
        counts = base_count[run] + position + 1
        sums = base_sum[run] + cum - before_run
        last = np.r_[first[1:], n] - 1
        state.set(run_keys, run_kgs, [{"count": int(c), "sum": int(s)}
                                      for c, s in zip(counts[last], sums[last])])
        ctx.emit({"key": events.column("key").cast(pa.string()), "seq": events.column("seq"),
                  "amount": events.column("amount"), "count": counts, "sum": sums},
                 keys=keys, timestamps=events.column("timestamp").to_pylist())


def live_soak_job(bootstrap: str, topic: str, *, name: str = "live_soak",
                  events_per_epoch: int = 20_000, trigger_interval_ms: int = 1_000) -> Job:
    """The job on ``topic`` at ``bootstrap`` (partitions ``<topic>-<n>``), 2 key-group
    ranges, Parquet output ``sinks/live_soak_running``."""
    source = KafkaSource(bootstrap, topic, value_schema=VALUE_SCHEMA, isolation_level="read_uncommitted",
                         timeout_s=60.0)
    return Job(name=name, source=source, operators=[RunningTotals()],
               sinks={"main": ParquetSink(SINK_TABLE, OUTPUT_SCHEMA)}, parallelism=2,
               events_per_epoch=events_per_epoch, trigger_interval_ms=trigger_interval_ms)


def job() -> Job:
    """``live_soak_job`` on the broker and topic of the environment (module docstring)."""
    return live_soak_job(os.environ["DKVSTREAM_LIVE_SOAK_BOOTSTRAP"], os.environ["DKVSTREAM_LIVE_SOAK_TOPIC"])
