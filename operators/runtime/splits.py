"""An epoch's input, read inside tasks: splits, what a read task returns, the stage input.

Which part of a ``Source`` runs where (docs/design.md, "Epochs and checkpoints"):

* **driver**: ``attach``, ``partitions``, ``start_offset``, ``end_offsets``, ``bounded``,
  ``value_schema``, ``close``: planning, offsets and the watermark's inputs.
* **tasks**: ``read``. The driver plans one ``Split`` per partition with offsets to read
  (a slice ``[start, end)``), and a read task (a Spark task; this process for the
  in-process runner) runs ``read_split`` on it: read, check the schema
  (``sources.check_slice``), screen bad rows to dead letters
  (``dkvstream.operators.io.dead_letter.screen``), tag each event with its key group and
  key-group range, and cut the good events into one table per range.

The source object travels to the tasks pickled, with the split: it must pickle small
(configuration, not data) and load what it reads lazily in the task.

What a read task returns goes two ways: the events and dead letters through the
exchange (Spark's shuffle, as Arrow IPC batches, to the range's operator task and to
the dead-letter task), and a ``SplitSummary`` (counts, max event time, the event-time
steps watermark alignment needs: ``event_time.EventTimeSteps``) to the driver. The summary's
size depends on the number of splits, never on the number of events.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.columns import (
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    KG_COLUMN,
    OFFSET_COLUMN,
    PART_COLUMN,
    RANGE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.api.keygroups import key_groups_of_column, range_indexes_of
from dkvstream.operators.api.operator import WATERMARK_MIN
from dkvstream.operators.io import dead_letter
from dkvstream.operators.io.dead_letter import DeadLetter
from dkvstream.operators.io.sources import Source, check_slice
from dkvstream.operators.runtime.event_time import EventTimeSteps


@dataclass(frozen=True)
class Split:
    """One slice of one source partition, read by one read task.

    Attributes:
        partition: the source partition's name.
        part_index: its index in the epoch's partition order (the events' ``_part``).
        start, end: offsets ``[start, end)`` to read, ``end > start``.
    """

    partition: str
    part_index: int
    start: int
    end: int


@dataclass(frozen=True)
class ReadContext:
    """What every read task of an epoch needs besides its split (pickled to tasks).

    Attributes:
        epoch: the epoch read (written into dead-letter rows).
        now_ms: the wall clock of the epoch's plan, ms (the future-timestamp screen).
        key_groups, parallelism: K and the first operator's number of ranges.
        dead_letter: the job's ``DeadLetter`` policy.
        alignment: the job aligns watermarks (``max_watermark_drift_ms``): summaries
            carry the event-time steps.
    """

    epoch: int
    now_ms: int
    key_groups: int
    parallelism: int
    dead_letter: DeadLetter
    alignment: bool = False


@dataclass(frozen=True)
class SplitSummary:
    """What the driver learns of a split it did not read (bytes independent of events).

    Attributes:
        split: the split.
        rows: good rows read (events).
        dead: rows screened out to the dead-letter table.
        max_ts: largest event time of the good rows, ms (``WATERMARK_MIN``: none).
        steps: the good rows' event-time steps, for watermark alignment (None: no rows,
            or the job does not align).
    """

    split: Split
    rows: int
    dead: int
    max_ts: int
    steps: EventTimeSteps | None


@dataclass
class ReadOutput:
    """A read task's output: ``events`` as ``[(range index, table)]`` (ranges with
    events only, each in offset order), ``dead`` (``DEAD_LETTER_SCHEMA`` rows) and the
    ``summary`` for the driver."""

    events: list[tuple[int, pa.Table]]
    dead: pa.Table
    summary: SplitSummary


def stage_input_schema(value_schema: pa.Schema) -> pa.Schema:
    """Schema of the first operator's input events: key, timestamp, the source's value
    columns, then ``_part``, ``_offset``, ``_ingest_time`` (null where the source gives
    none), ``_kg`` and ``_range``."""
    return pa.schema([pa.field(KEY_COLUMN, pa.binary()), pa.field(TIMESTAMP_COLUMN, pa.int64()),
                      *value_schema, pa.field(PART_COLUMN, pa.int32()), pa.field(OFFSET_COLUMN, pa.int64()),
                      pa.field(INGEST_TIME_COLUMN, pa.int64()), pa.field(KG_COLUMN, pa.int32()),
                      pa.field(RANGE_COLUMN, pa.int32())])


def read_split(source: Source, split: Split, ctx: ReadContext) -> ReadOutput:
    """Reads one split in a task: check, screen, tag with key group and range, cut by range.

    Args:
        source: the job's source (unpickled in the task).
        split: what to read.
        ctx: the epoch's ``ReadContext``.

    Returns:
        The ``ReadOutput``.

    Raises:
        TypeError, ValueError: the slice does not match the source's schema or offsets
            (``sources.check_slice``; the message names source, partition and offsets).
        BadInputError: a bad row under ``DeadLetter(tolerance="none")``.
    """
    p, start, end = split.partition, split.start, split.end
    t = check_slice(source, p, start, end, source.read(p, start, end))
    if OFFSET_COLUMN in t.column_names:  # a source with offset gaps names them
        offsets = t.column(OFFSET_COLUMN).to_numpy().astype(np.int64, copy=False)
        t = t.drop_columns([OFFSET_COLUMN])
    else:
        offsets = np.arange(start, end, dtype=np.int64)
    ingest = None
    if INGEST_TIME_COLUMN in t.column_names:  # for the latency metric, not operators
        ingest = t.column(INGEST_TIME_COLUMN).combine_chunks()
        t = t.drop_columns([INGEST_TIME_COLUMN])
    read_offsets = offsets
    t, dead, offsets = dead_letter.screen(t, offsets, ctx.dead_letter, source=source.name, partition=p,
                                          epoch=ctx.epoch, now_ms=ctx.now_ms)
    if ingest is None:
        ingest = pa.nulls(len(offsets), pa.int64())
    elif len(offsets) != len(read_offsets):
        ingest = ingest.take(pa.array(np.searchsorted(read_offsets, offsets)))
    n = t.num_rows
    t, ranges = tag_events(t, split.part_index, offsets, ingest, ctx.key_groups, ctx.parallelism)
    ts = t.column(TIMESTAMP_COLUMN).to_numpy() if n else np.zeros(0, np.int64)
    summary = SplitSummary(split=split, rows=n, dead=dead.num_rows,
                           max_ts=int(ts.max()) if n else WATERMARK_MIN,
                           steps=EventTimeSteps.of(offsets, ts) if n and ctx.alignment else None)
    return ReadOutput(events=split_by_range(t, ranges), dead=dead, summary=summary)


def tag_events(events: pa.Table, part_index: int, offsets: np.ndarray, ingest: pa.Array,
               key_groups: int, parallelism: int) -> tuple[pa.Table, np.ndarray]:
    """Appends the columns a read task tags its events with, for the first operator.

    Args:
        events: key (binary), timestamp and value columns, in input order.
        part_index: the partition's index in the epoch's plan (``_part``).
        offsets: each row's source offset (int64, one per row; ``_offset``).
        ingest: each row's ingest time, ms, or nulls (int64; ``_ingest_time``).
        key_groups: the job's key groups.
        parallelism: the first operator's parallelism (ranges).

    Returns:
        ``(events with _part, _offset, _ingest_time, _kg and _range appended, the range
        index of each row as int32)``.
    """
    n = events.num_rows
    kgs = key_groups_of_column(events.column(KEY_COLUMN), key_groups) if n else np.zeros(0, np.int32)
    ranges = range_indexes_of(kgs, key_groups, parallelism)
    for name, column in ((PART_COLUMN, pa.array(np.full(n, part_index, np.int32))),
                         (OFFSET_COLUMN, pa.array(offsets, pa.int64())), (INGEST_TIME_COLUMN, ingest),
                         (KG_COLUMN, pa.array(kgs, pa.int32())), (RANGE_COLUMN, pa.array(ranges, pa.int32()))):
        events = events.append_column(name, column)
    return events, ranges


def split_by_range(events: pa.Table, ranges: np.ndarray) -> list[tuple[int, pa.Table]]:
    """``[(range index, rows of that range in input order)]`` for the ranges present."""
    if not len(ranges):
        return []
    order = np.argsort(ranges, kind="stable")
    ordered = events.take(pa.array(order))
    sorted_ranges = ranges[order]
    cuts = np.flatnonzero(np.diff(sorted_ranges)) + 1
    bounds = [0, *cuts.tolist(), len(sorted_ranges)]
    return [(int(sorted_ranges[a]), ordered.slice(a, b - a)) for a, b in itertools.pairwise(bounds)]


def apply_cuts(events: pa.Table, offset_limits: dict[int, int] | None) -> pa.Table:
    """The rows of ``events`` before their partition's alignment cut: ``_offset <
    offset_limits[_part]`` (a partition not named is not cut)."""
    if not offset_limits or not events.num_rows:
        return events
    part = events.column(PART_COLUMN).to_numpy()
    limit = np.full(int(part.max()) + 1, np.iinfo(np.int64).max, np.int64)
    for i, cut in offset_limits.items():
        if i < len(limit):
            limit[i] = cut
    keep = events.column(OFFSET_COLUMN).to_numpy() < limit[part]
    return events if keep.all() else events.filter(pa.array(keep))


def cut_dead_letters(dead: pa.Table, cuts: dict[str, int] | None) -> pa.Table:
    """Dead-letter rows before their partition's alignment cut (the rest is read again)."""
    if not cuts or not dead.num_rows:
        return dead
    limit = pa.array([cuts.get(p, np.iinfo(np.int64).max) for p in dead.column("partition").to_pylist()],
                     pa.int64())
    return dead.filter(pc.less(dead.column("offset"), limit))
