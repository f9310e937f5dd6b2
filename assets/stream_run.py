"""A stream job's epochs inside a Dagster step, and how a run termination stops them.

Dagster terminates a run by interrupting the process that executes its step: the run
launcher asks the run worker to stop, and the worker sends itself SIGINT (``dagster``'s
``send_interrupt``; a container runtime sends SIGTERM, which Dagster maps to the same
handler). Inside a step, Dagster's handler raises ``DagsterExecutionInterruptedError``
wherever the step's thread happens to be. An epoch must not be cut at an arbitrary
bytecode: it either commits whole or is never started.

``run_epochs`` therefore separates the two:

* the epochs (``JobRunner.epochs``) run in a worker thread, which no signal handler ever
  runs in (CPython runs them on the main thread only);
* the step's thread waits for committed epochs and reports each one (``on_epoch``),
  with a SIGINT/SIGTERM handler of its own installed instead of Dagster's raising one.
  The handler only calls ``JobRunner.stop()`` (safe in a signal handler): the epoch in
  flight finishes its commit, publish and retention, a run waiting for input or for its
  trigger returns without starting one, and ``run_epochs`` returns normally once every
  committed epoch was reported.
* a second signal does not wait (as ``dkvstream.operators.tools.run_job --continuous`` and Spark's
  and Flink's command lines): the step's thread raises ``DagsterExecutionInterruptedError``
  at its next check (never from inside a report's write to the Dagster instance) and
  the epoch in flight is abandoned to the process's exit, which is a
  driver crash, safe as below. For an epoch that hangs (a stuck Spark task).

This is Flink's stop-with-savepoint rather than its cancel: the run ends at a
checkpoint, nothing is left half done, and the step succeeds (under the in-process
executor the run then ends SUCCESS; ``dkvstream.assets.definitions``). Dagster's "force
termination" sends the same interrupt, it only does not wait for the run before marking
it canceled. A run worker killed outright (SIGKILL, a lost machine) is a driver crash,
which the epoch protocol already makes safe: an epoch in flight is abandoned before its
commit and the next run restarts from the newest checkpoint (``dkvstream.operators.runtime.recovery``).
"""
from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterExecutionInterruptedError

from dkvstream.operators.runtime.driver import EpochResult, JobRunner

__all__ = ["RunOutcome", "run_epochs"]

TERMINATION_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Longest a termination signal waits for its handler while the step's thread waits for
# an epoch (``_next``), s.
SIGNAL_CHECK_S = 0.5


@dataclass
class RunOutcome:
    """How a run of ``run_epochs`` ended.

    Attributes:
        epochs: epochs committed (and reported) by this run.
        stop_signals: names of the signals that asked the run to stop, in order
            (empty: the run ended on its own: source drained, nothing new on a live
            source outside a continuous run, or ``max_epochs`` reached).
    """

    epochs: int = 0
    stop_signals: list[str] = field(default_factory=list)

    @property
    def terminated(self) -> bool:
        """True if a termination request stopped the run."""
        return bool(self.stop_signals)


