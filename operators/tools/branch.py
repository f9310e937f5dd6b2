"""Branch, shadow run, diff and promote from the command line (``docs/branches.md``)::

    python -m dkvstream.operators.tools.branch create  --main MOD:JOB --branch MOD:JOB --store S [--epoch N]
    python -m dkvstream.operators.tools.branch shadow  --branch MOD:JOB --store S [--in-process] [--max-epochs N]
    python -m dkvstream.operators.tools.branch diff    --main MOD:JOB --branch MOD:JOB --store S \\
        [--key OUTPUT=COL,COL ...] [--samples N]
    python -m dkvstream.operators.tools.branch promote --main MOD:JOB --branch MOD:JOB --store S
    python -m dkvstream.operators.tools.branch run-main --main MOD:JOB --branch MOD:JOB --store S [--in-process]

``MOD:JOB`` is a ``module:attribute`` naming a ``Job`` or a function returning one (as
``run_job --job``). ``create`` forks the main's newest checkpoint (or ``--epoch``) into the
branch; ``shadow`` runs the branch on the main's epochs until it caught up; ``diff``
prints, per output and epoch, the rows only in the main, only in the branch and changed
(``--json``: the whole diff); ``promote`` switches the stopped main to the branch's state
and code; ``run-main`` runs the main's epochs with the code it runs now (the branch's once
promoted). Exit status: 0 done, 1 refused or failed (the message says why and what to
do), 2 a usage mistake.
"""
from __future__ import annotations

import argparse
import json

from dkvstream.operators.errors import InvalidJobError
from dkvstream.operators.runtime import branches
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import UsageError, run_command
from dkvstream.storage.objectstore import open_existing_store


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand (module docstring); returns the exit status."""
    return run_command(lambda: _run(argv), (InvalidJobError,))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.branch",
                                description="Branch a job, run the branch as a shadow, diff, promote.")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, main: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help)
        if main:
            c.add_argument("--main", required=True, help="module:attribute of the main Job")
        c.add_argument("--branch", required=True, help="module:attribute of the branch Job")
        c.add_argument("--store", required=True, help="object-store root: a path or s3://bucket/prefix")
        c.add_argument("--json", action="store_true", help="print the result as JSON")
        return c

    create = command("create", "fork the main's newest checkpoint into the branch")
    create.add_argument("--epoch", type=int, help="fork this retained checkpoint instead of the newest")
    for name, help, main in (("shadow", "run the branch on the main's epochs until it caught up", False),
                             ("run-main", "run the main with the code it runs now (the branch's once promoted)",
                              True)):
        c = command(name, help, main)
        c.add_argument("--in-process", action="store_true", help="run every stage in this process, no Spark")
        c.add_argument("--master", help="Spark master (default local[*] or $DKVSTREAM_SPARK_MASTER)")
        c.add_argument("--max-epochs", type=int)
    d = command("diff", "rows that differ per output and epoch")
    d.add_argument("--key", action="append", default=[], metavar="OUTPUT=COL,COL",
                   help="columns identifying a row of OUTPUT (repeatable); others compare whole rows")
    d.add_argument("--samples", type=int, default=branches.DEFAULT_SAMPLES, help="key samples per kind and epoch")
    command("promote", "the stopped main continues from the branch's state and code")
    return p


def _run(argv: list[str] | None) -> int:
    a = _parser().parse_args(argv)
    try:
        store = open_existing_store(a.store)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--store {a.store}: {e}") from None
    branch_job = load_job(a.branch)
    main_job = load_job(a.main) if getattr(a, "main", None) else None
    if a.command == "create":
        record = branches.branch(store, main_job, branch_job, epoch=a.epoch)
        _out(a.json, record.__dict__, f"branch {record.branch} forked from {record.main}'s checkpoint "
                                      f"{record.fork_epoch}")
    elif a.command in ("shadow", "run-main"):
        job = branch_job if a.command == "shadow" else branches.job_to_run(store, main_job,
                                                                            {branch_job.name: branch_job})
        spark = None
        try:
            if not a.in_process:
                from dkvstream.operators.spark.session import get_spark

                spark = get_spark({"spark.master": a.master} if a.master else None)
            if a.command == "shadow":
                results = branches.run_branch(job, spark, store, max_epochs=a.max_epochs)
            else:
                from dkvstream.operators.runtime.driver import JobRunner

                with JobRunner(job, spark, store) as runner:
                    results = runner.run(a.max_epochs)
        finally:
            if spark is not None:
                from dkvstream.operators.spark.session import stop_spark

                stop_spark(spark)
        last = results[-1].epoch if results else None
        _out(a.json, {"job": job.name, "epochs": [r.epoch for r in results]},
             f"job {job.name}: {len(results)} epochs committed" + (f", newest {last}" if last else ""))
    elif a.command == "diff":
        d = branches.diff(store, main_job, branch_job, key_columns=_keys(a.key), samples=a.samples)
        if a.json:
            print(json.dumps(d.as_dict(), default=str))
        else:
            print(_diff_text(d))
        return 0
    else:
        p = branches.promote(store, main_job, branch_job)
        _out(a.json, p.__dict__, f"job {p.main} continues from branch {p.branch}'s checkpoint {p.branch_epoch} as "
                                 f"its epoch {p.epoch}; run it with: python -m dkvstream.operators.tools.branch "
                                 f"run-main --main {a.main} --branch {a.branch} --store {a.store}")
    return 0


def _keys(specs: list[str]) -> dict[str, list[str]]:
    """``OUTPUT=COL,COL`` arguments as ``{output: [columns]}``.

    Raises:
        UsageError: one is not of that form.
    """
    out = {}
    for spec in specs:
        output, sep, cols = spec.partition("=")
        if not sep or not output or not cols:
            raise UsageError(f"--key {spec!r}: expected OUTPUT=COL[,COL...]")
        out[output] = cols.split(",")
    return out


def _out(as_json: bool, body: dict, line: str) -> None:
    print(json.dumps(body, default=str) if as_json else line)


def _diff_text(d: branches.BranchDiff) -> str:
    """The diff as lines: per output its totals and columns, then each epoch that differs."""
    lines = [f"diff {d.main} -> {d.branch}, epochs {d.epochs[0]}..{d.epochs[1]}"]
    if d.outputs_added or d.outputs_removed:
        lines.append(f"outputs added {d.outputs_added}, removed {d.outputs_removed}")
    for name, out in d.outputs.items():
        t = out.totals()
        lines.append(f"output {name}: {t['main_rows']} rows in main, {t['branch_rows']} in branch; only in main "
                     f"{t['only_in_main']}, only in branch {t['only_in_branch']}, changed {t['changed']}; "
                     f"columns added {out.columns_added}, removed {out.columns_removed}")
        for e in out.epochs:
            if e.differs:
                lines.append(f"  epoch {e.epoch}: only in main {e.only_in_main}, only in branch {e.only_in_branch}, "
                             f"changed {e.changed} {e.changed_columns}; samples {json.dumps(e.samples, default=str)}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
