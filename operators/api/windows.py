"""Keyed event-time windows on state and timers: tumbling, sliding and session windows
with incremental aggregates, allowed lateness, a late-events output and early firings.

``window_operator(name, windows, aggregates, ...)`` builds a ready-made operator in either
form (``form="batch"``, a ``BatchOperator``, or ``form="event"``, an ``Operator``), with
the same state, timers and output in both. The model is Flink's ``WindowOperator`` with an
``AggregateFunction`` (accumulating mode):

* a window is ``[window_start, window_end)`` of one subject key; its accumulator is
  stored in a ``MapSpec`` (state id ``windows``) keyed by window start (ms), as a
  ``RecordCodec`` of the aggregates' accumulator fields; a key's session windows are
  one value (state id ``sessions``), a list of its sessions' fields;
* a window fires (``on_time``) when the watermark reaches ``window_end - 1`` (Flink's
  ``maxTimestamp``), through a timer at that time (a key's sessions share one timer, at
  the earliest time one of them is due);
* with ``allowed_lateness_ms`` L > 0 the window is kept until the watermark reaches
  ``window_end - 1 + L`` (a second timer): an event arriving in between updates it and
  fires it again at once (``late`` firing, the full updated aggregate);
* an event whose windows are all past ``window_end - 1 + L`` is late: it goes to the
  ``late`` output when one is configured and is dropped otherwise (for sessions, its own
  window ``[ts, ts + gap)``, even if it would merge into an open session: unlike Flink,
  so that the result does not depend on the order of an epoch's events);
* ``early_every=N`` also fires a window (``early``) each time its event count crosses a
  multiple of N before it fires on time;
* ``early_every_ms=T`` (Flink's ``ContinuousProcessingTimeTrigger``) fires a window
  (``early``) at most once per interval ``[k*T, (k+1)*T)`` of processing time, when it has
  events since its last firing and has not fired on time: each key has one
  processing-time timer, at the next multiple of T after the epoch's processing time,
  set by its first event and re-set each time it fires while the key has windows the
  watermark has not closed. Processing time is the epoch's (``BatchContext.processing_time``),
  decided once by the driver and recorded in the checkpoint: a task retried, or an epoch
  run again after a failed task, fires the same windows; an epoch a crashed driver had
  not committed is planned again at the new clock reading (its first attempt published
  nothing).

In the vectorised form an epoch's events are assigned to windows and pre-aggregated per
window with Arrow group-bys, then merged with the stored accumulators by another
group-by; only a user ``AggregateFunction`` runs Python per event. The per-event form runs
the same code on a one-event table (same state bytes, same rows; use it to mix windows
into an ``on_event`` job, not for throughput).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec, MsgpackCodec, RecordCodec
from dkvstream.operators.api.columns import KEY_COLUMN, KEY_GROUP_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.operator import MAIN_OUTPUT, KeyedEvent, Operator, Subject, TimeDomain
from dkvstream.operators.api.state import MapSpec, ValueSpec

WINDOW_START, WINDOW_END, FIRING = "window_start", "window_end", "firing"
EARLY, ON_TIME, LATE = "early", "on_time", "late"  # values of the ``firing`` column
AGG_PREFIX = "@"  # of an aggregate's accumulator fields in state
_TS = pa.timestamp("ms", tz="UTC")
# Accumulator fields every window keeps besides its aggregates'.
_BASE_FIELDS = {"start": pa.int64(), "end": pa.int64(), "events": pa.int64(), "first_ts": pa.int64(),
                "last_ts": pa.int64()}
_KG = KEY_GROUP_COLUMN  # the bulk state calls' key-group column


# --- window kinds -------------------------------------------------------------------

class TumblingWindows:
    """Fixed, non-overlapping windows ``[offset + k*size, offset + (k+1)*size)``.

    Args:
        size_ms: window length (ms, > 0).
        offset_ms: alignment (ms); 0 aligns to the epoch (UTC midnight for a day).

    Raises:
        ValueError: a size that is not a positive int.
    """

    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        _positive("size_ms", size_ms)
        self.size_ms, self.offset_ms = int(size_ms), int(offset_ms)
        self.slide_ms = self.size_ms

    def assign(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each event's windows: (event row index, window start) per (event, window) pair."""
        last = ts - (ts - self.offset_ms) % self.slide_ms
        n = -(-self.size_ms // self.slide_ms)  # windows per event at most
        rows = np.repeat(np.arange(len(ts)), n)
        starts = np.repeat(last, n) - np.tile(np.arange(n, dtype=np.int64) * self.slide_ms, len(ts))
        keep = starts + self.size_ms > np.repeat(ts, n)
        return rows[keep], starts[keep]

    def starts_ending_at(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(is a window end, that window's start) for each end (ms)."""
        starts = ends - self.size_ms
        return (starts - self.offset_ms) % self.slide_ms == 0, starts

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class SlidingWindows(TumblingWindows):
    """Hopping windows of ``size_ms`` starting every ``slide_ms`` (Flink's sliding
    windows): an event belongs to up to ``ceil(size/slide)`` windows.

    Raises:
        ValueError: a size or slide that is not a positive int.
    """

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        super().__init__(size_ms, offset_ms)
        _positive("slide_ms", slide_ms)
        self.slide_ms = int(slide_ms)

    def __repr__(self) -> str:
        return f"SlidingWindows(size_ms={self.size_ms}, slide_ms={self.slide_ms}, offset_ms={self.offset_ms})"


class SessionWindows:
    """Per key, events less than or equal to ``gap_ms`` apart form one session
    ``[first event, last event + gap)``; sessions that come to overlap or touch as events
    arrive (in any order) merge, as Flink's ``EventTimeSessionWindows``.

    Raises:
        ValueError: a gap that is not a positive int.
    """

    def __init__(self, gap_ms: int) -> None:
        _positive("gap_ms", gap_ms)
        self.gap_ms = int(gap_ms)

    def __repr__(self) -> str:
        return f"SessionWindows(gap_ms={self.gap_ms})"


def _nan_to_null(values: pa.Array) -> pa.Array:
    if pa.types.is_floating(values.type):
        return pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
    return values


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int (ms), got {value!r}")


# --- aggregates ---------------------------------------------------------------------

class Aggregate:
    """One output column computed incrementally per window.

    Args:
        column: the input: a value column's name, a ``pyarrow.compute`` expression over
            the event columns (``pc.is_null(pc.field("dep_time"))``), or None where the
            aggregate needs none.
        type: the input's and result's Arrow type.

    Numeric aggregates (``Sum``, ``Min``, ``Max``, ``Mean``) skip nulls and NaN, as pandas'
    ``skipna``; over no values they give null.
    """

    type: pa.DataType = pa.float64()
    funcs: tuple[str, ...] = ()  # Arrow hash aggregates of the input, one per accumulator field
    merges: tuple[str, ...] = ()  # and of the accumulator fields, merging partial accumulators
    order: str | None = None  # "first"/"last": the merge keeps the earliest/latest event's value

    def __init__(self, column: str | pc.Expression | None = None, type: pa.DataType | None = None) -> None:
        self.column = column
        if type is not None:
            self.type = type

    def fields(self, name: str) -> dict[str, pa.DataType]:
        """The accumulator fields stored for output column ``name``."""
        return {name: self.type}

    def input(self, values: pa.Array) -> pa.Array:
        """The evaluated input, cast to ``type``; NaN becomes null for float inputs."""
        return _nan_to_null(values.cast(self.type))

    def result(self, acc: pa.Table, name: str) -> pa.Array:
        """The output column from the accumulator columns."""
        return acc.column(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.column!r})"


class Count(Aggregate):
    """Events in the window (``column`` None), or its values of ``column`` that are
    neither null nor NaN (pandas' ``count``)."""

    type = pa.int64()
    funcs, merges = ("count",), ("sum",)

    def input(self, values: pa.Array) -> pa.Array:
        return _nan_to_null(values)


class Sum(Aggregate):
    """Sum of the non-null, non-NaN values (``type`` float64 unless given)."""

    funcs = merges = ("sum",)


class Min(Aggregate):
    """Smallest non-null, non-NaN value."""

    funcs = merges = ("min",)


class Max(Aggregate):
    """Largest non-null, non-NaN value."""

    funcs = merges = ("max",)


class Mean(Aggregate):
    """Arithmetic mean of the non-null, non-NaN values (float64); null over none."""

    funcs, merges = ("sum", "count"), ("sum", "sum")

    def fields(self, name: str) -> dict[str, pa.DataType]:
        return {f"{name}__sum": pa.float64(), f"{name}__count": pa.int64()}

    def result(self, acc: pa.Table, name: str) -> pa.Array:
        n = acc.column(f"{name}__count")
        return pc.if_else(pc.greater(n, 0), pc.divide(acc.column(f"{name}__sum"), n.cast(pa.float64())),
                          pa.scalar(None, pa.float64()))


class First(Aggregate):
    """The value of the window's earliest event (by event time; ties: the first to
    arrive), null included. ``type`` is required for non-float columns."""

    funcs = merges = ("first",)
    order = "first"

    def input(self, values: pa.Array) -> pa.Array:
        return values.cast(self.type)


class Last(First):
    """The value of the window's latest event (by event time; ties: the last to arrive)."""

    funcs = merges = ("last",)
    order = "last"


class AggregateFunction(Aggregate):
    """A user aggregate, as Flink's ``AggregateFunction``: subclass it, set ``type`` (the
    result's Arrow type) and implement the four methods. Accumulators must be msgpack
    values (numbers, strings, lists, dicts) and are stored with the window. ``add`` runs
    once per event in Python, in both operator forms.

    Example: ``class Distinct(AggregateFunction)`` with ``create_accumulator() -> []``,
    ``add(value, acc) -> sorted(set(acc) | {value})``, ``merge(a, b)``, ``get_result(acc)
    -> len(acc)``, used as ``Distinct("dest")``.
    """

    type = pa.binary()

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError

    def fields(self, name: str) -> dict[str, pa.DataType]:
        return {name: pa.binary()}

    def input(self, values: pa.Array) -> pa.Array:
        return values

    def result(self, acc: pa.Table, name: str) -> pa.Array:
        return pa.array([self.get_result(msgpack.unpackb(b, raw=False)) for b in acc.column(name).to_pylist()],
                        self.type)


# --- the operator core ----------------------------------------------------------------

class _WindowCore:
    """What both operator forms share: assignment, partial aggregation, merging with
    stored accumulators, timers and firing. Subclasses (built by ``window_operator``)
    declare the state specs as class attributes ``windows`` (and ``sessions``)."""

    def _configure(self, name: str, windows: Any, aggregates: dict[str, Aggregate], *,
                   allowed_lateness_ms: int, late_output: str | None, late_columns: dict[str, pa.DataType],
                   early_every: int | None, key_column: str | None, early_every_ms: int | None = None) -> None:
        # Internally (state fields, working columns) an aggregate's name carries an "@"
        # prefix, so that no output name can clash with the window's own fields.
        self.name, self.spec = name, windows
        self.aggregates = {AGG_PREFIX + n: a for n, a in aggregates.items()}
        self.allowed_lateness_ms, self.late_output = int(allowed_lateness_ms), late_output
        self.late_columns, self.early_every, self.key_column = dict(late_columns), early_every, key_column
        self.early_every_ms = early_every_ms
        self.session = isinstance(windows, SessionWindows)
        self.with_firing = bool(early_every) or bool(early_every_ms) or self.allowed_lateness_ms > 0
        cols = [pa.field(key_column, pa.string())] if key_column else []
        cols += [pa.field(WINDOW_START, _TS), pa.field(WINDOW_END, _TS)]
        cols += [pa.field(n, a.type) for n, a in aggregates.items()]
        if self.with_firing:
            cols.append(pa.field(FIRING, pa.string()))
        self.outputs = {MAIN_OUTPUT: pa.schema(cols)}
        if late_output:
            self.outputs[late_output] = pa.schema(
                [pa.field("key", pa.binary()), pa.field("event_time", _TS)]
                + [pa.field(c, t) for c, t in self.late_columns.items()] + [pa.field("watermark", pa.int64())])

    # -- events

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        wm, L = ctx.watermark, self.allowed_lateness_ms
        ts = events.column(TIMESTAMP_COLUMN).to_numpy()
        if self.session:
            rows, starts = np.arange(len(ts)), ts
            kept = ts + self.spec.gap_ms - 1 + L > wm
        else:
            rows, starts = self.spec.assign(ts)
            kept = starts + self.spec.size_ms - 1 + L > wm
        if not kept.all():
            self._emit_late(ctx, events, np.bincount(rows[kept], minlength=len(ts)) == 0)
            rows, starts = rows[kept], starts[kept]
        if not len(rows):
            return
        table = self._inputs(events)
        if not np.array_equal(rows, np.arange(len(ts))):  # (else: one window per event, as they are)
            table = table.take(pa.array(rows))
        if self.session:
            partial = self._partial(table, _runs(table.column(KEY_COLUMN), ts[rows], self.spec.gap_ms))
            partial = partial.set_column(partial.schema.get_field_index("end"), "end",
                                         pc.add(partial.column("last_ts"), self.spec.gap_ms))
            self._merge_sessions(ctx, partial)
            return
        table = table.append_column("start", pa.array(starts))
        if self.spec.slide_ms != self.spec.size_ms:  # an event in several windows: group them
            table = table.take(pc.sort_indices(table, [(KEY_COLUMN, "ascending"), ("start", "ascending")]))
        partial = self._partial(table, _runs(table.column(KEY_COLUMN), table.column("start").to_numpy(), 0))
        partial = partial.set_column(partial.schema.get_field_index("end"), "end",
                                     pc.add(partial.column("start"), self.spec.size_ms))
        state = ctx.state(self.windows)
        at = state.dkv_keys(partial.column(KEY_COLUMN), partial.column(_KG), partial.column("start"))
        old = state.get_columns_at(at)
        present = np.asarray(old.is_valid())
        merged = partial.append_column("fresh", partial.column("events"))
        if present.any():
            idx = np.flatnonzero(present)
            stored = self._stored(partial.select([KEY_COLUMN, _KG]).take(idx), old.filter(pa.array(present)))
            both = pa.concat_tables([stored.append_column("g", pa.array(idx)),
                                     merged.append_column("g", pa.array(np.arange(len(partial))))])
            merged = self._merge(both.take(pc.sort_indices(both, [("g", "ascending")])))
        state.set_columns_at(at, merged.select(list(self._fields)))
        self._after_update(ctx, merged)

    def _merge_sessions(self, ctx: BatchContext, partial: pa.Table) -> None:
        """Merges the epoch's sessions with the keys' stored ones (Flink's
        ``MergingWindowSet``): sorted by (key, start), a session joins the previous one
        when it starts at or before the running end. A key's sessions are one state
        value (few per key, read and written together), and the key has one timer, at
        its earliest due time."""
        sessions, wm = ctx.state(self.sessions), ctx.watermark
        keys, kgs = partial.column(KEY_COLUMN), partial.column(_KG)
        first = np.flatnonzero(_changes(keys, None))
        ukeys, ukgs = keys.take(first).to_pylist(), kgs.take(first).to_pylist()
        old_rows, old_code = [], []
        for code, rows in enumerate(sessions.get(ukeys, ukgs)):
            if rows:
                old_rows += rows
                old_code += [code] * len(rows)
        both = partial.append_column("fresh", partial.column("events"))
        if old_rows:
            code = np.asarray(old_code, np.int64)
            stored = self._stored(pa.table({KEY_COLUMN: pa.array(ukeys, pa.binary()).take(code),
                                            _KG: pa.array(ukgs, pa.int32()).take(code)}), self._rows_struct(old_rows))
            both = pa.concat_tables([stored, both.cast(stored.schema)])
            # Sorted by (key, start): the keys' ranks (``ukeys`` is in key order) sort as the keys.
            codes = np.concatenate([code, np.cumsum(_changes(keys, None)) - 1])
            order = np.lexsort((both.column("start").to_numpy(), codes))
            both = both.take(pa.array(order))
            fired = np.concatenate([np.asarray([r[-1] for r in old_rows], np.int64),
                                    np.zeros(len(partial), np.int64)])[order]
        else:
            fired = np.zeros(len(partial), np.int64)
        starts, ends = both.column("start").to_numpy(), both.column("end").to_numpy()
        key_change = _changes(both.column(KEY_COLUMN), None)
        reach = pd.Series(ends).groupby(np.cumsum(key_change)).cummax().to_numpy()
        new = key_change.copy()
        new[1:] |= starts[1:] > reach[:-1]
        g = np.cumsum(new) - 1
        merged = self._merge(both.append_column("g", pa.array(g)))
        touched = merged.column("fresh").to_numpy() > 0
        # Fired (on time or late): an untouched session keeps its flag (it merged with
        # nothing); a touched one is due now if the watermark already passed its end.
        flag = np.where(touched, merged.column("end").to_numpy() - 1 <= wm,
                        np.maximum.reduceat(fired, np.flatnonzero(new)))
        self._store_sessions(ctx, merged, flag.astype(np.int64))
        self._after_update(ctx, merged.filter(pa.array(touched)))

    def _store_sessions(self, ctx: BatchContext, merged: pa.Table, fired: np.ndarray) -> None:
        """Writes the keys' sessions (``merged``: all of each key's, sorted by key) and
        sets each key's timer at its earliest due time: a session's end - 1 until it has
        fired, then end - 1 + allowed lateness (when it goes)."""
        bounds = np.append(np.flatnonzero(_changes(merged.column(KEY_COLUMN), None)), merged.num_rows)
        rows = list(zip(*(merged.column(f).to_pylist() for f in self._fields), fired.tolist()))
        due = np.where(fired > 0, merged.column("end").to_numpy() - 1 + self.allowed_lateness_ms,
                       merged.column("end").to_numpy() - 1)
        heads = bounds[:-1]
        keys, kgs = merged.column(KEY_COLUMN).take(heads).to_pylist(), merged.column(_KG).take(heads).to_pylist()
        ctx.state(self.sessions).set(keys, kgs, [rows[a:b] for a, b in zip(heads.tolist(), bounds[1:].tolist())])
        ctx.set_timers(keys, kgs, np.minimum.reduceat(due, heads).tolist() if len(heads) else [])

    def _rows_struct(self, rows: list) -> pa.StructArray:
        """Stored session rows (field values in ``_fields`` order, then the fired flag)
        as a struct column of the record fields."""
        columns = list(zip(*rows))
        return pa.StructArray.from_arrays([pa.array(columns[i], self._types[f]) for i, f in enumerate(self._fields)],
                                          names=self._fields)

    def _after_update(self, ctx: BatchContext, merged: pa.Table) -> None:
        """Timers, late and early firings of the windows an epoch's events updated."""
        wm, L = ctx.watermark, self.allowed_lateness_ms
        end = merged.column("end").to_numpy()
        due = end - 1 <= wm  # fired on time already: this update is a late firing
        keys, kgs = merged.column(KEY_COLUMN), merged.column(_KG)
        pending = np.flatnonzero(~due)
        if len(pending) and not self.session:  # (a key's sessions share one timer)
            pk, pg = keys.take(pending).to_pylist(), kgs.take(pending).to_pylist()
            ctx.set_timers(pk, pg, (end[pending] - 1).tolist())
            if L:
                ctx.set_timers(pk, pg, (end[pending] - 1 + L).tolist())
        if due.any():
            self._fire(ctx, merged.filter(pa.array(due)), LATE)
        if self.early_every:
            n, events = self.early_every, merged.column("events").to_numpy()
            before = events - merged.column("fresh").to_numpy()
            early = ~due & (before // n != events // n)
            if early.any():
                self._fire(ctx, merged.filter(pa.array(early)), EARLY)
        if self.early_every_ms and len(pending):
            self._mark_dirty(ctx, merged.take(pa.array(pending)))

    # -- processing-time early firings (early_every_ms)

    def _next_tick(self, processing_time: int) -> int:
        """The first multiple of ``early_every_ms`` after ``processing_time`` (ms), as
        Flink's ``ContinuousProcessingTimeTrigger`` aligns its timers."""
        t = self.early_every_ms
        return processing_time - processing_time % t + t

    def _mark_dirty(self, ctx: BatchContext, updated: pa.Table) -> None:
        """Records, per key (state ``early``: ``[timer, max end, dirty window starts]``),
        the open windows an epoch's events updated, and sets the key's processing-time
        timer when it has none. A session is named by its start: merges only widen a
        session, so the session that later holds that start is the one updated."""
        keys, kgs = updated.column(KEY_COLUMN).to_pylist(), updated.column(_KG).to_pylist()
        starts, ends = updated.column("start").to_pylist(), updated.column("end").to_pylist()
        per_key: dict[tuple[bytes, int], tuple[set, int]] = {}
        for k, g, s, e in zip(keys, kgs, starts, ends):  # one row per updated window, not per event
            dirty, top = per_key.get((k, g), (set(), e))
            dirty.add(s)
            per_key[(k, g)] = (dirty, max(top, e))
        pk, pg = [k for k, _ in per_key], [g for _, g in per_key]
        state, tick = ctx.state(self.early), self._next_tick(ctx.processing_time)
        values, new_k, new_g = [], [], []
        for (k, g), old in zip(per_key, state.get(pk, pg)):
            dirty, top = per_key[(k, g)]
            timer, old_top, old_dirty = old if old else (None, top, [])
            if timer is None:
                timer = tick
                new_k.append(k)
                new_g.append(g)
            values.append([timer, max(top, old_top), sorted(dirty | set(old_dirty))])
        state.set(pk, pg, values)
        if new_k:
            ctx.set_processing_timers(new_k, new_g, [tick] * len(new_k))

    def _early_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        """A key's processing-time timer: fires its updated windows the watermark has not
        closed (``early``), then sets the next timer while the key has such windows."""
        wm, state = ctx.watermark, ctx.state(self.early)
        pairs = list(dict.fromkeys(zip(timers.column("key").to_pylist(), timers.column("key_group").to_pylist())))
        pk, pg = [k for k, _ in pairs], [g for _, g in pairs]
        fk, fg, fat, again, values, gone = [], [], [], [], [], []
        for k, g, value in zip(pk, pg, state.get(pk, pg)):
            if not value:
                continue
            _, top, dirty = value
            for s in dirty:
                fk.append(k)
                fg.append(g)
                fat.append(s)
            if top - 1 > wm:
                again.append((k, g))
                values.append([self._next_tick(ctx.processing_time), top, []])
            else:
                gone.append((k, g))
        if fk:
            self._fire_open(ctx, fk, fg, fat)
        if again:
            ak, ag = [k for k, _ in again], [g for _, g in again]
            state.set(ak, ag, values)
            ctx.set_processing_timers(ak, ag, [v[0] for v in values])
        if gone:
            state.drop([k for k, _ in gone], [g for _, g in gone])

    def _fire_open(self, ctx: BatchContext, keys: list, key_groups: list, starts: list) -> None:
        """Fires (``early``) the given windows (by start; for sessions, the unfired
        session holding that start) that the watermark has not closed."""
        wm = ctx.watermark
        if not self.session:
            starts_a = np.asarray(starts, np.int64)
            keep = starts_a + self.spec.size_ms - 1 > wm
            idx = np.flatnonzero(keep).tolist()
            self.fire_current(ctx, [keys[i] for i in idx], [key_groups[i] for i in idx], starts_a[keep].tolist())
            return
        s_at, e_at = self._fields.index("start"), self._fields.index("end")
        pairs = list(dict.fromkeys(zip(keys, key_groups)))
        wanted: dict[tuple, list] = {}
        for k, g, s in zip(keys, key_groups, starts):
            wanted.setdefault((k, g), []).append(s)
        ends: list = []
        ek, eg = [], []
        for (k, g), rows in zip(pairs, ctx.state(self.sessions).get([k for k, _ in pairs], [g for _, g in pairs])):
            for r in rows or ():
                if not r[-1] and r[e_at] - 1 > wm and any(r[s_at] <= s < r[e_at] for s in wanted[(k, g)]):
                    ek.append(k)
                    eg.append(g)
                    ends.append(r[e_at])
        if ek:
            self.fire_current(ctx, ek, eg, ends)

    # -- timers

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        # One call holds one domain's timers; processing time only drives early firings.
        if "domain" in timers.column_names and timers.num_rows \
                and timers.column("domain")[0].as_py() == TimeDomain.PROCESSING_TIME:
            if self.early_every_ms:
                self._early_timers(ctx, timers)
            return
        if self.session:
            self._session_timers(ctx, timers)
            return
        state, L = ctx.state(self.windows), self.allowed_lateness_ms
        ts = timers.column("timestamp").to_numpy()
        keys, kgs = timers.column("key"), timers.column("key_group")
        fire, at_fire = self.spec.starts_ending_at(ts + 1)
        if fire.any():
            hit = pa.array(fire)
            fk, fg = keys.filter(hit), kgs.filter(hit)
            at = state.dkv_keys(fk, fg, at_fire[fire])
            acc = state.get_columns_at(at)
            present = acc.is_valid()
            if pc.any(present).as_py():
                self._fire(ctx, self._stored(pa.table({KEY_COLUMN: fk, _KG: fg}).filter(present),
                                             acc.filter(present)), ON_TIME)
                if not L:
                    state.delete_at([a for a, keep in zip(at, present.to_pylist()) if keep])
        if L:
            drop, at_drop = self.spec.starts_ending_at(ts + 1 - L)
            if drop.any():
                hit = pa.array(drop)
                state.delete_at(state.dkv_keys(keys.filter(hit), kgs.filter(hit), at_drop[drop]))

    def _session_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        """A key's timer: fires its sessions the watermark has reached (once), drops those
        past their lateness, and sets the key's next timer."""
        state, wm, L = ctx.state(self.sessions), ctx.watermark, self.allowed_lateness_ms
        pairs = list(dict.fromkeys(zip(timers.column("key").to_pylist(), timers.column("key_group").to_pylist())))
        pk, pg = [k for k, _ in pairs], [g for _, g in pairs]
        fire, fire_code, kept, kept_code, emptied = [], [], [], [], []
        end_at = self._fields.index("end")
        for code, rows in enumerate(state.get(pk, pg)):
            left = 0
            for row in rows or ():
                end = row[end_at]
                if not row[-1] and end - 1 <= wm:
                    fire.append(row)
                    fire_code.append(code)
                    row = [*row[:-1], 1]
                if end - 1 + L > wm:
                    kept.append(row)
                    kept_code.append(code)
                    left += 1
            if not left:
                emptied.append(code)
        if fire:
            code = pa.array(fire_code)
            self._fire(ctx, self._stored(pa.table({KEY_COLUMN: pa.array(pk, pa.binary()).take(code),
                                                   _KG: pa.array(pg, pa.int32()).take(code)}),
                                         self._rows_struct(fire)), ON_TIME)
        if kept:
            code = pa.array(kept_code)
            merged = self._stored(pa.table({KEY_COLUMN: pa.array(pk, pa.binary()).take(code),
                                            _KG: pa.array(pg, pa.int32()).take(code)}), self._rows_struct(kept))
            self._store_sessions(ctx, merged, np.asarray([r[-1] for r in kept], np.int64))
        if emptied:
            state.drop([pk[i] for i in emptied], [pg[i] for i in emptied])

    # -- shared steps

    def _inputs(self, events: pa.Table) -> pa.Table:
        """key, key_group, timestamp and each aggregate's input column (named as the
        aggregate), computed in one Acero projection."""
        exprs, names = [pc.field(KEY_COLUMN), pc.field(_KG), pc.field(TIMESTAMP_COLUMN)], [KEY_COLUMN, _KG, "ts"]
        for name, agg in self.aggregates.items():
            col = agg.column
            exprs.append(pc.field(TIMESTAMP_COLUMN) if col is None else pc.field(col) if isinstance(col, str) else col)
            names.append(name)
        try:
            out = acero.Declaration.from_sequence([
                acero.Declaration("table_source", acero.TableSourceNodeOptions(events)),
                acero.Declaration("project", acero.ProjectNodeOptions(exprs, names))]).to_table(use_threads=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"window operator {self.name!r}: an aggregate's input does not evaluate on the "
                             f"events (columns {events.column_names}): {e}; name an existing column") from e
        cols = {n: out.column(n).combine_chunks() for n in names}
        for name, agg in self.aggregates.items():
            cols[name] = agg.input(cols[name])
        return pa.table(cols)

    def _partial(self, table: pa.Table, g: np.ndarray) -> pa.Table:
        """Per run of rows (``g``, non-decreasing): the accumulator of its events."""
        table = table.append_column("g", pa.array(g))
        specs = [(KEY_COLUMN, "first"), (_KG, "first"), ("ts", "min"), ("ts", "max"), ("ts", "count")]
        names = [KEY_COLUMN, _KG, "first_ts", "last_ts", "events"]
        if "start" in table.column_names:
            specs.append(("start", "first"))
            names.append("start")
        custom = []
        for name, agg in self.aggregates.items():
            if isinstance(agg, AggregateFunction):
                custom.append(name)
                continue
            for f, func in zip(agg.fields(name), agg.funcs):
                specs.append((name, func, pc.ScalarAggregateOptions(skip_nulls=False)) if agg.order else
                             (name, func))
                names.append(f)
        out = _aggregated(table.group_by("g", use_threads=False).aggregate(specs), names)
        if "start" not in names:
            out = out.append_column("start", out.column("first_ts"))
        out = out.append_column("end", out.column("start"))  # set by the caller
        bounds = np.append(np.flatnonzero(np.diff(g, prepend=-1)), len(g))
        for name in custom:
            agg, values = self.aggregates[name], table.column(name).to_pylist()
            accs = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                acc = agg.create_accumulator()
                for v in values[lo:hi]:
                    acc = agg.add(v, acc)
                accs.append(msgpack.packb(acc, use_bin_type=True))
            out = out.append_column(name, pa.array(accs, pa.binary()))
        return out.select([KEY_COLUMN, _KG, *self._fields])

    def _merge(self, rows: pa.Table) -> pa.Table:
        """Merges accumulator rows by their group ``g`` (sorted; older rows first within a
        group): one row per group, the window spanning them all."""
        specs = [(KEY_COLUMN, "first"), (_KG, "first"), ("start", "min"), ("end", "max"), ("events", "sum"),
                 ("first_ts", "min"), ("last_ts", "max"), ("fresh", "sum")]
        names = [s[0] for s in specs]
        ordered: dict[str, list] = {"first": [], "last": []}
        custom = []
        for name, agg in self.aggregates.items():
            if isinstance(agg, AggregateFunction):
                custom.append(name)
            elif agg.order:
                ordered[agg.order].append(name)
            else:
                for f, func in zip(agg.fields(name), agg.merges):
                    specs.append((f, func))
                    names.append(f)
        out = _aggregated(rows.group_by("g", use_threads=False).aggregate(specs), names)
        for order, col in (("first", "first_ts"), ("last", "last_ts")):
            if ordered[order]:
                by = rows.take(pc.sort_indices(rows, [("g", "ascending"), (col, "ascending")]))
                got = by.group_by("g", use_threads=False).aggregate(
                    [(n, order, pc.ScalarAggregateOptions(skip_nulls=False)) for n in ordered[order]])
                got = _aggregated(got, ordered[order])
                for n in ordered[order]:
                    out = out.append_column(n, got.column(n))
        if custom:
            g = rows.column("g").to_numpy()
            bounds = np.append(np.flatnonzero(np.diff(g, prepend=-1)), len(g))
            for name in custom:
                agg, packed = self.aggregates[name], rows.column(name).to_pylist()
                accs = []
                for lo, hi in zip(bounds[:-1], bounds[1:]):
                    acc = msgpack.unpackb(packed[lo], raw=False)
                    for b in packed[lo + 1:hi]:
                        acc = agg.merge(acc, msgpack.unpackb(b, raw=False))
                    accs.append(msgpack.packb(acc, use_bin_type=True))
                out = out.append_column(name, pa.array(accs, pa.binary()))
        return out.select([KEY_COLUMN, _KG, *self._fields, "fresh"])

    def _stored(self, ids: pa.Table, acc: pa.StructArray) -> pa.Table:
        """Stored accumulators as rows: ``ids`` (key, key_group) beside the record fields,
        with ``fresh`` 0 (no event of this epoch)."""
        table = ids
        for i, f in enumerate(acc.type):
            table = table.append_column(f.name, acc.field(i))
        return table.append_column("fresh", pa.array(np.zeros(len(ids), np.int64)))

    def _fire(self, ctx: BatchContext, windows: pa.Table, firing: str) -> None:
        """Emits the windows' results to ``main``; timestamp ``window_end - 1``."""
        ends = windows.column("end")
        cols: dict[str, Any] = {}
        if self.key_column:
            cols[self.key_column] = windows.column(KEY_COLUMN).cast(pa.string())
        cols[WINDOW_START] = windows.column("start").cast(_TS)
        cols[WINDOW_END] = ends.cast(_TS)
        for name, agg in self.aggregates.items():
            cols[name[len(AGG_PREFIX):]] = agg.result(windows, name)
        if self.with_firing:
            cols[FIRING] = pa.array([firing] * len(windows), pa.string())
        ctx.emit(cols, keys=windows.column(KEY_COLUMN).to_pylist(), timestamps=pc.subtract(ends, 1).to_pylist())

    def _emit_late(self, ctx: BatchContext, events: pa.Table, late: np.ndarray) -> None:
        if not self.late_output or not late.any():
            return
        lt = events.filter(pa.array(late))
        ctx.emit({"key": lt.column(KEY_COLUMN), "event_time": lt.column(TIMESTAMP_COLUMN).cast(_TS),
                  **{c: lt.column(c) for c in self.late_columns},
                  "watermark": pa.array(np.full(lt.num_rows, ctx.watermark, np.int64))},
                 output=self.late_output, keys=lt.column(KEY_COLUMN).to_pylist(),
                 timestamps=lt.column(TIMESTAMP_COLUMN).to_pylist())

    def fire_current(self, ctx: BatchContext, keys: Sequence[bytes], key_groups: Sequence[int],
                     windows_at: Sequence[int], firing: str = EARLY) -> None:
        """Emits the current result of the given windows (absent ones are skipped), marked
        ``firing``: the hook for a trigger other than ``early_every`` (a processing-time
        timer's handler calls it).

        Args:
            keys, key_groups: the windows' subject keys, aligned rows.
            windows_at: each window's start (tumbling, sliding) or end (sessions), ms.
            firing: the ``firing`` column's value.
        """
        if self.session:
            wanted = set(zip(keys, key_groups, windows_at))
            pairs = list(dict.fromkeys(zip(keys, key_groups)))  # a key read once, however many of its sessions
            pk, pg = [k for k, _ in pairs], [g for _, g in pairs]
            found = [(k, g, r) for k, g, rows in zip(pk, pg, ctx.state(self.sessions).get(pk, pg))
                     for r in rows or () if (k, g, r[self._fields.index("end")]) in wanted]
            if found:
                ids = pa.table({KEY_COLUMN: pa.array([k for k, _, _ in found], pa.binary()),
                                _KG: pa.array([g for _, g, _ in found], pa.int32())})
                self._fire(ctx, self._stored(ids, self._rows_struct([r for _, _, r in found])), firing)
            return
        state = ctx.state(self.windows)
        acc = state.get_columns_at(state.dkv_keys(list(keys), list(key_groups), list(windows_at)))
        p = acc.is_valid()
        ids = pa.table({KEY_COLUMN: pa.array(keys, pa.binary()), _KG: pa.array(key_groups, pa.int32())}).filter(p)
        if ids.num_rows:
            self._fire(ctx, self._stored(ids, acc.filter(p)), firing)

    def __reduce__(self) -> tuple:
        # The class is built per configuration (its state specs depend on the aggregates):
        # pickling rebuilds it from the configuration.
        return (_rebuild, (self._config,))


def _aggregated(grouped: pa.Table, names: list[str]) -> pa.Table:
    """A group-by result without its group column ``g``, its aggregates named ``names``."""
    return pa.table([c for n, c in zip(grouped.column_names, grouped.columns) if n != "g"], names=names)


def _changes(keys: pa.ChunkedArray | pa.Array, values: np.ndarray | None) -> np.ndarray:
    """True where a row starts a new key (or a new ``values``) in sorted rows."""
    n = len(keys)
    out = np.ones(n, np.bool_)
    if n > 1:
        k = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        out[1:] = np.asarray(pc.not_equal(k.slice(1), k.slice(0, n - 1)).fill_null(True))
        if values is not None:
            out[1:] |= values[1:] != values[:-1]
    return out


def _runs(keys: pa.ChunkedArray | pa.Array, values: np.ndarray, gap: int) -> np.ndarray:
    """Run ids of rows sorted by (key, value): a new run where the key changes or the
    value steps by more than ``gap`` (0: changes at all)."""
    change = _changes(keys, None)
    if len(values) > 1:
        change[1:] |= (values[1:] - values[:-1]) > gap
    return np.cumsum(change) - 1


# --- the factory ------------------------------------------------------------------------

def window_operator(name: str, windows: TumblingWindows | SlidingWindows | SessionWindows,
                    aggregates: dict[str, Aggregate], *, allowed_lateness_ms: int = 0,
                    late_output: str | None = None, late_columns: dict[str, pa.DataType] | None = None,
                    early_every: int | None = None, early_every_ms: int | None = None,
                    key_column: str | None = "key", form: str = "batch") -> Operator:
    """A keyed event-time window operator (see the module docstring for the semantics).

    Args:
        name: the operator's name (its state lives under it).
        windows: ``TumblingWindows``, ``SlidingWindows`` or ``SessionWindows``.
        aggregates: output column -> ``Aggregate`` (``Count()``, ``Sum("x")``, ``Mean("x")``,
            ``First("x", pa.string())``, an ``AggregateFunction``...), in output order.
        allowed_lateness_ms: how long (ms of watermark) a fired window still accepts late
            events, each re-firing it (``late``); 0: a window's state goes when it fires.
        late_output: the output name for events too late for any window (columns ``key``,
            ``event_time``, ``late_columns``, ``watermark``), or None to drop them.
        late_columns: event columns (name -> type) copied into the late output.
        early_every: fire a window early each time its event count crosses a multiple of
            this; None: no early firings.
        early_every_ms: fire a window early at most once per this many ms of processing
            time while it has events since its last firing and the watermark has not
            closed it (processing-time timers, one per key); None: none.
        key_column: name of the output column holding the subject key as UTF-8 text (a
            key that is not UTF-8 fails the epoch naming it), or None for none (e.g. when
            ``First`` aggregates carry the key's parts).
        form: ``"batch"`` (a ``BatchOperator``) or ``"event"`` (an ``Operator``, per event).

    Returns:
        The operator; its ``outputs`` are ``main`` (key column, ``window_start``,
        ``window_end`` as UTC timestamps, the aggregates, and ``firing`` when early or
        late firings are possible) and ``late_output``.

    Raises:
        ValueError: an unknown form, an aggregate that is not an ``Aggregate``, a name
            clash with the window columns, or a negative lateness.
    """
    config = dict(name=name, windows=windows, aggregates=dict(aggregates),
                  allowed_lateness_ms=allowed_lateness_ms, late_output=late_output,
                  late_columns=dict(late_columns or {}), early_every=early_every, early_every_ms=early_every_ms,
                  key_column=key_column, form=form)
    if form not in ("batch", "event"):
        raise ValueError(f"window operator {name!r}: form must be 'batch' or 'event', got {form!r}")
    if not isinstance(windows, (TumblingWindows, SessionWindows)):
        raise ValueError(f"window operator {name!r}: windows must be TumblingWindows, SlidingWindows or "
                         f"SessionWindows, got {windows!r}")
    reserved = {WINDOW_START, WINDOW_END, FIRING, key_column}
    for col, agg in aggregates.items():
        if not isinstance(agg, Aggregate):
            raise ValueError(f"window operator {name!r}: aggregate {col!r} is {agg!r}, not an Aggregate "
                             f"(Count(), Sum('x'), Mean('x'), ...)")
        if col in reserved or not isinstance(col, str) or not col:
            raise ValueError(f"window operator {name!r}: aggregate name {col!r} clashes with an output column "
                             f"({sorted(c for c in reserved if c)}) or is not a name; rename it")
    if isinstance(allowed_lateness_ms, bool) or not isinstance(allowed_lateness_ms, int) or allowed_lateness_ms < 0:
        raise ValueError(f"window operator {name!r}: allowed_lateness_ms must be an int >= 0, got "
                         f"{allowed_lateness_ms!r}")
    if early_every is not None:
        _positive("early_every", early_every)
    if early_every_ms is not None:
        _positive("early_every_ms", early_every_ms)
    fields = dict(_BASE_FIELDS)
    for col, agg in aggregates.items():
        fields.update(agg.fields(AGG_PREFIX + col))
    attrs: dict[str, Any] = {"_config": config, "_fields": list(fields), "_types": fields, "__module__": __name__}
    if isinstance(windows, SessionWindows):
        # A key's sessions, ascending: [field values in _fields order..., fired (0/1)].
        attrs["sessions"] = ValueSpec(MsgpackCodec())
    else:
        attrs["windows"] = MapSpec(IntCodec(), RecordCodec(fields))
    if early_every_ms is not None:
        # Per key: [processing-time timer (ms), max window end, starts of updated windows].
        attrs["early"] = ValueSpec(MsgpackCodec())
    base = WindowOperator if form == "batch" else EventWindowOperator
    cls = type(base.__name__, (base,), attrs)
    op = cls.__new__(cls)
    op._configure(name, windows, aggregates, allowed_lateness_ms=allowed_lateness_ms, late_output=late_output,
                  late_columns=late_columns or {}, early_every=early_every, key_column=key_column,
                  early_every_ms=early_every_ms)
    return op


def _rebuild(config: dict) -> Operator:
    return window_operator(**config)


class WindowOperator(_WindowCore, BatchOperator):
    """The vectorised window operator; build it with ``window_operator(...)``."""


class EventWindowOperator(_WindowCore, Operator):
    """The per-event window operator (``window_operator(..., form="event")``): the same
    code as ``WindowOperator`` run on one event at a time. Also a helper for an
    ``on_event`` operator of one's own: call its ``on_event``/``on_timer_expired`` from
    that operator's, which declares the same state spec (``windows``, or ``sessions``)
    and outputs as class attributes."""

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        events = pa.table({KEY_COLUMN: pa.array([subject.key], pa.binary()),
                           TIMESTAMP_COLUMN: pa.array([event.timestamp], pa.int64()),
                           _KG: pa.array([subject.key_group], pa.int32()),
                           **{c: pa.array([v]) for c, v in event.value.items()}})
        ctx = _SubjectContext(subject, self)
        self.on_batch(ctx, events)
        ctx.forward()

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        ctx = _SubjectContext(subject, self)
        domain = getattr(subject, "time_domain", None) or TimeDomain.EVENT_TIME
        _WindowCore.on_timers(self, ctx, pa.table({"key": pa.array([subject.key], pa.binary()),
                                                   "key_group": pa.array([subject.key_group], pa.int32()),
                                                   "timestamp": pa.array([timestamp], pa.int64()),
                                                   "domain": pa.array([str(domain)], pa.string())}))
        ctx.forward()


class _SubjectTimers:
    """``BulkTimers`` on one subject (its key only), of event time or (``processing``)
    processing time."""

    def __init__(self, subject: Subject, processing: bool = False) -> None:
        self._set = subject.set_processing_timer if processing else subject.set_timer
        self._delete = subject.delete_processing_timer if processing else subject.delete_timer

    def set_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None:
        for t in timestamps:
            self._set(int(t))

    def delete_many(self, key_groups: Sequence[int], timestamps: Sequence[int], keys: Sequence[bytes]) -> None:
        for t in timestamps:
            self._delete(int(t))


class _SubjectContext(BatchContext):
    """A ``BatchContext`` over one subject's state and timers; ``forward`` hands the
    emitted rows to ``subject.emit``."""

    def __init__(self, subject: Subject, op: Operator) -> None:
        super().__init__(subject._db, _SubjectTimers(subject), op.outputs, op.name,  # type: ignore[attr-defined]
                         _SubjectTimers(subject, processing=True))
        self.watermark = subject.watermark
        self.processing_time = getattr(subject, "processing_time", 0)
        # The subject's clocks of TTL'd state (None: made from the watermark and the wall clock).
        self.state_clock = getattr(subject, "state_clock", None)
        self._subject = subject

    def forward(self) -> None:
        for output, parts in self.emitted.items():
            for table, keys, stamps in parts:
                # Timestamps as ms ints, as an on_event operator emits them.
                table = table.cast(pa.schema([pa.field(f.name, pa.int64()) if pa.types.is_timestamp(f.type) else f
                                              for f in table.schema]))
                for value, key, ts in zip(table.to_pylist(), keys, stamps):
                    self._subject.emit(value, output=output, key=key, timestamp=ts)
