"""Sensors that run the platform: compaction, cleanup and new input, one set per stream job.

* ``<job>_compaction_sensor`` reads the metadata of the newest materialization of
  ``<job>_checkpoint`` and requests a ``compaction`` run when a range's level-0 table
  count reaches ``DKVSettingsResource.l0_compaction_trigger`` or its size amplification
  exceeds ``size_amp_threshold``. Its cursor is the storage id of the last checkpoint
  event it judged, so each checkpoint is judged once and fires at most one run; a
  checkpoint seen while a compaction of the job is still queued or running is skipped
  (its tables are the ones being compacted).
* ``<job>_cleanup_sensor`` lists the job's checkpoints and requests a ``cleanup`` run
  whenever retention has something to delete (more than ``retain_checkpoints``
  committed) for a newest checkpoint or retention setting it has not cleaned up for
  (cursor ``<newest checkpoint's identity>:<retain>``).
* ``<job>_table_compaction_sensor`` (jobs with a ``TableSink``) counts the small files
  of each Delta table sink's current version and requests a ``table_compaction`` run
  when one has at least ``min_small_files`` (``TableCompactionConfig``); cursor: the
  tables (Delta table id and version) it last requested a run for.
* ``<job>_source_sensor`` compares the source's end offsets with the newest checkpoint's
  and starts a run of the job's asset job when new input arrived and no run of it is in
  progress (cursor: the end offsets, the newest checkpoint's identity and the job's
  newest checkpoint event it last started a run for). Before it asks the source for new
  input it checks the source against the newest checkpoint, as a restart does
  (``dkvstream.operators.runtime.recovery.restore_source``): a file source whose log lost objects
  fails the tick with ``RecoveryRefusedError`` instead of logging files under offsets
  the checkpoint says were read. On by default for a live source
  whose job runs in short runs (each run processes the new input and ends); off by
  default for a bounded source (finished data: the bundled flights replay) and for a
  continuous job, whose one long-running run is started and terminated by hand (turned
  on, the sensor restarts it when new input arrives and none is running).

Cursors and run keys name things that never come back. A job reset (its prefix deleted)
numbers its epochs from 1 again and recreates its Delta tables at version 0, so an epoch
or a table version alone would repeat: the sensor would take the new checkpoints for
ones it already handled, and Dagster skips a run request whose run key an earlier run
had. A checkpoint is named by its epoch and a digest of its bytes (a committed
checkpoint is written once and names DKV manifests under the committing task attempts'
fresh ids, so a later incarnation's epoch e differs from an earlier one's); a Delta table
by its table id (a fresh uuid when the table is created) and version; a commit seen by
Dagster by its event's storage id, which only grows.

Thresholds are the ``dkv`` resource's settings (``$DKVSTREAM_DKV_*``); tick intervals
come from ``$DKVSTREAM_SENSOR_INTERVAL_S`` (default 15 s).
"""
import hashlib
import json
import os

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dkvstream.assets.checkpoints import L0_TABLES_MAX, SIZE_AMP_MAX, checkpoint_asset_key
from dkvstream.assets.jobs import (
    TableCompactionConfig,
    cleanup_job_def,
    compaction,
    op_config,
    table_compaction_job,
)
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.table_layout import storage_options
from dkvstream.operators.io.table_maintenance import small_files
from dkvstream.operators.io.table_sink import TableSink
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, list_epochs
from dkvstream.operators.runtime.recovery import restore_source
from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
               DagsterRunStatus.STARTED]
STREAM_JOB_TAG = "dkvstream/job"


def sensor_interval_s() -> int:
    """Minimum seconds between ticks of every sensor here (``$DKVSTREAM_SENSOR_INTERVAL_S``)."""
    return int(os.environ.get("DKVSTREAM_SENSOR_INTERVAL_S", "15"))


def _in_progress(context: SensorEvaluationContext, job_name: str, stream_job: str) -> bool:
    records = context.instance.get_run_records(
        RunsFilter(job_name=job_name, statuses=IN_PROGRESS, tags={STREAM_JOB_TAG: stream_job}), limit=1)
    return bool(records)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def newest_checkpoint(store: ObjectStore, job_prefix: str) -> tuple[str, str | None, bytes | None]:
    """The identity, key and bytes of the job's newest checkpoint, as stored (not
    decoded: a corrupt one still has an identity); ``("none", None, None)`` without one.
    The identity is ``e<epoch>-<digest>``, the digest the first 16 hex digits of the
    SHA-256 of its bytes, so a job reset and run to the same epoch again yields another
    identity (module docstring)."""
    for _ in range(3):
        epochs = list_epochs(store, job_prefix)
        if not epochs:
            break
        key = checkpoint_key(job_prefix, epochs[-1])
        try:
            data = store.get(key)
        except ObjectNotFoundError:
            continue  # deleted since the listing (a reset): list again
        return f"e{epochs[-1]}-{_digest(data)}", key, data
    return "none", None, None


