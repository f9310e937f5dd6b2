"""Checkpoint manifests of one DKV instance: loading, publishing, and advancing to a later one.

A checkpoint names the instance's whole state in one manifest (format in ``manifest.py``,
key in ``paths.py``): its tables per level, the WAL objects written since the last flush,
``last_seq`` and ``flushed_seq``, and, after a rescale, its key range and the remote
compactions it has handled. ``DKV.checkpoint`` first makes the buffered writes durable
(``flush.py``) and compacts if due, then ``publish`` checks the manifest against
``invariants.py`` and writes it with ``put_if_absent``, so a name is used once and an
inconsistent manifest never reaches the bucket. ``load_checked`` applies the same checks
to every manifest read back (``DKV.open``, ``DKV.advance_to``, rescaling).

``extends`` is the rule of ``DKV.advance_to``: an instance open at a checkpoint may move
to a later checkpoint of its lineage by replaying only the WAL objects that checkpoint
lists beyond those it holds, if nothing else changed in between (no flush, compaction or
rescale). Flink's task-local recovery plays the same role.

Source: storage/RFC-0001, "Lifecycle"; storage/RFC-0002, "Manifest v2 changes".
"""

from __future__ import annotations

from dkvstream.storage.dkv.invariants import check_manifest
from dkvstream.storage.dkv.manifest import Manifest, load_manifest, publish_manifest
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import ObjectStore


def load_checked(store: ObjectStore, key: str) -> Manifest:
    """Reads the manifest at ``key`` and checks its invariants.

    Raises:
        ObjectNotFoundError: No such manifest.
        CorruptionError: It fails verification or an invariant.
    """
    m = load_manifest(store, key)
    check_manifest(m, store.uri(key))
    return m


def publish(store: ObjectStore, key: str, m: Manifest) -> None:
    """Checks ``m``'s invariants, then writes it under ``key`` once, atomically.

    Raises:
        CorruptionError: ``m`` breaks an invariant (a bug; nothing is written).
        ManifestConflictError: ``key`` already exists.
    """
    check_manifest(m, store.uri(key))
    fault_point("dkv_before_manifest")
    publish_manifest(store, key, m)


def extends(held: Manifest, later: Manifest) -> bool:
    """Whether ``later`` is ``held`` plus more WAL objects, and nothing else changed.

    Args:
        held: The state an instance holds, as a manifest (name and handled compactions
            are not compared).
        later: A later manifest of the same lineage.

    Returns:
        True if ``later`` has the same prefix, level list, key range and
        ``flushed_seq``, a ``last_seq`` not below ``held``'s, lists ``held``'s WAL
        objects first, and its first further WAL object (if any) starts right after
        ``held.last_seq``; replaying ``later.wal[len(held.wal):]`` onto ``held`` then
        gives ``later``'s state.
    """
    n = len(held.wal)
    if (later.prefix != held.prefix or later.levels != held.levels
            or later.key_range != held.key_range or later.flushed_seq != held.flushed_seq
            or later.last_seq < held.last_seq or tuple(later.wal[:n]) != tuple(held.wal)):
        return False
    new = later.wal[n:]
    return not new or new[0].first_seq == held.last_seq + 1
