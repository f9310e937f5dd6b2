"""Bad input: screening source events and the job's dead-letter output.

The driver screens every slice a source returns before an event reaches an operator
(Kafka Connect's ``errors.tolerance=all`` with a dead-letter queue, Flink's side output
for bad records). A row is bad, with exactly one reason (checked in this order):

=======================  ==============================================================
reason                   the row
=======================  ==============================================================
``unparseable_value``    the source could not decode it: its ``_error`` column (see
                         ``dkvstream.operators.api.columns.ERROR_COLUMN``) is set, e.g. a topic value
                         that is not JSON or does not fit ``value_schema`` without loss
                         (the error names the field: ``field 'price': JSON true is not a
                         number``; ``dkvstream.operators.io.topics.decode_json_values``)
``missing_key``          key null or empty (a null key would otherwise be taken for the
                         runtime's heartbeat row and vanish)
``missing_timestamp``    timestamp null
``timestamp_before_epoch``  timestamp < 0 (before 1970-01-01T00:00:00Z)
``timestamp_in_future``  timestamp > the driver's wall clock when the epoch was planned
                         + ``max_future_ms`` (default one day)
=======================  ==============================================================

Why a future bound, and why wall-clock based: one event dated in year 2200 (a
microsecond timestamp read as milliseconds, a 9999-12-31 sentinel) would raise its
partition's max event time and with it the watermark, making every later event late
and firing every timer: silent loss of correct data. The bound cannot be event-time
based, since the first epoch has no watermark to compare with, and a replayed historical
source is always far in the past of the wall clock, so it never trips. One day tolerates
producer clock skew and a local time mislabelled as UTC (at most 14 h off); Kafka's
``log.message.timestamp.after.max.ms`` makes the same check at the broker. The clock
reading belongs to the epoch's plan: a committed epoch is never screened again, and a
replay of an uncommitted epoch can only differ for an event within the replay delay of
the bound.

An event or timer an operator raises on is a dead letter too, with reason
``operator_error``, under ``Job.on_operator_error="dead_letter"``: the task that ran it
stages its rows, the driver names them in the checkpoint with the screen's
(``dkvstream.operators.runtime.operator_errors``).

Bad rows are removed before the watermark is computed and written to the dead-letter
table (``DeadLetter.table``, ``sinks/<table>/epoch=<e>/part-source.parquet``), staged
and published like any sink, so exactly once: the file is named by the epoch's
checkpoint under ``DEAD_LETTER_OUTPUT``. Columns: ``DEAD_LETTER_SCHEMA``; ``value`` holds
the raw bytes the source could not decode, else the row's value columns as compact JSON.
The files hold every column but ``epoch`` (``DEAD_LETTER_FILE_SCHEMA``): their
``epoch=<e>`` directory gives it, to ``DeadLetterSink.read`` and to pyarrow, DuckDB and
Spark reading the table's directory, which cannot merge a file column with the
directory's (files written before hold it as well; ``DeadLetterSink.read`` reads both).
Per-reason counts go to the checkpoint's ``metrics["dead_letter"]``.

An epoch whose dead letters are more than ``DeadLetter.max_ratio`` of its records fails
before its commit (``check_ratio``): a few bad records are the dead-letter table's job,
most of an epoch failing alike is a job that does not match its input.
"""
from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dkvstream.operators.api.columns import ERROR_COLUMN, KEY_COLUMN, RAW_VALUE_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.errors import BadInputError, TooManyDeadLettersError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import EPOCH_COLUMN, ParquetSink
from dkvstream.operators.paths import LAYOUT_FLAT, staging_prefix
from dkvstream.storage.objectstore import ObjectStore
from dkvstream.storage.objectstore.checksum import ObjectChecksum

DEAD_LETTER_OUTPUT = "_dead_letter"  # its key in JobCheckpoint.outputs
STAGED_FILE_NAME = "dead_letter.parquet"  # every staged dead-letter file's name (``stage``)
DAY_MS = 86_400_000
# The screen's reasons in the order it checks them, then ``operator_error``: an event or
# timer an operator raised on, under ``Job.on_operator_error="dead_letter"``
# (``dkvstream.operators.runtime.operator_errors``; written by the task, not the screen).
OPERATOR_ERROR = "operator_error"
REASONS = ("unparseable_value", "missing_key", "missing_timestamp", "timestamp_before_epoch",
           "timestamp_in_future", OPERATOR_ERROR)
DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("source", pa.string()), pa.field("partition", pa.string()),
    pa.field("offset", pa.int64()), pa.field("key", pa.binary()),
    pa.field("timestamp", pa.int64()), pa.field("value", pa.binary()),
    pa.field("reason", pa.string()), pa.field("error", pa.string()),
    pa.field(EPOCH_COLUMN, pa.int64()),
])
DEAD_LETTER_FILE_SCHEMA = DEAD_LETTER_SCHEMA.remove(DEAD_LETTER_SCHEMA.get_field_index(EPOCH_COLUMN))


class DeadLetterSink(ParquetSink):
    """The dead-letter Parquet table: files of ``DEAD_LETTER_FILE_SCHEMA`` in ``epoch=<e>``
    directories, read back as ``DEAD_LETTER_SCHEMA`` (module docstring)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, DEAD_LETTER_FILE_SCHEMA)

    def read_published(self, store: ObjectStore, key: str, epoch: int) -> pa.Table:
        t = super().read_published(store, key, epoch)
        if EPOCH_COLUMN not in t.column_names:
            t = t.append_column(EPOCH_COLUMN, pa.array(np.full(t.num_rows, epoch, np.int64)))
        return t.select(DEAD_LETTER_SCHEMA.names).cast(DEAD_LETTER_SCHEMA)

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """Every published dead-letter row, ``DEAD_LETTER_SCHEMA`` (with ``epoch``)."""
        t = super().read(store, job_prefix)
        return t if t.num_rows else DEAD_LETTER_SCHEMA.empty_table()

    def staged_file_name(self) -> str:
        return STAGED_FILE_NAME

    def erase_key(self, store: ObjectStore, job_prefix: str, keys: list[bytes | str]) -> list[str]:
        """Erasure: the dead-letter rows whose ``key`` is one of ``keys`` (``erase_rows``
        on the ``key`` column: published and staged files rewritten without them).
        Rows whose key is unknown (``missing_key``, an ``unparseable_value`` whose key
        did not decode) cannot be found by key; their ``value`` may still hold the key's
        data.

        Returns:
            The keys of the objects that held such a row (before the rewrite), sorted.
        """
        return self.erase_rows(store, job_prefix, "key", list(keys))


@dataclass(frozen=True)
class DeadLetter:
    """Bad-input handling of a job (``Job.dead_letter``).

    Attributes:
        table: name of the dead-letter Parquet table (``sinks/<table>/``).
        max_future_ms: a timestamp more than this many ms after the driver's wall clock
            is bad (``timestamp_in_future``); None disables the check.
        tolerance: ``"all"``: bad rows go to the dead-letter table and the job keeps
            running; ``"none"``: the first bad row fails the epoch (``BadInputError``)
            before any stage runs.
        max_ratio: the largest share (0..1) of an epoch's records that may be dead
            letters; an epoch over it fails before its commit (``TooManyDeadLettersError``,
            ``check_ratio``). A record is a row read from the source, an event a later
            operator received, or a timer that fired. None: no limit.
        min_records: ``max_ratio`` is checked only for epochs of at least this many
            records, so a few bad records in a quiet epoch do not stop a job.
    """

    table: str = "dead_letter"
    max_future_ms: int | None = DAY_MS
    tolerance: str = "all"
    max_ratio: float | None = 0.5
    min_records: int = 100

    @property
    def sink(self) -> DeadLetterSink:
        """The Parquet sink of the dead-letter table."""
        return DeadLetterSink(self.table)


def value_json(table: pa.Table, value_columns: list[str]) -> list[bytes]:
    """Each row's value columns as compact JSON bytes (keys sorted; a value JSON cannot
    hold, e.g. bytes, as its ``str``; a float NaN as Python's ``NaN``): the ``value`` of a
    dead-letter row whose source bytes are not at hand."""
    return [json.dumps(v, sort_keys=True, separators=(",", ":"), default=str).encode()
            for v in table.select(value_columns).to_pylist()]


def _raw_values(table: pa.Table, value_columns: list[str]) -> list[bytes]:
    raw = (table.column(RAW_VALUE_COLUMN).to_pylist() if RAW_VALUE_COLUMN in table.column_names
           else [None] * table.num_rows)
    return [r if r is not None else v for r, v in zip(raw, value_json(table, value_columns))]


def screen(table: pa.Table, offsets: np.ndarray, policy: DeadLetter, *, source: str, partition: str,
           epoch: int, now_ms: int | None = None) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Splits one source slice into good rows and dead-letter rows.

    Args:
        table: what ``Source.read`` returned (key, timestamp, value columns and maybe
            ``_error`` / ``_raw_value``).
        offsets: the source offset of each row (int64, same length).
        policy: the job's ``DeadLetter``.
        source, partition, epoch: written into the dead-letter rows.
        now_ms: the wall clock (ms since the Unix epoch) of the epoch's plan; default now.

    Returns:
        ``(good, dead, good_offsets)``: good rows without the ``_error``/``_raw_value``
        columns, dead-letter rows (``DEAD_LETTER_SCHEMA``), and the good rows' offsets.

    Raises:
        BadInputError: a bad row with ``policy.tolerance == "none"``.
    """
    n = table.num_rows
    value_columns = [c for c in table.column_names
                     if c not in (KEY_COLUMN, TIMESTAMP_COLUMN, ERROR_COLUMN, RAW_VALUE_COLUMN)]
    reason = np.full(n, -1, np.int8)  # index into REASONS, -1 = good

    def mark(code: int, mask) -> None:
        m = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), bool)
        reason[(reason < 0) & m] = code

    errors = table.column(ERROR_COLUMN) if ERROR_COLUMN in table.column_names else pa.nulls(n, pa.string())
    mark(0, pc.is_valid(errors))
    key = table.column(KEY_COLUMN)
    mark(1, pc.or_kleene(pc.is_null(key), pc.equal(pc.binary_length(key), 0)))
    ts = table.column(TIMESTAMP_COLUMN).cast(pa.int64())
    mark(2, pc.is_null(ts))
    mark(3, pc.less(ts, 0))
    if policy.max_future_ms is not None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        mark(4, pc.greater(ts, now + policy.max_future_ms))
    good_mask = reason < 0
    good = table.drop_columns([c for c in (ERROR_COLUMN, RAW_VALUE_COLUMN) if c in table.column_names])
    if good_mask.all():
        return good, DEAD_LETTER_SCHEMA.empty_table(), offsets
    bad_idx = np.flatnonzero(~good_mask)
    bad = table.take(pa.array(bad_idx))
    if policy.tolerance == "none":
        i = int(bad_idx[0])
        raise BadInputError(f"source {source} partition {partition} offset {int(offsets[i])}: "
                            f"{REASONS[reason[i]]} (dead_letter.tolerance='none')")
    dead = pa.table({
        "source": pa.array([source] * len(bad_idx), pa.string()),
        "partition": pa.array([partition] * len(bad_idx), pa.string()),
        "offset": pa.array(offsets[bad_idx], pa.int64()),
        "key": bad.column(KEY_COLUMN).cast(pa.binary()),
        "timestamp": bad.column(TIMESTAMP_COLUMN).cast(pa.int64()),
        "value": pa.array(_raw_values(bad, value_columns), pa.binary()),
        "reason": pa.array([REASONS[r] for r in reason[bad_idx]], pa.string()),
        "error": errors.take(pa.array(bad_idx)).cast(pa.string()),
        "epoch": pa.array(np.full(len(bad_idx), epoch, np.int64)),
    }, schema=DEAD_LETTER_SCHEMA)
    return good.filter(pa.array(good_mask)), dead, offsets[good_mask]


