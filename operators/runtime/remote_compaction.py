"""Compaction of a job's state outside the job, on object storage only.

For each key-group range of the newest checkpoint, plan and run a compaction against
that range's DKV manifest and publish the result (``dkvstream.storage.dkv.remote_compaction``).
The job installs a result at its next epoch only if every input table is still live in
the range's level list, and discards it otherwise (docs/design.md, "DKV files"). This is
what the Dagster ``compact`` op runs.
"""
from __future__ import annotations

from dkvstream.operators import paths
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint
from dkvstream.storage.objectstore import ObjectStore


def compact_job(store: ObjectStore, job_prefix: str, options: DKVOptions | None = None) -> list[str]:
    """Compact every range of the newest checkpoint that needs it.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        options: DKV options (compaction triggers and file sizes).

    Returns:
        Object keys of the published compaction results (empty: nothing to do).

    Raises:
        LookupError: the job has no committed checkpoint.
    """
    ckpt = latest_checkpoint(store, job_prefix)
    if ckpt is None:
        raise LookupError(f"{store.uri(job_prefix)}: no committed checkpoint to compact")
    results = []
    for op, ranges in sorted(ckpt.operators.items()):
        for label, manifest_key in sorted(ranges.items()):
            key = compact_checkpoint(store, paths.state_prefix(job_prefix, op, label, ckpt.layout), manifest_key,
                                     options)
            if key is not None:
                results.append(key)
    return results
