"""The error hierarchy (one root, ``retryable``) and errors crossing Spark with their type."""
from __future__ import annotations

import inspect

import pytest

import dkvstream.operators.errors
import dkvstream.storage.errors
import dkvstream.storage.log.errors
from dkvstream.operators.errors import BadInputError, DkvstreamError, OperatorError, StateTypeError
from dkvstream.operators.runtime.task_errors import carry_errors, encode, error_class, task_error
from dkvstream.storage.errors import ManifestConflictError
from dkvstream.storage.objectstore.s3 import S3CredentialsError, S3RequestError

MODULES = (dkvstream.operators.errors, dkvstream.storage.errors, dkvstream.storage.log.errors)


def _classes(module) -> list[type]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == module.__name__]


def test_every_project_error_derives_from_the_one_root_and_keeps_its_builtin_base() -> None:
    classes = [c for m in MODULES for c in _classes(m)]
    assert len(classes) > 20
    assert all(issubclass(c, DkvstreamError) for c in classes), [c for c in classes
                                                                  if not issubclass(c, DkvstreamError)]
    assert dkvstream.operators.errors.DkvstreamError is dkvstream.storage.errors.DkvstreamError
    # Callers that only know the standard library still catch them.
    assert issubclass(dkvstream.operators.errors.InvalidJobError, ValueError)
    assert issubclass(BadInputError, ValueError)
    assert issubclass(dkvstream.operators.errors.JobFailedError, RuntimeError)
    assert issubclass(dkvstream.operators.errors.SnapshotVacuumedError, LookupError)
    assert issubclass(StateTypeError, TypeError)
    assert issubclass(dkvstream.storage.errors.ObjectNotFoundError, FileNotFoundError)


def test_retryable_is_true_for_transient_io_and_lost_races_only() -> None:
    retryable = {c.__name__ for m in MODULES for c in _classes(m) if c.retryable}
    assert retryable == {"KafkaIOError", "ManifestConflictError", "MetadataConflictError"}
    assert S3RequestError.retryable and not S3CredentialsError.retryable


@pytest.mark.parametrize("error", [
    BadInputError("partition p0 offset 7: column 'delay' is 'x', not a number; fix the input"),
    OperatorError("operator count on_event raised on the event with key b'k'\nZeroDivisionError: x"),
    StateTypeError("operator 'totals' state 'last': the value codec (int64) expects int, got str '1'"),
    ManifestConflictError("manifest 'm-1' exists"),
])
def test_an_error_and_its_line_round_trip_in_process(error) -> None:
    text = f"Traceback (most recent call last):\n  ...\nTaskError: x\n{encode(error)}\n SQLSTATE: 38000"
    rebuilt = task_error(RuntimeError(text))
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)
    assert rebuilt.retryable == error.retryable
    assert task_error(error) is error  # in process: the error itself


def test_an_instance_retryable_crosses_too() -> None:
    error = S3RequestError("S3 GetObject s3://b/k failed: HTTP 400 InvalidArgument")
    error.retryable = False
    assert task_error(RuntimeError(encode(error))).retryable is False


def test_only_the_projects_error_classes_are_rebuilt() -> None:
    assert error_class("dkvstream.operators.errors:BadInputError") is BadInputError
    unknown_topic = dkvstream.storage.log.errors.UnknownTopicError
    assert error_class("dkvstream.storage.log.errors:UnknownTopicError") is unknown_topic
    for name in ("builtins:ValueError", "os:system", "subprocess:Popen", "dkvstream.operators.errors:Job",
                 "dkvstream.operators.errors", "operators.no_such_module:X"):
        assert error_class(name) is None, name
    line = '{"type": "builtins:ValueError", "args": ["x"], "retryable": false}'
    assert task_error(RuntimeError(f"dkvstream-task-error/1 {line}")) is None
    # A newer format, or no line at all: not ours to read.
    assert task_error(RuntimeError(encode(BadInputError("x")).replace("/1 ", "/2 "))) is None
    assert task_error(RuntimeError("Traceback ...\nBadInputError: x")) is None


@pytest.mark.parametrize("error", [
    BadInputError("partition p0 offset 7: column 'delay' is 'x', not a number; fix the input"),
    OperatorError("operator count on_event raised on the event with key b'k' (partition p0, offset 3): "
                  "ZeroDivisionError: division by zero"),
    StateTypeError("operator 'totals' state 'last': the value codec (int64) expects int, got str '1'"),
])
def test_a_spark_tasks_error_reaches_the_driver_as_its_type(spark, error) -> None:
    def task(rows):  # nested: pickled by value, the workers cannot import this module
        raise error

    sc = spark.sparkContext
    with pytest.raises(Exception) as failed:
        sc.runJob(sc.parallelize([1], 1), carry_errors(task))
    assert not isinstance(failed.value, DkvstreamError)  # Spark's exception, with text only
    rebuilt = task_error(failed.value)
    assert isinstance(rebuilt, type(error)) and str(rebuilt) == str(error)
    assert rebuilt.__cause__ is failed.value  # the worker's traceback, for the logs
