"""``Job.on_operator_error="dead_letter"``: an event an operator raises on goes to the
dead-letter table and the rest of the epoch commits (Kafka Streams'
``ProcessingExceptionHandler`` returning ``CONTINUE``, with a dead-letter queue).

A task first runs exactly as under ``"fail"``: no buffering, no per-event checks, so a
job without errors pays nothing. When a handler raises, the task throws away its DKV
instance (every write since the previous checkpoint is in memory and never
checkpointed), reopens the range at that checkpoint and runs the epoch again *guarded*:

* ``on_event`` / ``on_timer_expired``: each call writes into a ``WriteBuffer`` that is
  applied to DKV (one write batch) when the call returns and dropped when it raises,
  with the rows it emitted and the timers it set or deleted (``TimerService.undo``).
  The event (or timer) it raised on becomes a dead-letter row. Rows an ``on_event``
  call emits are converted to their output schema right after the call, so a value of
  the wrong type (a string for a float field) is the event's error, not the output's.
  Cost when an error occurs: reopening the range, and one more pass over the task's
  events with a dict lookup per state access.
* ``on_batch`` / ``on_timers``: the failing row is not known, so it is searched for.
  Every probe runs the handler on a subset of the rows from the state the task started
  from and drops what it did. First group testing over the subject keys (halves of the
  keys' rows, recursing into the halves that raise), then within a key that raises on
  its own the shortest prefix of its rows (in handler order) that raises, by an
  exponential then binary search: its last row is the event ``on_event`` would have
  raised on. That row is dead-lettered, and the search goes on with the key's other
  rows. The handler then runs once on every row not dead-lettered, and that run is
  kept: the output is exactly what the same handler gives the batch without those
  events. Cost when errors occur, for ``b`` failing keys among ``k`` keys and ``n``
  events: about ``2 b log2 k`` probes over at most ``2 b n`` events in all, plus for a
  failing key of ``m`` events ``O(log m)`` probes over at most ``m`` events per bad
  event, plus reopening the range and one final run.

What is not dead-lettered (the task fails as under ``"fail"``): an error of the storage
underneath (``dkvstream.storage.errors.StorageError``, or any error a state read raised), a
``MemoryError``, a runtime check outside the handler, and a batch that raises while no
single key's rows do (the error is not one event's).

Dead-letter rows (``dkvstream.operators.io.dead_letter.DEAD_LETTER_SCHEMA``, reason
``operator_error``): ``error`` is ``operator <name> <handler>: <type>: <message> (at
<file>:<line> in <function>)``, the innermost frame of the exception. For an event of
the job's first operator: ``source``, ``partition`` and ``offset`` are the event's source
position, ``value`` its value columns as JSON. An event of a later operator was emitted
by the operator before it, which has no source position: ``source`` is
``operator:<that operator>``, ``partition`` and ``offset`` are null. A timer: ``source`` is
``timer:<operator>``, ``key`` and ``timestamp`` are the timer's (its time, ms),
``partition``, ``offset`` and ``value`` null. A failing timer is consumed (it does not
fire again); its state changes are discarded.

Under ``"fail"`` (the default) the epoch fails with an ``OperatorError`` naming the
operator, handler and what it raised on: an event's key, source partition and offset
(or the operator that emitted it) and event time (``event_error``); a timer's key and
time (``timer_error``). ``on_event`` and ``on_timer_expired`` name the call that raised;
for ``on_batch`` and ``on_timers`` the task finds the row as ``"dead_letter"`` does
(reopening the range and searching, a cost paid only by a failing epoch) and names the
first one.
"""
from __future__ import annotations

import datetime
import inspect
import os
import traceback
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from dkvstream.operators.api.columns import KEY_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.operator import Operator
from dkvstream.operators.api.state import StateStore
from dkvstream.operators.errors import OperatorError
from dkvstream.operators.io.dead_letter import DEAD_LETTER_SCHEMA, OPERATOR_ERROR, value_json
from dkvstream.storage.dkv.db import prefix_successor
from dkvstream.storage.errors import StorageError

_MAX_MESSAGE = 2_000  # characters of the exception message kept in ``error``
TIMER_SOURCE = "timer:"  # ``source`` of a timer's dead-letter row: ``timer:<operator>``
_BYTES = {bytes}
_BYTES_OR_NONE = {bytes, type(None)}


