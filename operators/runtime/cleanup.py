"""Checkpoint retention and garbage collection of a job's files.

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
   lease is live (``operators.runtime.control``: written by the driver before its tasks run,
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

The fence (``operators.runtime.checkpoints``): before deleting expired checkpoints, the
retention floor is raised to the newest of them, so a lagging driver that writes one of
them again is fenced; checkpoint objects at or below the floor (such a driver's write)
and commit records and floors older than the newest of their kind are deleted.

Damage that only retention trips over (a retained checkpoint or one of its range
manifests that does not read) does not fail the cleanup: what the damaged object names
cannot be known, so the files it could name are not collected (of its operator; all files
if the checkpoint object itself is damaged), and the damage is reported in
``CleanupReport.damaged`` and logged as a warning. A restart falling back to that
checkpoint would refuse it; the Dagster ``verified`` check reports it.

Last, writes abandoned by killed writers (a local ``.tmp-`` file, an S3 multipart upload
never completed) under the job's prefix are removed once ``ABANDONED_WRITE_AGE_S`` old:
no write of a live writer takes that long (an epoch's lease lasts at most 30 minutes).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from operators import paths
from operators.paths import checkpoint_key
from operators.runtime.checkpoints import (
    list_epochs,
    read_checkpoint,
    read_commit_log,
    retire_through,
)
from operators.runtime.control import read_lease
from storage.dkv.gc import collect_garbage
from storage.errors import CorruptionError, ObjectNotFoundError
from storage.faults import fault_point
from storage.objectstore import ObjectStore

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
    """

    retained_epochs: list[int]
    checkpoints_deleted: int = 0
    files_deleted: int = 0
    bytes_freed: int = 0
    deferred: str = ""
    abandoned_writes_removed: int = 0
    damaged: list[str] = field(default_factory=list)


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
    if concurrent:
        report.deferred = _in_flight(store, job_prefix, kept[-1])
        if not report.deferred:
            listed = (store.list(paths.state_root(job_prefix)),
                      store.list(paths.staging_root(job_prefix)))
            report.deferred = _in_flight(store, job_prefix, kept[-1])
            store = _ListedOnly(store, {*listed[0], *listed[1]})
    retained = []
    for e in kept:
        try:
            retained.append(read_checkpoint(store, job_prefix, e))
        except (ObjectNotFoundError, CorruptionError) as err:
            _damaged(report, job_prefix,
                     f"retained checkpoint epoch {e}: {err}; no file is collected")
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

    prefix_root = paths.state_root(job_prefix)
    state_keys, staged_keys = listed or (store.list(prefix_root),
                                         store.list(paths.staging_root(job_prefix)))
    range_prefixes: dict[str, set[str]] = {}  # operator -> DKV prefixes of all its ranges, old and new
    for key in state_keys:
        op, label = key[len(prefix_root):].split("/", 2)[:2]
        range_prefixes.setdefault(op, set()).add(paths.state_prefix(job_prefix, op, label))
    for op, prefixes in sorted(range_prefixes.items()):
        manifests = [m for c in retained for m in c.operators.get(op, {}).values()]
        try:
            stats = collect_garbage(store, sorted(prefixes), manifests)
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
    return report


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


class _ListedOnly(ObjectStore):
    """The store as seen through one listing: ``list`` returns only keys listed then, so
    garbage collection can never reach a file written afterwards. Everything else is
    passed through."""

    def __init__(self, inner: ObjectStore, listed: set[str]) -> None:
        super().__init__()
        self._inner = inner
        self._listed = listed
        self.stats = inner.stats

    @property
    def root_uri(self) -> str:
        return self._inner.root_uri

    def uri(self, key: str) -> str:
        return self._inner.uri(key)

    def put(self, key: str, data: bytes) -> None:
        self._inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._inner.get_range(key, start, length)

    def size(self, key: str) -> int:
        return self._inner.size(key)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return [k for k in self._inner.list(prefix) if k in self._listed]

    def delete(self, key: str) -> None:
        self._inner.delete(key)

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        # Age, not the listing, keeps writes in progress safe here.
        return self._inner.remove_abandoned_writes(prefix, older_than_s)
