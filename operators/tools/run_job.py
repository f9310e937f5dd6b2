"""Run a job's epochs from the command line, on local Spark, a cluster, or in-process.

One process is one driver: it continues from the newest checkpoint of the store, so
stopping it (``--max-epochs``, or a kill) and starting it again, with another
``--parallelism`` if wished, stops and resumes (rescales) the job::

    python -m dkvstream.operators.tools.run_job --job dkvstream.examples.flights:flights_job \\
        --store s3://bucket/prefix --master spark://127.0.0.1:7077 \\
        --parallelism 4 --events-per-epoch 50000 --max-epochs 2

On a cluster the executors get the S3 endpoint and credentials of this process's
environment through the Spark configuration (``dkvstream.operators.spark.session.executor_env_conf``).

Prints one readable line per step to stdout: ``starting Spark (10-40 s)...``, then
``Spark up: master ..., application ..., UI at http://...`` once the session is up, then
one line per committed epoch (``dkvstream.operators.runtime.progress.epoch_line``): for a bounded
source ``epoch 3 of ~7 (43%, ~8 s left): 100,002 events in 2.1 s (47,620 events/s),
watermark 2013-05-02 14:04:59.999 UTC, offsets EWR=... JFK=... LGA=...``; for a live source
the arrival rate and the lag per partition instead of the total. An epoch that fails with
a ``DkvstreamError`` (``TooManyDeadLettersError``, ``OperatorError``, ``BadInputError``:
a user's error whose message says what to do; ``JobFailedError``, ``S3CredentialsError``
...) prints its message on stderr (below) and exits 1; nothing of that epoch is committed.

``--json`` prints one JSON object per line instead, for scripts: ``{"event": "started",
"app_id", "ui", "master"}`` once the Spark session is up, then ``{"event": "committed",
"epoch", "events", "dead_letter", "seconds", "finished", "drained", "parallelism",
"requests", "watermark", "source_offsets", "live"}`` per committed epoch (``events``:
events the operators got; ``dead_letter``: the epoch's dead letters per reason and
``total``, ``EpochResult.dead_letter``; ``requests``: the checkpoint's object-store
request counts, ``{"driver": {...}, "tasks": {...}}``; ``watermark``: ms;
``source_offsets``: the next offset per source partition; ``live``: arrival, read and
processing rates, lag, end-to-end latency and watermark delay, ``EpochResult.live``),
``{"event": "failed", "error"}`` for an epoch that failed as above (the message is on
stderr too) and ``{"event": "stopped", "epoch", "drained"}`` (below).

Errors and exit statuses are those of every ``python -m`` tool (``dkvstream.storage.cli``): one
line on stderr; 2 for a mistake on the command line (a ``--job`` that cannot be loaded,
an invalid job, a ``--store`` that does not exist), ``error: <message>``; 1 when the run
failed otherwise (a failed epoch, no Java for Spark, S3 credentials missing),
``error: <Type>: <message>``; other exceptions are bugs and print their traceback.

Where the job starts: from the newest checkpoint of the job in ``--store``, else from the
beginning of its source. A ``--store`` given as a local directory must exist, so that a
misspelled path is an error ("no store at ...") rather than a new job started from the
beginning: ``--create-store`` creates it (the first run in a new directory). The default
store, ``.dkvstream``, is created when missing. An ``s3://`` store is a key prefix, which
exists as soon as anything is written under it: there the first ``committed`` line tells
a new job (epoch 1) from a continued one.

``--dkv FIELD=VALUE`` (repeatable) sets a ``dkvstream.storage.dkv.DKVOptions`` field of every
task's state, e.g. ``--dkv wal_flush_bytes=1048576``.

``--continuous`` keeps a job on a live source running (``JobRunner.epochs(continuous=True)``,
docs/continuous-jobs.md): SIGTERM or SIGINT asks it to stop after the epoch in flight
(``JobRunner.stop()``), prints that it stopped (``{"event": "stopped", "epoch",
"drained"}`` with ``--json``: the newest committed epoch, 0 if none; whether the job is
drained, finished for good) and exits 0; a second signal exits at once with 128 + the
signal number, like an uncaught SIGTERM (a restart continues from the newest checkpoint,
as after any crash). With ``--drain-on-stop`` the first signal stops with a drain
(``JobRunner.stop(drain=True)``, Flink's ``stop --drain``): one more epoch at watermark
+infinity emits every open window, and the job is finished for good. A signal during
start-up (Spark starting, the store opening) stops the run as soon as it is up, before
any epoch, the same way. The signal may go to the whole process group (``systemctl stop``,
Ctrl-C): Spark's JVM runs in a session of its own (``dkvstream.operators.spark.session``), so it
stays up until this process stops it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys

from dkvstream.operators.errors import DkvstreamError, InvalidJobError
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import EpochResult, JobRunner
from dkvstream.operators.runtime.progress import ProgressTracker, epoch_line
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import UsageError, run_command
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.objectstore import open_existing_store

DEFAULT_STORE = ".dkvstream"


def _print(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run epochs (see module docstring); returns 0 once the epochs asked for committed,
    or, with ``--continuous``, after a clean stop on SIGTERM/SIGINT; 1 when an epoch
    failed (the previous checkpoint stays the newest) or Spark could not start; 2 for a
    usage mistake (module docstring)."""
    return run_command(lambda: _run(argv), (InvalidJobError,))