class WriteBuffer:
    """A ``StateStore`` over a task's DKV that holds one handler call's writes until
    ``commit`` (applied as one write batch) or ``discard`` (dropped). Reads see the
    buffered writes over DKV.

    ``store_error`` is set when a read of DKV raised: such an error is the storage's,
    not the event's, even if the handler turned it into another exception.
    """

    __slots__ = ("_base", "_writes", "store_error")

    def __init__(self, base: StateStore) -> None:
        self._base = base
        self._writes: dict[bytes, bytes | None] = {}
        self.store_error: BaseException | None = None

    def _read(self, fn: Callable, arg):
        try:
            return fn(arg)
        except Exception as e:
            self.store_error = e
            raise

    def get(self, key: bytes) -> bytes | None:
        w = self._writes
        if key in w:
            return w[key]
        return self._read(self._base.get, key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out = self._read(self._base.get_many, keys)
        w = self._writes
        return [w.get(k, v) for k, v in zip(keys, out)] if w else out

    def put(self, key: bytes, value: bytes) -> None:
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError("DKV keys and values must be bytes")
        self._writes[key] = value

    def delete(self, key: bytes) -> None:
        if type(key) is not bytes:
            raise TypeError("DKV keys must be bytes")
        self._writes[key] = None

    def write_batch(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"write_batch: {len(keys)} keys but {len(values)} values")
        if not set(map(type, keys)) <= _BYTES or not set(map(type, values)) <= _BYTES_OR_NONE:
            raise TypeError("DKV keys must be bytes and values bytes or None (a delete)")
        self._writes.update(zip(keys, values))

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.scan_range(prefix, prefix_successor(prefix))

    def scan_range(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """DKV's scan with the buffered writes merged in (as they are when the scan
        starts; a buffered delete hides the key)."""
        mine = sorted((k, v) for k, v in self._writes.items() if start <= k and (end is None or k < end))
        base = self._read(lambda a: iter(self._base.scan_range(*a)), (start, end))
        return self._merge(base, mine)

    def _merge(self, base: Iterator[tuple[bytes, bytes]], mine: list) -> Iterator[tuple[bytes, bytes]]:
        i, n = 0, len(mine)
        while True:
            try:
                k, v = next(base)
            except StopIteration:
                break
            except Exception as e:
                self.store_error = e
                raise
            while i < n and mine[i][0] < k:
                if mine[i][1] is not None:
                    yield mine[i]
                i += 1
            if i < n and mine[i][0] == k:
                if mine[i][1] is not None:
                    yield mine[i]
                i += 1
            else:
                yield k, v
        for k, v in mine[i:]:
            if v is not None:
                yield k, v

    def commit(self) -> None:
        """Applies the buffered writes to DKV (one write batch) and empties the buffer."""
        if self._writes:
            w, self._writes = self._writes, {}
            self._base.write_batch(list(w), list(w.values()))

    def discard(self) -> list[bytes]:
        """Drops the buffered writes; returns their keys."""
        keys = list(self._writes)
        self._writes = {}
        return keys

    def stored(self, key: bytes) -> bool:
        """Whether DKV (without the buffer) holds ``key``."""
        return self._base.get(key) is not None


def attributable(e: BaseException, buffer: WriteBuffer | None = None) -> bool:
    """Whether an exception raised in a handler call is the event's (dead-lettered), not
    the storage's or the machine's (the task fails)."""
    if isinstance(e, (StorageError, MemoryError)):
        return False
    return buffer is None or buffer.store_error is None


def describe(operator: str, handler: str, e: BaseException, code_file: str | None = None) -> str:
    """The ``error`` column of a dead-letter row: ``operator <name> <handler>: <type>:
    <message, one line> (at <file>:<line> in <function>)``: the innermost frame in
    ``code_file`` (the operator's source file), else the innermost frame (an error raised
    inside pyarrow is then placed at the operator's line that called it)."""
    return f"operator {operator} {handler}: {cause_of(e, code_file)}"


def cause_of(e: BaseException, code_file: str | None) -> str:
    """``<type>: <message, one line> (at <file>:<line> in <function>)`` (``describe``)."""
    text = " ".join(str(e).split())
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + "..."
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if code_file is not None and f.filename == code_file]
    frame = (own or frames or [None])[-1]
    where = f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})" if frame else ""
    return f"{type(e).__name__}: {text}{where}"