def compaction_trigger(l0_tables: int, size_amp: float, dkv: DKVSettingsResource) -> str:
    """Why a checkpoint needs compaction ("" if it does not): the level-0 count fires AT
    the trigger, size amplification ABOVE the threshold (as in the planner)."""
    if l0_tables >= dkv.l0_compaction_trigger:
        return f"a range has {l0_tables} level-0 tables (trigger {dkv.l0_compaction_trigger})"
    if size_amp > dkv.size_amp_threshold:
        return f"a range has size amplification {size_amp:.3f} (threshold {dkv.size_amp_threshold})"
    return ""


def make_compaction_sensor(job: Job):
    """The compaction sensor of ``job`` (see module docstring)."""
    key = checkpoint_asset_key(job)

    @sensor(name=f"{job.name}_compaction_sensor", job=compaction, minimum_interval_seconds=sensor_interval_s(),
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Compact {job.name}'s state when level-0 tables or size amplification cross the triggers")
    def compaction_sensor(context: SensorEvaluationContext, dkv: DKVSettingsResource):
        records = context.instance.fetch_materializations(key, limit=1).records
        if not records:
            return SkipReason(f"{key.to_user_string()} has no materialization yet")
        event = records[0]
        seen = int(context.cursor) if context.cursor else -1
        if event.storage_id <= seen:
            return SkipReason(f"checkpoint event {event.storage_id} already judged")
        md = event.asset_materialization.metadata
        epoch = md["epoch"].value if "epoch" in md else "?"
        if L0_TABLES_MAX not in md:
            return SensorResult(skip_reason=f"epoch {epoch}: no level metadata", cursor=str(event.storage_id))
        reason = compaction_trigger(int(md[L0_TABLES_MAX].value), float(md[SIZE_AMP_MAX].value), dkv)
        if not reason:
            return SensorResult(skip_reason=f"epoch {epoch}: below the compaction triggers",
                                cursor=str(event.storage_id))
        if _in_progress(context, compaction.name, job.name):
            return SensorResult(skip_reason=f"epoch {epoch}: {reason}, but a compaction is already running",
                                cursor=str(event.storage_id))
        context.log.info(f"{job.name} epoch {epoch}: {reason}")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"{job.name}-compaction-{event.storage_id}",
                                     run_config=op_config("plan_compaction", job.name),
                                     tags={STREAM_JOB_TAG: job.name, "dkvstream/epoch": str(epoch),
                                           "dkvstream/trigger": reason})],
            cursor=str(event.storage_id))

    return compaction_sensor


def make_cleanup_sensor(job: Job):
    """The cleanup sensor of ``job`` (see module docstring)."""

    @sensor(name=f"{job.name}_cleanup_sensor", job=cleanup_job_def, minimum_interval_seconds=sensor_interval_s(),
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Apply checkpoint retention and collect garbage of {job.name} when checkpoints expire")
    def cleanup_sensor(context: SensorEvaluationContext, object_store: ObjectStoreResource,
                       dkv: DKVSettingsResource):
        store = object_store.open()
        epochs = list_epochs(store, job.prefix)
        if len(epochs) <= dkv.retain_checkpoints:
            return SkipReason(f"{len(epochs)} checkpoints, retention keeps {dkv.retain_checkpoints}")
        newest, _, _ = newest_checkpoint(store, job.prefix)
        state = f"{newest}:{dkv.retain_checkpoints}"
        if context.cursor == state:
            return SkipReason(f"already cleaned up at checkpoint {newest}")
        if _in_progress(context, cleanup_job_def.name, job.name):
            return SkipReason("a cleanup is already running")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"{job.name}-cleanup-{state}", run_config=op_config("cleanup", job.name),
                                     tags={STREAM_JOB_TAG: job.name})],
            cursor=state)

    return cleanup_sensor


