"""Erase a key from a job (a GDPR request): request, apply, report, scan.

Usage::

    python -m dkvstream.operators.tools.erase request --store S --job JOB --key K [--reason R]
    python -m dkvstream.operators.tools.erase apply   --store S --job JOB
    python -m dkvstream.operators.tools.erase status  --store S --job JOB --id ID --key K [--key-column C]
                                                       [--scan-prefix P | --no-scan]
    python -m dkvstream.operators.tools.erase scan    --store S --key K [--prefix P]

``JOB`` is ``module:attribute`` of the Job (its sinks are then erased too) or the job's
name. ``request`` writes the request a running job serves at its next epoch and prints
its id; ``apply`` serves the pending requests of a stopped (or finished) job with an
epoch of its own; ``status`` prints the report as JSON, finishing an applied erasure
first (sinks, savepoints, the scan); ``scan`` lists the objects still holding the key.
Keys are UTF-8 text, or hex digits with ``--hex``.

Exit status: 0 done (``scan``/``status``: nothing holds the key, or the request is still
pending for ``status``), 1 something still holds the key or the job failed, 2 a usage
mistake. Everything is in ``dkvstream.operators.runtime.erasure``; docs/erasure.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from dkvstream.operators import paths
from dkvstream.operators.runtime import erasure
from dkvstream.operators.runtime.erasure_scan import scan_store
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import parse_bytes, run_command


def _job(spec: str) -> tuple[str, dict]:
    """``(job prefix, sinks)`` of ``--job``: a Job's ``module:attribute`` (its sinks and
    dead-letter table) or a bare job name (no sinks)."""
    if ":" not in spec:
        return paths.job_prefix(spec), {}
    job = load_job(spec)
    return job.prefix, erasure.job_sinks(job)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI (module docstring); returns the exit status."""
    from dkvstream.storage.objectstore import open_existing_store

    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.erase",
                                description="Erase a key from a job's state, sinks and store.")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", default=".dkvstream", help="object-store root (default .dkvstream)")
    keyed = argparse.ArgumentParser(add_help=False)
    keyed.add_argument("--key", required=True, help="the subject key (UTF-8 text, or hex with --hex)")
    keyed.add_argument("--hex", action="store_true", help="--key is hex digits")
    jobbed = argparse.ArgumentParser(add_help=False)
    jobbed.add_argument("--job", required=True, help="module:attribute of the Job, or the job's name")
    r = sub.add_parser("request", parents=[common, jobbed, keyed], help="ask the running job to erase a key")
    r.add_argument("--reason", default="", help="free text for the report (e.g. a ticket number)")
    sub.add_parser("apply", parents=[common, jobbed], help="serve the pending requests of a stopped job")
    s = sub.add_parser("status", parents=[common, jobbed, keyed], help="finish and print an erasure's report")
    s.add_argument("--id", required=True, help="the request id printed by 'request'")
    s.add_argument("--key-column", help="the sinks' column holding the key (default: sinks are not erased)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--scan-prefix", default="", help="prefix of the final scan (default: the whole store)")
    where.add_argument("--no-scan", action="store_true", help="skip the final scan")
    c = sub.add_parser("scan", parents=[common, keyed], help="list every object still holding a key")
    c.add_argument("--prefix", default="", help="only objects under this prefix (default: the whole store)")
    a = p.parse_args(argv)

    def command() -> int:
        store = open_existing_store(a.store)
        if a.command == "scan":
            result = scan_store(store, parse_bytes(a.key, a.hex), a.prefix)
            out.write(json.dumps(result.to_json(), indent=1) + "\n")
            return 1 if result.holding else 0
        prefix, sinks = _job(a.job)
        if a.command == "request":
            rid = erasure.request_erasure(store, prefix, parse_bytes(a.key, a.hex), a.reason)
            out.write(f"{rid}\n")
            return 0
        if a.command == "apply":
            records = erasure.apply_offline(store, prefix)
            out.write(json.dumps([{k: rec[k] for k in ("id", "applied_epoch")} for rec in records]) + "\n")
            return 0
        report = erasure.complete_erasure(store, prefix, a.id, parse_bytes(a.key, a.hex), sinks=sinks,
                                          key_column=a.key_column, scan_prefix=None if a.no_scan else a.scan_prefix)
        out.write(json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n")
        return 1 if report.status == "held" or (report.scan and report.scan["holding"]) else 0

    return run_command(command, (ValueError, LookupError))


if __name__ == "__main__":
    sys.exit(main())