def code_file_of(operator: Operator) -> str | None:
    """The source file of the operator's class (None: it has none), where ``describe``
    looks for the frame that raised."""
    try:
        return inspect.getsourcefile(type(operator))
    except TypeError:  # a class without a source file
        return None


def _time(ms: int) -> str:
    """``<ms> (<ISO 8601 UTC>)``: an event or timer time as stored and as read."""
    try:
        iso = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return f"{ms} ({iso.replace('+00:00', 'Z')})"


WHAT_TO_DO = ("Under on_operator_error='fail' the epoch fails, and so does every rerun of it: fix the "
               "operator or the input, or set Job(on_operator_error='dead_letter') to send what it "
               "raises on to the dead-letter table and go on.")


def event_error(operator: Operator, handler: str, e: BaseException, *, key: bytes, timestamp: int,
                source: str, partition: str | None, offset: int | None) -> OperatorError:
    """The error an epoch fails with when ``handler`` raised ``e`` on an event under
    ``on_operator_error="fail"``: names the operator, handler, the event's key, its
    source position (``partition`` None: emitted by the operator ``source`` names,
    ``operator:<name>``) and event time, the cause and what to do."""
    at = (f"source {source} partition {partition} offset {offset}" if partition is not None
          else f"emitted by {source}")
    return OperatorError(f"operator {operator.name} {handler} raised on the event with key {key!r} ({at}, "
                         f"event time {_time(timestamp)}): {cause_of(e, code_file_of(operator))}. {WHAT_TO_DO}")


def timer_error(operator: Operator, handler: str, e: BaseException, *, key: bytes, timestamp: int) -> OperatorError:
    """``event_error`` for a timer: names its key and time."""
    return OperatorError(f"operator {operator.name} {handler} raised on the timer of key {key!r} at "
                         f"{_time(timestamp)}: {cause_of(e, code_file_of(operator))}. {WHAT_TO_DO}")


def isolate(groups: list[np.ndarray], probe: Callable[[np.ndarray], BaseException | None],
            error: BaseException, what: str) -> dict[int, BaseException]:
    """The rows a vectorised handler raises on (see the module docstring).

    Args:
        groups: row indexes per subject key, each ascending (handler order); the handler
            over all of them together raised ``error``.
        probe: runs the handler on the rows of an ascending index array from the state
            the task started from, drops what it did, and returns the exception it raised
            (None if it returned).
        error: what the handler raised over all of ``groups``.
        what: ``"operator <name> <handler>"``, for the error below.

    Returns:
        ``{row index: the exception the shortest failing prefix of its key raised}``,
        not empty.

    Raises:
        RuntimeError: no key's rows raise on their own: the error is not one event's.
    """
    bad: dict[int, BaseException] = {}
    for group, err in _failing_groups(groups, probe, error, what):
        bad.update(_failing_rows(group, probe, err))
    return bad


def _failing_groups(groups: list[np.ndarray], probe, error: BaseException, what: str
                    ) -> list[tuple[np.ndarray, BaseException]]:
    """Group testing: the groups that raise on their own, with what they raise."""
    if len(groups) == 1:
        return [(groups[0], error)]
    half = len(groups) // 2
    found = []
    for part in (groups[:half], groups[half:]):
        err = probe(np.sort(np.concatenate(part)))
        if err is not None:
            found += _failing_groups(part, probe, err, what)
    if not found:
        raise RuntimeError(
            f"{what} raised over {len(groups)} keys' events but not over any half of them, so "
            f"no event can be dead-lettered for it (on_operator_error='dead_letter'): "
            f"{type(error).__name__}: {' '.join(str(error).split())}") from error
    return found


