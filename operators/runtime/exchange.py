"""The epoch's data plane: read tasks, the exchange of events by key-group range, operator tasks.

One epoch moves its events like this (docs/design.md, "Epochs and checkpoints"):

1. **Read stage**: one read task per ``splits.Split`` (``splits.read_split``) emits its
   good events per key-group range of the first operator, its dead-letter rows (to
   range 0) and a ``SplitSummary``.
2. **Event time** (``event_time.epoch_event_time``, one pure function of the summaries): when
   the job aligns watermarks, the summaries (with their event-time steps) go to the
   driver (``Exchange.read``), which computes the watermark and the cuts before any
   operator task runs: a Spark job of its own. Otherwise every range of the first
   operator receives every summary (a few dozen bytes each) with its events and computes
   the same watermark itself, so reading and the first operator are one Spark job.
3. **Operator stages**: operator i runs one task per key-group range over the events
   routed to that range (``run_range``); an intermediate operator's ``main`` output is
   routed by the next operator's ranges in the same way, and only the ``TaskResult``s
   reach the driver. The first operator's range 0 also stages the epoch's bad input
   rows, before the alignment cut, as one file (``run_dead_letters``).

Two implementations: ``LocalExchange`` runs every task in this process (the in-process
runner: tests, debugging), ``dkvstream.operators.spark.stage.SparkExchange`` runs them as Spark tasks
with Spark's shuffle routing Arrow IPC batches. Both run the same task bodies here.
"""
from __future__ import annotations

import dataclasses
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from dkvstream.operators.api.columns import RANGE_COLUMN
from dkvstream.operators.api.operator import Operator
from dkvstream.operators.io import dead_letter
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.paths import LAYOUT_FLAT
from dkvstream.operators.runtime.event_time import EventTimeInputs, epoch_event_time
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.splits import (
    ReadContext,
    Split,
    SplitSummary,
    cut_dead_letters,
    read_split,
    split_by_range,
)
from dkvstream.operators.runtime.task import TaskResult, TaskSpec, run_task
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.objectstore import ObjectStore, subtract_requests


@dataclass(frozen=True)
class DeadLetterSpec:
    """What range 0 of the first operator needs to stage the dead letters (pickled to it).

    Attributes:
        job_prefix, epoch: where and for which epoch it stages.
        cuts: watermark alignment's cuts, ``{partition: first offset not read}``.
        layout: the job's key layout (``dkvstream.operators.paths``).
    """

    job_prefix: str
    epoch: int
    cuts: dict[str, int]
    layout: int = LAYOUT_FLAT


@dataclass
class DeadLetterResult:
    """What staging the dead letters gave: the staged file (None: no bad rows),
    per-reason counts (``dead_letter.reason_counts``) and the file's checksum
    (``ObjectChecksum.to_json``; None: no file)."""

    staged_key: str | None
    counts: dict[str, int]
    checksum: list[int] | None = None


@dataclass(frozen=True)
class FirstStage:
    """What the first operator's stage does besides its operator.

    Attributes:
        dead: staging the dead letters (range 0).
        event_time: when the driver did not compute the epoch's event time (the job
            does not align): its inputs; each task computes it from the summaries it
            received and uses its watermark, range 0 returns it
            (``TaskResult.event_time``). None: the specs carry the watermark and cuts.
    """

    dead: DeadLetterSpec
    event_time: EventTimeInputs | None = None


def summary_order(summary: SplitSummary) -> tuple[int, int]:
    """The order summaries are used in, whatever order they arrived in."""
    return summary.split.part_index, summary.split.start