def reason_counts(dead: pa.Table) -> dict[str, int]:
    """``{reason: rows}`` of dead-letter rows (reasons present only)."""
    if not dead.num_rows:
        return {}
    grouped = dead.group_by("reason").aggregate([("reason", "count")])
    return {r: int(n) for r, n in zip(grouped.column("reason").to_pylist(), grouped.column("reason_count").to_pylist())}


def counts(screened: dict[str, int], operator_errors: int = 0) -> dict[str, int]:
    """Per-reason row counts of an epoch's dead letters, every reason present, plus
    ``total``: ``screened`` (``reason_counts`` of the screen's rows) and ``operator_errors``
    rows the tasks staged (reason ``operator_error``)."""
    got = dict(screened)
    got[OPERATOR_ERROR] = got.get(OPERATOR_ERROR, 0) + operator_errors
    return {"total": sum(got.values()), **{r: int(got.get(r, 0)) for r in REASONS}}


def stage(store: ObjectStore, job_prefix: str, epoch: int, dead: pa.Table, attempt: str,
          label: str = "source", layout: int = LAYOUT_FLAT) -> tuple[str, ObjectChecksum]:
    """Writes dead-letter rows as a staged Parquet file; returns its key and checksum
    (the checkpoint's ``output_checksums``: a restart never publishes it damaged).

    Args:
        dead: rows of ``DEAD_LETTER_SCHEMA``, all of epoch ``epoch``; written without
            the ``epoch`` column (``DEAD_LETTER_FILE_SCHEMA``: the directory gives it).
        label: who wrote them: ``"source"`` for the driver's screen, ``<operator>-<range
            label>`` for a task (``dkvstream.operators.runtime.operator_errors``). It names the
            published file (``part-<label>.parquet``), so it is unique within an epoch.
        attempt: unique to the writer's attempt (driver or task): a failed attempt's file
            is never named by a checkpoint and is cleaned up like any staged output.
        layout: the job's key layout (``dkvstream.operators.paths``).

    Raises:
        ValueError: a row of another epoch (a bug of the caller).
    """
    epochs = pc.unique(dead.column(EPOCH_COLUMN)).to_pylist()
    if any(e != epoch for e in epochs):
        raise ValueError(f"dead-letter rows of epochs {epochs} staged for epoch {epoch}")
    buf = io.BytesIO()
    pq.write_table(dead.drop_columns([EPOCH_COLUMN]), buf, compression="zstd")
    key = f"{staging_prefix(job_prefix, epoch, DEAD_LETTER_OUTPUT, label, attempt, layout)}/{STAGED_FILE_NAME}"
    data = buf.getvalue()
    store.put(key, data)
    return key, ObjectChecksum.of(data)


