"""How a task's ``DkvstreamError`` crosses Spark to the driver with its type.

A Python task's exception reaches the driver as ``pyspark.errors.PythonException``
whose only content is the worker's traceback text (Spark's own error classes,
``getCondition()``, say "PYTHON_EXCEPTION", nothing of ours). So a task body wrapped in
``carry_errors`` turns a ``DkvstreamError`` it raises into a ``TaskError`` whose message
ends with one line of a versioned format::

    dkvstream-task-error/1 {"type": "dkvstream.operators.errors:BadInputError", "args": ["..."], "retryable": false}

(JSON on one line: a message's newlines are escaped.) The traceback Spark sends carries
the line, and ``task_error`` on the driver reads the last such line of the failure's text
and rebuilds the error: the class is looked up by ``module:qualname`` among the
subclasses of ``DkvstreamError`` (never ``eval``, never an arbitrary import), built from
its ``args``, with ``retryable`` as the task saw it. An unknown type, a newer format
version or no line at all gives None: the driver then reports the failure as text.

The task's original traceback stays in the text (``TaskError`` is raised ``from`` it),
for Spark's UI and logs. Errors of other types are not wrapped: they are bugs, and
their traceback is what to read.
"""
from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Callable, Iterator

from dkvstream.storage.errors import DkvstreamError

FORMAT = "dkvstream-task-error"
VERSION = 1
_LINE = re.compile(rf"^{FORMAT}/(\d+) (\{{.*\}})\s*$", re.MULTILINE)
# Modules a type name may come from (imported if not yet, so the driver knows every class
# a task may send); anything else is not ours.
_PACKAGES = ("operators.", "storage.")


class TaskError(Exception):
    """Raised in a Spark task in place of a ``DkvstreamError`` (module docstring): its
    message is the error's ``Type: message`` and the line ``task_error`` reads."""


def encode(e: DkvstreamError) -> str:
    """The ``dkvstream-task-error/1 {...}`` line for ``e`` (module docstring). Arguments
    that are not JSON values are sent as ``str(e)``."""
    args = list(e.args)
    try:
        json.dumps(args)
    except (TypeError, ValueError):
        args = [str(e)]
    payload = {"type": f"{type(e).__module__}:{type(e).__qualname__}", "args": args, "retryable": e.retryable}
    return f"{FORMAT}/{VERSION} {json.dumps(payload, separators=(', ', ': '))}"


def carry_errors(task: Callable[..., Iterator]) -> Callable[..., Iterator]:
    """Wraps a task body (a function returning an iterator, as Spark's
    ``mapPartitions`` and ``runJob`` take) so a ``DkvstreamError`` it raises, while
    called or iterated, is raised as a ``TaskError`` (module docstring)."""

    @functools.wraps(task)
    def body(*args, **kwargs) -> Iterator:
        try:
            yield from task(*args, **kwargs)
        except DkvstreamError as e:
            raise TaskError(f"{type(e).__name__}: {e}\n{encode(e)}") from e

    return body


def task_error(failure: BaseException) -> DkvstreamError | None:
    """The ``DkvstreamError`` a task raised, rebuilt from a Spark job's failure.

    Args:
        failure: what the driver's Spark call raised (``PythonException``,
            ``Py4JJavaError``...) or the error itself when the task ran in this process.

    Returns:
        ``failure`` itself when it is a ``DkvstreamError``; else the error of the last
        ``dkvstream-task-error`` line in its text, with its type, ``args`` and
        ``retryable``, and ``failure`` (whose text holds the task's traceback) as its
        ``__cause__``; None when there is none, or its version or type is unknown.
    """
    if isinstance(failure, DkvstreamError):
        return failure
    found = _LINE.findall(str(failure))
    if not found:
        return None
    version, payload = found[-1]
    if int(version) != VERSION:
        return None
    try:
        data = json.loads(payload)
        cls = error_class(data["type"])
        if cls is None:
            return None
        error = cls(*data["args"])
    except (ValueError, KeyError, TypeError):
        return None
    if data.get("retryable") is not None and data["retryable"] != cls.retryable:
        error.retryable = bool(data["retryable"])
    error.__cause__ = failure
    return error


def error_class(name: str) -> type[DkvstreamError] | None:
    """The subclass of ``DkvstreamError`` named ``module:qualname``; None if no such
    class of ours exists."""
    module, sep, qualname = name.partition(":")
    if not sep:
        return None
    if module.startswith(_PACKAGES):
        try:
            importlib.import_module(module)
        except ImportError:
            return None
    for cls in _subclasses(DkvstreamError):
        if cls.__module__ == module and cls.__qualname__ == qualname:
            return cls
    return None


def _subclasses(cls: type) -> Iterator[type]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _subclasses(sub)