def make_source_sensor(job: Job, asset_job, continuous: bool = False):
    """The new-input sensor of ``job``, starting runs of ``asset_job`` (see module
    docstring); ``continuous``: the job's runs are continuous (the sensor is then off by
    default)."""
    on = not job.source.bounded and not continuous

    @sensor(name=f"{job.name}_source_sensor", job=asset_job, minimum_interval_seconds=sensor_interval_s(),
            default_status=DefaultSensorStatus.RUNNING if on else DefaultSensorStatus.STOPPED,
            description=f"Run {job.name}'s epochs when its source has new input")
    def source_sensor(context: SensorEvaluationContext, object_store: ObjectStoreResource):
        store = object_store.open()
        job.source.attach(store, job.prefix)
        newest, key, data = newest_checkpoint(store, job.prefix)
        ckpt = JobCheckpoint.decode(data, store.uri(key)) if data is not None else None
        if ckpt is not None:
            # Before discovering, as a restart: a file source whose log lost objects would
            # otherwise log new files under offsets the checkpoint says were read.
            restore_source(job, ckpt)
        ends = job.source.end_offsets()
        done = ckpt.source_offsets if ckpt is not None else {}
        if all(ends[p] <= done.get(p, 0) for p in ends):
            return SkipReason("no new input")
        # The newest checkpoint event Dagster recorded: after a reset the store has no
        # checkpoint again, as before the first run, but this has grown since then.
        events = context.instance.fetch_materializations(checkpoint_asset_key(job), limit=1).records
        commits = events[0].storage_id if events else 0
        state = json.dumps({"ends": ends, "from": newest, "commits": commits}, sort_keys=True)
        if context.cursor == state:
            return SkipReason("a run was already started for this input")
        if _in_progress(context, asset_job.name, job.name):
            return SkipReason(f"{asset_job.name} is already running")
        new = sum(ends[p] - done.get(p, 0) for p in ends)
        return SensorResult(
            run_requests=[RunRequest(run_key=f"{job.name}-input-{_digest(state.encode())}",
                                     tags={STREAM_JOB_TAG: job.name, "dkvstream/new_events": str(new)})],
            cursor=state)

    return source_sensor


def make_table_compaction_sensor(job: Job, min_small_files: int | None = None, target_bytes: int | None = None):
    """The Delta table compaction sensor of ``job`` (see module docstring), or None if
    the job has no ``TableSink``. ``min_small_files`` and ``target_bytes`` default to
    ``TableCompactionConfig``'s and go into the runs it requests."""
    sinks = [s for s in job.sinks.values() if isinstance(s, TableSink)]
    if not sinks:
        return None
    defaults = TableCompactionConfig(job=job.name)
    if min_small_files is not None:
        defaults = defaults.model_copy(update={"min_small_files": min_small_files})
    if target_bytes is not None:
        defaults = defaults.model_copy(update={"target_bytes": target_bytes})

    @sensor(name=f"{job.name}_table_compaction_sensor", job=table_compaction_job,
            minimum_interval_seconds=sensor_interval_s(), default_status=DefaultSensorStatus.RUNNING,
            description=f"Compact the small files of {job.name}'s Delta tables")
    def table_compaction_sensor(context: SensorEvaluationContext, object_store: ObjectStoreResource):
        from deltalake import DeltaTable

        store = object_store.open()
        opts = storage_options(store)
        versions, crowded = {}, []
        for sink in sinks:
            uri = sink.table_uri(store, job.prefix)
            if not DeltaTable.is_deltatable(uri, storage_options=opts):
                continue
            dt = DeltaTable(uri, storage_options=opts)
            versions[sink.name] = f"{dt.metadata().id}@v{dt.version()}"
            n = small_files(uri, defaults.target_bytes, opts)
            if n >= defaults.min_small_files:
                crowded.append(f"{sink.name}: {n} small files")
        if not crowded:
            return SkipReason(f"no table has {defaults.min_small_files} small files")
        state = json.dumps(versions, sort_keys=True)
        if context.cursor == state:
            return SkipReason(f"a compaction was already requested at table versions {state}")
        if _in_progress(context, table_compaction_job.name, job.name):
            return SkipReason("a table compaction is already running")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"{job.name}-tables-{_digest(state.encode())}",
                                     run_config=op_config("compact_tables", job.name,
                                                          min_small_files=defaults.min_small_files,
                                                          target_bytes=defaults.target_bytes),
                                     tags={STREAM_JOB_TAG: job.name, "dkvstream/trigger": "; ".join(crowded)})],
            cursor=state)

    return table_compaction_sensor
