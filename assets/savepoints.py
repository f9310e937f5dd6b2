"""Savepoint and fork ops and jobs (``dkvstream.operators.runtime.savepoints``, ``...forks``).

* ``take_savepoint`` (job ``savepoint``): pins a retained checkpoint of a stream job;
  its record is a materialization of the job's ``<job>_savepoints`` asset with the
  savepoint's name, epoch, files and bytes pinned.
* ``drop_savepoint`` (job ``savepoint_drop``): unpins and deletes one; a materialization
  of the same asset says which is gone and which remain.
* ``fork`` (job ``fork_stream_job``): starts a new stream job from a savepoint or a
  retained checkpoint of another, copying no state file; the new job's first run (its
  own Definitions entry, with its own code and parallelism) continues from there.
* ``drop_fork`` (job ``fork_drop``): releases the pins a fork (or branch) job holds on
  its parent's files; the fork never runs again.

Every op works on the object store only (no Spark), so it runs while the job runs.
Restoring a job from a savepoint needs the job's code and a stopped job: use
``restore`` from Python or ``python -m dkvstream.operators.tools.savepoints restore``.
"""

from dagster import AssetKey, AssetMaterialization, AssetSpec, MetadataValue, OpExecutionContext, Output, job, op

from dkvstream.assets.jobs import StreamJobConfig
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime import savepoints
from dkvstream.operators.runtime.forks import drop_fork as drop_fork_record
from dkvstream.operators.runtime.forks import fork_job


def savepoints_asset_key(job_name: str) -> AssetKey:
    """Key of stream job ``job_name``'s savepoints asset."""
    return AssetKey(f"{job_name}_savepoints")


def savepoints_asset_spec(job: Job, group_name: str | None = None) -> AssetSpec:
    """The savepoints asset of ``job`` (materialized by the ops here, never by a run)."""
    return AssetSpec(savepoints_asset_key(job.name), group_name=group_name or job.name,
                     description=f"Savepoints of stream job {job.name}: pinned checkpoints "
                                 "(materialized by the savepoint and savepoint_drop jobs)")


class SavepointConfig(StreamJobConfig):
    """Config of ``take_savepoint`` and ``drop_savepoint``.

    Attributes:
        name: the savepoint's name (``[A-Za-z0-9._-]``).
        epoch: the retained epoch to pin (take only; None: the newest).
    """

    name: str
    epoch: int | None = None


class ForkConfig(StreamJobConfig):
    """Config of ``fork``: ``job`` is the parent.

    Attributes:
        child: the new stream job's name.
        savepoint: the parent's savepoint to start from, or None.
        epoch: the parent's retained epoch (without ``savepoint``; None: the newest).
    """

    child: str
    savepoint: str | None = None
    epoch: int | None = None


def _listing(store, job_name: str) -> list[dict]:
    return [{"name": sp.name, "epoch": sp.epoch, "files": sp.files, "bytes": sp.bytes}
            for sp in savepoints.list_savepoints(store, job_name)]


@op(description="Pin a retained checkpoint of a stream job as a savepoint")
def take_savepoint(context: OpExecutionContext, config: SavepointConfig,
                   object_store: ObjectStoreResource) -> Output[dict]:
    store = object_store.open()
    sp = savepoints.savepoint(store, config.job, config.name, config.epoch)
    context.log_event(AssetMaterialization(savepoints_asset_key(config.job), metadata={
        "savepoint": MetadataValue.text(sp.name), "epoch": MetadataValue.int(sp.epoch),
        "files": MetadataValue.int(sp.files), "bytes_pinned": MetadataValue.int(sp.bytes),
        "pins": MetadataValue.json(sp.pins), "savepoints": MetadataValue.json(_listing(store, config.job))}))
    return Output({"name": sp.name, "epoch": sp.epoch, "files": sp.files, "bytes": sp.bytes})


@op(description="Unpin and delete a savepoint of a stream job")
def drop_savepoint(context: OpExecutionContext, config: SavepointConfig,
                   object_store: ObjectStoreResource) -> Output[dict]:
    store = object_store.open()
    sp = savepoints.drop_savepoint(store, config.job, config.name)
    epoch = sp.epoch if sp else -1  # -1: only the pins a crashed drop left were deleted
    context.log_event(AssetMaterialization(savepoints_asset_key(config.job), metadata={
        "dropped": MetadataValue.text(config.name), "epoch": MetadataValue.int(epoch),
        "savepoints": MetadataValue.json(_listing(store, config.job))}))
    return Output({"name": config.name, "epoch": epoch})


@op(description="Start a new stream job from a savepoint or checkpoint of another (copies no state file)")
def fork(context: OpExecutionContext, config: ForkConfig, object_store: ObjectStoreResource) -> Output[dict]:
    store = object_store.open()
    before = store.stats.snapshot()
    ckpt = fork_job(store, config.job, config.child, savepoint=config.savepoint, epoch=config.epoch)
    spent = {k: v - before.get(k, 0) for k, v in store.stats.snapshot().items()}
    context.log.info(f"job {config.child} forked from {config.job} at epoch {ckpt.epoch}: requests {spent}")
    return Output({"child": config.child, "epoch": ckpt.epoch}, metadata={
        "parent": MetadataValue.text(config.job), "epoch": MetadataValue.int(ckpt.epoch),
        "savepoint": MetadataValue.text(config.savepoint or "-"),
        "requests": MetadataValue.json(spent), "copies": MetadataValue.int(spent.get("COPY", 0))})


@op(description="Release the pins a fork or branch job holds on its parent's files (it never runs again)")
def drop_fork(context: OpExecutionContext, config: StreamJobConfig, object_store: ObjectStoreResource) -> Output[dict]:
    record = drop_fork_record(object_store.open(), config.job)
    context.log.info(f"fork {config.job} of job {record.get('parent')} dropped; pins released at "
                     f"{record.get('owners', [])}")
    return Output({"child": config.job, "parent": record.get("parent")}, metadata={
        "parent": MetadataValue.text(str(record.get("parent"))),
        "owners": MetadataValue.json(record.get("owners", []))})


@job(name="savepoint", description="Pin a retained checkpoint of a stream job as a savepoint")
def savepoint_job():
    take_savepoint()


@job(name="savepoint_drop", description="Unpin and delete a savepoint of a stream job")
def drop_savepoint_job():
    drop_savepoint()


@job(name="fork_stream_job", description="Start a new stream job from another's savepoint or checkpoint")
def fork_stream_job():
    fork()


@job(name="fork_drop", description="Release a fork's or branch's pins on its parent's files; it never runs again")
def drop_fork_job():
    drop_fork()


SAVEPOINT_JOBS = [savepoint_job, drop_savepoint_job, fork_stream_job, drop_fork_job]
