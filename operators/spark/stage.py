"""The epoch's data plane on Spark: read tasks, Spark's shuffle as the exchange, operator tasks.

``SparkExchange`` implements ``operators.runtime.exchange.Exchange`` with RDD operations
(the task bodies are ``operators.runtime.exchange``'s, the same as in process):

* **Read stage.** ``parallelize(splits)`` with one split per partition; each read task
  (``splits.read_split``) emits ``(range index, Arrow IPC bytes)`` per key-group range of
  the first operator it has events for, ``(DEAD, IPC)`` for its dead-letter rows and
  ``(META, SplitSummary)``. ``partitionBy(P + 2)`` with the identity as partitioner is
  the exchange: shuffle partition r < P holds range r's batches, ``DEAD = P`` the dead
  letters, ``META = P + 1`` the summaries. The driver runs a job on the META partition
  only (``SparkContext.runJob``), which runs the read stage (the shuffle's map side) and
  brings back the summaries: the driver never receives an event.
* **Operator stage.** ``mapPartitionsWithIndex`` over the same shuffled RDD: the task of
  partition r < P runs range r's operator task over its batches, the DEAD task stages
  the dead letters (first operator only). Spark reuses the read stage's shuffle output
  (the map stage is skipped), so sources are read once per epoch. An intermediate
  operator's tasks emit their ``main`` output the same way, ``(next range, IPC)``, plus
  ``(META, TaskResult)``, into the next ``partitionBy``: the next operator's exchange;
  the driver runs the job on META to take the results. The last operator's tasks
  return their ``TaskResult`` straight to the driver.

Task retries and speculation stay safe: a task writes only under names unique to its
attempt (``task.run_task``), and the shuffle registers one map output per partition, so
the results the driver collects and the events the next stage reads come from the same
attempt. A map stage Spark re-runs after a lost executor (a fetch failure) recomputes the
same events from the same offsets and state; its files are new names, and the
checkpoint names the ones whose results the driver took.

The earlier form of this module had the driver read every slice and ``parallelize`` one
payload per range, and ``collect`` an intermediate operator's output to send it out
again: every event crossed the driver twice per operator.
"""
from __future__ import annotations

import functools
import pickle
from collections.abc import Iterable, Iterator

import pyarrow as pa

