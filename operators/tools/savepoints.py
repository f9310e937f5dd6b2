"""Savepoints and forks from the command line (``dkvstream.operators.runtime.savepoints``,
``dkvstream.operators.runtime.forks``)::

    python -m dkvstream.operators.tools.savepoints [--store .dkvstream] create JOB NAME [--epoch N]
    python -m dkvstream.operators.tools.savepoints [--store ...] list JOB [--json]
    python -m dkvstream.operators.tools.savepoints [--store ...] drop JOB NAME
    python -m dkvstream.operators.tools.savepoints [--store ...] restore --job MODULE:ATTRIBUTE NAME
    python -m dkvstream.operators.tools.savepoints [--store ...] fork PARENT CHILD
        [--savepoint NAME | --epoch N] [--job MODULE:ATTRIBUTE]
    python -m dkvstream.operators.tools.savepoints [--store ...] drop-fork CHILD

``JOB``, ``PARENT`` and ``CHILD`` are job names. ``restore`` needs the job itself
(``--job``: its sinks say what output is visible, its operators must read the state);
``fork --job`` names the child's job, whose key groups and state declarations are then
checked before anything is written (else on the child's first run). ``drop-fork``
releases what a fork (or branch) job holds of its parent's files; the child never runs
again.

Exit status: 0 done, 1 refused or failed (``RecoveryRefusedError``: output of later
epochs visible, a driver running; a missing file), 2 a usage mistake (an unknown job,
savepoint or epoch, a taken name), each with a one-line message.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from dkvstream.operators.runtime.forks import drop_fork, fork_job
from dkvstream.operators.runtime.savepoints import drop_savepoint, list_savepoints, restore, savepoint
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import run_command


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the CLI (module docstring); returns the exit status."""
    from dkvstream.storage.objectstore import open_existing_store

    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.savepoints",
                                description="Take, list, drop and restore savepoints; fork jobs.")
    p.add_argument("--store", default=".dkvstream", help="object-store root (default .dkvstream)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="pin a retained checkpoint as a savepoint")
    c.add_argument("job")
    c.add_argument("name")
    c.add_argument("--epoch", type=int, help="retained epoch (default: the newest)")
    ls = sub.add_parser("list", help="the job's savepoints")
    ls.add_argument("job")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    d = sub.add_parser("drop", help="unpin a savepoint and delete it")
    d.add_argument("job")
    d.add_argument("name")
    r = sub.add_parser("restore", help="make the job continue from a savepoint")
    r.add_argument("--job", required=True, help="module:attribute of the Job or a function returning one")
    r.add_argument("name")
    f = sub.add_parser("fork", help="start a new job from a savepoint or checkpoint, copying no state")
    f.add_argument("parent")
    f.add_argument("child")
    which = f.add_mutually_exclusive_group()
    which.add_argument("--savepoint", help="the parent's savepoint to start from")
    which.add_argument("--epoch", type=int, help="the parent's retained epoch (default: the newest)")
    f.add_argument("--job", help="module:attribute of the child's Job, checked before the fork")
    df = sub.add_parser("drop-fork", help="release a fork's (or branch's) pins on its parent; it never runs again")
    df.add_argument("child")
    a = p.parse_args(argv)

    def command() -> int:
        try:
            store = open_existing_store(a.store)
        except FileNotFoundError:
            raise LookupError(f"no store under {a.store}: no such directory (check --store)") from None
        w = out.write
        if a.command == "create":
            sp = savepoint(store, a.job, a.name, a.epoch)
            w(f"savepoint {sp.name} of job {sp.job}: epoch {sp.epoch}, {sp.files} files "
              f"({sp.bytes:,} bytes) pinned by {len(sp.pins)} pin(s)\n")
        elif a.command == "list":
            for sp in list_savepoints(store, a.job):
                row = {"name": sp.name, "epoch": sp.epoch, "files": sp.files, "bytes": sp.bytes,
                       "taken_at_ms": sp.taken_at_ms, "pins": sp.pins, "pending": sp.pending}
                w(json.dumps(row) + "\n" if a.json else
                  f"{sp.name}\tepoch {sp.epoch}\t{sp.files} files\t{sp.bytes:,} bytes"
                  + ("\tbeing taken (or its taking crashed: drop it)" if sp.pending else "") + "\n")
        elif a.command == "drop":
            sp = drop_savepoint(store, a.job, a.name)
            w(f"dropped savepoint {a.name} of job {a.job}"
              f"{f' (epoch {sp.epoch})' if sp else ' (only pins a crashed drop left)'}; its files no "
              "checkpoint names go at the next full sweep\n")
        elif a.command == "drop-fork":
            record = drop_fork(store, a.child)
            w(f"dropped fork {a.child} of job {record.get('parent')}: pins released at "
              f"{', '.join(record.get('owners', [])) or 'no job'}; their files no other record names go "
              f"at the owners' next full sweep; job {a.child} cannot run again\n")
        elif a.command == "restore":
            job = load_job(a.job)
            ckpt = restore(store, job, a.name)
            w(f"job {job.name} continues from savepoint {a.name}: committed epoch {ckpt.epoch}\n")
        else:
            child = load_job(a.job) if a.job else a.child
            if a.job and child.name != a.child:
                raise ValueError(f"--job {a.job} is job {child.name!r}, not {a.child!r}")
            ckpt = fork_job(store, a.parent, child, savepoint=a.savepoint, epoch=a.epoch)
            w(f"job {a.child} forked from job {a.parent} at epoch {ckpt.epoch}; no state file copied\n")
        return 0

    return run_command(command, (ValueError, LookupError))


if __name__ == "__main__":
    sys.exit(main())
