"""The epoch's data plane on Spark: read tasks, Spark's shuffle as the exchange, operator tasks.

``SparkExchange`` implements ``dkvstream.operators.runtime.exchange.Exchange`` with RDD operations
(the task bodies are ``dkvstream.operators.runtime.exchange``'s, the same as in process):

* **Read stage.** ``parallelize(splits)`` (at most one task per core); each read task
  (``splits.read_split``) emits ``(range index, (EVENTS, Arrow IPC bytes))`` per
  key-group range of the first operator it has events for, ``(0, (DEAD, IPC))`` for its
  dead-letter rows and its ``SplitSummary``. ``partitionBy`` with the identity as
  partitioner is the exchange: shuffle partition r holds range r's batches.
* **Event time.** Without watermark alignment each read task sends its summary to every
  range, ``(r, (SUMMARY, pickle))``, and each operator task computes the epoch's
  watermark from them (``event_time.epoch_event_time``): the read stage and the first
  operator's stage are one Spark job. With alignment the summaries (which then carry
  event-time steps, up to ~32 KB each) go to one extra shuffle partition, ``META = P``;
  the driver runs a job on it alone (``SparkContext.runJob``), which runs the read stage
  and brings back the summaries, and computes the watermark and cuts before the
  operator stage.
* **Operator stage.** ``mapPartitionsWithIndex`` over the shuffled RDD: the task of
  partition r < P runs range r's operator task over its batches (range 0 of the first
  operator also stages the dead letters). Spark reuses the read stage's shuffle output
  when the driver ran it already (the map stage is skipped). An intermediate operator's
  tasks emit their ``main`` output the same way, ``(next range, (EVENTS, IPC))``, plus
  ``(META', TaskResult)`` into the next ``partitionBy``; the driver runs the job on META'
  to take the results. The last operator's tasks return their ``TaskResult``s straight
  to the driver. Whatever a task sends the driver is pickled by the task, so the driver
  counts the bytes (``bytes_received``, the checkpoint's ``driver_bytes_received``).

A ``DkvstreamError`` a task raises reaches the driver with its type
(``dkvstream.operators.runtime.task_errors``; the task bodies here are wrapped in ``carry_errors``).

Task retries and speculation stay safe: a task writes only under names unique to its
attempt (``task.run_task``), and the shuffle registers one map output per partition, so
the results the driver collects and the events the next stage reads come from the same
attempt. A map stage Spark re-runs after a lost executor (a fetch failure) recomputes the
same events from the same offsets and state; its files get new names, and the
checkpoint names the ones whose results the driver took.

The earlier form of this module had the driver read every slice and ``parallelize`` one
payload per range, and ``collect`` an intermediate operator's output to send it out
again: every event crossed the driver twice per operator.
"""
from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from dkvstream.operators.api.operator import Operator
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.runtime.exchange import DeadLetterResult, Exchange, FirstStage, run_range
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.splits import ReadContext, Split, SplitSummary, read_split
from dkvstream.operators.runtime.task import TaskResult, TaskSpec
from dkvstream.operators.runtime.task_errors import carry_errors, task_error
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.objectstore import ObjectStore


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


# Tags of the exchanged records' values.
EVENTS, DEAD, SUMMARY = 0, 1, 2


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

    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary] | None:
        p = self._parallelism
        partitions = p + 1 if ctx.alignment else p  # META = P, with alignment only
        if not splits:
            self._input = self.sc.parallelize([], partitions)
            return [] if ctx.alignment else None
        # No more read tasks than cores: a task's fixed cost (closure, worker round trip)
        # is paid once per core, and every core still reads.
        tasks = min(len(splits), max(1, self.sc.defaultParallelism))
        rdd = self.sc.parallelize(splits, tasks).mapPartitions(functools.partial(_read_splits, source, ctx))
        self._input = rdd.partitionBy(partitions, _identity)
        if not ctx.alignment:
            return None
        summaries = self._take(self._input, [p])
        order = {s: i for i, s in enumerate(splits)}
        return sorted(summaries, key=lambda s: order[s.split])

    def run_operator(self, operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema,
                     sinks: dict[str, Sink] | None, first: FirstStage | None
                     ) -> tuple[list[TaskResult], DeadLetterResult | None]:
        p = len(specs)
        if p != self._parallelism:
            raise ValueError(f"operator {operator.name}: {p} task specs for an exchange of "
                             f"{self._parallelism} ranges")
        last = sinks is not None
        next_p = None if last else specs[0].next_parallelism
        body = functools.partial(_run_partition, operator, specs, input_schema, self.store, sinks,
                                 self.dkv_options, first, next_p)
        tasks = self._input.mapPartitionsWithIndex(body)
        if last:
            out = self._take(tasks, list(range(p)))
        else:
            self._input = tasks.partitionBy(next_p + 1, _identity)
            self._parallelism = next_p
            out = self._take(self._input, [next_p])
        results = sorted((r for r in out if isinstance(r, TaskResult)), key=lambda r: r.range_index)
        dead_results = [r for r in out if isinstance(r, DeadLetterResult)]
        if len(results) != p:
            raise RuntimeError(f"stage of operator {operator.name} returned {len(results)} task results "
                               f"for {p} ranges")
        return results, (dead_results[0] if dead_results else None)


