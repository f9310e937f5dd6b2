"""Read a job's operator state at a retained checkpoint without running the job.

Like Spark's ``statestore`` data source: ``read_state`` returns one state id's entries
as a typed Arrow table (values decoded with the spec's codec), ``list_timers`` the
pending timers, ``checkpoint_entries`` the raw DKV entries, and ``to_spark`` turns any of
them into a Spark DataFrame. Command line::

    python -m operators.tools.state_reader --store .dkvstream \\
        --job examples.flights:flights_job --state-id windows [--epoch N] [--timers]
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator

import pyarrow as pa

from operators import paths
from operators.api.job import Job
from operators.api.state import (
    SCHEMA_STATE,
    SCHEMA_TIMER,
    ListSpec,
    MapSpec,
    decode_state_key,
    list_payload,
    state_specs,
)
from operators.runtime.checkpoints import JobCheckpoint, latest_checkpoint, read_checkpoint
from operators.runtime.timers import decode_timer_key
from storage.dkv import DKV
from storage.objectstore import ObjectStore


def _checkpoint(store: ObjectStore, job_prefix: str, epoch: int | None) -> JobCheckpoint:
    ckpt = latest_checkpoint(store, job_prefix) if epoch is None else read_checkpoint(store, job_prefix, epoch)
    if ckpt is None:
        raise LookupError(f"{store.uri(job_prefix)}: no committed checkpoint")
    return ckpt


def checkpoint_entries(store: ObjectStore, job_prefix: str, epoch: int | None = None,
                       operator: str | None = None) -> Iterator[tuple[str, str, bytes, bytes]]:
    """Every live DKV entry of a checkpoint, in (operator, range, key) order.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        epoch: committed, retained epoch to read (None: the newest).
        operator: only this operator (None: all).

    Yields:
        ``(operator name, range label, dkv key, value)``.

    Raises:
        LookupError: the job has no committed checkpoint.
        ObjectNotFoundError: ``epoch`` is not retained.
    """
    ckpt = _checkpoint(store, job_prefix, epoch)
    for op_name in sorted(ckpt.operators):
        if operator is not None and op_name != operator:
            continue
        for label, manifest_key in sorted(ckpt.operators[op_name].items()):
            db = DKV.open(store, paths.state_prefix(job_prefix, op_name, label, ckpt.layout), manifest_key)
            try:
                yield from ((op_name, label, k, v) for k, v in db.scan_range(b"", None))
            finally:
                db.close()


def _operator(job: Job, name: str | None):
    if name is None:
        if len(job.operators) != 1:
            raise ValueError(f"job {job.name} has operators {[o.name for o in job.operators]}: name one")
        return job.operators[0]
    for op in job.operators:
        if op.name == name:
            return op
    raise KeyError(f"job {job.name} has no operator {name!r}")


def read_state(store: ObjectStore, job: Job, state_id: str, operator: str | None = None,
               epoch: int | None = None) -> pa.Table:
    """One state id's entries at a checkpoint, decoded with its spec's codecs.

    Args:
        store: the job's object store.
        job: the job definition (its operators' specs give the codecs).
        state_id: the spec's state id (its attribute name by default).
        operator: operator name (None: the job's only operator).
        epoch: retained epoch (None: the newest).

    Returns:
        Columns ``key_group`` (int32), ``subject_key`` (binary), ``state_id`` (string),
        ``map_key`` (MapSpec only, typed by the key codec) and ``value`` (typed by the
        value codec; a list for ListSpec).

    Raises:
        KeyError: unknown operator or state id. LookupError: no checkpoint.
    """
    op = _operator(job, operator)
    specs = state_specs(op)
    if state_id not in specs:
        raise KeyError(f"operator {op.name} declares no state {state_id!r} (has {sorted(specs)})")
    spec = specs[state_id]
    is_map, is_list = isinstance(spec, MapSpec), isinstance(spec, ListSpec)
    value_codec = spec.value_codec if is_map else spec.codec
    cols: dict[str, list] = {"key_group": [], "subject_key": [], "state_id": [], "map_key": [], "value": []}
    for _, _, k, v in checkpoint_entries(store, job.prefix, epoch, op.name):
        if k[2] != SCHEMA_STATE:
            continue
        kg, subject_key, sid, map_key = decode_state_key(k)
        if sid != state_id:
            continue
        cols["key_group"].append(kg)
        cols["subject_key"].append(subject_key)
        cols["state_id"].append(sid)
        if is_map:
            cols["map_key"].append(spec.key_codec.arrow_value(map_key))
        cols["value"].append([value_codec.arrow_value(e) for e in list_payload(v)] if is_list
                             else value_codec.arrow_value(v))
    value_type = pa.list_(value_codec.arrow_type) if is_list else value_codec.arrow_type
    fields = [pa.field("key_group", pa.int32()), pa.field("subject_key", pa.binary()),
              pa.field("state_id", pa.string())]
    if is_map:
        fields.append(pa.field("map_key", spec.key_codec.arrow_type))
    else:
        del cols["map_key"]
    fields.append(pa.field("value", value_type))
    return pa.table(cols, schema=pa.schema(fields))


def list_timers(store: ObjectStore, job: Job, operator: str | None = None, epoch: int | None = None) -> pa.Table:
    """Pending timers at a checkpoint, in (operator, range, key group, time) order.

    Returns:
        Columns ``operator``, ``key_group`` (int32), ``timestamp`` (timestamp[ms, UTC])
        and ``subject_key`` (binary).
    """
    rows: dict[str, list] = {"operator": [], "key_group": [], "timestamp": [], "subject_key": []}
    op_name = None if operator is None else _operator(job, operator).name
    for op, _, k, _ in checkpoint_entries(store, job.prefix, epoch, op_name):
        if k[2] != SCHEMA_TIMER:
            continue
        kg, ts, subject_key = decode_timer_key(k)
        for col, val in zip(rows, (op, kg, ts, subject_key)):
            rows[col].append(val)
    return pa.table(rows, schema=pa.schema([
        pa.field("operator", pa.string()), pa.field("key_group", pa.int32()),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC")), pa.field("subject_key", pa.binary())]))


def to_spark(spark, table: pa.Table):
    """An Arrow table from this module as a Spark DataFrame."""
    return spark.createDataFrame(table)


def is_timer(dkv_key: bytes) -> bool:
    """True if ``dkv_key`` is a timer entry."""
    return len(dkv_key) > 2 and dkv_key[2] == SCHEMA_TIMER


def load_job(spec: str) -> Job:
    """``module:attribute`` naming a Job or a function returning one."""
    module, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    return obj() if callable(obj) and not isinstance(obj, Job) else obj


def main(argv: list[str] | None = None) -> int:
    """Print state or timers of a job checkpoint (see module docstring)."""
    from storage.objectstore import open_object_store

    p = argparse.ArgumentParser(prog="python -m operators.tools.state_reader", description="Read operator state.")
    p.add_argument("--store", default=".dkvstream")
    p.add_argument("--job", required=True, help="module:attribute of a Job or a function returning one")
    p.add_argument("--operator")
    p.add_argument("--state-id")
    p.add_argument("--epoch", type=int)
    p.add_argument("--timers", action="store_true", help="list pending timers instead of state")
    p.add_argument("--limit", type=int, default=20)
    a = p.parse_args(argv)
    store, job = open_object_store(a.store), load_job(a.job)
    if a.timers:
        table = list_timers(store, job, a.operator, a.epoch)
    elif a.state_id:
        table = read_state(store, job, a.state_id, a.operator, a.epoch)
    else:
        p.error("give --state-id or --timers")
    print(f"{table.num_rows:,} rows")
    print(table.slice(0, a.limit).to_pandas().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
