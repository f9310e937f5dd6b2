"""Named fault points for crash tests (fail points, as in slatedb's ``tablestore.rs``).

The driver, tasks, DKV and cleanup call ``fault_point("<name>")`` at the steps where a
crash matters (after tasks and before the commit, between a compaction's output and its
install, between deletions of a cleanup, ...); the driver's points also pass the epoch
(``fault_point("after_tasks", epoch=3)``). Unarmed, a point costs a dict lookup and
an empty loop, and does nothing. This is the project's one fault-injection mechanism,
with two ways in:

- ``arm(point, hit, action, epoch=...)``: one shot. The ``hit``-th pass of the point (of
  that epoch, if given) runs ``action(point, epoch)``, by default a real ``SIGKILL`` of
  the process itself, so no ``finally`` block, ``atexit`` hook or buffered write runs
  (the same as a machine losing power, minus the page cache). An in-process test passes
  an action that raises (a simulated driver crash) instead.
- ``callback(action)``: a context manager; ``action(point, epoch)`` runs at every pass
  while inside (a test that stops, drains or pauses a driver at a step, or advances its
  clock).

``trace_to`` appends every point passed to a file, one name a line, flushed to the OS
before the point acts, so a test knows how many times a fault-free run passes each
point (to pick a random hit) and where a kill from outside landed.

Arming is per process (never inherited by Spark's Python workers, which arm nothing
unless code running in them calls ``arm``), and seen by every thread. Not for
production use: the registry is a test hook with no locking.

Points (where they are called):

=========================  ==================================================================
``epoch_planned``          runtime: epoch planned, lease held, no task started
``task_before_checkpoint`` task: events processed and staged files written, no DKV manifest
``task_after_checkpoint``  task: DKV manifest written, result not returned yet
``dkv_table_written``      DKV flush: an L0 SSTable written, not in the level list yet
``dkv_compaction_written`` DKV compaction: output tables written, not installed yet
``dkv_before_manifest``    DKV checkpoint: WAL written, manifest not published
``after_tasks``            runtime: every task done, job checkpoint not written
``after_commit``           runtime: job checkpoint written, nothing published
``publish_file``           runtime: one sink's files published (other sinks' may not be)
``before_cleanup``         runtime: published, retention not applied
``cleanup_checkpoint``     cleanup: one expired job checkpoint deleted (incremental
                           retention: the batch of expired checkpoints and markers)
``gc_delete``              DKV garbage collection: one unnamed file deleted (incremental
                           retention: one batch of dropped DKV files)
``cleanup_staged``         cleanup: one unnamed staged file deleted (incremental
                           retention: one batch of expired staged files)
``after_cleanup``          runtime: cleanup done, lease not released
=========================  ==================================================================
"""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

POINTS = (
    "epoch_planned", "task_before_checkpoint", "task_after_checkpoint", "dkv_table_written",
    "dkv_compaction_written", "dkv_before_manifest", "after_tasks", "after_commit", "publish_file",
    "before_cleanup", "cleanup_checkpoint", "gc_delete", "cleanup_staged", "after_cleanup",
)

# action(point, epoch): epoch is the driver's epoch at its points, None at the others.
Action = Callable[[str, "int | None"], None]

_armed: dict[str, tuple[int | None, int, Action]] = {}  # point -> (epoch or None: any, passes left, action)
_callbacks: tuple[Action, ...] = ()  # replaced, never mutated: other threads iterate it
_trace: list = []  # [open file] while tracing


def kill_self(point: str, epoch: int | None = None) -> None:
    """The default action: ``SIGKILL`` this process (nothing after it runs)."""
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, hit: int = 1, action: Action = kill_self, *, epoch: int | None = None) -> None:
    """Runs ``action(point, epoch)`` at the ``hit``-th pass (1-based, counted from now) of
    ``point``; with ``epoch``, counting only the passes of that epoch (driver points).

    One shot: the point is disarmed before the action runs. Arming a point again
    replaces its previous arming.

    Raises:
        ValueError: unknown point or ``hit`` < 1.
    """
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
    if hit < 1:
        raise ValueError(f"hit must be >= 1, got {hit}")
    _armed[point] = (epoch, hit, action)


@contextlib.contextmanager
def callback(action: Action) -> Iterator[None]:
    """Runs ``action(point, epoch)`` at every pass of every point inside the block (in
    the order installed, before an armed action); an exception it raises propagates
    from the point, as a crash there."""
    global _callbacks
    _callbacks = (*_callbacks, action)
    try:
        yield
    finally:
        _callbacks = tuple(a for a in _callbacks if a is not action)


def disarm(point: str) -> None:
    """Disarms ``point`` if it is armed (its one shot not yet taken)."""
    _armed.pop(point, None)


def disarm_all() -> None:
    """Disarms every point, removes the callbacks and stops tracing."""
    global _callbacks
    _armed.clear()
    _callbacks = ()
    for f in _trace:
        f.close()
    _trace.clear()


def trace_to(path: str) -> None:
    """Appends the name of every point passed from now on to the file ``path``."""
    _trace.append(open(path, "a", buffering=1))  # noqa: SIM115 - closed by disarm_all


def fault_point(point: str, epoch: int | None = None) -> None:
    """Marks a crash-relevant step (see the module docstring for the names); ``epoch``:
    the driver's epoch at its points."""
    for f in _trace:
        f.write(point + "\n")
        f.flush()  # in the kernel: a SIGKILL does not lose it
    for action in _callbacks:
        action(point, epoch)
    armed = _armed.get(point)
    if armed is not None and (armed[0] is None or armed[0] == epoch):
        if armed[1] > 1:
            _armed[point] = (armed[0], armed[1] - 1, armed[2])
        else:
            del _armed[point]
            armed[2](point, epoch)

