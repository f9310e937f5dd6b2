"""Schemas are enforced where data enters and leaves an operator.

* Emitted rows against the operator's ``outputs`` schema (``dkvstream.operators.runtime.task`` for
  ``Subject.emit``, ``BatchContext.emit`` for the vectorised form): an unknown field, or a
  non-nullable field missing or null, fails the epoch naming operator, output and field.
* Source slices against ``key`` binary, ``timestamp`` int64 ms and ``Source.value_schema``
  (``dkvstream.operators.io.sources.check_slice``): lossless widenings are applied, anything else
  fails the epoch naming source, partition, offsets and column.

Oracles: the rows a pandas computation of the job gives; for refusals, the error and an
empty store (no checkpoint, no output).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.columns import ERROR_COLUMN, RAW_VALUE_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.errors import JobFailedError
from dkvstream.operators.io import sources
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner

DAY_MS = 86_400_000
STEP_MS = 3_600_000  # an hour between events: several days per key
EVENTS = 120


def _source() -> SyntheticSource:
    return SyntheticSource(EVENTS, keys=5, partitions=2, step_ms=STEP_MS)


def _input(source: SyntheticSource) -> pd.DataFrame:
    """Every event of ``source`` as generated (before any change a test source makes)."""
    return pd.concat([SyntheticSource.full_partition(source, p).to_pandas()
                      for p in source.partitions()])


def _run(job: Job, tmp_path) -> tuple[JobRunner, pd.DataFrame]:
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    return runner, job.sinks["main"].read(runner.store, job.prefix).to_pandas()


def _assert_nothing_committed(runner: JobRunner, job: Job) -> None:
    assert runner.latest() is None
    assert job.sinks["main"].read(runner.store, job.prefix).num_rows == 0


# -- emitted rows against the output schema ------------------------------------------------

DAILY_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("day", pa.int64()),
                          pa.field("amount", pa.int64())])


class DailyEcho(Operator):
    """Every event as (key, day, amount); ``rename`` maps schema names to emitted names
    (a misspelling), ``drop`` leaves fields out, ``extra`` adds constant fields."""

    name = "daily_echo"

    def __init__(self, schema: pa.Schema = DAILY_SCHEMA, rename: dict[str, str] | None = None,
                 drop: tuple[str, ...] = (), extra: dict | None = None) -> None:
        self.outputs = {"main": schema}
        self.rename, self.drop, self.extra = rename or {}, drop, extra or {}

    def shape(self, row: dict) -> dict:
        row = {**row, **self.extra}
        return {self.rename.get(k, k): v for k, v in row.items() if k not in self.drop}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        subject.emit(self.shape({"key": subject.key.decode(),
                                 "day": event.timestamp - event.timestamp % DAY_MS,
                                 "amount": event.value["amount"]}))


class DailyEchoBatch(BatchOperator):
    """``DailyEcho`` in vectorised form; ``as_table`` emits a ``pa.Table``, else a dict."""

    name = "daily_echo"

    def __init__(self, schema: pa.Schema = DAILY_SCHEMA, rename: dict[str, str] | None = None,
                 drop: tuple[str, ...] = (), extra: dict | None = None,
                 as_table: bool = False) -> None:
        self.outputs = {"main": schema}
        self.rename, self.drop, self.extra = rename or {}, drop, extra or {}
        self.as_table = as_table

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        ts = events.column("timestamp").to_numpy()
        cols = {"key": events.column("key").cast(pa.string()), "day": pa.array(ts - ts % DAY_MS),
                "amount": events.column("amount"),
                **{k: [v] * len(ts) for k, v in self.extra.items()}}
        values = {self.rename.get(k, k): v for k, v in cols.items() if k not in self.drop}
        ctx.emit(pa.table(values) if self.as_table else values,
                 keys=events.column("key").to_pylist(), timestamps=ts.tolist())


def _daily_job(operator: Operator, schema: pa.Schema = DAILY_SCHEMA) -> Job:
    return Job(name="daily", source=_source(), operators=[operator],
               sinks={"main": ParquetSink("daily", schema)}, key_groups=8, parallelism=2,
               events_per_epoch=100)


def _daily_oracle(drop: tuple[str, ...] = ()) -> pd.DataFrame:
    df = _input(_source())
    out = pd.DataFrame({"key": df["key"].map(bytes.decode),
                        "day": df["timestamp"] - df["timestamp"] % DAY_MS, "amount": df["amount"]})
    for c in drop:
        out[c] = None
    return _sorted(out)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["key", "day", "amount"]).reset_index(drop=True)


FORMS = {
    "on_event": lambda **kw: DailyEcho(**kw),
    "batch_dict": lambda **kw: DailyEchoBatch(**kw),
    "batch_table": lambda **kw: DailyEchoBatch(as_table=True, **kw),
}


@pytest.mark.parametrize("form", FORMS)
def test_misspelled_emitted_field_fails_the_epoch(form, tmp_path) -> None:
    # ``day_start`` for ``day``: before the check the on_event form wrote a column of
    # nulls and the batch form dropped an extra table column or raised a bare KeyError.
    job = _daily_job(FORMS[form](rename={"day": "day_start"}))
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(JobFailedError, match=r"operator daily_echo output 'main'.* field "
                                             r"'day_start' is not in the output schema"):
        runner.run()
    _assert_nothing_committed(runner, job)


@pytest.mark.parametrize("form", FORMS)
def test_extra_emitted_field_fails_the_epoch(form, tmp_path) -> None:
    # All schema fields present plus one more: the extra one was dropped silently.
    job = _daily_job(FORMS[form](extra={"comment": "x"}))
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(JobFailedError,
                       match=r"operator daily_echo output 'main'.* field 'comment' is not in"):
        runner.run()
    _assert_nothing_committed(runner, job)


NOT_NULL_DAY = pa.schema([pa.field("key", pa.string()),
                          pa.field("day", pa.int64(), nullable=False),
                          pa.field("amount", pa.int64())])


@pytest.mark.parametrize("form", FORMS)
def test_missing_non_nullable_field_fails_the_epoch(form, tmp_path) -> None:
    job = _daily_job(FORMS[form](schema=NOT_NULL_DAY, drop=("day",)), NOT_NULL_DAY)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(JobFailedError,
                       match=r"operator daily_echo output 'main'.* field 'day' is not nullable"):
        runner.run()
    _assert_nothing_committed(runner, job)


@pytest.mark.parametrize("form", FORMS)
def test_missing_nullable_field_is_null(form, tmp_path) -> None:
    # The same in both forms: a nullable field left out is null (the batch form raised a
    # bare KeyError for a dict and for a table).
    job = _daily_job(FORMS[form](drop=("amount",)))
    _, got = _run(job, tmp_path)
    want = _daily_oracle(drop=("amount",))
    assert got["amount"].isna().all() and len(got) == 2 * EVENTS
    pd.testing.assert_frame_equal(_sorted(got).drop(columns="amount"),
                                  want.drop(columns="amount"))


@pytest.mark.parametrize("form", FORMS)
def test_well_formed_output_is_unchanged(form, tmp_path) -> None:
    _, got = _run(_daily_job(FORMS[form]()), tmp_path)
    pd.testing.assert_frame_equal(_sorted(got), _daily_oracle(), check_dtype=False)


def test_emitted_value_of_wrong_type_names_operator_output_and_field(tmp_path) -> None:
    class Wrong(DailyEcho):
        def on_event(self, subject, event):
            subject.emit({"key": subject.key.decode(), "day": "monday", "amount": 1})

    job = _daily_job(Wrong())
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(JobFailedError, match=r"operator daily_echo output 'main': field 'day'"):
        runner.run()
    _assert_nothing_committed(runner, job)


# -- source slices against the source schema -----------------------------------------------

ECHO_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("ts", pa.int64()),
                         pa.field("amount", pa.int64())])


class Echo(Operator):
    """Every event as (key, ts, amount)."""

    name = "echo"
    outputs = {"main": ECHO_SCHEMA}

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        subject.emit({"key": subject.key.decode(), "ts": event.timestamp,
                      "amount": event.value["amount"]})


class Reshaped(SyntheticSource):
    """``SyntheticSource`` whose slices of ``partitions`` go through ``change``."""

    name = "reshaped"

    def __init__(self, change: Callable[[pa.Table], pa.Table],
                 partitions: tuple[str, ...] = ("p1",)) -> None:
        super().__init__(EVENTS, keys=5, partitions=2, step_ms=STEP_MS)
        self.change, self.changed = change, partitions

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        t = super().read(partition, start, end)
        return self.change(t) if partition in self.changed else t


def _echo_job(source: SyntheticSource) -> Job:
    return Job(name="echo", source=source, operators=[Echo()],
               sinks={"main": ParquetSink("echo", ECHO_SCHEMA)}, key_groups=8, parallelism=2,
               events_per_epoch=100)


def _echo_oracle(source: SyntheticSource) -> pd.DataFrame:
    df = _input(source)
    out = pd.DataFrame({"key": df["key"].map(bytes.decode), "ts": df["timestamp"],
                        "amount": df["amount"]})
    return out.sort_values(["key", "ts"]).reset_index(drop=True)


def _set(t: pa.Table, name: str, column) -> pa.Table:
    return t.set_column(t.column_names.index(name), name, column)


def _refused(source: SyntheticSource, tmp_path, match: str) -> None:
    job = _echo_job(source)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    with pytest.raises(TypeError, match=match):
        runner.run()
    _assert_nothing_committed(runner, job)


def test_value_column_of_a_lossy_type_is_refused(tmp_path) -> None:
    # amount as float64 (12.0) in every partition: before the check the job ran, the
    # echo operator's int64 output taking the floats silently.
    source = Reshaped(lambda t: _set(t, "amount", t.column("amount").cast(pa.float64())),
                      partitions=("p0", "p1"))
    _refused(source, tmp_path, r"source reshaped partition p0 offsets \[0, 50\): column 'amount' "
                               r"is double, value_schema says int64; cast it in the source")


def test_partitions_returning_other_columns_name_the_partition(tmp_path) -> None:
    # Before: pa.concat_tables failed ("Schema at index 1 was different"), naming no
    # partition.
    source = Reshaped(lambda t: t.append_column("note", pa.array(["x"] * t.num_rows)))
    _refused(source, tmp_path, r"source reshaped partition p1 offsets \[0, 50\): column 'note' is "
                               r"not in value_schema")
    source = Reshaped(lambda t: t.drop_columns(["amount"]))
    _refused(source, tmp_path,
             r"partition p1 offsets \[0, 50\): column 'amount' of value_schema is missing")


def test_arrow_timestamp_column_is_refused_with_what_to_do(tmp_path) -> None:
    # Before: a raw TypeError from deep in the driver.
    utc_ms = pa.timestamp("ms", tz="UTC")
    source = Reshaped(lambda t: _set(t, "timestamp", t.column("timestamp").cast(utc_ms)),
                      partitions=("p0", "p1"))
    _refused(source, tmp_path, r"partition p0 offsets \[0, 50\): column 'timestamp' is "
                               r"timestamp\[ms, tz=UTC\].*cast the timestamp column to int64 "
                               r"milliseconds")


def _cast(name: str, to: pa.DataType) -> Callable[[pa.Table], pa.Table]:
    return lambda t: _set(t, name, t.column(name).cast(to))


@pytest.mark.parametrize("changed", [("p1",), ("p0", "p1")],
                         ids=["one-partition", "all-partitions"])
@pytest.mark.parametrize("change", [
    pytest.param(_cast("key", pa.string()), id="str-key"),
    pytest.param(_cast("key", pa.large_binary()), id="large-binary-key"),
    pytest.param(_cast("timestamp", pa.int32()), id="int32-timestamp"),
    pytest.param(_cast("amount", pa.int32()), id="int32-value"),
    pytest.param(lambda t: t.select(["amount", "timestamp", "key"]), id="column-order"),
])
def test_lossless_widenings_are_applied(change, changed, tmp_path) -> None:
    # Before: partitions of different schemas failed in pa.concat_tables; a str key in
    # every partition raised a raw TypeError.
    source = Reshaped(change, changed)
    _, got = _run(_echo_job(source), tmp_path)
    pd.testing.assert_frame_equal(got.sort_values(["key", "ts"]).reset_index(drop=True),
                                  _echo_oracle(source), check_dtype=False)


def _slice(**columns) -> pa.Table:
    base = {"key": pa.array([b"a", b"b", None]), "timestamp": pa.array([1, 2, 3], pa.int64()),
            "amount": pa.array([1, 2, 3], pa.int64())}
    base.update(columns)
    return pa.table({k: v for k, v in base.items() if v is not None})


def test_check_slice_decisions() -> None:
    src = SyntheticSource(10, 2)
    want = pa.schema([pa.field("key", pa.binary()), pa.field("timestamp", pa.int64()),
                      *src.value_schema])
    with_errors = pa.schema([*want, pa.field(ERROR_COLUMN, pa.string()),
                             pa.field(RAW_VALUE_COLUMN, pa.binary())])

    def ok(**columns) -> pa.Table:
        out = sources.check_slice(src, "p0", 7, 10, _slice(**columns))
        assert out.schema.equals(with_errors if ERROR_COLUMN in columns else want)
        return out

    def refused(match: str, **columns) -> None:
        with pytest.raises(TypeError, match=r"source synthetic partition p0 offsets \[7, 10\): "
                                            + match):
            sources.check_slice(src, "p0", 7, 10, _slice(**columns))

    assert ok().equals(_slice())
    assert ok(key=pa.array(["a", "b", None])).column("key").to_pylist() == [b"a", b"b", None]
    keys = pa.array(["a", "b", "a"]).dictionary_encode()
    assert ok(key=keys).column("key").to_pylist() == [b"a", b"b", b"a"]
    stamps = pa.array([1, 2, 3], pa.uint32())
    assert ok(timestamp=stamps).column("timestamp").to_pylist() == [1, 2, 3]
    assert ok(amount=pa.array([1, None, 3], pa.int8())).column("amount").to_pylist() == [1, None, 3]
    assert ok(amount=pa.nulls(3)).column("amount").to_pylist() == [None] * 3
    out = ok(**{ERROR_COLUMN: pa.array([None, "bad", None]),
                RAW_VALUE_COLUMN: pa.array(["", "x", ""])})
    assert out.column(RAW_VALUE_COLUMN).to_pylist() == [b"", b"x", b""]
    to_ms = ".*cast the timestamp column to int64 milliseconds"
    refused(r"column 'timestamp' is uint64 " + to_ms, timestamp=pa.array([1, 2, 3], pa.uint64()))
    refused(r"column 'timestamp' is double " + to_ms, timestamp=pa.array([1.0, 2.0, 3.0]))
    refused(r"column 'timestamp' is timestamp\[us\] " + to_ms,
            timestamp=pa.array([1, 2, 3], pa.timestamp("us")))
    refused(r"column 'key' is int64 .*binary", key=pa.array([1, 2, 3]))
    refused(r"column 'key' is missing", key=None)
    refused(r"column 'amount' is uint64, value_schema says int64",
            amount=pa.array([1, 2, 3], pa.uint64()))
    refused(r"column 'amount' is string, value_schema says int64", amount=pa.array(["1", "2", "3"]))
    refused(r"column 'extra' is not in value_schema", extra=pa.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"offsets \[7, 10\): 2 rows for 3 offsets"):
        sources.check_slice(src, "p0", 7, 10, _slice().slice(0, 2))
    dup = pa.Table.from_arrays([pa.array([b"a"]), pa.array([1]), pa.array([1]), pa.array([2])],
                               names=["key", "timestamp", "amount", "amount"])
    with pytest.raises(TypeError, match=r"column 'amount' appears twice"):
        sources.check_slice(src, "p0", 0, 1, dup)
    empty = sources.check_slice(src, "p0", 0, 0, _slice().slice(0, 0))
    assert empty.num_rows == 0 and empty.schema.equals(want)


@pytest.mark.parametrize("have,want,taken", [
    (pa.int32(), pa.int64(), True), (pa.uint32(), pa.int64(), True),
    (pa.uint64(), pa.int64(), False), (pa.int64(), pa.int32(), False),
    (pa.int32(), pa.float64(), True),
    (pa.int64(), pa.float64(), False), (pa.int16(), pa.float32(), True),
    (pa.int32(), pa.float32(), False), (pa.float32(), pa.float64(), True),
    (pa.float64(), pa.float32(), False), (pa.float64(), pa.int64(), False),
    (pa.large_string(), pa.string(), True), (pa.binary(), pa.string(), False),
    (pa.string(), pa.binary(), True), (pa.dictionary(pa.int8(), pa.string()), pa.string(), True),
    (pa.null(), pa.list_(pa.int64()), True), (pa.list_(pa.int32()), pa.list_(pa.int64()), False),
    (pa.timestamp("ms"), pa.timestamp("ms", tz="UTC"), False), (pa.date32(), pa.int64(), False),
])
def test_value_casts_are_lossless_widenings_only(have, want, taken) -> None:
    """A value column of type ``have`` where value_schema says ``want``: cast or refused."""
    src = SimpleNamespace(name="s", value_schema=pa.schema([pa.field("v", want)]))
    table = pa.table({"key": [b"a", b"b"], "timestamp": [1, 2], "v": pa.nulls(2, have)})
    if taken:
        assert sources.check_slice(src, "p", 0, 2, table).schema.field("v").type == want
    else:
        with pytest.raises(TypeError, match=rf"column 'v' is {re.escape(str(have))}, value_schema"):
            sources.check_slice(src, "p", 0, 2, table)
