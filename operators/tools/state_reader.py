"""Read a job's operator state at a retained checkpoint without running the job.

Like Spark's ``statestore`` data source: ``read_state`` returns one state id's entries
as a typed Arrow table (values decoded with the spec's codec), ``list_timers`` the
pending timers, ``checkpoint_entries`` the raw DKV entries, ``to_spark`` turns any of
them into a Spark DataFrame, and ``describe`` says what a job's checkpoints hold.
Command line::

    python -m dkvstream.operators.tools.state_reader --job MODULE:ATTRIBUTE [--store .dkvstream]
        (--list | --state-id ID | --timers | --verify) [--operator NAME] [--epoch N]
        [--from KEY] [--to KEY] [--hex] [--json] [--limit N]

``--list`` prints the retained epochs and, per operator, its key-group ranges (each
with its DKV manifest, which ``dkvstream.storage.dkv.dump`` reads) and its state ids with their
kind and codecs. ``--state-id`` prints one state id's entries, decoded with the job's
codecs; ``--timers`` the pending timers; both only of subject keys in ``[--from, --to)``
(UTF-8, or hex with ``--hex``), as a table (the first ``--limit`` rows, default 20) or,
with ``--json``, as JSON lines (all rows unless ``--limit``).
``--verify`` reads every file the checkpoint names (each range manifest, SSTable block
and WAL record, each staged output) and prints each damaged one.

The decoding lives here rather than in ``dkvstream.storage.dkv.dump``: the key layout and the
codecs are the operators' (``dkvstream.operators.api.state``), and ``storage`` never imports
``operators``; ``dkvstream.storage.dkv.dump`` prints the same entries as raw bytes.

Exit status: 0 done, 1 damage found by ``--verify``, 2 a usage mistake (no checkpoint
under ``--store``, an unknown job attribute, operator, state id or epoch), with a
one-line message.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from typing import TextIO

import pyarrow as pa

from dkvstream.operators import paths
from dkvstream.operators.api.columns import DOMAIN_COLUMN, KEY_GROUP_COLUMN
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.state import (
    ListSpec,
    MapSpec,
    decode_state_key,
    list_payload,
    state_specs,
)
from dkvstream.operators.api.state_schema import bound_value_codec, evolve
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, list_epochs, read_checkpoint
from dkvstream.operators.runtime.recovery import check_checkpoint
from dkvstream.operators.runtime.timers import SCHEMAS, decode_timer_key
from dkvstream.storage.cli import UsageError, parse_bytes, render_bytes, run_command
from dkvstream.storage.dkv import DKV
from dkvstream.storage.dkv.expiry import EXPIRY
from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

KeyRange = tuple[bytes, bytes | None]


def _no_checkpoint(store: ObjectStore, job_prefix: str) -> LookupError:
    return LookupError(f"no checkpoint found under {store.uri(paths.checkpoint_prefix(job_prefix))}"
                       f": check --store and the job's name")


def _checkpoint(store: ObjectStore, job_prefix: str, epoch: int | None) -> JobCheckpoint:
    """The checkpoint of ``epoch`` (None: the newest).

    Raises:
        LookupError: the job has no committed checkpoint under ``store`` ("no checkpoint
            found under ..."), or none of ``epoch`` (the message lists the retained ones).
    """
    if epoch is None:
        epochs = list_epochs(store, job_prefix)
        if not epochs:
            raise _no_checkpoint(store, job_prefix)
        epoch = epochs[-1]
    try:
        return read_checkpoint(store, job_prefix, epoch)
    except ObjectNotFoundError:
        epochs = list_epochs(store, job_prefix)
        if not epochs:
            raise _no_checkpoint(store, job_prefix) from None
        raise LookupError(f"epoch {epoch} is not retained under {store.uri(job_prefix)} "
                          f"(retained epochs: {', '.join(map(str, epochs))})") from None


def _in_range(subject_key: bytes, key_range: KeyRange | None) -> bool:
    return key_range is None or (key_range[0] <= subject_key
                                 and (key_range[1] is None or subject_key < key_range[1]))


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
        LookupError: the job has no committed checkpoint, or ``epoch`` is not retained.
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
               epoch: int | None = None, key_range: KeyRange | None = None) -> pa.Table:
    """One state id's entries at a checkpoint, decoded with its spec's codecs.

    Args:
        store: the job's object store.
        job: the job definition (its operators' specs give the codecs).
        state_id: the spec's state id (its attribute name by default).
        operator: operator name (None: the job's only operator).
        epoch: retained epoch (None: the newest).
        key_range: only subject keys in ``[start, end)`` (end None: no bound); None: all.

    Returns:
        Columns ``key_group`` (int32), ``subject_key`` (binary), ``state_id`` (string),
        ``map_key`` (MapSpec only, typed by the key codec) and ``value`` (typed by the
        value codec; a list for ListSpec); for a state with a TTL, ``expiry`` (int64, ms
        of its clock): an entry at or past it is invisible to the job, and stays in
        storage until a compaction rewrites it.

    Raises:
        KeyError: unknown operator or state id. LookupError: no checkpoint, or
            ``epoch`` is not retained.
        StateSchemaError: the spec's codecs cannot read the entries the checkpoint
            holds (``dkvstream.operators.api.state_schema``).
    """
    op = _operator(job, operator)
    specs = state_specs(op)
    if state_id not in specs:
        raise KeyError(f"operator {op.name} declares no state {state_id!r} (has {sorted(specs)})")
    spec = specs[state_id]
    is_map, is_list = isinstance(spec, MapSpec), isinstance(spec, ListSpec)
    # Entries of every schema version the checkpoint recorded, read in the declared fields.
    ckpt = _checkpoint(store, job.prefix, epoch)
    recorded = ckpt.state_schemas.get(op.name, {}).get(state_id)
    value_codec = bound_value_codec(spec, evolve(op.name, state_id, recorded, spec, ckpt.epoch))
    epoch = ckpt.epoch
    cols: dict[str, list] = {KEY_GROUP_COLUMN: [], "subject_key": [], "state_id": [], "map_key": [], "value": [],
                             "expiry": []}
    for _, _, k, v in checkpoint_entries(store, job.prefix, epoch, op.name):
        if k[2] != spec.schema:
            continue
        kg, subject_key, sid, map_key = decode_state_key(k)
        if sid != state_id or not _in_range(subject_key, key_range):
            continue
        if spec.ttl is not None:
            cols["expiry"].append(EXPIRY.unpack_from(v)[0])
            v = v[8:]
        cols[KEY_GROUP_COLUMN].append(kg)
        cols["subject_key"].append(subject_key)
        cols["state_id"].append(sid)
        if is_map:
            cols["map_key"].append(spec.key_codec.arrow_value(map_key))
        cols["value"].append([value_codec.arrow_value(e) for e in list_payload(v)] if is_list
                             else value_codec.arrow_value(v))
    value_type = pa.list_(value_codec.arrow_type) if is_list else value_codec.arrow_type
    fields = [pa.field(KEY_GROUP_COLUMN, pa.int32()), pa.field("subject_key", pa.binary()),
              pa.field("state_id", pa.string())]
    if is_map:
        fields.append(pa.field("map_key", spec.key_codec.arrow_type))
    else:
        del cols["map_key"]
    fields.append(pa.field("value", value_type))
    if spec.ttl is not None:
        fields.append(pa.field("expiry", pa.int64()))
    else:
        del cols["expiry"]
    return pa.table(cols, schema=pa.schema(fields))


def list_timers(store: ObjectStore, job: Job, operator: str | None = None, epoch: int | None = None,
                key_range: KeyRange | None = None) -> pa.Table:
    """Pending timers at a checkpoint, in (operator, range, key group, time) order.

    Args: as ``read_state``.

    Returns:
        Columns ``operator``, ``key_group`` (int32), ``timestamp`` (timestamp[ms, UTC]),
        ``subject_key`` (binary) and ``domain`` (string: ``event_time`` or
        ``processing_time``, the timer's ``TimeDomain``).
    """
    rows: dict[str, list] = {"operator": [], KEY_GROUP_COLUMN: [], "timestamp": [], "subject_key": [],
                             DOMAIN_COLUMN: []}
    domains = {schema: domain.value for domain, schema in SCHEMAS.items()}
    op_name = None if operator is None else _operator(job, operator).name
    for op, _, k, _ in checkpoint_entries(store, job.prefix, epoch, op_name):
        domain = domains.get(k[2])
        if domain is None:
            continue
        kg, ts, subject_key = decode_timer_key(k, k[2])
        if not _in_range(subject_key, key_range):
            continue
        for col, val in zip(rows, (op, kg, ts, subject_key, domain)):
            rows[col].append(val)
    return pa.table(rows, schema=pa.schema([
        pa.field("operator", pa.string()), pa.field(KEY_GROUP_COLUMN, pa.int32()),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC")), pa.field("subject_key", pa.binary()),
        pa.field(DOMAIN_COLUMN, pa.string())]))


def to_spark(spark, table: pa.Table):
    """An Arrow table from this module as a Spark DataFrame."""
    return spark.createDataFrame(table)


_TIMER_SCHEMAS = frozenset(SCHEMAS.values())


def is_timer(dkv_key: bytes) -> bool:
    """True if ``dkv_key`` is a timer entry (of either time domain)."""
    return len(dkv_key) > 2 and dkv_key[2] in _TIMER_SCHEMAS


def spec_kind(spec) -> str:
    """A state spec's kind and codecs, e.g. ``map<int64, record<...>>``."""
    if isinstance(spec, MapSpec):
        return f"map<{spec.key_codec.name}, {spec.value_codec.name}>"
    return f"{'list' if isinstance(spec, ListSpec) else 'value'}<{spec.codec.name}>"


def describe(store: ObjectStore, job: Job, epoch: int | None = None) -> dict:
    """What a job's checkpoints hold, for ``--list``.

    Returns:
        ``{"job", "checkpoints" (URI), "epochs" (retained, ascending), "epoch" (the one
        described), "operators": [{"name", "ranges": {key-group range label: URI of its DKV
        manifest at that epoch}, "states": {state id: kind and codecs, and the record
        schema versions the checkpoint holds when more than one}}]}``.

    Raises:
        LookupError: no checkpoint, or ``epoch`` is not retained.
    """
    ckpt = _checkpoint(store, job.prefix, epoch)
    return {"job": job.name, "checkpoints": store.uri(paths.checkpoint_prefix(job.prefix)),
            "epochs": list_epochs(store, job.prefix), "epoch": ckpt.epoch,
            "operators": [{"name": op.name,
                           "ranges": {label: store.uri(key) for label, key in
                                      sorted(ckpt.operators.get(op.name, {}).items())},
                           "states": {sid: spec_kind(spec) + _versions(ckpt, op.name, sid)
                                      for sid, spec in sorted(state_specs(op).items())}}
                          for op in job.operators]}


def _versions(ckpt: JobCheckpoint, operator: str, state_id: str) -> str:
    """`` (schema versions 0..N)`` when the checkpoint records more than one version of
    the state's record fields (``dkvstream.operators.api.state_schema``), else ``""``."""
    versions = ckpt.state_schemas.get(operator, {}).get(state_id, {}).get("versions", [])
    return f" (schema versions 0..{len(versions) - 1})" if len(versions) > 1 else ""


def verify(store: ObjectStore, job: Job, epoch: int | None = None) -> tuple[int, list[str]]:
    """Reads every file a checkpoint names, as the Dagster asset check does.

    Returns:
        ``(epoch, errors)``: one error per missing or corrupt file, naming its URI.

    Raises:
        LookupError: no checkpoint, or ``epoch`` is not retained.
    """
    epoch = _checkpoint(store, job.prefix, epoch).epoch
    return epoch, check_checkpoint(store, job.prefix, epoch, "full")[1]


def load_job(spec: str) -> Job:
    """``module:attribute`` naming a Job or a function returning one.

    Raises:
        UsageError: (a ``ValueError``) ``spec`` is not ``module:attribute``, the module
            cannot be imported, it has no such attribute, the attribute is a function that
            needs arguments, or not a Job (the message says which).
    """
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise UsageError(f"--job {spec!r}: give module:attribute, e.g. dkvstream.examples.flights:flights_job")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"--job {spec!r}: cannot import {module!r} ({e})") from e
    if not hasattr(mod, attr):
        jobs = sorted(n for n, v in vars(mod).items() if isinstance(v, Job)
                      or ("job" in n.lower() and callable(v) and not isinstance(v, type)))
        raise UsageError(f"--job {spec!r}: module {module!r} has no attribute {attr!r} (jobs: {jobs})")
    obj = getattr(mod, attr)
    if callable(obj) and not isinstance(obj, Job):
        required = _required_parameters(obj)
        if required:
            raise UsageError(f"--job {spec!r} takes arguments {required}: name a Job, or a function "
                             f"returning one that needs none")
        obj = obj()
    job = obj
    if not isinstance(job, Job):
        raise UsageError(f"--job {spec!r} is a {type(job).__name__}, not a Job or a function returning one")
    return job


def _required_parameters(fn) -> list[str]:
    """Names of ``fn``'s parameters without a default ([] when Python cannot tell)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _json_value(value):
    """JSON for what ``to_pylist`` gives: bytes as text, timestamps as ms."""
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _rows_json(table: pa.Table, hex: bool, out: TextIO) -> None:
    binary = [f.name for f in table.schema if pa.types.is_binary(f.type)]
    for row in table.to_pylist():
        for name in binary:
            row[name] = render_bytes(row[name], hex)
        out.write(json.dumps(row, default=_json_value) + "\n")


def _print_listing(d: dict, out: TextIO) -> None:
    w = out.write
    w(f"job {d['job']}: checkpoints under {d['checkpoints']}\n")
    w(f"retained epochs: {', '.join(map(str, d['epochs']))} (described: {d['epoch']})\n")
    for op in d["operators"]:
        w(f"operator {op['name']}: {len(op['ranges'])} key-group ranges\n")
        for label, manifest in op["ranges"].items():
            w(f"  range {label}: {manifest}\n")
        for sid, kind in op["states"].items():
            w(f"  state {sid}: {kind}\n")
        w("  timers (--timers)\n")


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI (see module docstring); returns the exit status."""
    from dkvstream.storage.objectstore import open_existing_store

    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.state_reader",
                                description="Read a job's operator state at a retained checkpoint.")
    p.add_argument("--store", default=".dkvstream", help="object-store root (default .dkvstream)")
    p.add_argument("--job", required=True, help="module:attribute of a Job or a function returning one")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="retained epochs, operators, state ids")
    what.add_argument("--state-id", help="print this state id's entries")
    what.add_argument("--timers", action="store_true", help="print pending timers")
    what.add_argument("--verify", action="store_true", help="read every file of the checkpoint")
    p.add_argument("--operator", help="operator name (default: the job's only operator)")
    p.add_argument("--epoch", type=int, help="retained epoch (default: the newest)")
    p.add_argument("--from", dest="start", help="first subject key (inclusive)")
    p.add_argument("--to", dest="end", help="end subject key (exclusive)")
    p.add_argument("--hex", action="store_true", help="--from/--to and --json bytes as hex")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--limit", type=int, help="rows to print (default 20; with --json all)")
    a = p.parse_args(argv)

    def command() -> int:
        job = load_job(a.job)
        try:
            store = open_existing_store(a.store)
        except FileNotFoundError:
            raise LookupError(f"no checkpoint found under {a.store}: no such directory (check --store)") from None
        key_range = None
        if a.start is not None or a.end is not None:
            key_range = (b"" if a.start is None else parse_bytes(a.start, a.hex),
                         None if a.end is None else parse_bytes(a.end, a.hex))
        if a.list:
            listing = describe(store, job, a.epoch)
            if a.json:
                out.write(json.dumps(listing) + "\n")
            else:
                _print_listing(listing, out)
            return 0
        if a.verify:
            epoch, errors = verify(store, job, a.epoch)
            for e in errors:
                out.write(f"FAILED: {e}\n")
            out.write(f"epoch {epoch}: {'ok' if not errors else f'{len(errors)} damaged files'}\n")
            return 1 if errors else 0
        if a.timers:
            table = list_timers(store, job, a.operator, a.epoch, key_range)
        else:
            table = read_state(store, job, a.state_id, a.operator, a.epoch, key_range)
        if a.json:
            _rows_json(table if a.limit is None else table.slice(0, a.limit), a.hex, out)
        else:
            out.write(f"{table.num_rows:,} rows\n")
            out.write(table.slice(0, 20 if a.limit is None else a.limit).to_pandas().to_string(index=False) + "\n")
        return 0

    # KeyError (an unknown operator or state id) is a LookupError.
    return run_command(command, (ValueError, LookupError))

if __name__ == "__main__":
    sys.exit(main())
