"""The small keyed counting job the driver tests share: 2 partitions x 3,000 events,
200 keys, an event every 6 s per partition, 750 events per epoch (8 epochs, each
closing an hourly window, so each publishes output), with DKV sized so that every epoch
flushes and compacts. In process: a run takes under a second. The oracle is pandas
(``dkvstream.examples.keyed_count.keyed_count_oracle``)."""

from __future__ import annotations

import pandas as pd

from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.dkv import DKVOptions

EPOCHS = 8
OPTIONS = DKVOptions(
    memtable_bytes=4 << 10,
    l0_compaction_trigger=2,
    target_file_bytes=16 << 10,
    level_base_bytes=64 << 10,
    block_cache_bytes=1 << 20,
    table_cache_bytes=1 << 20,
)


def job(parallelism: int = 2) -> Job:
    """The job (a new instance each call: a driver's job is its own)."""
    return keyed_count_job(
        3_000,
        200,
        partitions=2,
        step_ms=6_000,
        events_per_epoch=750,
        parallelism=parallelism,
        name="small_count",
    )


def runner(root: str, retain: int | None = 2, parallelism: int = 2, **kw) -> JobRunner:
    """An in-process ``JobRunner`` of ``job(parallelism)`` on store ``root``."""
    return JobRunner(
        job(parallelism), None, root, dkv_options=OPTIONS, retain_checkpoints=retain, **kw
    )


def output(r: JobRunner) -> pd.DataFrame:
    """The published ``main`` output, sorted (duplicates kept)."""
    return _sorted(r.job.sinks["main"].read(r.store, r.job.prefix).to_pandas())


def oracle() -> pd.DataFrame:
    """What ``output`` must be."""
    return _sorted(keyed_count_oracle(job().source))


def assert_output_exact(r: JobRunner, what: str) -> None:
    """The output equals the oracle: no row duplicated, lost or different."""
    got, want = output(r), oracle()
    dup = int(got.duplicated(["key", "window_start"]).sum())
    assert dup == 0, f"{what}: {dup} duplicated output rows"
    assert len(got) == len(want), f"{what}: {len(got)} output rows, the oracle has {len(want)}"
    pd.testing.assert_frame_equal(got, want, obj=what)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return (
        df[["key", "window_start", "count", "amount"]]
        .sort_values(["key", "window_start"])
        .reset_index(drop=True)
        .astype({"count": "int64", "amount": "int64"})
    )
