"""One operator's epoch as one Spark stage: one partition per key-group range, no shuffle.

The driver already holds the epoch's events tagged with their range (``_range``), so it
cuts them into one Arrow IPC payload per range and hands Spark exactly P elements,
``(TaskSpec, payload)``, with ``SparkContext.parallelize(payloads, P)``: element i is
partition i, the task of range i. ``mapPartitions`` runs ``operators.runtime.task.run_task`` on
each and ``collect`` brings back the ``TaskResult``s (with an intermediate operator's
forwarded events as IPC bytes). One action, so each range runs once per stage (Spark
retries a failed task with the same element; a retried or duplicate attempt writes
under its own attempt id, as before).

Why not ``createDataFrame(events).groupBy(range).applyInArrow(...)`` (the first form):
that plans a SQL query, converts Arrow to rows and back, shuffles the events between
two stages, and needed a probe job to find grouping values that hash to distinct
shuffle partitions. Measured on ``local[2]`` (flights, 50,000 events per epoch) it cost
~2 s per epoch and ~10 s more in the first epoch on top of the tasks' own work; the
payloads here are the same bytes the shuffle moved, without the stage boundary.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from operators.api.operator import Operator
from operators.io.sinks import Sink
from operators.runtime.open_state import OpenState
from operators.runtime.task import RANGE_COLUMN, TaskResult, TaskSpec, run_task
from storage.dkv import DKVOptions
from storage.objectstore import ObjectStore, subtract_requests


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes (only the rows a slice covers)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table ``to_ipc`` wrote."""
    return pa.ipc.open_stream(data).read_all()


def split_by_range(events: pa.Table, parallelism: int) -> list[pa.Table]:
    """Rows of ``events`` per range index 0..P-1 (``_range`` column), each in input order.

    Raises:
        ValueError: a row's range index is outside [0, P).
    """
    ranges = events.column(RANGE_COLUMN).to_numpy()
    if ranges.size and (ranges.min() < 0 or ranges.max() >= parallelism):
        raise ValueError(f"range index outside [0, {parallelism}) in events: {ranges.min()}..{ranges.max()}")
    order = np.argsort(ranges, kind="stable")
    bounds = np.searchsorted(ranges[order], np.arange(parallelism + 1))
    ordered = events.take(pa.array(order)) if ranges.size else events
    return [ordered.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i in range(parallelism)]


def run_stage(spark, operator: Operator, specs: list[TaskSpec], events: pa.Table, store: ObjectStore,
              sinks: dict[str, Sink] | None, dkv_options: DKVOptions | None
              ) -> tuple[list[TaskResult], pa.Table | None]:
    """Run ``operator`` for every range of ``specs`` as one Spark stage.

    Args:
        spark: the ``SparkSession``.
        operator: the operator the stage runs.
        specs: one ``TaskSpec`` per range, ``specs[i].range_index == i``.
        events: the stage's events with their ``_range`` column (see ``operators.runtime.task``).
        store: the job's object store; each task gets it pickled (its configuration).
        sinks: the job's sinks for the last operator (tasks stage files), else None.
        dkv_options: DKV tuning.

    Returns:
        ``(results, forwarded)``: one ``TaskResult`` per range in range order (its
        ``metrics["requests"]`` holds the task's object-store requests), and for an
        intermediate operator the ``main`` output events of all ranges (else None).

    Raises:
        Whatever Spark raises when a task fails after its retries (the operator's
        error is in the message).
    """
    parts = split_by_range(events, len(specs))
    payloads = [(spec, to_ipc(part)) for spec, part in zip(specs, parts)]
    rdd = spark.sparkContext.parallelize(payloads, len(payloads))
    task = functools.partial(_run_partition, operator, store, sinks, dkv_options)
    rows = rdd.mapPartitions(task).collect()
    results, forwarded = [], []
    for res, fwd in sorted(rows, key=lambda row: row[0].range_index):
        results.append(res)
        if fwd is not None:
            forwarded.append(from_ipc(fwd))
    if len(results) != len(specs):
        raise RuntimeError(f"stage of operator {operator.name} returned {len(results)} task results "
                           f"for {len(specs)} ranges")
    return results, (pa.concat_tables(forwarded) if forwarded else None)


# Per Spark Python worker process (workers are reused, spark.python.worker.reuse): the
# object stores of the tasks it ran, by root URI, and the ranges' open DKV instances.
_STORES: dict[str, ObjectStore] = {}
_OPEN_STATE = OpenState()


def _run_partition(operator: Operator, store: ObjectStore, sinks: dict[str, Sink] | None,
                   dkv_options: DKVOptions | None,
                   payloads: Iterable[tuple[TaskSpec, bytes]]) -> Iterator[tuple[TaskResult, bytes | None]]:
    """The body of one Spark task: each of its ranges (exactly one with ``parallelize``)."""
    # One store per root in a worker: its clients and stats live as long as the worker.
    store = _STORES.setdefault(store.root_uri, store)
    for spec, data in payloads:
        before = store.stats.snapshot()
        res = run_task(operator, spec, from_ipc(data), store, sinks=sinks, dkv_options=dkv_options,
                       open_state=_OPEN_STATE)
        res.metrics["requests"] = subtract_requests(store.stats.snapshot(), before)
        fwd, res.forwarded = res.forwarded, None
        yield res, (None if fwd is None else to_ipc(fwd))