def _run(argv: list[str] | None) -> int:
    """``main``'s command; raises what ``dkvstream.storage.cli.run_command`` maps to an exit status."""
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.run_job", description="Run a job's epochs.")
    p.add_argument("--job", required=True, help="module:attribute of a Job or a function returning one")
    p.add_argument("--store", help=f"object-store root: a path or s3://bucket/prefix (default {DEFAULT_STORE}); "
                                   "a local one must exist, see --create-store")
    p.add_argument("--create-store", action="store_true",
                   help="create the --store directory if it does not exist (without it, a --store that does "
                        "not exist is refused, so a misspelled path does not start a new job)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--master", help="Spark master, e.g. spark://127.0.0.1:7077 "
                                        "(default: DKVSTREAM_SPARK_MASTER, else local[2])")
    where.add_argument("--in-process", action="store_true", help="run every stage in this process, no Spark")
    p.add_argument("--stages-per-epoch", action="store_true",
                   help="on Spark, one or two Spark jobs per epoch instead of long-lived tasks for the run "
                        "(docs/design.md, 'Spark as a task runner')")
    p.add_argument("--parallelism", type=int, help="key-group ranges (tasks) per operator")
    p.add_argument("--events-per-epoch", type=int)
    p.add_argument("--max-epochs", type=int, help="stop after this many committed epochs (default: to the end)")
    p.add_argument("--continuous", action="store_true",
                   help="on a live source, keep running until SIGTERM/SIGINT (default: stop when caught up)")
    p.add_argument("--drain-on-stop", action="store_true",
                   help="with --continuous: on SIGTERM/SIGINT, drain (emit every open window, finish the "
                        "job for good) before exiting")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per line (started, committed, failed, stopped) instead of "
                        "readable lines, for scripts")
    p.add_argument("--retain-checkpoints", type=int, default=10, help="0 keeps every checkpoint")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    p.add_argument("--dkv", action="append", default=[], metavar="FIELD=VALUE",
                   help="a DKV option of every task's state (dkvstream.storage.dkv.DKVOptions field, e.g. "
                        "wal_flush_bytes=1048576; repeatable)")
    a = p.parse_args(argv)
    if a.drain_on_stop and not a.continuous:
        p.error("--drain-on-stop needs --continuous (without it the run ends when caught up)")
    dkv_options = _dkv_options(p, a.dkv)

    # Installed first, so a signal during start-up is a stop request too (not a kill).
    stop = _StopOnSignals(drain=a.drain_on_stop) if a.continuous else None
    job = load_job(a.job)
    changes = {k: v for k, v in (("parallelism", a.parallelism), ("events_per_epoch", a.events_per_epoch))
               if v is not None}
    job = dataclasses.replace(job, **changes)
    job.validate()
    store = _store_uri(a.store, a.create_store, job.name)

    spark = None
    try:
        if not a.in_process:
            from dkvstream.operators.spark.session import get_spark

            conf = dict(kv.split("=", 1) for kv in a.conf)
            if a.master:
                conf["spark.master"] = a.master
            if not a.json:
                _say("starting Spark (10-40 s)...")
            spark = get_spark(conf)
            _print_started(spark, a.json)
        with JobRunner(job, spark, store, retain_checkpoints=a.retain_checkpoints or None,
                       dkv_options=dkv_options, long_lived_tasks=not a.stages_per_epoch) as runner:
            if stop is not None:
                stop.attach(runner)
            progress = ProgressTracker(job.source, job.events_per_epoch)
            try:
                for result in runner.epochs(a.max_epochs, continuous=a.continuous):
                    if a.json:
                        _print_committed(runner, result, job.parallelism)
                    else:
                        _say(epoch_line(result, progress.update(result)))
            except DkvstreamError as e:
                # Often the user's error (a schema that does not match the input, an operator
                # that raises): its message says what and what to do; run_command prints it.
                if a.json:
                    _print({"event": "failed", "error": str(e)})
                raise
            if a.continuous:
                newest = runner.latest()
                epoch, drained = newest.epoch if newest else 0, bool(newest and newest.metrics.get("drained"))
                if a.json:
                    _print({"event": "stopped", "epoch": epoch, "drained": drained})
                else:
                    _say(f"stopped at epoch {epoch}" + (" (drained: finished for good)" if drained else ""))
    finally:
        if spark is not None:
            from dkvstream.operators.spark.session import stop_spark

            stop_spark(spark)
    return 0


