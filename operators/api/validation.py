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

from dkvstream.operators.api import codecs as codecs_module
from dkvstream.operators.api.batch import BatchOperator
from dkvstream.operators.api.codecs import Codec
from dkvstream.operators.api.keygroups import MAX_KEY_GROUPS
from dkvstream.operators.api.operator import MAIN_OUTPUT, Operator
from dkvstream.operators.api.state import ListSpec, MapSpec, ValueSpec, state_specs
from dkvstream.operators.errors import InvalidJobError
from dkvstream.operators.io.sinks import ParquetSink, Sink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.paths import LAYOUTS

if TYPE_CHECKING:
    from dkvstream.operators.api.job import Job



def known_codecs() -> list[str]:
    """Names of the codec classes in ``dkvstream.operators.api.codecs`` (for error messages)."""
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
    # By type, not by its methods: the runtime picks the per-event or the vectorised
    # form by class (``BatchOperator`` is an ``Operator``), and reads name/outputs/state.
    if isinstance(op, type) and issubclass(op, Operator):
        raise InvalidJobError(f"job {job.name}: operator {op.__name__} is a class, not an "
                              f"instance; write {op.__name__}()")
    if not isinstance(op, (Operator, BatchOperator)):
        raise InvalidJobError(
            f"job {job.name}: {op!r} is not an Operator; subclass dkvstream.Operator "
            f"(on_event per event) or dkvstream.BatchOperator (on_batch per epoch)")
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


def _check_name(job: Job) -> None:
    if not isinstance(job.name, str) or not job.name or "/" in job.name:
        raise InvalidJobError(f"job name {job.name!r} is not usable: its files live under "
                              f"jobs/<name>/, so give a non-empty string without '/'")


def check_structure(job: Job) -> None:
    """Checks how operators and sinks connect: at least one operator, each an
    ``Operator``, unique names, intermediate operators emitting only to ``"main"``, and
    exactly one sink per output of the last operator.

    Raises:
        InvalidJobError: naming the job, the operator or output, and what to do.
    """
    if not isinstance(job.operators, (list, tuple)):
        raise InvalidJobError(f"job {job.name}: operators must be a list of operators, got "
                              f"{job.operators!r}; write operators=[...]")
    if not job.operators:
        raise InvalidJobError(f"job {job.name}: needs at least one operator; pass "
                              f"operators=[MyOperator()]")
    for op in job.operators:
        check_operator(job, op)
    names = [op.name for op in job.operators]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidJobError(f"job {job.name}: operator names must be unique (checkpoints "
                              f"keep state by name), {twice} appear more than once in {names}; "
                              f"give each operator its own name")
    for op in job.operators[:-1]:
        if set(op.outputs) != {MAIN_OUTPUT}:
            raise InvalidJobError(
                f"job {job.name}: intermediate operator {op.name} may only declare the "
                f"'{MAIN_OUTPUT}' output (it feeds the next operator), got {sorted(op.outputs)}; "
                f"declare other outputs on the last operator")
    if not isinstance(job.sinks, dict):
        raise InvalidJobError(f"job {job.name}: sinks must be a dict of output name -> Sink, got "
                              f"{job.sinks!r}")
    last = job.operators[-1]
    missing = sorted(set(last.outputs) - set(job.sinks))
    if missing:
        raise InvalidJobError(f"job {job.name}: outputs {missing} of {last.name} have no sink; "
                              f"add them to sinks, e.g. sinks={{{missing[0]!r}: ParquetSink(...)}}")
    extra = sorted(set(job.sinks) - set(last.outputs))
    if extra:
        raise InvalidJobError(f"job {job.name}: sinks {extra} name no output of {last.name} "
                              f"(its outputs: {sorted(last.outputs)}); remove them or declare "
                              f"the output in {type(last).__name__}.outputs")
    for output, sink in job.sinks.items():
        if isinstance(sink, ParquetSink) and isinstance(last.outputs.get(output), pa.Schema):
            try:  # an ``epoch`` column: refused here, not in the first epoch's tasks
                sink.check_columns(last.outputs[output].names)
            except ValueError as e:
                raise InvalidJobError(f"job {job.name}: output {output!r} of {last.name}: {e}") from None


def check_job(job: Job) -> None:
    """Checks the name, the numeric settings, source, sinks, operators (how they connect
    and each one's state) and dead-letter settings.

    Raises:
        InvalidJobError: naming the job and the first bad field (a ``ValueError``).
    """
    _check_name(job)
    _check_int(job, "key_groups", job.key_groups, 1, MAX_KEY_GROUPS)
    _check_int(job, "parallelism", job.parallelism, 1, job.key_groups,
               " (at most key_groups: a task owns at least one key group)")
    _check_int(job, "events_per_epoch", job.events_per_epoch, 1)
    _check_int(job, "max_out_of_orderness_ms", job.max_out_of_orderness_ms, 0,
               why=" (a negative bound would put the watermark ahead of the events)")
    _check_int(job, "trigger_interval_ms", job.trigger_interval_ms, 0)
    if job.idle_timeout_ms is not None:
        _check_int(job, "idle_timeout_ms", job.idle_timeout_ms, 1)
    if job.quiet_timeout_ms is not None:
        _check_int(job, "quiet_timeout_ms", job.quiet_timeout_ms, 1)
    if job.max_watermark_drift_ms is not None:
        _check_int(job, "max_watermark_drift_ms", job.max_watermark_drift_ms, 0)
    if job.on_operator_error not in ("fail", "dead_letter"):
        raise InvalidJobError(f"job {job.name}: on_operator_error must be 'fail' or 'dead_letter', "
                              f"got {job.on_operator_error!r}")
    if not isinstance(job.source, Source):
        raise InvalidJobError(f"job {job.name}: source {job.source!r} is not a Source")
    check_structure(job)
    names = {op.name for op in job.operators}
    for name, parallelism in job.operator_parallelism.items():
        if name not in names:
            raise InvalidJobError(f"job {job.name}: operator_parallelism names {name!r}, which is not an "
                                  f"operator of the job (operators: {sorted(names)})")
        _check_int(job, f"operator_parallelism[{name!r}]", parallelism, 1, job.key_groups,
                   " (at most key_groups: a task owns at least one key group)")
    if job.key_layout not in LAYOUTS:
        raise InvalidJobError(f"job {job.name}: key_layout must be one of {sorted(LAYOUTS)}, "
                              f"got {job.key_layout!r}")
    for name, sink in job.sinks.items():
        if not isinstance(sink, Sink):
            raise InvalidJobError(f"job {job.name}: sink {name!r} is {sink!r}, not a Sink")
    dl = job.dead_letter
    if dl.max_future_ms is not None:
        _check_int(job, "dead_letter.max_future_ms", dl.max_future_ms, 0)
    if dl.tolerance not in ("all", "none"):
        raise InvalidJobError(f"job {job.name}: dead_letter.tolerance must be 'all' or 'none', "
                              f"got {dl.tolerance!r}")
    if dl.max_ratio is not None and not (isinstance(dl.max_ratio, (int, float)) and not isinstance(dl.max_ratio, bool)
                                         and 0 <= dl.max_ratio <= 1):
        raise InvalidJobError(f"job {job.name}: dead_letter.max_ratio must be a share from 0 to 1 or None, "
                              f"got {dl.max_ratio!r}")
    _check_int(job, "dead_letter.min_records", dl.min_records, 0)
    if dl.sink.name in {s.name for s in job.sinks.values()}:
        raise InvalidJobError(f"job {job.name}: dead-letter table {dl.sink.name!r} collides with a sink")