# Dead-letter rows a ``TooManyDeadLettersError`` quotes.
EXAMPLES = 3


def per_reason(counts: dict[str, int]) -> str:
    """``"<reason> <n>, ..."`` of the reasons with rows in ``counts`` (``counts``), for a
    message or a log line."""
    return ", ".join(f"{r} {n:,}" for r, n in counts.items() if r != "total" and n)


def check_ratio(policy: DeadLetter, counts: dict[str, int], records: int, staged: list[str],
                store: ObjectStore, where: str) -> None:
    """Fails an epoch that sent more than ``policy.max_ratio`` of its records to the
    dead-letter table (Kafka Connect's ``errors.tolerance`` stops at the first error or
    never; this stops when most input is bad, which is a wrong schema or a broken
    producer rather than a few bad records). Called by the driver before the commit.

    Args:
        policy: the job's ``DeadLetter``.
        counts: the epoch's ``counts`` (per reason and ``total``).
        records: the epoch's records (rows read from the source, events later operators
            received, timers fired); ``counts["total"]`` of them are dead letters.
        staged: the epoch's staged dead-letter files, in order (the screen's first):
            the error quotes their first rows.
        store: the job's object store.
        where: ``"job <name>: epoch <n>"``, the message's start.

    Raises:
        TooManyDeadLettersError: ``records >= policy.min_records`` and the share of
            dead letters is above ``policy.max_ratio``; the message names the counts, the
            share, each reason's count, the first rows' positions and errors, and what to do.
    """
    total = counts.get("total", 0)
    if policy.max_ratio is None or records < max(1, policy.min_records) or total <= policy.max_ratio * records:
        return
    reasons = per_reason(counts)
    first = "; ".join(_describe_row(row) for row in first_rows(store, staged, EXAMPLES))
    raise TooManyDeadLettersError(
        f"{where} sent {total:,} of its {records:,} records ({total / records:.1%}) to the dead-letter "
        f"table {policy.table!r}, more than DeadLetter.max_ratio={policy.max_ratio} allows; the epoch is "
        f"not committed (per reason: {reasons}). First: {first}. Most records failing alike means the job "
        f"does not match its input: fix the source's value_schema or the operator and run again (the epoch "
        f"is redone); to accept this share of bad input, raise DeadLetter(max_ratio=...) or set it to None.")


def first_rows(store: ObjectStore, staged: list[str], n: int) -> list[dict]:
    """The first ``n`` rows (``DEAD_LETTER_FILE_SCHEMA`` columns but ``value``, as dicts) of the
    staged dead-letter files ``staged``, in order."""
    rows: list[dict] = []
    columns = [f.name for f in DEAD_LETTER_FILE_SCHEMA if f.name != "value"]  # epoch: the directory's
    for key in staged:
        if len(rows) >= n:
            break
        table = pq.read_table(arrow_input(store.get(key)), columns=columns)
        rows += table.slice(0, n - len(rows)).to_pylist()
    return rows


def _describe_row(row: dict) -> str:
    """One dead-letter row for an error message: where it came from and why."""
    if row["partition"] is not None:
        at = f"source {row['source']} partition {row['partition']} offset {row['offset']}"
    else:
        at = f"{row['source']} key {row['key']!r} at {row['timestamp']}"
    return f"{at}: {row['reason']}" + (f" ({row['error']})" if row["error"] else "")
