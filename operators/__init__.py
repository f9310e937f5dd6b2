"""dkvstream: keyed, stateful stream operators on PySpark with state in DKV.

The public API, re-exported here::

    from dkvstream.operators import Job, Operator, BatchOperator, ValueSpec, JobRunner, ...

Layout: ``dkvstream.operators.api`` (operators, state specs, codecs, jobs, validation, key groups),
``dkvstream.operators.runtime`` (driver, tasks, timers, checkpoints, recovery, retention),
``dkvstream.operators.spark`` (session, stage, worker daemon), ``dkvstream.operators.io`` (sources and sinks),
``dkvstream.operators.tools`` (command-line tools), ``dkvstream.operators.errors`` and ``dkvstream.operators.paths``
(every job-level object key). ``JobRunner`` and the connectors are imported on first use,
so ``from dkvstream import operators`` stays light.
"""
from __future__ import annotations

from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import (
    BytesCodec,
    Codec,
    FloatCodec,
    IntCodec,
    JsonCodec,
    MsgpackCodec,
    RecordCodec,
    StrCodec,
)
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject, TimeDomain
from dkvstream.operators.api.state import ListSpec, ListState, MapSpec, MapState, StateTtl, ValueSpec, ValueState
from dkvstream.operators.errors import (
    BadInputError,
    DkvstreamError,
    InsertConflictError,
    InvalidJobError,
    JobFailedError,
    JobFencedError,
    RecoveryRefusedError,
    SnapshotVacuumedError,
    StateSchemaError,
)
from dkvstream.operators.io.dead_letter import DeadLetter
from dkvstream.operators.io.sinks import ParquetSink, Sink
from dkvstream.operators.io.sources import Source

# Heavier modules (the driver pulls in the runtime; the connectors deltalake and the log),
# imported when first named: ``from dkvstream.operators import JobRunner`` works as the rest.
_LAZY = {
    "JobRunner": "dkvstream.operators.runtime.driver",
    "EpochResult": "dkvstream.operators.runtime.driver",
    "TopicSource": "dkvstream.operators.io.topics",
    "TopicSink": "dkvstream.operators.io.topics",
    "TableSink": "dkvstream.operators.io.table_sink",
    "get_spark": "dkvstream.operators.spark.session",
    "OperatorTestHarness": "dkvstream.operators.testing",
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
    "OperatorTestHarness",
    "ParquetSink",
    "RecordCodec",
    "RecoveryRefusedError",
    "Sink",
    "SnapshotVacuumedError",
    "Source",
    "StateSchemaError",
    "StateTtl",
    "StrCodec",
    "Subject",
    "TableSink",
    "TimeDomain",
    "TopicSink",
    "TopicSource",
    "ValueSpec",
    "ValueState",
    "get_spark",
]
