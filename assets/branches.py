"""Branches in Dagster: the branch and its diff as assets, and the jobs that run each step.

For a main job M and a branch job B (``dkvstream.operators.runtime.branches``),
``branch_definitions(M, B)`` gives, in M's asset group:

- asset ``<B>_branch``: materializing it forks M's newest checkpoint into B the first
  time (``branch``), then runs B as M's shadow until it has caught up with M's newest
  checkpoint (``run_branch``; on Spark, or in process with ``in_process: true``).
  Metadata: the fork epoch, B's and M's newest epochs, epochs and events run.
- asset ``<B>_diff`` (downstream of it): ``diff`` of M's and B's outputs, epoch by epoch.
  Metadata per output: rows of each side, only in main / only in branch / changed, the
  columns added and removed, the changed columns, a table per epoch that differs with
  key samples, and the whole diff as JSON.
- jobs ``branch_<B>`` and ``diff_<B>`` (materialize each asset) and ``promote_<B>`` (op
  ``promote_branch_<B>``: M continues from B's state and code; M must be stopped).

M's own epochs job runs B's code once M was promoted to it (``job_to_run``), when the
Definitions know B (``dkvstream_definitions(..., branches=[...])``).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster import (
    AssetExecutionContext,
    AssetKey,
    Config,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    Output,
    asset,
    define_asset_job,
    in_process_executor,
    job,
    op,
)
from dagster_pyspark import PySparkResource

from dkvstream.assets.job_assets import pool_name
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime import branches
from dkvstream.operators.runtime.checkpoints import read_commit_log
from dkvstream.storage.objectstore import ObjectStore


@dataclass(frozen=True)
class BranchSpec:
    """A branch for ``dkvstream_definitions(..., branches=[...])``.

    Attributes:
        main: the main job's name (one of the Definitions' jobs).
        job: the branch's ``Job``.
        key_columns: per output, the columns identifying a row in the diff.
    """

    main: str
    job: Job
    key_columns: Mapping[str, list[str]] = field(default_factory=dict)


class BranchRunConfig(Config):
    """Launch configuration of the branch asset.

    Attributes:
        max_epochs: stop after this many epochs (0: until caught up with the main).
        in_process: run the branch's tasks in this process instead of on Spark.
    """

    max_epochs: int = 0
    in_process: bool = False


def branch_asset_key(branch_job: Job) -> AssetKey:
    """Key of the branch's asset."""
    return AssetKey(f"{branch_job.name}_branch")


def diff_asset_key(branch_job: Job) -> AssetKey:
    """Key of the branch's diff asset."""
    return AssetKey(f"{branch_job.name}_diff")


def branch_definitions(main_job: Job, branch_job: Job,
                       key_columns: Mapping[str, list[str]] | None = None) -> dict:
    """The branch asset, the diff asset and the three jobs of one branch (module docstring),
    as ``Definitions`` kwargs.

    Args:
        main_job: the main job.
        branch_job: the branch's ``Job`` (changed code, the same source, its own name).
        key_columns: per output, the columns identifying a row (``branches.diff``).
    """
    group = main_job.name

    @asset(key=branch_asset_key(branch_job), group_name=group, pool=pool_name(branch_job),
           description=f"Branch {branch_job.name} of job {main_job.name}: its state forked from "
                       f"{main_job.name}'s checkpoint, run as its shadow on the same input")
    def branch_asset(context: AssetExecutionContext, config: BranchRunConfig, object_store: ObjectStoreResource,
                     pyspark: PySparkResource, dkv: DKVSettingsResource) -> MaterializeResult:
        store = object_store.open()
        try:
            record = branches.read_branch(store, branch_job)
        except branches.BranchError:
            record = branches.branch(store, main_job, branch_job)
            context.log.info(f"forked {main_job.name}'s checkpoint {record.fork_epoch} into {branch_job.name}")
        spark = None if config.in_process else pyspark.spark_session
        results = branches.run_branch(branch_job, spark, store, max_epochs=config.max_epochs or None,
                                      dkv_options=dkv.options(),
                                      retain_checkpoints=dkv.retain_checkpoints if dkv.inline_retention else None)
        for r in results:
            context.log.info(f"epoch {r.epoch}: {r.events:,} events, watermark {r.watermark}, "
                             f"output rows {r.output_rows}")
        return MaterializeResult(metadata=_branch_metadata(store, record, results))

    @asset(key=diff_asset_key(branch_job), group_name=group, deps=[branch_asset_key(branch_job)],
           description=f"Rows that differ between {main_job.name}'s and branch {branch_job.name}'s "
                       f"outputs, per output and epoch")
    def diff_asset(object_store: ObjectStoreResource) -> MaterializeResult:
        d = branches.diff(object_store.open(), main_job, branch_job, key_columns=key_columns)
        return MaterializeResult(metadata=diff_metadata(d))

    @op(name=f"promote_branch_{branch_job.name}",
        description=f"Job {main_job.name} continues from branch {branch_job.name}'s state and code")
    def promote_op(context: OpExecutionContext, object_store: ObjectStoreResource) -> Output[dict]:
        promotion = branches.promote(object_store.open(), main_job, branch_job)
        context.log.info(f"job {main_job.name} continues from branch {branch_job.name}'s checkpoint "
                         f"{promotion.branch_epoch} as its epoch {promotion.epoch}")
        return Output({"epoch": promotion.epoch, "branch_epoch": promotion.branch_epoch}, metadata={
            "main": MetadataValue.text(main_job.name), "branch": MetadataValue.text(branch_job.name),
            "epoch": MetadataValue.int(promotion.epoch), "branch_epoch": MetadataValue.int(promotion.branch_epoch),
            "operators": MetadataValue.json(promotion.code["operators"]),
            "pins": MetadataValue.json(promotion.pins)})

    @job(name=f"promote_{branch_job.name}", executor_def=in_process_executor,
         description=f"Promote branch {branch_job.name} into job {main_job.name} (stop {main_job.name} first)")
    def promote_job():
        promote_op()

    return {
        "assets": [branch_asset, diff_asset],
        "jobs": [
            define_asset_job(f"branch_{branch_job.name}", selection=[branch_asset_key(branch_job)],
                             executor_def=in_process_executor,
                             description=f"Fork (once) and run branch {branch_job.name} as {main_job.name}'s shadow"),
            define_asset_job(f"diff_{branch_job.name}", selection=[diff_asset_key(branch_job)],
                             executor_def=in_process_executor,
                             description=f"Diff {main_job.name}'s and {branch_job.name}'s outputs"),
            promote_job,
        ],
    }


