"""Every error the job API and the runtime raise, in one place (as ``dkvstream.storage.errors``).

All derive from ``dkvstream.storage.errors.DkvstreamError`` (re-exported here), the project's one
root, and keep the built-in base that says what kind of mistake each is (``ValueError``
for a bad job or input, ``RuntimeError`` for a failed run...). ``retryable`` (a class
attribute) says whether running the same thing again may work: only ``KafkaIOError`` is,
among these. Errors of the stores underneath (``CorruptionError``,
``ObjectNotFoundError``, ...) stay in ``dkvstream.storage.errors``; ``RecoveryRefusedError`` is one
of them, since stored objects cause it.

A task on Spark that raises one of these reaches the driver as the same type with the
same message (``dkvstream.operators.runtime.task_errors``).
"""
from __future__ import annotations

from dkvstream.storage.errors import CorruptionError, DkvstreamError

__all__ = ["DkvstreamError", "InvalidJobError", "JobFailedError", "JobFencedError", "RecoveryRefusedError",
           "StateTypeError", "StateSchemaError", "BadInputError", "TooManyDeadLettersError", "OperatorError",
           "SourceFileChangedError", "InsertConflictError", "SnapshotVacuumedError", "KafkaIOError",
           "JavaNotFoundError", "BootstrapError"]


class InvalidJobError(DkvstreamError, ValueError):
    """Raised when a job definition is inconsistent; the message names the job and field."""


class JobFailedError(DkvstreamError, RuntimeError):
    """Raised when an epoch fails; the previous checkpoint stays the newest. Raised from
    the task's error when there is one (``__cause__``), whose ``retryable`` it takes."""


class JobFencedError(JobFailedError):
    """Raised when another driver committed this epoch first: this driver must stop (it
    published nothing of the epoch; its task files are garbage for cleanup)."""


class RecoveryRefusedError(CorruptionError):
    """Raised when no checkpoint can be restarted from safely; names the bad objects and why.

    A ``CorruptionError``: it is always caused by stored objects that are corrupt or missing.
    """


class StateTypeError(DkvstreamError, TypeError):
    """Raised when an operator stores a value (or map key) its state's codec cannot
    encode; names the operator, the state id, the codec, the expected type and the value
    (``dkvstream.operators.api.state``)."""


class StateSchemaError(InvalidJobError):
    """Raised at a restart, before any epoch runs, when the job's state declarations
    cannot read the state its checkpoint holds: a record field narrowed or of another
    type, another map-key or value codec, another kind of state under the same id.
    Names the operator, the state id and the field, and what to do
    (``dkvstream.operators.api.state_schema``)."""


class BadInputError(DkvstreamError, ValueError):
    """Raised with ``tolerance="none"`` on the first bad row; names partition, offset, reason."""


class BootstrapError(DkvstreamError, ValueError):
    """Raised when a job's initial state cannot be written from the tables given
    (``dkvstream.operators.runtime.bootstrap``): the job has a checkpoint already, an
    unknown operator or state id, a missing or mistyped column, a repeated key; names
    the table, the column and the row or key, and what to do."""


class TooManyDeadLettersError(JobFailedError):
    """Raised when an epoch sends more than ``DeadLetter.max_ratio`` of its records to the
    dead-letter table; nothing of the epoch is committed (``dkvstream.operators.io.dead_letter``)."""


class OperatorError(JobFailedError):
    """Raised under ``Job.on_operator_error="fail"`` when an operator raises on an event or
    a timer; names the operator, handler, key, source partition and offset (or the timer)
    and event time (``dkvstream.operators.runtime.operator_errors``)."""


class SourceFileChangedError(DkvstreamError, RuntimeError):
    """Raised when a file a file source logged has since changed or vanished, so its
    offsets can no longer be read as they were logged; names the file, what was logged
    and what is there now (``dkvstream.operators.io.files``)."""


class InsertConflictError(DkvstreamError, RuntimeError):
    """Raised when an insert names a primary key the table (or the same epoch) already holds."""


class SnapshotVacuumedError(DkvstreamError, LookupError):
    """Raised when time travel asks for a table version whose data files a VACUUM may
    have deleted (superseded before the vacuum's retention window)."""


class KafkaIOError(DkvstreamError, RuntimeError):
    """Raised when a Kafka broker fails or does not answer in time a source's read or a
    sink's publish; names the topic, partition and offsets (``dkvstream.operators.io.kafka``)."""

    retryable = True


class JavaNotFoundError(DkvstreamError, RuntimeError):
    """Raised before Spark starts when it could not: no ``java`` on ``PATH``, or
    ``JAVA_HOME`` naming a directory without ``bin/java``; says how to install Java
    (``dkvstream.operators.spark.session.get_spark``)."""
