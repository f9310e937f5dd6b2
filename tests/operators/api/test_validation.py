"""Invalid configuration fails fast: at Job construction (or JobRunner start, for a job
changed after construction), with a message naming the field, before any write."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from dkvstream.examples.synthetic import WINDOW_COUNT_SCHEMA, KeyWindowCount, SyntheticSource
from dkvstream.operators.api.codecs import IntCodec, JsonCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.state import ListSpec, MapSpec, ValueSpec
from dkvstream.operators.api.validation import InvalidJobError
from dkvstream.operators.io.dead_letter import DeadLetter
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner


def _kwargs(**over) -> dict:
    kw = dict(name="cfg", source=SyntheticSource(50, 5), operators=[KeyWindowCount()],
              sinks={"main": ParquetSink("counts", WINDOW_COUNT_SCHEMA)})
    return {**kw, **over}


class StringCodec(KeyWindowCount):
    name = "string_codec"
    totals = MapSpec(IntCodec(), "json", id="totals")


class CodecClass(KeyWindowCount):
    name = "codec_class"
    extra = ValueSpec(JsonCodec)


class NotACodec(KeyWindowCount):
    name = "not_a_codec"
    buffer = ListSpec(object())


class LooksLikeABatchOperator:
    """Has what a BatchOperator has (name, outputs, on_batch) but is not one."""

    name = "duck"
    outputs = {"main": WINDOW_COUNT_SCHEMA}

    def on_batch(self, ctx, events) -> None:
        pass


class TwoOutputs(KeyWindowCount):
    name = "two_outputs"
    outputs = {"main": WINDOW_COUNT_SCHEMA, "late": WINDOW_COUNT_SCHEMA}


BAD = {
    "zero key groups": ({"key_groups": 0}, r"key_groups=0 must be in \[1, 32768\]"),
    "negative key groups": ({"key_groups": -4}, r"key_groups=-4"),
    "parallelism above key groups": ({"key_groups": 8, "parallelism": 9},
                                     r"parallelism=9 must be in \[1, 8\] \(at most key_groups"),
    "zero parallelism": ({"parallelism": 0}, r"parallelism=0"),
    "float parallelism": ({"parallelism": 2.0}, r"parallelism must be an int, got 2.0"),
    "negative events per epoch": ({"events_per_epoch": -1}, r"events_per_epoch=-1 must be >= 1"),
    "negative watermark delay": ({"max_out_of_orderness_ms": -1}, r"max_out_of_orderness_ms=-1 must be >= 0"),
    "unknown codec name": ({"operators": [StringCodec()]},
                           r"operator string_codec state 'totals' value codec: unknown codec 'json'.*JsonCodec"),
    "codec class, not instance": ({"operators": [CodecClass()]},
                                  r"state 'extra' codec is the class JsonCodec, not an instance"),
    "object that is not a codec": ({"operators": [NotACodec()]}, r"state 'buffer' codec: unknown codec 'object'"),
    "negative future bound": ({"dead_letter": DeadLetter(max_future_ms=-5)}, r"dead_letter.max_future_ms=-5"),
    "unknown tolerance": ({"dead_letter": DeadLetter(tolerance="some")}, r"tolerance must be 'all' or 'none'"),
    "dead-letter ratio above 1": ({"dead_letter": DeadLetter(max_ratio=50)},
                                  r"dead_letter.max_ratio must be a share from 0 to 1 or None, got 50"),
    "negative min_records": ({"dead_letter": DeadLetter(min_records=-1)}, r"dead_letter.min_records=-1"),
    "sink that is not a Sink": ({"sinks": {"main": "counts.parquet"}}, r"sink 'main' is 'counts.parquet', not a Sink"),
    "output schema not a schema": ({"operators": [type("BadOut", (KeyWindowCount,), {
        "name": "bad_out", "outputs": {"main": [("group", pa.string())]}})()]}, r"output 'main' schema is list"),
    "empty name": ({"name": ""}, r"job name '' is not usable.*non-empty string without '/'"),
    "name with a slash": ({"name": "a/b"}, r"job name 'a/b' is not usable"),
    "no operators": ({"operators": []}, r"needs at least one operator; pass operators=\[MyOperator\(\)\]"),
    "one operator, not a list": ({"operators": KeyWindowCount()}, r"operators must be a list.*operators=\[\.\.\.\]"),
    "operator class, not instance": ({"operators": [KeyWindowCount]},
                                     r"operator KeyWindowCount is a class, not an instance; write KeyWindowCount\(\)"),
    "duck-typed operator": ({"operators": [LooksLikeABatchOperator()]},
                            r"is not an Operator; subclass dkvstream.Operator .* or dkvstream.BatchOperator"),
    "duplicate operator names": ({"operators": [KeyWindowCount(), KeyWindowCount()]},
                                 r"operator names must be unique.*\['key_window_count'\] appear more than once"),
    "intermediate operator with two outputs": ({"operators": [TwoOutputs(), KeyWindowCount()]},
                                               r"intermediate operator two_outputs may only declare the 'main'"),
    "output without a sink": ({"operators": [TwoOutputs()]},
                              r"outputs \['late'\] of two_outputs have no sink; add them to sinks"),
    "sink of no output": ({"sinks": {"main": ParquetSink("counts", WINDOW_COUNT_SCHEMA),
                                     "extra": ParquetSink("x")}},
                          r"sinks \['extra'\] name no output of key_window_count .*remove them"),
    "epoch column into a Parquet sink": ({"operators": [type("EpochOut", (KeyWindowCount,), {
        "name": "epoch_out", "outputs": {"main": WINDOW_COUNT_SCHEMA.append(pa.field("epoch", pa.int64()))}})()],
        "sinks": {"main": ParquetSink("counts")}},
        r"output 'main' of epoch_out: ParquetSink 'counts': the output has a column 'epoch'.*rename the column"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_invalid_job_fails_at_construction(case: str) -> None:
    over, message = BAD[case]
    with pytest.raises(InvalidJobError, match=message):
        Job(**_kwargs(**over))


@pytest.mark.parametrize("case", ["zero key groups", "parallelism above key groups", "negative watermark delay",
                                  "unknown codec name"])
def test_invalid_job_fails_at_runner_start_before_any_write(case: str, tmp_path: Path) -> None:
    over, message = BAD[case]
    job = Job(**_kwargs())
    for name, value in over.items():
        setattr(job, name, value)  # changed after construction: the runner checks again
    root = tmp_path / "store"
    with pytest.raises(InvalidJobError, match=message):
        JobRunner(job, None, str(root))
    assert not root.exists()  # no object-store write, no directory even


def test_valid_job_passes_and_error_is_a_value_error() -> None:
    Job(**_kwargs(key_groups=2, parallelism=2, max_out_of_orderness_ms=0))
    assert issubclass(InvalidJobError, ValueError)  # callers catching ValueError still do
    assert dataclasses.is_dataclass(DeadLetter())
