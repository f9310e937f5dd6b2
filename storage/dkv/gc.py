"""Garbage collection of DKV files under the retention policy (the data-ownership rule).

After a rescale, ranges share tables (``DKV.open_from_parents`` references parent tables in
place), so no single range owns its files. The rule is therefore global over one
operator: the caller passes the prefixes of ALL its ranges (current and former) and ALL
their retained manifests; an object under those prefixes is live iff a retained manifest
names it (``files_named_by``), it is in ``protect``, or it belongs to a remote compaction
that may still be installed:

* a published result (``<p>/compactions/<id>.json``) that no retained manifest of ``p``
  lists as handled and whose base manifest is retained is *pending*: the result and its
  outputs stay. Once a retained manifest lists it as handled (installed or discarded),
  its outputs go unless a retained manifest names them (i.e. unless it was installed).
  A result whose base manifest is gone can no longer be told apart from a stale one and
  is collected the same way.
* a result object and its output directory go together: the result object of a handled
  or stale compaction stays as long as any object of its directory stays (an installed
  output still named by a retained manifest, of this range or of a range that shares
  it after a rescale), and is deleted in the same GC run as its last output. So an
  output directory never outlives its result object, and a directory without one
  really is in progress (without this, the installed outputs would later become
  unnamed, look in progress, and leak).
* an output directory ``<p>/compactions/<id>/`` without a result object is *in progress*
  (a compaction job may be writing it): left alone unless ``include_in_progress=True``
  (use that only when no compaction job can be running, e.g. older than a deadline), or
  unless a retained manifest of ``p`` lists ``<id>`` as handled (then it was published,
  so it is not in progress; such leftovers come from GC runs before the rule above).

Objects outside the given prefixes are never touched, even if unnamed.

Concurrency: a running task writes tables before its manifest is committed, so run GC
only when no task writes under the prefixes, or pass their new files (e.g. everything
newer than the last commit) in ``protect``.
"""

from __future__ import annotations

from collections.abc import Iterable

from dkvstream.storage.dkv.manifest import Manifest, load_manifest
from dkvstream.storage.dkv.paths import compaction_dir, compactions_dir, parse_result_key
from dkvstream.storage.dkv.remote_compaction import load_result
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.faults import fault_point
from dkvstream.storage.objectstore import ObjectStore, map_requests


def _named(key: str, m: Manifest) -> set[str]:
    out = {key}
    out.update(t.key for t in m.levels.all_tables())
    out.update(w.key for w in m.wal)
    return out


def files_named_by(store: ObjectStore, manifest_keys: Iterable[str]) -> set[str]:
    """Returns every object key the manifests reference: themselves, tables, WAL objects.

    Installed remote compaction outputs are tables of the manifests, so they are included.

    Raises:
        ObjectNotFoundError: A manifest is missing.
        CorruptionError: A manifest fails verification.
    """
    out: set[str] = set()
    for key in manifest_keys:
        out |= _named(key, load_manifest(store, key))
    return out


def collect_garbage(
    store: ObjectStore, prefixes: list[str], retained_manifests: list[str],
    protect: Iterable[str] = frozenset(), include_in_progress: bool = False,
) -> dict:
    """Deletes every object under ``prefixes`` that nothing retained needs.

    Args:
        store: The object store.
        prefixes: DKV prefixes of all ranges of one operator (tables may be shared).
        retained_manifests: Every manifest key to keep, of all those ranges.
        protect: Keys never to delete.
        include_in_progress: Also delete output directories of unpublished remote
            compactions (see the module docstring).

    Returns:
        ``{"deleted": int, "bytes_freed": int, "deleted_keys": [str, ...]}``.

    Raises:
        ObjectNotFoundError / CorruptionError: A retained manifest is missing or broken
            (nothing is deleted then).
    """
    # Independent GETs, REQUEST_THREADS at a time: R x P manifests take seconds, not minutes.
    keys = list(dict.fromkeys(retained_manifests))
    manifests = dict(zip(keys, map_requests(lambda k: load_manifest(store, k), keys)))
    keep: set[str] = set(protect)
    handled: dict[str, set[str]] = {}
    for k, m in manifests.items():
        keep |= _named(k, m)
        handled.setdefault(m.prefix, set()).update(m.handled_compactions)
    deleted: list[str] = []
    freed = 0
    for prefix in prefixes:
        p = prefix.strip("/")
        keys = store.list(p + "/")
        cdir = compactions_dir(p)
        results: dict[str, str] = {}
        for key in keys:
            cid = parse_result_key(p, key)
            if cid is not None:
                results[cid] = key
        p_handled = handled.get(p, set())
        named_dirs = {  # compaction ids with an output still named (installed, live)
            k[len(cdir) :].split("/", 1)[0] for k in keys
            if k in keep and k.startswith(cdir) and "/" in k[len(cdir) :]
        }
        keep_dirs: list[str] = []
        for cid, rkey in results.items():
            d = compaction_dir(p, cid)
            if cid in named_dirs:
                keep.add(rkey)  # its installed outputs are still named: the pair stays
            if cid in p_handled:
                continue
            try:
                base = load_result(store, rkey).base_manifest
            except (CorruptionError, ObjectNotFoundError):
                continue
            if base in manifests:
                keep.add(rkey)
                keep_dirs.append(d)
        result_keys = set(results.values())
        for key in keys:
            if key in keep or any(key.startswith(d) for d in keep_dirs):
                continue
            if not include_in_progress and key.startswith(cdir) and key not in result_keys:
                cid = key[len(cdir) :].split("/", 1)[0]
                if cid not in results and cid not in p_handled:
                    continue  # an in-progress compaction's output
            try:
                size = store.size(key)
            except ObjectNotFoundError:
                continue
            store.delete(key)
            fault_point("gc_delete")
            deleted.append(key)
            freed += size
    return {"deleted": len(deleted), "bytes_freed": freed, "deleted_keys": deleted}
