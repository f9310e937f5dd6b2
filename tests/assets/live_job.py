"""A live stream job for the Dagster tests: ``SyntheticSource`` made live, keyed window
counts, and the ``pyspark`` resource without Spark (the in-process runner)."""
from __future__ import annotations

import pyarrow as pa
from dagster_pyspark import PySparkResource

from dkvstream.examples.synthetic import WINDOW_COUNT_SCHEMA, KeyWindowCount, SyntheticSource
from dkvstream.operators.api.columns import INGEST_TIME_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink

NAME = "live_small"
PREFIX = f"jobs/{NAME}"
EVENTS_PER_EPOCH = 1_000  # 500 per partition and epoch


class LiveSource(SyntheticSource):
    """``SyntheticSource`` made live: ``visible`` events per partition are readable, and
    the rest never arrives. ``end_offsets`` refuses to answer before ``attach`` (as a
    source keeping its metadata in the store would). With ``ingest_time_ms`` set, every
    event has that ``_ingest_time``. ``on_read(start)`` and ``on_end_offsets()`` are
    test hooks, called on the thread reading."""

    name = "live_synthetic"

    def __init__(self, visible: int) -> None:
        super().__init__(events=3_000, keys=400, partitions=2, step_ms=1_000)
        self.visible = visible
        self.ingest_time_ms: int | None = None
        self.attached: tuple | None = None
        self.on_read = lambda start: None
        self.on_end_offsets = lambda: None

    def __getstate__(self) -> dict:
        return {k: v for k, v in super().__getstate__().items() if not k.startswith("on_")}

    @property
    def bounded(self) -> bool:
        return False

    def attach(self, store, job_prefix: str) -> None:
        self.attached = (store.uri(""), job_prefix)

    def end_offsets(self) -> dict[str, int]:
        if self.attached is None:
            raise RuntimeError(f"{self.name}: end_offsets() before attach()")
        self.on_end_offsets()
        return {p: self.visible for p in self.partitions()}

    def read(self, partition: str, start: int, end: int):
        self.on_read(start)
        table = super().read(partition, start, end)
        if self.ingest_time_ms is None:
            return table
        return table.append_column(INGEST_TIME_COLUMN, pa.array([self.ingest_time_ms] * table.num_rows, pa.int64()))


def live_job(visible: int, trigger_interval_ms: int = 0) -> Job:
    """The job over ``LiveSource(visible)``: 1,000 events per epoch (500 per partition)."""
    return Job(name=NAME, source=LiveSource(visible), operators=[KeyWindowCount()],
               sinks={"main": ParquetSink("live_window_counts", WINDOW_COUNT_SCHEMA)},
               key_groups=64, parallelism=2, events_per_epoch=EVENTS_PER_EPOCH, trigger_interval_ms=trigger_interval_ms)


class NoSpark(PySparkResource):
    """The ``pyspark`` resource without a session: ``JobRunner`` then runs every stage
    in process (``spark=None``)."""

    def setup_for_execution(self, context) -> None:
        pass