def _print_started(spark, as_json: bool) -> None:
    """The ``started`` line: master, application id and the Spark UI's URL (None when
    ``spark.ui.enabled`` is false)."""
    from dkvstream.operators.spark.session import describe_session

    sc = spark.sparkContext
    if as_json:
        _print({"event": "started", "app_id": sc.applicationId, "ui": sc.uiWebUrl, "master": sc.master})
    else:
        _say(describe_session(spark))


def _store_uri(given: str | None, create: bool, job_name: str) -> str:
    """The store to run in: ``given``, which must exist unless ``create`` (module
    docstring), else ``DEFAULT_STORE``.

    Raises:
        UsageError: ``given`` is a local directory that does not exist, without
            ``create``; or its scheme is unknown.
    """
    if given is None:
        return DEFAULT_STORE
    if not create:
        try:
            open_existing_store(given)
        except FileNotFoundError:
            raise UsageError(f"no store at {given}: no such directory (check --store; to start job "
                             f"{job_name} in a new store there, pass --create-store)") from None
        except ValueError as e:  # an unknown scheme
            raise UsageError(f"--store {given}: {e}") from None
    return given


def _print_committed(runner: JobRunner, result: EpochResult, parallelism: int) -> None:
    """The ``committed`` line of one epoch (module docstring)."""
    requests = read_checkpoint(runner.store, runner.job.prefix, result.epoch).metrics["requests"]
    _print({"event": "committed", "epoch": result.epoch, "events": result.events,
            "dead_letter": result.dead_letter, "seconds": round(result.seconds, 3), "finished": result.finished,
            "drained": result.drained, "parallelism": parallelism, "requests": requests,
            "watermark": result.watermark, "source_offsets": result.source_offsets, "live": result.live})


def _dkv_options(parser: argparse.ArgumentParser, settings: list[str]) -> DKVOptions | None:
    """``DKVOptions`` from ``FIELD=VALUE`` strings (None: none given, the defaults); an
    unknown field or a value of the wrong type exits with a usage error naming it."""
    if not settings:
        return None
    fields = {f.name: f.type for f in dataclasses.fields(DKVOptions)}
    values = {}
    for kv in settings:
        name, sep, value = kv.partition("=")
        if not sep or name not in fields:
            parser.error(f"--dkv {kv!r}: expected FIELD=VALUE with FIELD one of {sorted(fields)}")
        try:
            values[name] = float(value) if fields[name] in (float, "float") else int(value)
        except ValueError:
            kind = 'a number' if fields[name] in (float, 'float') else 'an integer'
            parser.error(f"--dkv {kv!r}: {name} takes {kind}")
    return DKVOptions(**values)


class _StopOnSignals:
    """SIGTERM/SIGINT handlers: the first signal asks the run to stop after the epoch in
    flight (with ``drain``: and to drain, ``JobRunner.stop(drain=True)``), the second
    exits at once (Spark's and Flink's command lines do the same). Installed before
    start-up; a signal received before ``attach`` stops the runner as soon as it is
    attached, before its first epoch."""

    def __init__(self, drain: bool = False) -> None:
        self.drain = drain
        self.received: list[int] = []
        self.runner: JobRunner | None = None
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def attach(self, runner: JobRunner) -> None:
        self.runner = runner
        if self.received:
            runner.stop(drain=self.drain)

    def _handle(self, signum, frame) -> None:
        if self.received:
            os._exit(128 + signum)  # no cleanup: a restart recovers as after a crash
        self.received.append(signum)
        then = "draining: every open window is emitted, " if self.drain else ""
        when = ("stopping after the epoch in flight" if self.runner is not None
                else "stopping once started, before any epoch")
        # os.write, not print: a handler may interrupt a print to the same stream.
        os.write(2, f"run_job: {signal.Signals(signum).name}: {when} ({then}send it again to "
                    f"exit at once)\n".encode())
        if self.runner is not None:
            self.runner.stop(drain=self.drain)


if __name__ == "__main__":
    sys.exit(main())
