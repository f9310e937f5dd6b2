"""Named fault points for crash tests (fail points, as in slatedb's ``tablestore.rs``).

The driver, tasks, DKV and cleanup call ``fault_point("<name>")`` at the steps where a
crash matters (after tasks and before the commit, between a compaction's output and its
install, between deletions of a cleanup, ...). Unarmed, a point costs one dict lookup
and does nothing. A test process arms a point with ``arm``; its ``hit``-th pass then
runs the action, by default a real ``SIGKILL`` of the process itself, so no ``finally``
block, ``atexit`` hook or buffered write runs (the same as a machine losing power,
minus the page cache). ``trace_to`` appends every point passed to a file, one name a
line, flushed to the OS before the point acts, so a test knows how many times a fault-free run
passes each point (to pick a random hit) and where a kill from outside landed.

Arming is per process (never inherited by Spark's Python workers, which arm nothing
unless code running in them calls ``arm``). Not for production use: the registry is a
test hook with no locking.

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

import os
import signal
from collections.abc import Callable

POINTS = (
    "epoch_planned", "task_before_checkpoint", "task_after_checkpoint", "dkv_table_written",
    "dkv_compaction_written", "dkv_before_manifest", "after_tasks", "after_commit", "publish_file",
    "before_cleanup", "cleanup_checkpoint", "gc_delete", "cleanup_staged", "after_cleanup",
)

Action = Callable[[str], None]

_armed: dict[str, tuple[int, Action]] = {}
_passes: dict[str, int] = {}
_trace: list = []  # [open file] while tracing


def kill_self(point: str) -> None:
    """The default action: ``SIGKILL`` this process (nothing after it runs)."""
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, hit: int = 1, action: Action = kill_self) -> None:
    """Runs ``action(point)`` at the ``hit``-th pass (1-based, counted from now) of ``point``.

    One shot: the point is disarmed before the action runs.

    Raises:
        ValueError: unknown point or ``hit`` < 1.
    """
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
    if hit < 1:
        raise ValueError(f"hit must be >= 1, got {hit}")
    _armed[point] = (_passes.get(point, 0) + hit, action)


def disarm_all() -> None:
    """Disarms every point and stops tracing."""
    _armed.clear()
    for f in _trace:
        f.close()
    _trace.clear()


def trace_to(path: str) -> None:
    """Appends the name of every point passed from now on to the file ``path``."""
    _trace.append(open(path, "a", buffering=1))  # noqa: SIM115 - closed by disarm_all


def fault_point(point: str) -> None:
    """Marks a crash-relevant step (see the module docstring for the names)."""
    n = _passes[point] = _passes.get(point, 0) + 1
    for f in _trace:
        f.write(point + "\n")
        f.flush()  # in the kernel: a SIGKILL does not lose it
    armed = _armed.get(point)
    if armed is not None and armed[0] == n:
        del _armed[point]
        armed[1](point)
