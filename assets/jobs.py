"""Maintenance ops and jobs: compaction, flush and cleanup of a running stream job.

Every op works on the object store only (no Spark), so it runs while the job runs:

* ``plan_compaction``: plans, per key-group range of the newest checkpoint, what
  compaction would do (the pure ``dkvstream.storage.dkv.compaction.plan_compaction`` over the
  range's manifest); the plan is the op's output and its metadata.
* ``compact``: runs remote compaction for the newest checkpoint
  (``dkvstream.operators.runtime.remote_compaction.compact_job``) and publishes the results, which the job
  installs at its next epoch.
* ``flush``: writes a flush request; the job's next epoch flushes every memtable to
  level-0 SSTables (``dkvstream.operators.runtime.control``).
* ``cleanup``: checkpoint retention and garbage collection, safe while an epoch is in
  flight (``dkvstream.operators.runtime.cleanup.cleanup_job(..., concurrent=True)``); reports bytes freed.

Jobs: ``compaction`` (``plan_compaction`` then ``compact``), ``memtable_flush``
(``flush``) and ``garbage_collection`` (``cleanup``). The
stream job they act on is op config (``job``: the job's name), which the sensors fill in.
"""

import time

from dagster import Config, MetadataValue, OpExecutionContext, Out, Output, job, op

from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators import paths
from dkvstream.operators.io.table_layout import storage_options
from dkvstream.operators.io.table_maintenance import compact_table, delta_tables, small_files, vacuum_table
from dkvstream.operators.runtime.checkpoints import latest_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.control import pending_flush_requests, request_flush
from dkvstream.operators.runtime.remote_compaction import compact_job
from dkvstream.storage.dkv.compaction import plan_compaction as plan_range
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.remote_compaction import load_result


class StreamJobConfig(Config):
    """Which stream job an op acts on.

    Attributes:
        job: the stream job's name (its files are under ``jobs/<job>/``).
    """

    job: str


class FlushConfig(StreamJobConfig):
    """Config of ``flush``.

    Attributes:
        wait_s: wait up to this many seconds for an epoch to serve the request (0: don't).
    """

    wait_s: float = 0.0


def job_prefix(name: str) -> str:
    """Object-store prefix of stream job ``name``."""
    return paths.job_prefix(name)


@op(out=Out(dict), description="Plan compaction of every range of the newest checkpoint (pure, no writes)")
def plan_compaction(context: OpExecutionContext, config: StreamJobConfig, object_store: ObjectStoreResource,
                    dkv: DKVSettingsResource):
    store = object_store.open()
    prefix = job_prefix(config.job)
    ckpt = latest_checkpoint(store, prefix)
    if ckpt is None:
        raise LookupError(f"{store.uri(prefix)}: no committed checkpoint to plan from")
    options = dkv.options()
    plans = []
    for op_name, ranges in sorted(ckpt.operators.items()):
        for label, manifest_key in sorted(ranges.items()):
            levels = load_manifest(store, manifest_key).levels
            plan = plan_range(levels, options)
            plans.append({
                "operator": op_name, "range": label, "l0_tables": len(levels.l0),
                "reason": plan.reason if plan else "-",
                "inputs": len(plan.inputs) if plan else 0,
                "input_bytes": plan.input_bytes if plan else 0,
                "output_level": plan.output_level if plan else 0,
                "drop_tombstones": plan.drop_tombstones if plan else False,
            })
    rows = ["| operator | range | L0 tables | reason | inputs | input bytes | output level |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| {p['operator']} | {p['range']} | {p['l0_tables']} | {p['reason']} | {p['inputs']} | "
             f"{p['input_bytes']:,} | {p['output_level']} |" for p in plans]
    working = [p for p in plans if p["inputs"]]
    yield Output({"job": config.job, "epoch": ckpt.epoch, "plans": plans}, metadata={
        "epoch": MetadataValue.int(ckpt.epoch),
        "ranges": MetadataValue.int(len(plans)),
        "ranges_to_compact": MetadataValue.int(len(working)),
        "input_bytes": MetadataValue.int(sum(p["input_bytes"] for p in working)),
        "plan": MetadataValue.md("\n".join(rows)),
    })


@op(description="Run remote compaction for the newest checkpoint and publish the results")
def compact(context: OpExecutionContext, plan: dict, object_store: ObjectStoreResource,
            dkv: DKVSettingsResource) -> Output[list]:
    store = object_store.open()
    if not any(p["inputs"] for p in plan["plans"]):
        context.log.info(f"job {plan['job']}: nothing to compact at epoch {plan['epoch']}")
        return Output([], metadata={"results": MetadataValue.int(0)})
    started = time.perf_counter()
    # compact_job replans from the newest checkpoint, which may be newer than the plan.
    keys = compact_job(store, job_prefix(plan["job"]), dkv.options())
    results = [load_result(store, k) for k in keys]
    seconds = time.perf_counter() - started
    in_bytes = sum(t.size for r in results for _, t in r.inputs)
    out_bytes = sum(t.size for r in results for t in r.outputs)
    return Output(keys, metadata={
        "results": MetadataValue.int(len(keys)),
        "input_tables": MetadataValue.int(sum(len(r.inputs) for r in results)),
        "output_tables": MetadataValue.int(sum(len(r.outputs) for r in results)),
        "input_bytes": MetadataValue.int(in_bytes),
        "output_bytes": MetadataValue.int(out_bytes),
        "duration_s": MetadataValue.float(round(seconds, 3)),
        "bytes_per_s": MetadataValue.float(round(in_bytes / seconds, 1) if seconds > 0 else 0.0),
        "result_uris": MetadataValue.json([store.uri(k) for k in keys]),
    })


