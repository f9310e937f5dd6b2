"""dkvstream: keyed, stateful stream operators on PySpark with state in DKV.

The public API, re-exported here::

    from operators import Job, Operator, BatchOperator, ValueSpec, JobRunner, ...

Layout: ``operators.api`` (operators, state specs, codecs, jobs, validation, key groups),
``operators.runtime`` (driver, tasks, timers, checkpoints, recovery, retention),
``operators.spark`` (session, stage, worker daemon), ``operators.io`` (sources and sinks),
``operators.tools`` (command-line tools), ``operators.errors`` and ``operators.paths``
(every job-level object key). ``JobRunner`` and the connectors are imported on first use,
so ``import operators`` stays light.
"""
from __future__ import annotations

from operators.api.batch import BatchContext, BatchOperator
from operators.api.codecs import (
    BytesCodec,
    Codec,
    FloatCodec,
    IntCodec,
    JsonCodec,
    MsgpackCodec,
    RecordCodec,
    StrCodec,
)
from operators.api.job import Job
from operators.api.operator import KeyedEvent, Operator, Subject
from operators.api.state import ListSpec, ListState, MapSpec, MapState, ValueSpec, ValueState
from operators.errors import (
    BadInputError,
    DkvstreamError,
    InsertConflictError,
    InvalidJobError,
    JobFailedError,
    JobFencedError,
    RecoveryRefusedError,
    SnapshotVacuumedError,
)
from operators.io.dead_letter import DeadLetter
from operators.io.sinks import ParquetSink, Sink
from operators.io.sources import Source

# Heavier modules (the driver pulls in the runtime; the connectors deltalake and the log),
# imported when first named: ``from operators import JobRunner`` works as the rest.
_LAZY = {
    "JobRunner": "operators.runtime.driver",
    "EpochResult": "operators.runtime.driver",
    "TopicSource": "operators.io.topics",
    "TopicSink": "operators.io.topics",
    "TableSink": "operators.io.table_sink",
    "get_spark": "operators.spark.session",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BadInputError",
    "BatchContext",
    "BatchOperator",
    "BytesCodec",
    "Codec",
    "DeadLetter",
    "DkvstreamError",
    "EpochResult",
    "FloatCodec",
    "InsertConflictError",
    "IntCodec",
    "InvalidJobError",
    "Job",
    "JobFailedError",
    "JobFencedError",
    "JobRunner",
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
    "RecoveryRefusedError",
    "Sink",
    "SnapshotVacuumedError",
    "Source",
    "StrCodec",
    "Subject",
    "TableSink",
    "TopicSink",
    "TopicSource",
    "ValueSpec",
    "ValueState",
    "get_spark",
]
