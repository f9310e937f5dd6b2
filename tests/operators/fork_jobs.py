"""Jobs the savepoint and fork tests run (importable: Spark workers unpickle their
operators): the small keyed count (``tests.operators.small_keyed_count``) under another
name, parallelism and, for a fork, changed operator code whose output the oracle knows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.examples.keyed_count import KeyedWindowCountBatch
from dkvstream.operators.api.batch import BatchContext
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime.driver import JobRunner
from tests.operators import small_keyed_count as small


class DoubledAmount(KeyedWindowCountBatch):
    """Changed code over the same state: emits each window's ``amount`` doubled."""

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys, kgs, stamps = timers.column("key"), timers.column("key_group"), timers.column("timestamp")
        starts = pc.subtract(stamps, self.window_ms)
        state = ctx.state(self.windows)
        at = state.dkv_keys(keys, kgs, starts)
        aggs = state.get_columns_at(at)
        hit = aggs.is_valid()
        ctx.emit({"key": keys.filter(hit).cast(pa.string()), "window_start": starts.filter(hit),
                  "count": aggs.field("count").filter(hit),
                  "amount": pc.multiply(aggs.field("amount").filter(hit), 2)},
                 keys=keys.filter(hit).to_pylist(), timestamps=stamps.filter(hit).to_pylist())
        state.delete_at([at[i] for i in np.flatnonzero(hit.to_numpy(zero_copy_only=False))])


def job(name: str, parallelism: int = 2, doubled: bool = False) -> Job:
    """The small keyed count named ``name``; ``doubled``: with ``DoubledAmount``."""
    j = small.job(parallelism)
    j.name = name
    if doubled:
        j.operators = [DoubledAmount()]
    return j


def runner(root, name: str, parallelism: int = 2, doubled: bool = False, spark=None, **kw) -> JobRunner:
    """A ``JobRunner`` of ``job(...)`` on store ``root`` (in process unless ``spark``)."""
    kw.setdefault("retain_checkpoints", 2)
    return JobRunner(job(name, parallelism, doubled), spark, root, dkv_options=small.OPTIONS, **kw)


def output(r: JobRunner) -> pd.DataFrame:
    """The job's published ``main`` output, sorted (duplicates kept)."""
    return small.output(r)


def parent_job() -> Job:
    """``job("parent")`` (for ``--job tests.operators.fork_jobs:parent_job``)."""
    return job("parent")
