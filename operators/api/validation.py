"""Fail-fast checks of a job definition, run by ``Job.validate`` at construction.

Every check here runs before the runtime plans an epoch, starts a Spark stage or
writes to the object store, so a misconfigured job fails with one clear
``InvalidJobError`` instead of a task error deep inside an epoch (or, worse, a job
that runs and silently misbehaves: a negative out-of-orderness bound moves the
watermark *ahead* of the events and makes them late).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from operators.api import codecs as codecs_module
from operators.api.codecs import Codec
from operators.api.keygroups import MAX_KEY_GROUPS
from operators.api.operator import Operator
from operators.api.state import ListSpec, MapSpec, ValueSpec, state_specs
from operators.errors import InvalidJobError
from operators.io.sinks import Sink
from operators.io.sources import Source

if TYPE_CHECKING:
    from operators.api.job import Job



def known_codecs() -> list[str]:
    """Names of the codec classes in ``operators.api.codecs`` (for error messages)."""
    return sorted(n for n, v in vars(codecs_module).items()
                  if isinstance(v, type) and issubclass(v, Codec) and v is not Codec)


def _check_int(job: Job, field: str, value, low: int, high: int | None = None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"job {job.name}: {field} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidJobError(f"job {job.name}: {field}={value} must be {bound}{why}")


def _check_codec(job: Job, where: str, codec) -> None:
    if isinstance(codec, Codec):
        return
    if isinstance(codec, type) and issubclass(codec, Codec):
        raise InvalidJobError(f"job {job.name}: {where} is the class {codec.__name__}, not an instance; "
                              f"write {codec.__name__}(...)")
    name = codec if isinstance(codec, str) else type(codec).__name__
    raise InvalidJobError(f"job {job.name}: {where}: unknown codec {name!r} (not a Codec); "
                          f"known codecs: {', '.join(known_codecs())}")


def check_operator(job: Job, op) -> None:
    """Checks one operator: its type, declared outputs and every state spec's codecs.

    Raises:
        InvalidJobError: naming the operator and the bad field.
    """
    if not isinstance(op, Operator) and not hasattr(op, "on_batch"):
        raise InvalidJobError(f"job {job.name}: {op!r} is not an Operator")
    for out, schema in op.outputs.items():
        if not isinstance(schema, pa.Schema):
            raise InvalidJobError(f"job {job.name}: operator {op.name} output {out!r} schema is "
                                  f"{type(schema).__name__}, not a pyarrow.Schema")
    for state_id, spec in state_specs(op).items():
        where = f"operator {op.name} state {state_id!r}"
        if isinstance(spec, MapSpec):
            _check_codec(job, f"{where} key codec", spec.key_codec)
            _check_codec(job, f"{where} value codec", spec.value_codec)
        elif isinstance(spec, (ValueSpec, ListSpec)):
            _check_codec(job, f"{where} codec", spec.codec)


def check_job(job: Job) -> None:
    """Checks the numeric settings, source, sinks, operators and dead-letter settings.

    Raises:
        InvalidJobError: naming the job and the first bad field (a ``ValueError``).
    """
    _check_int(job, "key_groups", job.key_groups, 1, MAX_KEY_GROUPS)
    _check_int(job, "parallelism", job.parallelism, 1, job.key_groups,
               " (at most key_groups: a task owns at least one key group)")
    _check_int(job, "events_per_epoch", job.events_per_epoch, 1)
    _check_int(job, "max_out_of_orderness_ms", job.max_out_of_orderness_ms, 0,
               why=" (a negative bound would put the watermark ahead of the events)")
    if not isinstance(job.source, Source):
        raise InvalidJobError(f"job {job.name}: source {job.source!r} is not a Source")
    for name, sink in job.sinks.items():
        if not isinstance(sink, Sink):
            raise InvalidJobError(f"job {job.name}: sink {name!r} is {sink!r}, not a Sink")
    for op in job.operators:
        check_operator(job, op)
    dl = job.dead_letter
    if dl.max_future_ms is not None:
        _check_int(job, "dead_letter.max_future_ms", dl.max_future_ms, 0)
    if dl.tolerance not in ("all", "none"):
        raise InvalidJobError(f"job {job.name}: dead_letter.tolerance must be 'all' or 'none', "
                              f"got {dl.tolerance!r}")
    if dl.sink.name in {s.name for s in job.sinks.values()}:
        raise InvalidJobError(f"job {job.name}: dead-letter table {dl.sink.name!r} collides with a sink")
