"""A two-operator job: operator 1's main output, re-keyed, feeds operator 2's stage."""
from __future__ import annotations

import pandas as pd
import pytest

from dkvstream.examples.synthetic import (
    GROUP_SUM_SCHEMA,
    GroupWindowSum,
    KeyWindowCount,
    SyntheticSource,
    group_of,
)
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.validation import InvalidJobError
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner


def _job(parallelism: int) -> Job:
    return Job(name="chain", source=SyntheticSource(events=3_000, keys=40, partitions=2, step_ms=1_000),
               operators=[KeyWindowCount(), GroupWindowSum()],
               sinks={"main": ParquetSink("group_window_sums", GROUP_SUM_SCHEMA)},
               key_groups=64, parallelism=parallelism, events_per_epoch=1_100)


def _oracle(source: SyntheticSource) -> pd.DataFrame:
    df = pd.concat([source.full_partition(p).to_pandas() for p in source.partitions()])
    df["group"] = [group_of(k) for k in df["key"]]
    df["window_start"] = df["timestamp"] - df["timestamp"] % 60_000
    per_key = df.groupby(["group", "key", "window_start"]).agg(count=("amount", "size"), amount=("amount", "sum"))
    out = per_key.groupby(["group", "window_start"]).agg(
        keys=("count", "size"), count=("count", "sum"), amount=("amount", "sum")).reset_index()
    return out.sort_values(["group", "window_start"]).reset_index(drop=True)


def _check(job: Job, runner: JobRunner) -> None:
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    got = got.sort_values(["group", "window_start"]).reset_index(drop=True)
    exp = _oracle(job.source)
    pd.testing.assert_frame_equal(got[exp.columns], exp, check_dtype=False)


@pytest.mark.parametrize("long_lived_tasks", [True, False], ids=["long-lived", "stages-per-epoch"])
def test_two_operator_chain_on_spark(spark, tmp_path, long_lived_tasks) -> None:
    job = _job(parallelism=2)
    runner = JobRunner(job, spark, str(tmp_path / "store"), long_lived_tasks=long_lived_tasks)
    results = runner.run()
    assert len(results) >= 5
    _check(job, runner)
    ckpt = runner.latest()
    assert set(ckpt.operators) == {"key_window_count", "group_window_sum"}
    assert all(len(ranges) == 2 for ranges in ckpt.operators.values())


def test_two_operator_chain_in_process(tmp_path) -> None:
    job = _job(parallelism=3)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    _check(job, runner)


def _per_operator_job(first: int, second: int) -> Job:
    job = _job(parallelism=2)
    job.operator_parallelism = {"key_window_count": first, "group_window_sum": second}
    job.validate()
    return job


def _run_rescaling(spark, root: str, long_lived_tasks: bool = True) -> tuple[Job, JobRunner]:
    """Epochs with the operators at 3 and 1 ranges, then the rest at 1 and 4 (each
    operator rescaled on its own at the restart)."""
    job = _per_operator_job(3, 1)
    JobRunner(job, spark, root, long_lived_tasks=long_lived_tasks).run(max_epochs=2)
    job = _per_operator_job(1, 4)
    runner = JobRunner(job, spark, root, long_lived_tasks=long_lived_tasks)
    runner.run()
    return job, runner


@pytest.mark.parametrize("long_lived_tasks", [True, False], ids=["long-lived", "stages-per-epoch"])
def test_operators_with_their_own_parallelism_on_spark(spark, tmp_path, long_lived_tasks) -> None:
    """Each operator has its own number of key-group ranges, the exchange between them
    re-routes by the next one's ranges, and a restart rescales each on its own: the
    output equals the pandas oracle."""
    job, runner = _run_rescaling(spark, str(tmp_path / "store"), long_lived_tasks)
    _check(job, runner)
    ckpt = runner.latest()
    assert len(ckpt.operators["key_window_count"]) == 1 and len(ckpt.operators["group_window_sum"]) == 4


def test_operators_with_their_own_parallelism_in_process(tmp_path) -> None:
    job, runner = _run_rescaling(None, str(tmp_path / "store"))
    _check(job, runner)


def test_operator_parallelism_names_an_operator() -> None:
    job = _job(parallelism=2)
    job.operator_parallelism = {"nope": 2}
    with pytest.raises(InvalidJobError, match="operator_parallelism names 'nope'"):
        job.validate()
    job.operator_parallelism = {"key_window_count": 65}
    with pytest.raises(InvalidJobError, match=r"operator_parallelism\['key_window_count'\]=65 must be in \[1, 64\]"):
        job.validate()
