"""Checkpoint retention and garbage collection of a job's files.

Two ways, one policy (keep the newest ``retain`` checkpoints and what they name):

* **Incremental** (``IncrementalRetention``, the driver after each epoch): each
  checkpoint records what its epoch's range manifests stopped naming compared with the
  previous checkpoint's (``JobCheckpoint.dropped``, from ``DKV.dropped_at_checkpoint``,
  with sizes from the manifests). When checkpoint e expires, exactly these become
  garbage: what checkpoint e+1 dropped, and e's staged output files (published by
  then). The driver deletes them with batched deletes (``ObjectStore.delete_many``, S3
  ``DeleteObjects`` of up to 1,000 keys), a few requests per epoch whatever the number of
  ranges, reading no range manifest and listing no state. See its docstring for when
  it falls back to the full sweep.
* **The full sweep** (``cleanup_job``, the Dagster ``cleanup`` op, and the driver every
  ``full_sweep_every`` epochs or when the incremental way cannot tell): lists the
  job's files and deletes whatever no retained checkpoint names, including the files
  of failed task attempts, which no checkpoint ever records. The rest of this docstring
  is about it.

Keeps the newest ``retain`` job checkpoints and deletes what only older checkpoints
named: expired checkpoint manifests first (so a crash half-way leaves garbage, never a
dangling reference), then DKV files no retained range manifest of any range names (the
seed's data-ownership policy: after a rescale a table may be shared by several ranges,
so all ranges of an operator are collected together), then staged output files of
committed epochs that no retained checkpoint names. Published sink files are output,
never garbage.

The runner calls it after each epoch it committed, and the Dagster cleanup op from
another process, both with ``concurrent=True``: a task writes its SSTables and staged
files *before* the epoch's commit names them, so an unreferenced file may belong to an
epoch in flight. The concurrent mode therefore:

1. defers (deletes no file, only expired checkpoint manifests) while the job's epoch
   lease is live (``dkvstream.operators.runtime.control``: written by the driver before its tasks run,
   released after the commit);
2. otherwise lists the job's files, then re-reads the lease and the newest epoch: if a
   lease appeared or an epoch committed meanwhile, it defers too;
3. otherwise deletes only garbage among the files listed in step 2. A file written after
   that listing is never touched, so an epoch that starts during the deletions is safe;
   everything it reads is named by the newest checkpoint, which is retained.

Staged files of epochs after the newest checkpoint are in flight and left alone.

The driver needs the concurrent mode too: another driver of the job (one that should not
be running, but may be) can have an epoch in flight, and a cleanup that did not re-check
would delete that epoch's files before its commit names them. A driver whose commit was
fenced never cleans up.

The fence (``dkvstream.operators.runtime.checkpoints``): before deleting expired checkpoints, the
retention floor is raised to the newest of them, so a lagging driver that writes one of
them again is fenced; checkpoint objects at or below the floor (such a driver's write)
and commit records and floors older than the newest of their kind are deleted.

Damage that only retention trips over (a retained checkpoint or one of its range
manifests that does not read) does not fail the cleanup: what the damaged object names
cannot be known, so the files it could name are not collected (of its operator; all files
if the checkpoint object itself is damaged), and the damage is reported in
``CleanupReport.damaged`` and logged as a warning. A restart falling back to that
checkpoint would refuse it; the Dagster ``verified`` check reports it.

**Other jobs' files and pins** (``dkvstream.operators.runtime.pins``): neither way ever
deletes an object outside the job's own prefix (a fork's checkpoints name its parent's
files, which are the parent's to collect), and both list the job's ``pins/`` after
deleting the expired checkpoint manifests and before deleting any file, and keep every
pinned file (a savepoint's, a fork's); a pin that does not read stops the collection
(reported as damage). A forked job's full sweep then shrinks the pins it holds at other
jobs to what its retained checkpoints and savepoints still name, and deletes a pin that
names nothing. Cost: one LIST of ``pins/`` per collection that deletes files, and one
GET per pin (the incremental way: per pin written since its previous call,
``pins.PinCache``).

Last, writes abandoned by killed writers (a local temp file, an S3 multipart upload
never completed) under the job's prefix are removed once ``ABANDONED_WRITE_AGE_S`` old:
no write of a live writer takes that long (an epoch's lease lasts at most 30 minutes).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from dkvstream.operators import paths
from dkvstream.operators.io.sinks import list_task_files
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime import pins, savepoints
from dkvstream.operators.runtime.checkpoints import (
    JobCheckpoint,
    decode_objects,
    list_epochs,
    read_checkpoint,
    read_commit_log,
    retire_through,
)
from dkvstream.operators.runtime.control import read_lease
from dkvstream.storage.dkv.gc import collect_garbage
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import DELETE_BATCH, ForwardingObjectStore, ObjectStore, map_requests

log = logging.getLogger(__name__)

ABANDONED_WRITE_AGE_S = 3600.0


@dataclass
class CleanupReport:
    """What a cleanup did.

    Attributes:
        retained_epochs: epochs whose checkpoints are kept.
        checkpoints_deleted: expired job checkpoints deleted.
        files_deleted: DKV and staged files deleted.
        bytes_freed: their total size, bytes.
        deferred: why no file was deleted (an epoch in flight), or "" if files were
            collected.
        abandoned_writes_removed: partial writes of killed writers removed.
        damaged: one message per retained object that does not read (a checkpoint or a
            range manifest, naming its URI and the epoch); what it could name was kept.
        full_sweep: why the full sweep ran (``cleanup_job``), or "" for an incremental
            retention (``IncrementalRetention``), which counts in ``bytes_freed`` the DKV
            files only (staged files' sizes are not recorded anywhere).
    """

    retained_epochs: list[int]
    checkpoints_deleted: int = 0
    files_deleted: int = 0
    bytes_freed: int = 0
    deferred: str = ""
    abandoned_writes_removed: int = 0
    damaged: list[str] = field(default_factory=list)
    full_sweep: str = ""


def cleanup_job(store: ObjectStore, job_prefix: str, retain: int, *, concurrent: bool = False) -> CleanupReport:
    """Keep the newest ``retain`` checkpoints of the job under ``job_prefix``; free the rest.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        retain: checkpoints to keep, at least 1.
        concurrent: an epoch of the job may be in flight right now (see module docstring),
            as for the driver's own retention and the Dagster cleanup; False only where
            no driver of the job can be running.

    Returns:
        A ``CleanupReport``.

    Raises:
        ValueError: ``retain`` < 1.
    """
    if retain < 1:
        raise ValueError(f"retain must be >= 1, got {retain}")
    commits = read_commit_log(store, job_prefix)
    epochs = commits.epochs
    kept, expired = epochs[-retain:], epochs[:-retain]
    report = CleanupReport(retained_epochs=kept)
    if not kept:
        return report
    listed: tuple[list[str], list[str]] | None = None  # state and staged files
    own = store  # pins and savepoints are read through it, never the listing below
    if concurrent:
        report.deferred = _in_flight(store, job_prefix, kept[-1])
        if not report.deferred:
            listed = list_task_files(store, job_prefix)
            report.deferred = _in_flight(store, job_prefix, kept[-1])
            store = _ListedOnly(store, {*listed[0], *listed[1]})
    retained = []
    for e, read in zip(kept, map_requests(lambda e: _read_or_error(store, job_prefix, e), kept)):
        if isinstance(read, JobCheckpoint):
            retained.append(read)
        else:
            _damaged(report, job_prefix,
                     f"retained checkpoint epoch {e}: {read}; no file is collected")
    if expired:
        retire_through(store, job_prefix, expired[-1])  # first: the fence (module docstring)
    for e in expired:
        store.delete(checkpoint_key(job_prefix, e))
        fault_point("cleanup_checkpoint")
        report.checkpoints_deleted += 1
    garbage = commits.withdrawn + commits.old_markers
    if expired and commits.retired_through:  # the floor written above superseded it
        garbage.append(paths.retired_key(job_prefix, commits.retired_through))
    for key in garbage:
        store.delete(key)
    if report.deferred or len(retained) < len(kept):
        return report
    try:  # after the expired checkpoints went (pins.py, "Why writing a pin is race-free")
        held = pins.read_pins(own, job_prefix)
        pinned = {k for p in held for k in p.keys}
    except CorruptionError as err:
        _damaged(report, job_prefix, f"{err}; no file is collected")
        return report

    state_keys, staged_keys = listed or list_task_files(store, job_prefix)
    range_prefixes: dict[str, set[str]] = {}  # operator -> DKV prefixes of all its ranges, old and new
    for key in state_keys:
        op, _, prefix = paths.parse_state_key(job_prefix, key)
        range_prefixes.setdefault(op, set()).add(prefix)
    for op, prefixes in sorted(range_prefixes.items()):
        manifests = [m for c in retained for m in c.operators.get(op, {}).values()]
        try:
            stats = collect_garbage(store, sorted(prefixes), manifests, protect=pinned)
        except (ObjectNotFoundError, CorruptionError) as err:  # nothing was deleted
            named_by = [str(c.epoch) for c in retained
                        if any(store.uri(m) in str(err) for m in c.operators.get(op, {}).values())]
            _damaged(report, job_prefix, f"range manifest of retained checkpoint epoch "
                     f"{', '.join(named_by) or '?'}: {err}; no file of operator {op} is collected")
            continue
        report.files_deleted += stats["deleted"]
        report.bytes_freed += stats["bytes_freed"]

    named = {k for c in retained for keys in c.outputs.values() for k in keys}
    newest = kept[-1]
    for key in staged_keys:
        epoch = paths.staged_epoch(key)
        if key in named or epoch is None or epoch > newest:
            continue
        report.bytes_freed += store.size(key)
        store.delete(key)
        fault_point("cleanup_staged")
        report.files_deleted += 1
    report.abandoned_writes_removed = store.remove_abandoned_writes(f"{job_prefix}/", ABANDONED_WRITE_AGE_S)
    if not report.damaged:
        pins.delete_pins(own, pins.released_restore_pins(held, job_prefix.split("/", 1)[1], kept[-1]))
        try:
            _shrink_checkpoint_pins(own, job_prefix, retained)
        except (ObjectNotFoundError, CorruptionError) as err:  # nothing shrunk: pins only keep more
            _damaged(report, job_prefix, f"{err}; the job's pins at other jobs were not shrunk")
    return report


def _shrink_checkpoint_pins(store: ObjectStore, job_prefix: str, retained: list[JobCheckpoint]) -> None:
    """A forked job's full sweep: its checkpoint pins at other jobs shrink to what its
    retained checkpoints and savepoints still name (``pins.shrink_pins``). Runs after
    the expired checkpoints were deleted, so no reader of this job starts from one that
    names more. Cost for a job never forked: one GET (its fork record, absent)."""
    owners = pins.held_at(store, job_prefix)
    if not owners:
        return
    named: dict[str, set[str]] = {}
    for ckpt in retained:
        for owner, files in pins.files_by_owner(store, ckpt).items():
            named.setdefault(owner, set()).update(files)
    for sp in savepoints.list_savepoints(store, job_prefix.split("/", 1)[1]):
        for owner, files in pins.files_by_owner(store, sp.checkpoint).items():
            named.setdefault(owner, set()).update(files)
    pins.shrink_pins(store, job_prefix, pins.CHECKPOINTS_PIN, owners, named)


def _read_or_error(store: ObjectStore, job_prefix: str, epoch: int) -> JobCheckpoint | Exception:
    try:
        return read_checkpoint(store, job_prefix, epoch)
    except (ObjectNotFoundError, CorruptionError) as err:
        return err


class IncrementalRetention:
    """The driver's checkpoint retention after each epoch, in O(1) requests per epoch:
    deletes what expired checkpoints made garbage, as the checkpoints recorded it
    (module docstring), never listing the job's files nor reading range manifests.

    Per call, when checkpoint e (and older) expire: one LIST of ``checkpoints/`` (the
    commit log), the retention floor's PUT (first: the fence, as in ``cleanup_job``),
    one ``delete_many`` of the expired checkpoints and superseded markers, then the
    garbage in batches of ``DELETE_BATCH`` keys sent ``REQUEST_THREADS`` at a time: the
    objects checkpoint e+1's ranges dropped and e's staged output files; and, for the
    checkpoints committed since the previous call, what their tasks wrote and their
    manifests do not name (``JobCheckpoint.unkept``: garbage from the commit on). A
    checkpoint this runner committed is known from ``committed``; another costs one GET
    (after a restart: each retained one, once).

    Checkpoints first, then files: a crash in between leaves garbage (for the full
    sweep), never a retained checkpoint naming a deleted file. Nothing deleted here is
    a file an epoch in flight may need: it was named only by expired checkpoints (or
    written by a committed task attempt and named by none), and an epoch runs from the
    newest checkpoint, which is retained. So unlike the full sweep this needs neither
    the lease nor the re-check; a driver lagging behind by the retention count is fenced
    at its commit (``dkvstream.operators.runtime.checkpoints``) whatever it finds missing.

    Falls back to the full sweep (``cleanup_job(concurrent=True)``) when it cannot tell:
    an expired checkpoint or its successor does not read (the sweep reports the damage)
    or is not the next epoch, or an operator's drops are unknown (a rescale epoch, a
    table shared after a rescale dropped, an operator removed from the job, a
    checkpoint written before ``dropped`` existed); and every ``full_sweep_every`` calls, which also collects what no
    checkpoint records: failed task attempts' files, remote compaction results, what a
    crash between the two deletions above left, abandoned writes.

    A damaged retained object that no expiry needs is not noticed here (nothing it
    could name is deleted either: only expired checkpoints' garbage is); the full sweep
    and the Dagster ``verified`` check report it.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        retain: checkpoints to keep, >= 1.
        full_sweep_every: run the full sweep instead every this many calls (>= 1), or
            None: only when needed (leave the periodic sweep to the Dagster ``cleanup``
            op).

    Raises:
        ValueError: ``retain`` < 1 or ``full_sweep_every`` < 1.
    """

    def __init__(self, store: ObjectStore, job_prefix: str, retain: int,
                 full_sweep_every: int | None = None) -> None:
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        if full_sweep_every is not None and full_sweep_every < 1:
            raise ValueError(f"full_sweep_every must be >= 1 or None, got {full_sweep_every}")
        self.store, self.job_prefix, self.retain = store, job_prefix, retain
        self.full_sweep_every = full_sweep_every
        self._own = f"{job_prefix}/"
        self._pins = pins.PinCache(store, job_prefix)  # one LIST per epoch while no pin changes
        self._calls = 0
        # epoch -> (staged output keys, dropped objects or None, unkept objects or None),
        # of checkpoints this runner committed or read; pruned below the retention floor.
        self._known: dict[int, _Record] = {}
        # Unkept objects are deleted for the epochs up to this one (None: none yet, so
        # the first call takes every retained checkpoint's, which a crash may have left).
        self._unkept_through: int | None = None

    def committed(self, ckpt: JobCheckpoint) -> None:
        """Remembers what retention needs of a checkpoint just committed (no request)."""
        self._known[ckpt.epoch] = self._record(ckpt)

    def _record(self, ckpt: JobCheckpoint) -> _Record:
        decoded = []
        for value in (ckpt.dropped, ckpt.unkept):
            try:
                decoded.append(decode_objects(value, self.job_prefix, ckpt.layout))
            except (ValueError, TypeError, AttributeError):  # a malformed field: unknown
                decoded.append(None)
        return _Record([k for keys in ckpt.outputs.values() for k in keys], *decoded,
                       frozenset(ckpt.operators), frozenset(ckpt.dropped or ()))

    def _known_or_read(self, epoch: int) -> _Record | None:
        if epoch not in self._known:
            try:
                self._known[epoch] = self._record(read_checkpoint(self.store, self.job_prefix, epoch))
            except (ObjectNotFoundError, CorruptionError):
                return None
        return self._known[epoch]

    def apply(self) -> CleanupReport:
        """Expires the checkpoints older than the newest ``retain`` and deletes their
        garbage (see the class docstring).

        Returns:
            A ``CleanupReport`` (``full_sweep`` says why the full sweep ran instead, if
            it did).
        """
        self._calls += 1
        if self.full_sweep_every is not None and self._calls % self.full_sweep_every == 0:
            return self._full_sweep(f"every {self.full_sweep_every} epochs")
        commits = read_commit_log(self.store, self.job_prefix)
        epochs = commits.epochs
        kept, expired = epochs[-self.retain:], epochs[:-self.retain]
        report = CleanupReport(retained_epochs=kept)
        if not kept:
            return report
        state: dict[str, int] = {}
        staged: list[str] = []
        for i, epoch in enumerate(expired):
            successor = epochs[i + 1]
            this, after = self._known_or_read(epoch), self._known_or_read(successor)
            if this is None or after is None:
                return self._full_sweep(f"checkpoint {epoch} or {successor} does not read")
            if successor != epoch + 1 or after.dropped is None or not this.operators <= after.recorded:
                # (An operator no longer in the job left its ranges' files unrecorded.)
                return self._full_sweep(f"what epoch {successor} dropped is unknown")
            staged += this.staged
            state.update(after.dropped)
        done = self._unkept_through
        for epoch in [e for e in epochs if done is None or e > done]:
            record = self._known_or_read(epoch)
            if record is not None and record.unkept:
                state.update(record.unkept)
        garbage = commits.withdrawn + commits.old_markers
        if expired:
            retire_through(self.store, self.job_prefix, expired[-1])  # first: the fence
            garbage += [checkpoint_key(self.job_prefix, e) for e in expired]
            if commits.retired_through:  # the floor written above superseded it
                garbage.append(paths.retired_key(self.job_prefix, commits.retired_through))
        if garbage:
            self.store.delete_many(garbage)
            fault_point("cleanup_checkpoint")
        report.checkpoints_deleted = len(expired)
        if state:
            # Never another job's file (a fork's checkpoints name its parent's), nor a
            # pinned one; pins are listed after the checkpoints went (pins.py).
            try:
                pinned = self._pins.pinned_keys()
            except CorruptionError as err:
                _damaged(report, self.job_prefix, f"{err}; no file is collected")
                return report
            state = {k: n for k, n in state.items() if k.startswith(self._own) and k not in pinned}
        self._delete({"gc_delete": sorted(state), "cleanup_staged": staged})
        report.files_deleted = len(state) + len(staged)
        report.bytes_freed = sum(state.values())
        floor = expired[-1] if expired else commits.retired_through
        self._known = {e: r for e, r in self._known.items() if e > floor}
        self._unkept_through = kept[-1]
        return report

    def _delete(self, keys_by_point: dict[str, list[str]]) -> None:
        """Deletes the keys in batches of ``DELETE_BATCH``, all batches in parallel; the
        fault point named by a batch's key passes after it."""
        batches = [(point, keys[i:i + DELETE_BATCH]) for point, keys in keys_by_point.items()
                   for i in range(0, len(keys), DELETE_BATCH)]

        def delete(batch: tuple[str, list[str]]) -> None:
            self.store.delete_many(batch[1])
            fault_point(batch[0])

        map_requests(delete, batches)

    def _full_sweep(self, why: str) -> CleanupReport:
        report = cleanup_job(self.store, self.job_prefix, self.retain, concurrent=True)
        report.full_sweep = why
        self._known = {e: r for e, r in self._known.items() if e in set(report.retained_epochs)}
        if report.retained_epochs and not report.deferred and not report.damaged:
            self._unkept_through = report.retained_epochs[-1]  # the sweep took them
        return report


@dataclass(frozen=True)
class _Record:
    """What retention needs of one checkpoint (``JobCheckpoint`` fields decoded)."""

    staged: list[str]
    dropped: dict[str, int] | None
    unkept: dict[str, int] | None
    operators: frozenset[str]  # the checkpoint's operators
    recorded: frozenset[str]  # the operators its ``dropped`` covers


def _damaged(report: CleanupReport, job_prefix: str, message: str) -> None:
    report.damaged.append(message)
    log.warning("%s: retention found a damaged object and went on without it: %s",
                job_prefix, message)


def _in_flight(store: ObjectStore, job_prefix: str, newest: int) -> str:
    """Why files may not be collected now ("" if they may): a live lease, or a newer epoch."""
    epochs = list_epochs(store, job_prefix)
    if epochs and epochs[-1] != newest:
        return f"epoch {epochs[-1]} committed during cleanup (newest was {newest}); run again"
    lease = read_lease(store, job_prefix)
    if lease is not None and lease.is_live(newest):
        return f"epoch {lease.epoch} in flight (lease held by {lease.owner})"
    return ""


class _ListedOnly(ForwardingObjectStore):
    """The store as seen through one listing: ``list`` returns only keys listed then, so
    garbage collection can never reach a file written afterwards. Everything else is
    passed through; abandoned writes are still removed by age, which, not the listing,
    keeps writes in progress safe."""

    def __init__(self, inner: ObjectStore, listed: set[str]) -> None:
        super().__init__(inner)
        self._listed = listed

    def list(self, prefix: str) -> list[str]:
        return [k for k in self.inner.list(prefix) if k in self._listed]