@carry_errors
def map_items(fn: Callable, items: Iterable) -> Iterator:
    """A task applying ``fn`` to each of its items (``JobRunner._map_in_tasks``)."""
    for item in items:
        yield fn(item)


def map_in_tasks(spark, fn: Callable, items: list) -> list:
    """``[fn(item) for item in items]`` in Spark tasks, one per item and at most one per
    core (``JobRunner._map_in_tasks``: publishing without passing bytes through the driver).

    Raises:
        DkvstreamError: a task's own error, rebuilt with its type (``task_errors``).
    """
    sc = spark.sparkContext
    tasks = sc.parallelize(items, min(len(items), max(1, sc.defaultParallelism)))
    try:
        return tasks.mapPartitions(functools.partial(map_items, fn)).collect()
    except Exception as e:
        cause = task_error(e)
        if cause is not None:  # the task's own error, as in process
            raise cause from e
        raise


# Per Spark Python worker process (workers are reused, spark.python.worker.reuse): the
# object stores of the tasks it ran, by root URI, and the ranges' open DKV instances.
_STORES: dict[str, ObjectStore] = {}
_OPEN_STATE = OpenState()


@carry_errors
def _read_splits(source: Source, ctx: ReadContext, splits: Iterable[Split]) -> Iterator[tuple[int, object]]:
    """A read task: each of its splits."""
    p = ctx.parallelism
    for split in splits:
        out = read_split(source, split, ctx)
        for r, table in out.events:
            yield r, (EVENTS, to_ipc(table))
        if out.dead.num_rows:
            yield 0, (DEAD, to_ipc(out.dead))
        summary = _pickled(out.summary)
        if ctx.alignment:
            yield p, summary  # META: the driver takes the summaries
        else:
            for r in range(p):  # every range computes the watermark
                yield r, (SUMMARY, summary)


@carry_errors
def _run_partition(operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema, store: ObjectStore,
                   sinks: dict[str, Sink] | None, dkv_options: DKVOptions | None, first: FirstStage | None,
                   next_parallelism: int | None, index: int,
                   pairs: Iterable[tuple[int, object]]) -> Iterator[tuple[int, object]]:
    """The task of shuffle partition ``index``: range ``index``'s operator task, or
    nothing for the META partition (``index == P``)."""
    p = len(specs)
    if index >= p:
        return
    # One store per root in a worker: its clients and stats live as long as the worker.
    store = _STORES.setdefault(store.root_uri, store)
    tables, dead, summaries = [], [], []
    for _, (tag, data) in pairs:
        if tag == EVENTS:
            tables.append(from_ipc(data))
        elif tag == DEAD:
            dead.append(from_ipc(data))
        else:
            summaries.append(pickle.loads(data))
    res, forwarded, dead_result = run_range(operator, specs[index], tables, input_schema, store, sinks,
                                            dkv_options, _OPEN_STATE, first, summaries, dead)
    meta = 0 if next_parallelism is None else next_parallelism
    for r, table in forwarded:
        yield r, (EVENTS, to_ipc(table))
    yield meta, _pickled(res)
    if dead_result is not None:
        yield meta, _pickled(dead_result)