@op(description="Ask the running job to flush its memtables at its next epoch")
def flush(context: OpExecutionContext, config: FlushConfig, object_store: ObjectStoreResource) -> Output[str]:
    store = object_store.open()
    prefix = job_prefix(config.job)
    key = request_flush(store, prefix, reason=f"dagster run {context.run_id}")
    served = False
    deadline = time.monotonic() + config.wait_s
    while config.wait_s > 0 and time.monotonic() < deadline:
        if key not in pending_flush_requests(store, prefix):
            served = True
            break
        time.sleep(0.5)
    return Output(key, metadata={"request_uri": MetadataValue.path(store.uri(key)),
                                 "served": MetadataValue.bool(served)})


@op(description="Delete expired checkpoints and unreferenced files (safe while an epoch runs); report bytes freed")
def cleanup(context: OpExecutionContext, config: StreamJobConfig, object_store: ObjectStoreResource,
            dkv: DKVSettingsResource) -> Output[dict]:
    store = object_store.open()
    report = cleanup_job(store, job_prefix(config.job), dkv.retain_checkpoints, concurrent=True)
    if report.deferred:
        context.log.warning(f"job {config.job}: files not collected: {report.deferred}")
    for damage in report.damaged:  # what a damaged retained object could name was kept
        context.log.warning(f"job {config.job}: {damage}")
    return Output({"bytes_freed": report.bytes_freed, "files_deleted": report.files_deleted,
                   "checkpoints_deleted": report.checkpoints_deleted, "deferred": report.deferred,
                   "abandoned_writes_removed": report.abandoned_writes_removed,
                   "damaged": report.damaged},
                  metadata={
                      "bytes_freed": MetadataValue.int(report.bytes_freed),
                      "files_deleted": MetadataValue.int(report.files_deleted),
                      "checkpoints_deleted": MetadataValue.int(report.checkpoints_deleted),
                      "abandoned_writes_removed": MetadataValue.int(report.abandoned_writes_removed),
                      "retained_epochs": MetadataValue.json(report.retained_epochs),
                      "deferred": MetadataValue.text(report.deferred or "no"),
                      "damaged": MetadataValue.json(report.damaged),
                  })


class TableCompactionConfig(StreamJobConfig):
    """Config of ``compact_tables``.

    Attributes:
        target_bytes: files below this size are small; OPTIMIZE writes files of about it.
        min_small_files: compact a table only when it has at least this many small files.
        retention_hours: after compacting, delete files no version of the last this many
            hours needs (VACUUM); time travel then reaches back only that far. None: keep
            every file (time travel to any epoch).
    """

    target_bytes: int = 32 << 20
    min_small_files: int = 16
    retention_hours: int | None = None


@op(description="Compact the small files of a stream job's Delta table sinks (delta-rs OPTIMIZE)")
def compact_tables(context: OpExecutionContext, config: TableCompactionConfig,
                   object_store: ObjectStoreResource) -> Output[list]:
    store = object_store.open()
    done, opts = [], storage_options(store)
    for uri in delta_tables(store, job_prefix(config.job)):
        small = small_files(uri, config.target_bytes, opts)
        if small < config.min_small_files:
            context.log.info(f"{uri}: {small} small files, below {config.min_small_files}")
            continue
        metrics = compact_table(uri, config.target_bytes, opts)
        vacuumed = [] if config.retention_hours is None else vacuum_table(uri, config.retention_hours, opts)
        done.append({"table": uri, "small_files": small, "files_added": metrics.get("numFilesAdded", 0),
                     "files_removed": metrics.get("numFilesRemoved", 0), "version": metrics["version"],
                     "files_vacuumed": len(vacuumed)})
    return Output(done, metadata={
        "tables_compacted": MetadataValue.int(len(done)),
        "files_removed": MetadataValue.int(sum(d["files_removed"] for d in done)),
        "files_added": MetadataValue.int(sum(d["files_added"] for d in done)),
        "files_vacuumed": MetadataValue.int(sum(d["files_vacuumed"] for d in done)),
        "tables": MetadataValue.json(done),
    })


@job(description="Plan and run remote compaction of a stream job's newest checkpoint")
def compaction():
    compact(plan_compaction())


@job(name="memtable_flush", description="Flush a stream job's memtables at its next epoch")
def flush_job():
    flush()


@job(name="garbage_collection", description="Checkpoint retention and garbage collection of a stream job")
def cleanup_job_def():
    cleanup()


def op_config(op_name: str, stream_job: str, **extra) -> dict:
    """Run config of a maintenance job whose first op is ``op_name``, for ``stream_job``."""
    return {"ops": {op_name: {"config": {"job": stream_job, **extra}}}}


@job(name="table_compaction", description="Compact the small files of a stream job's Delta table sinks")
def table_compaction_job():
    compact_tables()


MAINTENANCE_JOBS = [compaction, flush_job, cleanup_job_def, table_compaction_job]
