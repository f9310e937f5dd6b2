"""A live test source whose events become readable as a test reveals them, the keyed
counting job over it, and its oracle.

``GrowingSource`` is ``SyntheticSource`` (2 partitions, an event every 6 s per
partition, 200 keys) made live: ``end_offsets`` is what a small JSON file under the
test's directory says is visible, so a test (or another process, for the ``run_job``
subprocess test) appends events by rewriting that file (``reveal``). On a live source
the watermark never reaches +infinity, so the oracle is the pandas answer restricted to
the windows that closed at or before the final watermark.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

from dkvstream.examples.keyed_count import (
    LATE_SCHEMA,
    OUTPUT_SCHEMA,
    WINDOW_MS,
    KeyedWindowCountBatch,
    keyed_count_oracle,
)
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.runtime.driver import JobRunner

EVENTS = 3_000  # per partition, at most
STEP_MS = 6_000
# The subprocess test names the visibility file through this variable (live_job()).
VISIBLE_FILE_ENV = "DKVSTREAM_TEST_VISIBLE_FILE"


class GrowingSource(Source):
    """``SyntheticSource``'s events, made visible as ``reveal`` says (module docstring).

    Args:
        visible_file: JSON file ``{partition: visible events}``; a partition not in it
            does not exist yet.
        partitions, step_ms, events: as ``SyntheticSource``.
        ingest_time: add an ``_ingest_time`` column: ``ingest_time(partition, offsets)``
            returns its int64 values (ms).
    """

    name = "growing"

    def __init__(self, visible_file: str | os.PathLike, partitions: int = 2, step_ms: int = STEP_MS,
                 events: int = EVENTS, ingest_time=None) -> None:
        self.data = SyntheticSource(events, 200, partitions=partitions, step_ms=step_ms)
        self.visible_file = str(visible_file)
        self.ingest_time = ingest_time

    @property
    def bounded(self) -> bool:
        return False

    @property
    def value_schema(self) -> pa.Schema:
        return self.data.value_schema

    def _visible(self) -> dict[str, int]:
        try:
            return json.loads(Path(self.visible_file).read_text())
        except FileNotFoundError:
            return {}

    def partitions(self) -> list[str]:
        visible = self._visible()
        return [p for p in self.data.partitions() if p in visible]

    def end_offsets(self) -> dict[str, int]:
        visible = self._visible()
        return {p: min(self.data.events, visible[p]) for p in self.data.partitions() if p in visible}

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        table = self.data.read(partition, start, end)
        if self.ingest_time is not None:
            table = table.append_column("_ingest_time", pa.array(
                self.ingest_time(partition, range(start, end)), pa.int64()))
        return table


class FailsOnceInEachTask(KeyedWindowCountBatch):
    """``KeyedWindowCountBatch`` whose task fails after its DKV checkpoint (a plain
    ``RuntimeError`` from the ``task_after_checkpoint`` fault point, as a store or worker
    failure would) the first time it sees each (watermark, events) pass, marked by a file
    in ``log_dir``: every task of every epoch fails once."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def on_batch(self, ctx, events):
        from dkvstream.storage import faults

        ts = events.column("timestamp").to_pylist() if events.num_rows else []
        mark = Path(self.log_dir, hashlib.sha1(repr((ctx.watermark, ts)).encode()).hexdigest())
        if not mark.exists():
            mark.touch()

            def fail(point: str, epoch: int | None) -> None:
                raise RuntimeError(f"injected failure of a task's first attempt at {point}")
            faults.arm("task_after_checkpoint", 1, fail)  # one shot, this task
        super().on_batch(ctx, events)


def reveal(visible_file: str | os.PathLike, visible: dict[str, int]) -> None:
    """Makes the first ``visible[p]`` events of each partition readable (atomically: a
    reader sees the old or the new file)."""
    tmp = f"{visible_file}.tmp"
    Path(tmp).write_text(json.dumps(visible))
    os.replace(tmp, visible_file)


def job(visible_file: str | os.PathLike, name: str = "growing_count", **fields) -> Job:
    """The keyed counting job on a ``GrowingSource``: 750 events per epoch, a 50 ms
    trigger; ``fields`` override Job fields, ``source_args`` the source's."""
    source = GrowingSource(visible_file, **fields.pop("source_args", {}))
    defaults = {"parallelism": 2, "events_per_epoch": 750,
                "max_out_of_orderness_ms": 2 * STEP_MS, "trigger_interval_ms": 50}
    return Job(name=name, source=source, operators=[KeyedWindowCountBatch()],
               sinks={"main": ParquetSink("keyed_counts", OUTPUT_SCHEMA),
                      "late": ParquetSink("keyed_counts_late", LATE_SCHEMA)},
               **{**defaults, **fields})


def live_job() -> Job:
    """``job`` on the file named by ``$DKVSTREAM_TEST_VISIBLE_FILE`` (for ``run_job``)."""
    return job(os.environ[VISIBLE_FILE_ENV])


def output(runner: JobRunner) -> pd.DataFrame:
    """The published ``main`` output, sorted (duplicates kept)."""
    return _sorted(runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas())


def oracle(source: GrowingSource, watermark: int) -> pd.DataFrame:
    """The output once every visible event is read and the watermark is ``watermark``:
    the windows of the visible events that end at or before it."""
    want = keyed_count_oracle(_Prefix(source.data, source.end_offsets()))
    return _sorted(want[want.window_start + WINDOW_MS <= watermark])


class _Prefix:
    """The visible prefix of each partition (what ``keyed_count_oracle`` reads)."""

    def __init__(self, data: SyntheticSource, visible: dict[str, int]) -> None:
        self.data, self.visible = data, visible

    def partitions(self) -> list[str]:
        return list(self.visible)

    def full_partition(self, partition: str) -> pa.Table:
        return self.data.full_partition(partition).slice(0, self.visible[partition])


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["key", "window_start"]).reset_index(drop=True)
