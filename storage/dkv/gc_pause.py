"""Python's cyclic garbage collector paused around DKV's bulk phases.

A memtable flush or a compaction allocates tens of thousands of small containers (the
sparse-index rows, one per data block; column lists of millions of entries) while the
memtable dict holds millions of entries. Each collection those allocations trigger walks
the young column lists and, for a full collection, the memtable too: measured on a
3,000,000-entry flush, the collector took about a third of the flush. These phases create
no reference cycles, so nothing is lost by collecting after them instead; the collector
is restored to its previous state on exit, exceptions included. (Instagram's ``gc.freeze``
and the ``gc.disable`` of bulk loaders are the same trade.) A task's pass of its operator
over an epoch (``dkvstream.operators.runtime.task``) is paused for the same reason: its
per-event allocations would trigger full collections that walk the memtable.

The collector's switch is one per process, and a process may flush or compact several
DKV instances at once (a Python worker's threads, a Dagster op's). So the pause is
counted: the first block to enter records the switch and turns it off, the last to
leave restores it, and no block runs with the collector turned back on under it.
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # ``with gc_paused()`` blocks running now, in all threads
_was_enabled = False  # the switch when the first of them entered


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disables the cyclic collector for the ``with`` block; the last block to leave
    (of all threads') restores the state the first one found, exceptions included."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
