"""Remote compaction: compact a checkpoint's tables outside the task, on the bucket only.

``compact_checkpoint`` reads a committed manifest, plans (the same pure planner as inline
compaction, or a full compaction), writes the outputs under
``<prefix>/compactions/<id>/`` and then publishes ``<prefix>/compactions/<id>.json`` with
``put_if_absent`` (format in ``manifest.py``). Until that object exists the directory is
*in progress*: garbage collection leaves it alone by default (``gc.py``).

The running DKV instance later calls ``DKV.install_pending_compactions``, which installs a
result only if it is still valid against its current level list (``can_install``) and
discards it otherwise. Either way the result id goes into the next manifest's
``handled_compactions``, so it is never looked at again.

Ids start with a zero-padded nanosecond timestamp, so listing order is publication order
(roughly) and installation applies older results first.
"""

from __future__ import annotations

import time
import uuid

from dkvstream.storage.dkv.compaction import CompactionPlan, plan_compaction, plan_full, run_compaction
from dkvstream.storage.dkv.invariants import check_manifest
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import RemoteResult, decode_result, encode_result, load_manifest
from dkvstream.storage.dkv.options import DKVOptions
from dkvstream.storage.dkv.paths import PathResolver, compaction_result_key, compactions_dir, parse_result_key
from dkvstream.storage.dkv.tablestore import TableStore
from dkvstream.storage.objectstore import ObjectStore


def new_compaction_id() -> str:
    """Returns a fresh id: ``<ns timestamp, 20 digits>-<12 hex>``."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def compact_checkpoint(
    store: ObjectStore, prefix: str, manifest_key: str, options: DKVOptions | None = None,
    full: bool = False,
) -> str | None:
    """Compacts one plan's worth of a checkpoint's tables and publishes the result.

    Args:
        store: The object store.
        prefix: DKV prefix of the range (results and outputs go under it).
        manifest_key: The committed manifest to plan from.
        options: Triggers, level sizes, table format; ``DKVOptions()`` if None.
        full: Merge every table into the last level instead of asking the planner.

    Returns:
        The result object's key, or None if there was nothing to do.

    Raises:
        ObjectNotFoundError: The manifest or an input table is missing.
        CorruptionError: The manifest or an input fails verification.
    """
    options = options or DKVOptions()
    m = load_manifest(store, manifest_key)
    check_manifest(m, store.uri(manifest_key))
    plan = plan_full(m.levels) if full else plan_compaction(m.levels, options)
    if plan is None:
        return None
    cid = new_compaction_id()
    paths = PathResolver(prefix, compaction_id=cid)
    tables = TableStore(store, paths, options)
    # The manifest's filter, at the clocks of its checkpoint: the same entries expire
    # wherever and whenever the plan runs.
    result = run_compaction(plan, tables, options.target_file_bytes, m.compaction_filter)
    remote = RemoteResult(
        id=cid, prefix=paths.prefix, base_manifest=manifest_key,
        inputs=tuple(zip(plan.input_levels, plan.inputs)), output_level=plan.output_level,
        outputs=result.outputs, drop_tombstones=plan.drop_tombstones, deeper=plan.deeper,
        reason=plan.reason,
    )
    key = compaction_result_key(paths.prefix, cid)
    store.put_if_absent(key, encode_result(remote))
    return key


def list_results(store: ObjectStore, prefix: str) -> dict[str, str]:
    """Returns ``{id: result object key}`` of every result published under ``prefix``
    (one LIST of ``<prefix>/compactions/``; output directories are skipped)."""
    listed: dict[str, str] = {}
    for key in store.list(compactions_dir(prefix)):
        cid = parse_result_key(prefix, key)
        if cid is not None:
            listed[cid] = key
    return listed


def load_result(store: ObjectStore, key: str) -> RemoteResult:
    """Reads and verifies a published result."""
    return decode_result(store.get(key), store.uri(key))


def can_install(levels: LevelList, r: RemoteResult) -> bool:
    """Whether ``r`` may replace its inputs in ``levels``.

    True iff (1) every input is live, in the same level, with the same reference (same
    clip and bounds); (2) no table outside the inputs below ``r.output_level`` overlaps the
    inputs' key span unless it was already there when the plan was made (``r.deeper``):
    a newer table pushed below the output level would otherwise sit under older data, and
    dropped tombstones would let older versions resurface; (3) the outputs do not overlap
    the other tables of ``r.output_level`` (checked by ``LevelList.with_compaction``).
    """
    live = {t.key: (i, t) for i, lvl in enumerate(levels.levels) for t in lvl}
    for lvl, t in r.inputs:
        if live.get(t.key) != (lvl, t):
            return False
    if not r.inputs:
        return False
    lo = min(t.min_key for _, t in r.inputs)
    hi = max(t.max_key for _, t in r.inputs)
    inputs = {t.key for _, t in r.inputs}
    allowed = set(r.deeper)
    for i in range(r.output_level + 1, len(levels.levels)):
        for t in levels.levels[i]:
            if t.key in inputs or t.max_key < lo or t.min_key > hi:
                continue
            if r.drop_tombstones or t.key not in allowed:
                return False
    return True


__all__ = ["CompactionPlan", "can_install", "compact_checkpoint", "list_results", "load_result"]