def run_range(operator: Operator, spec: TaskSpec, tables: list[pa.Table], input_schema: pa.Schema,
              store: ObjectStore, sinks: dict[str, Sink] | None, dkv_options: DKVOptions | None,
              open_state: OpenState | None, first: FirstStage | None = None, summaries: list[SplitSummary] = (),
              dead_tables: list[pa.Table] = ()
              ) -> tuple[TaskResult, list[tuple[int, pa.Table]], DeadLetterResult | None]:
    """One operator task: the events routed to ``spec``'s range (``tables``, any order;
    none: an empty table of ``input_schema``, so the range still fires its timers) run
    through ``task.run_task``. In the first operator's stage (``first``): with
    ``first.event_time``, the epoch's event time computed from ``summaries`` gives the
    watermark; range 0 stages ``dead_tables``.

    Returns:
        ``(result, forwarded, dead)``: the ``TaskResult`` (``metrics["requests"]``: the
        task's object-store requests), for an intermediate operator its ``main`` output
        as ``[(next range index, table)]``, and range 0's ``DeadLetterResult`` (else None).
    """
    event_time = None
    if first is not None and first.event_time is not None:
        event_time = epoch_event_time(first.event_time, sorted(summaries, key=summary_order))
        spec = dataclasses.replace(spec, watermark_after=event_time.watermark)
    events = pa.concat_tables(tables) if tables else input_schema.empty_table()
    before = store.stats.snapshot()
    res = run_task(operator, spec, events, store, sinks=sinks, dkv_options=dkv_options, open_state=open_state)
    dead = None
    if first is not None and spec.range_index == 0:
        dead = run_dead_letters(first.dead, list(dead_tables), store)
        res.event_time = event_time
    res.metrics["requests"] = subtract_requests(store.stats.snapshot(), before)
    forwarded, res.forwarded = res.forwarded, None
    if forwarded is None or not forwarded.num_rows:
        return res, [], dead
    return res, split_by_range(forwarded, forwarded.column(RANGE_COLUMN).to_numpy()), dead


def run_dead_letters(spec: DeadLetterSpec, tables: list[pa.Table], store: ObjectStore) -> DeadLetterResult:
    """The read tasks' bad rows before the alignment cut, staged as one file labelled
    ``source`` (published as ``part-source.parquet``)."""
    dead = cut_dead_letters(pa.concat_tables(tables), spec.cuts) if tables else None
    if dead is None or not dead.num_rows:
        return DeadLetterResult(None, {})
    key, checksum = dead_letter.stage(store, spec.job_prefix, spec.epoch, dead, uuid.uuid4().hex[:12],
                                      layout=spec.layout)
    return DeadLetterResult(key, dead_letter.reason_counts(dead), checksum.to_json())


class Exchange(ABC):
    """One epoch's data plane: ``read`` once, then ``run_operator`` per operator in order.

    ``bytes_received``: bytes of summaries and task results the driver received from
    tasks (Spark; 0 in process, where there is no transfer).
    """

    bytes_received: int = 0

    @abstractmethod
    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary] | None:
        """Runs the read tasks, keeping their events and dead letters for the first
        operator's stage. With ``ctx.alignment`` returns the ``SplitSummary``s (in
        ``splits`` order); else None: the summaries go to the first operator's tasks
        with the events (Spark runs the read tasks in the first operator's job then).

        Raises:
            Whatever a read task raises (a bad slice, ``BadInputError``).
        """

    @abstractmethod
    def run_operator(self, operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema,
                     sinks: dict[str, Sink] | None, first: FirstStage | None
                     ) -> tuple[list[TaskResult], DeadLetterResult | None]:
        """Runs ``operator``'s tasks, one per ``specs[i]`` (range i), over the events
        routed to each range (``input_schema``: their schema); an intermediate
        operator's (``sinks`` None) ``main`` output is kept for the next call.
        ``first``: this is the first operator's stage (``FirstStage``).

        Returns:
            ``(results in range order, range 0's DeadLetterResult in the first stage, else None)``.
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
        self._summaries: list[SplitSummary] = []

    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary] | None:
        for split in splits:
            out = read_split(source, split, ctx)
            for r, table in out.events:
                self._events.setdefault(r, []).append(table)
            if out.dead.num_rows:
                self._dead.append(out.dead)
            self._summaries.append(out.summary)
        return list(self._summaries) if ctx.alignment else None

    def run_operator(self, operator, specs, input_schema, sinks, first):
        results, routed, dead = [], {}, None
        for spec in specs:
            res, forwarded, dead_result = run_range(
                operator, spec, self._events.get(spec.range_index, []), input_schema, self.store, sinks,
                self.dkv_options, self.open_state, first, self._summaries, self._dead)
            results.append(res)
            dead = dead_result or dead
            for r, table in forwarded:
                routed.setdefault(r, []).append(table)
        self._events, self._dead, self._summaries = routed, [], []
        return results, dead