def _branch_metadata(store: ObjectStore, record: branches.BranchRecord, results: list) -> dict:
    main_epoch = read_commit_log(store, f"jobs/{record.main}").newest_committed
    epoch = read_commit_log(store, f"jobs/{record.branch}").newest_committed
    return {
        "main": MetadataValue.text(record.main),
        "fork_epoch": MetadataValue.int(record.fork_epoch),
        "epoch": MetadataValue.int(epoch),
        "main_epoch": MetadataValue.int(main_epoch),
        "epochs_behind": MetadataValue.int(max(0, main_epoch - epoch)),
        "epochs_this_run": MetadataValue.int(len(results)),
        "events_this_run": MetadataValue.int(sum(r.events for r in results)),
    }


def diff_metadata(d: branches.BranchDiff) -> dict:
    """A ``BranchDiff`` as Dagster metadata: per output the totals (``<output>_changed``
    etc.), the columns added, removed and changed, a Markdown table of the epochs that
    differ with key samples, and ``diff``: the whole diff as JSON."""
    meta: dict = {"epochs": MetadataValue.text(f"{d.epochs[0]}..{d.epochs[1]}"),
                  "differs": MetadataValue.bool(d.differs),
                  "outputs_added": MetadataValue.json(d.outputs_added),
                  "outputs_removed": MetadataValue.json(d.outputs_removed)}
    for name, out in d.outputs.items():
        for k, v in out.totals().items():
            meta[f"{name}_{k}"] = MetadataValue.int(v)
        changed_columns: dict[str, int] = {}
        for e in out.epochs:
            for c, n in e.changed_columns.items():
                changed_columns[c] = changed_columns.get(c, 0) + n
        meta[f"{name}_columns"] = MetadataValue.json({"added": out.columns_added, "removed": out.columns_removed,
                                                      "changed": changed_columns, "key": out.key_columns})
        rows = ["| epoch | main rows | branch rows | only in main | only in branch | changed | changed columns "
                "| key samples |", "|---|---|---|---|---|---|---|---|"]
        rows += [f"| {e.epoch} | {e.main_rows} | {e.branch_rows} | {e.only_in_main} | {e.only_in_branch} | "
                 f"{e.changed} | {', '.join(sorted(e.changed_columns)) or '-'} | {_samples(e.samples)} |"
                 for e in out.epochs if e.differs]
        meta[f"{name}_epochs"] = MetadataValue.md("\n".join(rows) if len(rows) > 2 else "no rows differ")
    meta["diff"] = MetadataValue.json(d.as_dict())
    return meta


def _samples(samples: dict[str, list[dict]]) -> str:
    """Key samples as one table cell."""
    return "; ".join(f"{kind}: " + ", ".join("(" + ", ".join(str(v) for v in s.values()) + ")" for s in keys)
                     for kind, keys in samples.items()).replace("|", "\\|")
