"""dkvstream operators: the job API and the runtime that runs jobs as PySpark stages.

The job API (no PySpark import) lives in `operators.api`, `operators.state`,
`operators.codecs`, `operators.sources`, `operators.sinks` and `operators.job`; the
runtime in `operators.runtime` (driver) and `operators.task` (Spark tasks).
"""
from __future__ import annotations

from operators.api import KeyedEvent, Operator, Subject
from operators.codecs import (
    BytesCodec,
    Codec,
    FloatCodec,
    IntCodec,
    JsonCodec,
    MsgpackCodec,
    RecordCodec,
    StrCodec,
)
from operators.job import Job
from operators.sinks import ParquetSink, Sink
from operators.sources import Source
from operators.state import ListSpec, ListState, MapSpec, MapState, ValueSpec, ValueState

__all__ = [
    "BytesCodec",
    "Codec",
    "FloatCodec",
    "IntCodec",
    "Job",
    "JsonCodec",
    "KeyedEvent",
    "ListSpec",
    "ListState",
    "MapSpec",
    "MapState",
    "MsgpackCodec",
    "Operator",
    "ParquetSink",
    "RecordCodec",
    "Sink",
    "Source",
    "StrCodec",
    "Subject",
    "ValueSpec",
    "ValueState",
]
