"""A task's pass over its epoch runs with Python's cyclic collector paused (its allocations
would otherwise trigger full collections that walk the memtable), restores it afterwards,
and leaves the ``"dead_letter"`` rerun, where every caught exception is a cycle, unpaused."""

from __future__ import annotations

import gc

import pyarrow as pa

from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner

SCHEMA = pa.schema([pa.field("key", pa.string())])


class SeesCollector(Operator):
    """Records ``gc.isenabled()`` in every handler call; raises on key ``k0`` when asked."""

    name = "sees_collector"
    outputs = {"main": SCHEMA}
    seen: list[bool]

    def __init__(self, fail: bool = False) -> None:
        self.seen, self.fail = [], fail

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        self.seen.append(gc.isenabled())
        if self.fail and event.key == b"k0":
            raise ValueError("bad event")


class SeesCollectorBatch(BatchOperator):
    name = "sees_collector"
    outputs = {"main": SCHEMA}

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        self.seen.append(gc.isenabled())


def _run(tmp_path, op, **job_args) -> None:
    job = Job(name="gc", source=SyntheticSource(events=50, keys=5, partitions=1), operators=[op],
              sinks={"main": ParquetSink("out", SCHEMA)}, parallelism=1, **job_args)
    with JobRunner(job, None, str(tmp_path / "store")) as runner:
        runner.run()


def test_operator_runs_with_the_collector_paused_and_it_is_restored(tmp_path) -> None:
    assert gc.isenabled()
    for op in (SeesCollector(), SeesCollectorBatch()):
        _run(tmp_path / type(op).__name__, op)
        assert op.seen and not any(op.seen)
        assert gc.isenabled()


def test_dead_letter_rerun_is_not_paused(tmp_path) -> None:
    op = SeesCollector(fail=True)
    _run(tmp_path, op, on_operator_error="dead_letter")
    assert False in op.seen and True in op.seen  # the first, paused run raised; the rerun is not paused
    assert gc.isenabled()
