"""Write a new job's initial state from tables (``dkvstream.operators.runtime.bootstrap``).

Command line::

    python -m dkvstream.operators.tools.bootstrap --job MODULE:ATTRIBUTE [--store .dkvstream]
        --state OPERATOR.STATE_ID=PATH [--state ...] [--timers OPERATOR=PATH ...]
        [--epoch 1] [--parallelism P] [--ttl-from-ms MS] [--master SPARK_MASTER] [--json]

Each ``PATH`` is a Parquet file or directory, or a Delta table, of the shape the state's
kind takes (docs/bootstrap.md). In this process by default; with ``--master`` the tables
are read and each key-group range written by Spark tasks. Prints each range written
(entries, SSTables, bytes) and the checkpoint; the job's next run starts from it.

Exit status: 0 done, 2 a usage mistake or a table refused (the job has a checkpoint, an
unknown operator or state id, a missing or mistyped column, a repeated key), with a
one-line message naming the table, column and row.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TextIO

from dkvstream.operators.errors import InvalidJobError
from dkvstream.operators.runtime.bootstrap import BootstrapResult, bootstrap
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import UsageError, run_command


def _pairs(values: list[str], flag: str, dotted: bool) -> dict:
    """``--state op.state=path`` (``dotted``) or ``--timers op=path`` arguments as
    ``{op: {state: path}}`` or ``{op: path}``."""
    out: dict = {}
    for value in values:
        name, eq, path = value.partition("=")
        op, dot, state = name.partition(".")
        if not eq or not path or not op or (dotted and (not dot or not state)):
            shape = "OPERATOR.STATE_ID=PATH" if dotted else "OPERATOR=PATH"
            raise UsageError(f"{flag} {value!r}: give {shape}")
        if dotted:
            out.setdefault(op, {})[state] = path
        else:
            out[op] = path
    return out


def print_result(result: BootstrapResult, as_json: bool, out: TextIO) -> None:
    """Each range written and the totals, as lines or one JSON object."""
    if as_json:
        out.write(json.dumps({"job": result.job, "epoch": result.epoch, "checkpoint": result.checkpoint_uri,
                              "entries": result.entries, "tables": result.tables,
                              "table_bytes": result.table_bytes,
                              "ranges": [dataclasses.asdict(r) for r in result.ranges]}) + "\n")
        return
    for r in result.ranges:
        out.write(f"{r.operator} {r.range_label}: {r.entries:,} entries, {r.tables} SSTables, "
                  f"{r.table_bytes:,} bytes\n")
    out.write(f"job {result.job}: {len(result.ranges)} ranges, {result.entries:,} entries, {result.tables} "
              f"SSTables, {result.table_bytes:,} bytes; checkpoint of epoch {result.epoch}: "
              f"{result.checkpoint_uri}\n")


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI (module docstring); returns the exit status."""
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.bootstrap",
                                description="Write a new job's initial state from Parquet or Delta tables.")
    p.add_argument("--store", default=".dkvstream", help="object-store root (default .dkvstream)")
    p.add_argument("--job", required=True, help="module:attribute of a Job or a function returning one")
    p.add_argument("--state", action="append", default=[], metavar="OPERATOR.STATE_ID=PATH",
                   help="a state's table (repeatable)")
    p.add_argument("--timers", action="append", default=[], metavar="OPERATOR=PATH",
                   help="an operator's timers: key, timestamp (ms) and optionally domain (repeatable)")
    p.add_argument("--epoch", type=int, default=1, help="the checkpoint's epoch (default 1; the run goes on from it)")
    p.add_argument("--parallelism", type=int, help="key-group ranges per operator (default: the job's)")
    p.add_argument("--ttl-from-ms", type=int,
                   help="for TTL'd states without an expiry column: the time (ms) their TTL counts from")
    p.add_argument("--master", help="write with Spark tasks on this master, e.g. local[2] (default: in process)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    a = p.parse_args(argv)

    def command() -> int:
        states = _pairs(a.state, "--state", dotted=True)
        timers = _pairs(a.timers, "--timers", dotted=False)
        if not states and not timers:
            raise UsageError("give at least one --state OPERATOR.STATE_ID=PATH (or --timers OPERATOR=PATH)")
        job = load_job(a.job)
        if a.parallelism is not None:
            job = dataclasses.replace(job, parallelism=a.parallelism)
        spark = None
        if a.master:
            from dkvstream.operators.spark.session import get_spark

            spark = get_spark({"spark.master": a.master})
        result = bootstrap(a.store, job, states, timers=timers, epoch=a.epoch, spark=spark,
                           ttl_from_ms=a.ttl_from_ms)
        print_result(result, a.json, out)
        return 0

    # BootstrapError (a refused table) and InvalidJobError are ValueErrors: usage mistakes.
    return run_command(command, (ValueError, InvalidJobError))


if __name__ == "__main__":
    sys.exit(main())