def _failing_rows(group: np.ndarray, probe, error: BaseException) -> dict[int, BaseException]:
    """The rows of one key to dead-letter: repeatedly the last row of the shortest
    prefix that raises, found by exponential then binary search (``rows[:good]`` is
    known to pass, ``rows[:hi]`` to raise)."""
    rows = group.tolist()
    bad: dict[int, BaseException] = {}
    good, err = 0, error
    while err is not None:
        lo, hi, hi_err, step = good, len(rows), err, 1
        while lo + step < hi:
            e = probe(np.asarray(rows[:lo + step]))
            if e is not None:
                hi, hi_err = lo + step, e
                break
            lo += step
            step *= 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            e = probe(np.asarray(rows[:mid]))
            if e is None:
                lo = mid
            else:
                hi, hi_err = mid, e
        bad[rows.pop(hi - 1)] = hi_err
        good = hi - 1
        err = probe(np.asarray(rows)) if len(rows) > good else None
    return bad


class DeadLetterRows:
    """The dead-letter rows one task collects (see the module docstring for columns).

    Args:
        operator: the operator.
        epoch: the epoch.
        source: the ``source`` column of its events' rows.
        partitions: source partition names by the events' ``_part`` index, or None when
            the events have no source position (a later operator's).
    """

    def __init__(self, operator: Operator, epoch: int, source: str, partitions: Sequence[str] | None) -> None:
        self.operator, self.epoch, self.source, self.partitions = operator.name, epoch, source, partitions
        self._code_file = code_file_of(operator)
        self._tables: list[pa.Table] = []
        self.count = 0
        self.raised: list[tuple[str, BaseException]] = []  # (handler, exception) per row, in row order

    def events(self, events: pa.Table, value_columns: list[str], rows: dict[int, BaseException],
               handler: str, part_column: str) -> None:
        """Adds rows ``rows`` (index -> exception) of ``events`` (key, timestamp, value
        columns, ``_part``, ``_offset``)."""
        if not rows:
            return
        idx = sorted(rows)
        t = events.take(pa.array(idx, pa.int64()))
        n = len(idx)
        if self.partitions is None:
            partition = pa.nulls(n, pa.string())
            offset = pa.nulls(n, pa.int64())
        else:
            partition = pa.array([self.partitions[p] for p in t.column(part_column).to_pylist()], pa.string())
            offset = t.column(OFFSET_COLUMN).cast(pa.int64())
        self._add(pa.array([self.source] * n, pa.string()), partition, offset, t.column(KEY_COLUMN),
                  t.column(TIMESTAMP_COLUMN), pa.array(value_json(t, value_columns), pa.binary()),
                  [describe(self.operator, handler, rows[i], self._code_file) for i in idx])
        self.raised += [(handler, rows[i]) for i in idx]

    def timers(self, keys: Sequence[bytes], stamps: Sequence[int], errors: Sequence[BaseException],
               handler: str) -> None:
        """Adds timers (subject key, timestamp ms) whose handler raised ``errors``; their
        ``source`` is ``timer:<operator>``."""
        n = len(keys)
        if not n:
            return
        self._add(pa.array([f"{TIMER_SOURCE}{self.operator}"] * n, pa.string()), pa.nulls(n, pa.string()),
                  pa.nulls(n, pa.int64()),
                  pa.array(keys, pa.binary()), pa.array(stamps, pa.int64()), pa.nulls(n, pa.binary()),
                  [describe(self.operator, handler, e, self._code_file) for e in errors])
        self.raised += [(handler, e) for e in errors]

    def _add(self, source, partition, offset, key, timestamp, value, errors: list[str]) -> None:
        n = len(errors)
        self._tables.append(pa.table({
            "source": source, "partition": partition, "offset": offset,
            "key": key.cast(pa.binary()), "timestamp": timestamp.cast(pa.int64()), "value": value,
            "reason": pa.array([OPERATOR_ERROR] * n, pa.string()),
            "error": pa.array(errors, pa.string()),
            "epoch": pa.array(np.full(n, self.epoch, np.int64)),
        }, schema=DEAD_LETTER_SCHEMA))
        self.count += n

    def first(self) -> tuple[dict, str, BaseException] | None:
        """The first row added (as a dict), its handler and what it raised, or None."""
        if not self.count:
            return None
        return self.table().slice(0, 1).to_pylist()[0], *self.raised[0]

    def table(self) -> pa.Table:
        """Every row added, as one table of ``DEAD_LETTER_SCHEMA``."""
        return pa.concat_tables(self._tables) if self._tables else DEAD_LETTER_SCHEMA.empty_table()
