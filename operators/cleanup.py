"""Checkpoint retention and garbage collection of a job's files.

Keeps the newest ``retain`` job checkpoints and deletes what only older checkpoints
named: expired checkpoint manifests first (so a crash half-way leaves garbage, never a
dangling reference), then DKV files no retained range manifest of any range names (the
seed's data-ownership policy: after a rescale a table may be shared by several ranges,
so all ranges of an operator are collected together), then staged output files of
committed epochs that no retained checkpoint names. Published sink files are output,
never garbage.

Safe while no epoch of the job is running (the runner calls it between epochs).
Staged files of epochs after the newest checkpoint are in flight and left alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from operators.checkpoints import checkpoint_key, list_epochs, read_checkpoint
from storage.dkv.gc import collect_garbage
from storage.objectstore import ObjectStore

_STAGED_EPOCH = re.compile(r"/staging/epoch=(\d+)/")


@dataclass
class CleanupReport:
    """What a cleanup did.

    Attributes:
        retained_epochs: epochs whose checkpoints are kept.
        checkpoints_deleted: expired job checkpoints deleted.
        files_deleted: DKV and staged files deleted.
        bytes_freed: their total size, bytes.
    """

    retained_epochs: list[int]
    checkpoints_deleted: int = 0
    files_deleted: int = 0
    bytes_freed: int = 0


def cleanup_job(store: ObjectStore, job_prefix: str, retain: int) -> CleanupReport:
    """Keep the newest ``retain`` checkpoints of the job under ``job_prefix``; free the rest.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        retain: checkpoints to keep, at least 1.

    Returns:
        A ``CleanupReport``.

    Raises:
        ValueError: ``retain`` < 1.
    """
    if retain < 1:
        raise ValueError(f"retain must be >= 1, got {retain}")
    epochs = list_epochs(store, job_prefix)
    kept, expired = epochs[-retain:], epochs[:-retain]
    report = CleanupReport(retained_epochs=kept)
    if not kept:
        return report
    retained = [read_checkpoint(store, job_prefix, e) for e in kept]
    for e in expired:
        store.delete(checkpoint_key(job_prefix, e))
        report.checkpoints_deleted += 1

    prefix_root = f"{job_prefix}/state/"
    range_prefixes: dict[str, set[str]] = {}  # operator -> DKV prefixes of all its ranges, old and new
    for key in store.list(prefix_root):
        op, label = key[len(prefix_root):].split("/", 2)[:2]
        range_prefixes.setdefault(op, set()).add(f"{prefix_root}{op}/{label}")
    for op, prefixes in sorted(range_prefixes.items()):
        manifests = [m for c in retained for m in c.operators.get(op, {}).values()]
        stats = collect_garbage(store, sorted(prefixes), manifests)
        report.files_deleted += stats["deleted"]
        report.bytes_freed += stats["bytes_freed"]

    named = {k for c in retained for keys in c.outputs.values() for k in keys}
    newest = kept[-1]
    for key in store.list(f"{job_prefix}/staging/"):
        m = _STAGED_EPOCH.search(key)
        if key in named or m is None or int(m.group(1)) > newest:
            continue
        report.bytes_freed += store.size(key)
        store.delete(key)
        report.files_deleted += 1
    return report
