"""Maintenance of table sinks' Delta tables: find them, count small files, compact
(OPTIMIZE) and vacuum. The ``table_compaction`` op and sensor (``assets``) call these;
each works on a table URI and delta-rs ``storage_options`` (``table_layout.storage_options``).
"""
from __future__ import annotations

import pyarrow as pa

from dkvstream.operators import paths
from dkvstream.operators.io.table_layout import delta_uri, storage_options
from dkvstream.storage.objectstore import ObjectStore


def delta_tables(store: ObjectStore, job_prefix: str) -> list[str]:
    """URIs of the Delta tables among a job's sinks (``<job>/sinks/<name>/_delta_log/``)."""
    from deltalake import DeltaTable

    depth = len(job_prefix.split("/")) + 1
    names = sorted({k.split("/")[depth] for k in store.list(paths.sinks_root(job_prefix))
                    if "/_delta_log/" in k})
    uris = [delta_uri(store, paths.sink_prefix(job_prefix, n)) for n in names]
    return [u for u in uris if DeltaTable.is_deltatable(u, storage_options=storage_options(store))]


def small_files(uri: str, target_bytes: int, opts: dict | None = None) -> int:
    """Data files of the table's current version smaller than ``target_bytes``."""
    from deltalake import DeltaTable

    # deltalake 1.x returns an arro3 table; pa.table converts it through the Arrow C interface.
    actions = DeltaTable(uri, storage_options=opts).get_add_actions(flatten=True)
    return sum(1 for s in pa.table(actions).column("size_bytes").to_pylist() if s < target_bytes)


def compact_table(uri: str, target_bytes: int, opts: dict | None = None) -> dict:
    """Rewrites the table's small files into files of about ``target_bytes``
    (delta-rs OPTIMIZE, bin-packing per partition; a ``dataChange=false`` commit, so
    readers and the job's next merge see the same rows; an epoch's commit that follows
    it fails, and ``TableSink.publish_in_tasks`` merges that epoch again on the new
    version). Old files stay for
    time travel until a vacuum. Returns delta-rs's metrics (``numFilesAdded``,
    ``numFilesRemoved``, ...) plus ``version``."""
    from deltalake import DeltaTable

    dt = DeltaTable(uri, storage_options=opts)
    metrics = dt.optimize.compact(target_size=target_bytes)
    dt.update_incremental()
    return {**metrics, "version": dt.version()}


# Files no commit names (written by a table sink's merge task whose publish crashed or
# was retried) are deleted once this old at least: younger ones may belong to a publish
# in flight, which is about to commit them.
UNCOMMITTED_FILE_HOURS = 24


def vacuum_table(uri: str, retention_hours: int, opts: dict | None = None) -> list[str]:
    """Deletes data files that no table version of the last ``retention_hours`` needs
    (delta-rs VACUUM), and files no commit names that are ``UNCOMMITTED_FILE_HOURS`` old
    or more (delta-rs's full VACUUM). Time travel (``as_of_epoch`` / ``as_of_time``) then
    reaches only versions younger than ``retention_hours``; an older one fails reading a
    deleted file.

    Returns:
        URIs (or paths) of the deleted files.
    """
    from deltalake import DeltaTable

    dt = DeltaTable(uri, storage_options=opts)
    removed = dt.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)
    return removed + dt.vacuum(retention_hours=max(retention_hours, UNCOMMITTED_FILE_HOURS), dry_run=False,
                               enforce_retention_duration=False, full=True)
