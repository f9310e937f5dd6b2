"""A small real stream job for the Dagster tests: synthetic keyed events, per-key windows,
tiny memtables and no inline compaction, so level-0 tables pile up in a few epochs."""
from __future__ import annotations

from collections import Counter

from dkvstream.assets.resources import DKVSettingsResource
from dkvstream.examples.synthetic import WINDOW_COUNT_SCHEMA, KeyWindowCount, SyntheticSource
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.tools.state_reader import checkpoint_entries
from dkvstream.storage.objectstore import ObjectStore

NAME = "small"
# 6 epochs of 1,000 events; about 3 level-0 tables per range and epoch.
SMALL_DKV = DKVSettingsResource(memtable_bytes=8 << 10, wal_flush_bytes=8 << 20, l0_compaction_trigger=4,
                                size_amp_threshold=0.5, max_inline_compaction_bytes=0,
                                target_file_bytes=8 << 20, retain_checkpoints=2)


def small_job(events: int = 3_000) -> Job:
    """The job; ``events`` per partition (2 partitions)."""
    return Job(name=NAME, source=SyntheticSource(events=events, keys=400, partitions=2, step_ms=1_000),
               operators=[KeyWindowCount()], sinks={"main": ParquetSink("key_window_counts", WINDOW_COUNT_SCHEMA)},
               key_groups=64, parallelism=2, events_per_epoch=1_000)


def state(store: ObjectStore, epoch: int | None = None) -> Counter:
    """Live DKV entries of a checkpoint regardless of range: the state oracle."""
    return Counter((op, k, v) for op, _, k, v in checkpoint_entries(store, f"jobs/{NAME}", epoch))