class _Done:
    """End of the worker's epochs; ``error`` is what ended them, if anything did."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def run_epochs(runner: JobRunner, *, max_epochs: int | None, continuous: bool,
               after_commit: Callable[[EpochResult], Any],
               on_epoch: Callable[[EpochResult, Any], None]) -> RunOutcome:
    """Runs ``runner.epochs(max_epochs, continuous=continuous)`` in a worker thread
    and reports each committed epoch on the calling thread, stopping the runner
    (never interrupting an epoch) when the process receives SIGINT or SIGTERM, and
    abandoning the epoch in flight at a second one (module docstring).

    Args:
        runner: the job's runner; this closes it (``JobRunner.close``) once its epochs
            have ended: before returning or raising, or, when a second signal abandoned
            the epoch in flight, on the worker thread after that epoch (the caller must
            not close it).
        max_epochs: stop after this many committed epochs (None: no limit).
        continuous: keep running on a live source until stopped (``JobRunner.epochs``).
        after_commit: called on the worker thread right after each commit, before the
            next epoch starts, with its ``EpochResult``; what it returns is handed to
            ``on_epoch``. For reads of the committed checkpoint that must happen before
            the next epoch's retention may delete it.
        on_epoch: called on the calling thread with each ``EpochResult`` and the value
            ``after_commit`` returned, in commit order; every committed epoch is
            reported, including the one in flight when a stop came.

    Returns:
        The ``RunOutcome``.

    Raises:
        Whatever the epochs raised (``JobFailedError``, ``JobFencedError``, ...), after
        every epoch committed before it was reported; whatever ``on_epoch`` raised,
        after stopping the runner and waiting for the epoch in flight;
        ``DagsterExecutionInterruptedError`` at a second signal (within ``SIGNAL_CHECK_S``). The signal
        handlers are only installed when called on the main thread (elsewhere Python
        cannot install them, and Dagster does not interrupt such a step either).
    """
    results: queue.SimpleQueue = queue.SimpleQueue()
    abandoned = threading.Event()

    def work() -> None:
        error = None
        try:
            for result in runner.epochs(max_epochs, continuous=continuous):
                results.put((result, after_commit(result)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, which raises it
            error = e
        finally:
            if abandoned.is_set():  # nobody waits for this thread: it closes what it used
                runner.close()
        results.put(_Done(error))

    outcome = RunOutcome()
    worker = threading.Thread(target=work, name=f"dkvstream-epochs-{runner.job.name}", daemon=True)
    with _stop_on_termination(runner, outcome.stop_signals):
        worker.start()
        try:
            while not isinstance(item := _next(results, outcome.stop_signals), _Done):
                outcome.epochs += 1
                on_epoch(*item)
            worker.join()
        except DagsterExecutionInterruptedError:
            # The second signal: the worker closes the runner after its epoch (if the
            # process lives that long), since it may still be using it.
            abandoned.set()
            raise
        except BaseException:
            runner.stop()
            worker.join()
            runner.close()
            raise
    runner.close()
    if item.error is not None:
        raise item.error
    return outcome


def _next(results: queue.SimpleQueue, stop_signals: list[str]):
    """The next item, waking at least every ``SIGNAL_CHECK_S``: Python runs a signal
    handler on the main thread only, and a lock wait there is cut short only when the
    kernel delivers the signal to that very thread (it may pick another), so the wait is
    cut into slices after each of which a pending handler runs.

    Raises:
        DagsterExecutionInterruptedError: a second termination signal has arrived.
    """
    while True:
        _raise_if_abandoned(stop_signals)
        try:
            return results.get(timeout=SIGNAL_CHECK_S)
        except queue.Empty:
            pass


def _raise_if_abandoned(stop_signals: list[str]) -> None:
    """Raises ``DagsterExecutionInterruptedError`` once a second signal has arrived.

    Raised here, between reports, rather than in the signal handler: a handler's
    exception lands wherever the thread is, and inside ``on_epoch``'s write to the
    Dagster instance it would leave that SQLite connection's transaction (and its
    database lock) open, so the run's own CANCELED event could not be written."""
    if len(stop_signals) > 1:
        raise DagsterExecutionInterruptedError(
            f"{' then '.join(stop_signals)}: the epoch in flight is abandoned; the next run restarts from "
            f"the newest checkpoint")


@contextmanager
def _stop_on_termination(runner: JobRunner, received: list[str]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``runner.stop()`` (and append the signal's name to
    ``received``) instead of raising, until the block ends; after a second one,
    ``_next`` raises ``DagsterExecutionInterruptedError`` (within ``SIGNAL_CHECK_S``, or
    once the report in progress has been written). The previous handlers (Dagster's) are
    restored at the end. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame) -> None:
        received.append(signal.Signals(signum).name)
        runner.stop()

    previous = {s: signal.getsignal(s) for s in TERMINATION_SIGNALS}
    try:
        for s in TERMINATION_SIGNALS:
            signal.signal(s, handler)
        yield
    finally:
        for s, h in previous.items():
            # None: a handler installed outside Python, which cannot be reinstalled
            # from here; the default action is the closest.
            signal.signal(s, h if h is not None else signal.SIG_DFL)
