"""A job with processing-time timers over ``live_sources.GrowingSource``, in both operator
forms, and its model (importable: Spark workers unpickle the operators from here).

The operator counts each key's events; a key's first event sets a processing-time timer
``DELAY_MS`` after the epoch's processing time, and every fifth event of the key moves it
(the old timer is deleted, a new one set ``DELAY_MS`` after the epoch's processing time).
When a timer fires the operator emits the key, its count, the timer's time, the epoch's
processing time and the domain, and forgets the timer. ``model`` replays the committed
epochs (their offsets and processing times, from the checkpoints) in plain Python.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject, TimeDomain
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from tests.operators.live_sources import GrowingSource

DELAY_MS = 10_000
EVERY = 5  # every EVERY-th event of a key moves its timer
OUTPUT_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("count", pa.int64()),
                           pa.field("due", pa.int64()), pa.field("fired_at", pa.int64()),
                           pa.field("domain", pa.string())])


class Timeout(Operator):
    """The ``on_event`` form (module docstring)."""

    name = "timeout"
    outputs = {"main": OUTPUT_SCHEMA}
    count = ValueSpec(IntCodec(), id="count")
    due = ValueSpec(IntCodec(), id="due")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        count, due = self.count.state_for(subject), self.due.state_for(subject)
        n = count.get(0) + 1
        count.set(n)
        old = due.get()
        if old is None or n % EVERY == 0:
            if old is not None:
                subject.delete_processing_timer(old)
            due.set(subject.processing_time + DELAY_MS)
            subject.set_processing_timer(subject.processing_time + DELAY_MS)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        subject.emit({"key": subject.key.decode(), "count": self.count.state_for(subject).get(0),
                      "due": timestamp, "fired_at": subject.processing_time,
                      "domain": str(subject.time_domain)})
        self.due.state_for(subject).drop()


class TimeoutBatch(BatchOperator):
    """``Timeout`` in vectorised form: one state read and write per key and epoch."""

    name = Timeout.name
    outputs = Timeout.outputs
    count, due = Timeout.count, Timeout.due

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        g = pa.table({"key": events.column("key"), "kg": events.column("key_group")}) \
            .group_by(["key", "kg"], use_threads=False).aggregate([([], "count_all")])
        keys, kgs = g.column("key").to_pylist(), g.column("kg").to_pylist()
        n = np.asarray(g.column("count_all").to_pylist(), np.int64)
        counts, dues = ctx.state(self.count), ctx.state(self.due)
        old_n = np.asarray([c or 0 for c in counts.get(keys, kgs)], np.int64)
        old_due = dues.get(keys, kgs)
        counts.set(keys, kgs, (old_n + n).tolist())
        # A multiple of EVERY in (old_n, old_n + n]: the timer moves.
        move = [d is None or m for d, m in zip(old_due, ((old_n + n) // EVERY > old_n // EVERY).tolist())]
        rows = [i for i, m in enumerate(move) if m]
        gone = [i for i in rows if old_due[i] is not None]
        ctx.delete_processing_timers([keys[i] for i in gone], [kgs[i] for i in gone], [old_due[i] for i in gone])
        at = [ctx.processing_time + DELAY_MS] * len(rows)
        ctx.set_processing_timers([keys[i] for i in rows], [kgs[i] for i in rows], at)
        dues.set([keys[i] for i in rows], [kgs[i] for i in rows], at)

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs = timers.column("key").to_pylist(), timers.column("key_group").to_pylist()
        ctx.emit({"key": timers.column("key").cast(pa.string()),
                  "count": [c or 0 for c in ctx.state(self.count).get(keys, kgs)],
                  "due": timers.column("timestamp"),
                  "fired_at": pa.array([ctx.processing_time] * timers.num_rows, pa.int64()),
                  "domain": timers.column("domain")},
                 keys=keys, timestamps=pc.cast(timers.column("timestamp"), pa.int64()).to_pylist())
        ctx.state(self.due).drop(keys, kgs)


class TimeoutFailsOnce(TimeoutBatch):
    """``TimeoutBatch`` whose tasks each fail once after their DKV checkpoint, the first
    time they see each (epoch's processing time, events) pass, marked by a file in
    ``log_dir`` (as ``live_sources.FailsOnceInEachTask``): every epoch is run twice."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        import hashlib
        from pathlib import Path

        from dkvstream.storage import faults

        mark = Path(self.log_dir, hashlib.sha1(repr(
            (ctx.processing_time, events.column("key").to_pylist())).encode()).hexdigest())
        if not mark.exists():
            mark.touch()

            def fail(point: str, epoch: int | None) -> None:
                raise RuntimeError(f"injected failure of a task's first attempt at {point}")
            faults.arm("task_after_checkpoint", 1, fail)
        super().on_batch(ctx, events)


def job(visible_file: str | os.PathLike, operator: Operator | None = None, **fields) -> Job:
    """The timeout job on a ``GrowingSource`` (one epoch reads everything revealed)."""
    defaults = {"parallelism": 2, "events_per_epoch": 100_000, "trigger_interval_ms": 50}
    return Job(name="timeouts", source=GrowingSource(visible_file), operators=[operator or TimeoutBatch()],
               sinks={"main": ParquetSink("timeouts", OUTPUT_SCHEMA)}, **{**defaults, **fields})


def output(runner: JobRunner) -> list[tuple]:
    """The published rows, sorted (duplicates kept)."""
    return sorted(tuple(r.values()) for r in runner.job.sinks["main"].read(runner.store, runner.job.prefix)
                  .to_pylist())


def model(runner: JobRunner, looks: list[tuple[int, int]] = ()) -> tuple[list[tuple], Counter]:
    """The rows the committed epochs should have published: each epoch's events (its
    checkpoint's offsets) handled at its recorded processing time, then its due timers
    fired in time order. Also counts what happened (``set``, ``deleted``, ``fired``,
    ``pending``), so a test can check its script exercised each, and ``missed``: the
    ``looks`` (``(clock ms, newest epoch)`` where a run ran no epoch) at which a timer
    left by that epoch was due."""
    source: GrowingSource = runner.job.source
    latest = runner.latest()
    count: dict[bytes, int] = {}
    due: dict[bytes, int] = {}
    rows, seen = [], Counter()
    offsets = {p: 0 for p in latest.source_offsets}
    for epoch in range(0, latest.epoch + 1):
        seen["missed"] += sum(1 for at, e in looks if e == epoch and due and min(due.values()) <= at)
        if epoch == latest.epoch:
            break
        ckpt = read_checkpoint(runner.store, runner.job.prefix, epoch + 1)
        now = ckpt.processing_time_ms
        for p, end in ckpt.source_offsets.items():
            for key in source.read(p, offsets.get(p, 0), end).column("key").to_pylist():
                count[key] = count.get(key, 0) + 1
                if key not in due or count[key] % EVERY == 0:
                    seen["deleted" if key in due else "set"] += 1
                    due[key] = now + DELAY_MS
            offsets[p] = end
        for key, t in sorted(due.items(), key=lambda kv: kv[1]):
            if t <= now:
                rows.append((key.decode(), count[key], t, now, TimeDomain.PROCESSING_TIME.value))
                del due[key]
                seen["fired"] += 1
    seen["pending"] = len(due)
    return sorted(rows), seen


def frame(rows: list[tuple]) -> pd.DataFrame:
    """Rows as a frame (for readable assertion failures)."""
    return pd.DataFrame(rows, columns=OUTPUT_SCHEMA.names)
