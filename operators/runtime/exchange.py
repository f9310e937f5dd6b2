"""The epoch's data plane: read tasks, the exchange of events by key-group range, operator tasks.

One epoch moves its events like this (docs/design.md, "Epochs and checkpoints"):

1. **Read stage**: one read task per ``splits.Split`` (``splits.read_split``) emits its
   good events per key-group range of the first operator, its dead-letter rows, and a
   ``SplitSummary``; only the summaries reach the driver (``Exchange.read``), which
   computes the watermark and the alignment cuts from them.
2. **Operator stages**: operator i runs one task per key-group range over the events
   routed to that range (``run_range``); an intermediate operator's ``main`` output is
   routed by the next operator's ranges in the same way, and only the ``TaskResult``s
   reach the driver. The dead-letter task (``run_dead_letters``) stages the epoch's bad
   input rows, before the alignment cut, as one file.

Two implementations: ``LocalExchange`` runs every task in this process (the in-process
runner: tests, debugging), ``operators.spark.stage.SparkExchange`` runs them as Spark tasks
with Spark's shuffle routing Arrow IPC batches. Both run the same task bodies here.
"""
from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from operators.api.operator import Operator
from operators.io.sinks import Sink
from operators.io.sources import Source
from operators.runtime import dead_letter
from operators.runtime.open_state import OpenState
from operators.runtime.splits import (
    RANGE_COLUMN,
    ReadContext,
    Split,
    SplitSummary,
    cut_dead_letters,
    read_split,
    split_by_range,
)
from operators.runtime.task import TaskResult, TaskSpec, run_task
from storage.dkv import DKVOptions
from storage.objectstore import ObjectStore, subtract_requests


@dataclass(frozen=True)
class DeadLetterSpec:
    """What the dead-letter task needs (pickled to it).

    Attributes:
        job_prefix, epoch: where and for which epoch it stages.
        cuts: watermark alignment's cuts, ``{partition: first offset not read}``.
    """

    job_prefix: str
    epoch: int
    cuts: dict[str, int]


@dataclass
class DeadLetterResult:
    """The dead-letter task's result: the staged file (None: no bad rows) and per-reason
    counts (``dead_letter.reason_counts``)."""

    staged_key: str | None
    counts: dict[str, int]


def run_range(operator: Operator, spec: TaskSpec, tables: list[pa.Table], input_schema: pa.Schema,
              store: ObjectStore, sinks: dict[str, Sink] | None, dkv_options: DKVOptions | None,
              open_state: OpenState | None) -> tuple[TaskResult, list[tuple[int, pa.Table]]]:
    """One operator task: the events routed to ``spec``'s range (``tables``, any order;
    none: an empty table of ``input_schema``, so the range still fires its timers) run
    through ``task.run_task``.

    Returns:
        ``(result, forwarded)``: the ``TaskResult`` (``metrics["requests"]``: the task's
        object-store requests) and, for an intermediate operator, its ``main`` output
        as ``[(next range index, table)]``.
    """
    events = pa.concat_tables(tables) if tables else input_schema.empty_table()
    before = store.stats.snapshot()
    res = run_task(operator, spec, events, store, sinks=sinks, dkv_options=dkv_options, open_state=open_state)
    res.metrics["requests"] = subtract_requests(store.stats.snapshot(), before)
    forwarded, res.forwarded = res.forwarded, None
    if forwarded is None or not forwarded.num_rows:
        return res, []
    return res, split_by_range(forwarded, forwarded.column(RANGE_COLUMN).to_numpy())


def run_dead_letters(spec: DeadLetterSpec, tables: list[pa.Table], store: ObjectStore) -> DeadLetterResult:
    """The dead-letter task: the read tasks' bad rows before the alignment cut, staged as
    one file labelled ``source`` (published as ``part-source.parquet``)."""
    dead = cut_dead_letters(pa.concat_tables(tables), spec.cuts) if tables else None
    if dead is None or not dead.num_rows:
        return DeadLetterResult(None, {})
    key = dead_letter.stage(store, spec.job_prefix, spec.epoch, dead, uuid.uuid4().hex[:12])
    return DeadLetterResult(key, dead_letter.reason_counts(dead))


class Exchange(ABC):
    """One epoch's data plane: ``read`` once, then ``run_operator`` per operator in order.

    ``bytes_received``: bytes of summaries and task results the driver received from
    tasks (Spark; 0 in process, where there is no transfer).
    """

    bytes_received: int = 0

    @abstractmethod
    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary]:
        """Runs the read tasks; keeps their events and dead letters for the first
        operator's stage; returns the ``SplitSummary``s, in ``splits`` order.

        Raises:
            Whatever a read task raises (a bad slice, ``BadInputError``).
        """

    @abstractmethod
    def run_operator(self, operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema,
                     sinks: dict[str, Sink] | None, dead: DeadLetterSpec | None
                     ) -> tuple[list[TaskResult], DeadLetterResult | None]:
        """Runs ``operator``'s tasks, one per ``specs[i]`` (range i), over the events
        routed to each range (``input_schema``: their schema); an intermediate
        operator's (``sinks`` None) ``main`` output is kept for the next call. ``dead``:
        also run the dead-letter task (the first operator's stage).

        Returns:
            ``(results in range order, the dead-letter task's result or None)``.
        """


class LocalExchange(Exchange):
    """Every task in this process, one after another (``JobRunner(job, None, ...)``).

    Args:
        store: the job's object store.
        dkv_options: DKV tuning.
        open_state: keeps each range's DKV open between epochs, as a Spark worker does.
    """

    def __init__(self, store: ObjectStore, dkv_options: DKVOptions | None, open_state: OpenState) -> None:
        self.store, self.dkv_options, self.open_state = store, dkv_options, open_state
        self._events: dict[int, list[pa.Table]] = {}
        self._dead: list[pa.Table] = []

    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary]:
        summaries = []
        for split in splits:
            out = read_split(source, split, ctx)
            for r, table in out.events:
                self._events.setdefault(r, []).append(table)
            if out.dead.num_rows:
                self._dead.append(out.dead)
            summaries.append(out.summary)
        return summaries

    def run_operator(self, operator, specs, input_schema, sinks, dead):
        results, routed = [], {}
        for spec in specs:
            res, forwarded = run_range(operator, spec, self._events.get(spec.range_index, []), input_schema,
                                       self.store, sinks, self.dkv_options, self.open_state)
            results.append(res)
            for r, table in forwarded:
                routed.setdefault(r, []).append(table)
        dead_result = None if dead is None else run_dead_letters(dead, self._dead, self.store)
        self._events, self._dead = routed, []
        return results, dead_result
