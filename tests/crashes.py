"""The in-process driver crash of the crash and restart tests: one shared helper over
``dkvstream.storage.faults`` (the crash harness's subprocesses arm the same points with
a real ``SIGKILL`` instead, ``tests/reliability/crash_driver.py``)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dkvstream.storage import faults


class Crash(Exception):
    """The simulated driver crash."""


def crash(point: str, epoch: int | None) -> None:
    """A fault action: raises ``Crash`` naming the point and epoch."""
    raise Crash(f"injected crash at {point} of epoch {epoch}")


@contextlib.contextmanager
def crash_at(point: str, epoch: int) -> Iterator[None]:
    """Inside the block, the first pass of the driver's ``point`` in ``epoch`` raises
    ``Crash`` (``faults.arm``); disarmed on leaving it, whether or not it was reached."""
    faults.arm(point, action=crash, epoch=epoch)
    try:
        yield
    finally:
        faults.disarm(point)
