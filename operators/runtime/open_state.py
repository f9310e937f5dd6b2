"""DKV instances a Spark Python worker keeps open from one epoch to the next.

Opening a range's DKV at a manifest replays the WAL objects the manifest lists into a
memtable and reopens its tables: for a job whose state stays in the memtable this costs
more than the epoch's own work, and grows with every epoch until the WAL is flushed. A
task that checkpointed DKV at manifest ``m`` therefore hands the open instance to this
cache instead of closing it; the next task of the same range in the same worker
process whose ``TaskSpec.manifest_key`` is ``m`` (the driver committed that attempt)
takes it instead of reopening. The instance is then exactly the state ``DKV.open(m)``
restores: a checkpoint makes everything written before it durable and leaves the
memtable as the manifest describes it.

Spark does not keep a range on one worker: in ``local[2]`` the two ranges swap workers
about every other epoch, so a worker's instance is often one epoch behind. When the
wanted manifest only appends WAL objects to the instance's one (same tables, same key
range: no flush or compaction happened in between), the instance catches up by
replaying just those WAL objects, as ``DKV.open`` would have replayed them after the
ones it already holds. Anything else reopens from the object store, as without the
cache: tables changed, a rescale, other DKV options, or a task that failed after taking
the instance (it is never put back).
Like Flink's task-local state, the cache is an optimisation only; it is never read on
the driver and holds nothing a checkpoint does not.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from dkvstream.operators.runtime.timers import Timers
from dkvstream.storage.dkv import DKV, DKVOptions

# Open ranges kept per worker process; older ones are closed. A worker usually runs the
# same few ranges epoch after epoch (local[2]: two workers, P ranges between them).
DEFAULT_CAPACITY = 8


class _Kept(NamedTuple):
    """One kept range: its DKV ``db`` checkpointed at ``manifest_key`` with ``options``,
    and the timer services its last task used over it (or None)."""
    manifest_key: str
    options: DKVOptions | None
    db: DKV
    timers: Timers | None


class OpenState:
    """A small LRU map (store root, state prefix) -> ``_Kept`` (manifest key, DKV
    options, DKV, timer services).

    Args:
        capacity: open instances kept; the least recently kept one is closed beyond it.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self.hits = self.caught_up = self.misses = 0

    def take(self, store_root: str, state_prefix: str, manifest_key: str | None,
             options: DKVOptions | None) -> tuple[DKV, Timers | None] | None:
        """The open DKV of this range at ``manifest_key`` with ``options`` (kept there, or
        caught up to it), removed from the cache (the caller owns it), with the range's
        timer services if the instance is exactly as its last task left it (None after a
        catch-up: other tasks' timers are not in its lower bound); else None (a stale
        entry is closed).

        Raises:
            ObjectNotFoundError, CorruptionError: reading the manifest or a WAL object
                (the instance is closed: it is no longer in the cache).
        """
        entry = self._entries.pop((store_root, state_prefix), None)
        if entry is not None and manifest_key is not None and entry.options == options:
            if entry.manifest_key == manifest_key:
                self.hits += 1
                return entry.db, entry.timers
            try:
                advanced = entry.db.advance_to(manifest_key)
            except BaseException:
                entry.db.close()
                raise
            if advanced:
                self.caught_up += 1
                return entry.db, None
        if entry is not None:
            entry.db.close()
        self.misses += 1
        return None

    def keep(self, store_root: str, state_prefix: str, manifest_key: str, options: DKVOptions | None,
             db: DKV, timers: Timers | None = None) -> None:
        """Keep ``db``, just checkpointed at ``manifest_key``, for the range's next task,
        with the task's timer services (``timers``) over it. The services' set-dedup memory
        of the epoch is dropped here rather than when the next task starts: it holds every
        timer key the task set, which is dead weight between epochs."""
        if timers is not None:
            timers.begin_epoch()
        old = self._entries.pop((store_root, state_prefix), None)
        if old is not None and old.db is not db:
            old.db.close()
        self._entries[(store_root, state_prefix)] = _Kept(manifest_key, options, db, timers)
        while len(self._entries) > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            evicted.db.close()

    def close_all(self) -> None:
        """Closes every kept instance and empties the cache (a runner that is done)."""
        while self._entries:
            _, kept = self._entries.popitem(last=False)
            kept.db.close()

    def __len__(self) -> int:
        return len(self._entries)