from operators.api.operator import Operator
from operators.io.sinks import Sink
from operators.io.sources import Source
from operators.runtime.exchange import (
    DeadLetterResult,
    DeadLetterSpec,
    Exchange,
    run_dead_letters,
    run_range,
)
from operators.runtime.open_state import OpenState
from operators.runtime.splits import ReadContext, Split, SplitSummary, read_split
from operators.runtime.task import TaskResult, TaskSpec
from storage.dkv import DKVOptions
from storage.objectstore import ObjectStore


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes (only the rows a slice covers)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table ``to_ipc`` wrote."""
    return pa.ipc.open_stream(data).read_all()


def _identity(key: int) -> int:
    return key


def _values(pairs: Iterable[tuple[int, object]]) -> Iterator[object]:
    for _, value in pairs:
        yield value


def _pickled(value) -> bytes:
    """What a task sends the driver, pickled by the task, so the driver can count the
    bytes it receives (``SparkExchange.bytes_received``)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class SparkExchange(Exchange):
    """``Exchange`` on a ``SparkSession`` (module docstring).

    Args:
        spark: the ``SparkSession``.
        store: the job's object store; each task gets it pickled (its configuration).
        dkv_options: DKV tuning.
        parallelism: the first operator's number of ranges.
    """

    def __init__(self, spark, store: ObjectStore, dkv_options: DKVOptions | None, parallelism: int) -> None:
        self.sc = spark.sparkContext
        self.store, self.dkv_options = store, dkv_options
        self._parallelism = parallelism
        self._input = None  # the shuffled RDD the next operator stage reads
        self.bytes_received = 0  # pickled summaries and results the driver took from tasks

    def _take(self, rdd, partitions: list[int]) -> list:
        """Runs a job on ``partitions`` of ``rdd`` (pairs whose values are ``_pickled``)
        and returns the values, counting their bytes."""
        data = self.sc.runJob(rdd, _values, partitions=partitions)
        self.bytes_received += sum(len(d) for d in data)
        return [pickle.loads(d) for d in data]

    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary]:
        p = self._parallelism
        if not splits:
            self._input = self.sc.parallelize([], p + 2)
            return []
        rdd = self.sc.parallelize(splits, len(splits)).mapPartitions(functools.partial(_read_splits, source, ctx))
        self._input = rdd.partitionBy(p + 2, _identity)
        summaries = self._take(self._input, [p + 1])
        order = {s: i for i, s in enumerate(splits)}
        return sorted(summaries, key=lambda s: order[s.split])

    def run_operator(self, operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema,
                     sinks: dict[str, Sink] | None, dead: DeadLetterSpec | None
                     ) -> tuple[list[TaskResult], DeadLetterResult | None]:
        p = len(specs)
        if p != self._parallelism:
            raise ValueError(f"operator {operator.name}: {p} task specs for an exchange of "
                             f"{self._parallelism} ranges")
        last = sinks is not None
        next_p = None if last else specs[0].next_parallelism
        body = functools.partial(_run_partition, operator, specs, input_schema, self.store, sinks,
                                 self.dkv_options, dead, next_p)
        tasks = self._input.mapPartitionsWithIndex(body)
        wanted = list(range(p)) + ([p] if dead is not None else [])
        if last:
            out = self._take(tasks, wanted)
        else:
            self._input = tasks.partitionBy(next_p + 2, _identity)
            self._parallelism = next_p
            out = self._take(self._input, [next_p + 1])
        results = sorted((r for r in out if isinstance(r, TaskResult)), key=lambda r: r.range_index)
        dead_results = [r for r in out if isinstance(r, DeadLetterResult)]
        if len(results) != p:
            raise RuntimeError(f"stage of operator {operator.name} returned {len(results)} task results "
                               f"for {p} ranges")
        return results, (dead_results[0] if dead_results else None)


# Per Spark Python worker process (workers are reused, spark.python.worker.reuse): the
# object stores of the tasks it ran, by root URI, and the ranges' open DKV instances.
_STORES: dict[str, ObjectStore] = {}
_OPEN_STATE = OpenState()


def _read_splits(source: Source, ctx: ReadContext, splits: Iterable[Split]) -> Iterator[tuple[int, object]]:
    """A read task: each of its splits (one with ``parallelize(splits, len(splits))``)."""
    dead_index, meta_index = ctx.parallelism, ctx.parallelism + 1
    for split in splits:
        out = read_split(source, split, ctx)
        for r, table in out.events:
            yield r, to_ipc(table)
        if out.dead.num_rows:
            yield dead_index, to_ipc(out.dead)
        yield meta_index, _pickled(out.summary)


def _run_partition(operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema, store: ObjectStore,
                   sinks: dict[str, Sink] | None, dkv_options: DKVOptions | None, dead: DeadLetterSpec | None,
                   next_parallelism: int | None, index: int,
                   pairs: Iterable[tuple[int, object]]) -> Iterator[tuple[int, object]]:
    """The task of shuffle partition ``index``: a range's operator task (index < P), the
    dead-letter task (``index == P``, first operator only) or nothing (the summaries)."""
    p = len(specs)
    meta = p + 1 if next_parallelism is None else next_parallelism + 1
    if index > p or (index == p and dead is None):
        return
    # One store per root in a worker: its clients and stats live as long as the worker.
    store = _STORES.setdefault(store.root_uri, store)
    tables = [from_ipc(data) for _, data in pairs]
    if index == p:
        yield meta, _pickled(run_dead_letters(dead, tables, store))
        return
    res, forwarded = run_range(operator, specs[index], tables, input_schema, store, sinks, dkv_options,
                               _OPEN_STATE)
    for r, table in forwarded:
        yield r, to_ipc(table)
    yield meta, _pickled(res)
