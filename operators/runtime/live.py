"""Running a job on a live source: the trigger, and stopping a continuous run.

``JobRunner.epochs(continuous=True)`` (``operators.runtime.driver``) keeps planning
epochs on a live source instead of ending when it has nothing new. This module holds
the pieces of that loop that are not the epoch protocol itself:

* ``ProcessingTimeTrigger``: when the next epoch may start (Spark Structured
  Streaming's ``Trigger.ProcessingTime``).
* ``StopRequest``: a request to stop the loop, safe to make from any thread and from
  a signal handler.
"""
from __future__ import annotations

import queue
import time
from collections.abc import Callable

# With no new input, the driver asks the source again after the trigger interval, but
# never more often than this (ms): a trigger interval of 0 must not poll the source's
# end offsets in a tight loop (Spark's ``spark.sql.streaming.pollingDelay`` plays this role).
NO_INPUT_POLL_MS = 100


class ProcessingTimeTrigger:
    """When a continuous run plans its next epoch (Spark's ``Trigger.ProcessingTime``).

    The trigger fires at most once per ``interval_ms``: an epoch that took less than the
    interval is followed by a wait for the rest of it; one that took longer is followed
    by the next at once. When the trigger fired and the source had nothing new, the next
    look is ``max(interval_ms, NO_INPUT_POLL_MS)`` after that one.

    Args:
        interval_ms: the trigger interval, ms (``Job.trigger_interval_ms``, >= 0).
        clock: seconds of a monotonic clock (tests pass a fake one).
    """

    def __init__(self, interval_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_ms < 0:
            raise ValueError(f"trigger interval must be >= 0 ms, got {interval_ms}")
        self.interval_ms = interval_ms
        self._clock = clock
        self._fired: float | None = None
        self._had_input = True

    def fire(self) -> None:
        """Records that the trigger fired now (the driver plans an epoch)."""
        self._fired = self._clock()
        self._had_input = True

    def nothing_new(self) -> None:
        """Records that the last firing found no input: the next look waits at least
        ``NO_INPUT_POLL_MS``."""
        self._had_input = False

    def seconds_to_next(self) -> float:
        """Seconds until the trigger may fire again (0.0: now; also before the first firing)."""
        if self._fired is None:
            return 0.0
        interval = self.interval_ms if self._had_input else max(self.interval_ms, NO_INPUT_POLL_MS)
        return max(0.0, self._fired + interval / 1000 - self._clock())


class StopRequest:
    """A request to stop a continuous run, and the wait it interrupts.

    ``request`` may be called from any thread and from a signal handler. A
    ``threading.Event`` is not safe there: a handler runs on the main thread between
    two bytecodes, possibly while that thread holds the event's internal lock inside
    ``wait``, and ``set`` would then wait for that lock forever. ``queue.SimpleQueue.put``
    is reentrant (documented for exactly such callers), so the waiter blocks in
    ``SimpleQueue.get(timeout=...)`` instead: no spinning, and woken at once.
    """

    def __init__(self) -> None:
        self._requested = False
        self._wakeups: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def request(self) -> None:
        """Asks the run to stop (idempotent; a stopped run stays stopped)."""
        self._requested = True  # a plain store: atomic, safe in a signal handler
        self._wakeups.put(True)

    @property
    def requested(self) -> bool:
        """True once ``request`` was called."""
        return self._requested

    def wait(self, seconds: float) -> bool:
        """Blocks up to ``seconds`` or until a stop is requested.

        Returns:
            True if a stop was requested (before or during the wait).
        """
        if self._requested or seconds <= 0:
            return self._requested
        try:
            self._wakeups.get(timeout=seconds)
        except queue.Empty:
            pass
        return self._requested
