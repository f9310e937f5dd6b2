"""Turn a dkvstream ``Job`` into Dagster assets, with no Dagster code from the user.

For a job J with source S and sinks T1..Tn this yields:

- ``S`` (the source): materializing it records its partitions and end offsets.
- ``T1..Tn`` (one multi-asset, upstream ``S``): materializing runs the job's epochs.
  A *short run* ends when the source is drained, or, on a live source, when it has
  nothing new; a *continuous run* on a live source keeps committing an epoch per
  trigger interval until the run is terminated (``dkvstream.assets.stream_run``). Either ends
  early at ``max_epochs``. Each sink is also materialized by every committed epoch that
  published rows to it (metadata ``epoch``, ``rows_published``), and once more when the
  run ends (its rows and a preview). Each committed epoch is logged, as it commits, as a
  materialization of
- ``<J>_checkpoint`` (the job's state checkpoint, produced by the same multi-asset),
  with metadata: epoch, watermark, source offsets, manifest URI, DKV tables and bytes
  per level, size amplification, keys, events and events/s, lag and latency, and for a
  bounded source the progress (epochs of the total, percent, time left;
  ``dkvstream.assets.checkpoints``), so the Dagster UI plots them. Its check ``verified``
  (``dkvstream.assets.checkpoints.checkpoint_check_result``) runs at the end of every run that
  materializes it; executed alone (the UI's "Execute check") it runs no epoch.

The run log has a line per step: Spark starting and its UI's URL
(``dkvstream.assets.resources.SparkResource``), then one line per committed epoch
(``dkvstream.operators.runtime.progress.epoch_line``: epochs of the total, percent and time left,
or lag per partition; events, rates, watermark as a date, offsets).
"""
import re
from collections.abc import Callable, Mapping

import pyarrow as pa
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    Config,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    multi_asset,
)
from dagster_pyspark import PySparkResource

from dkvstream.assets.checkpoints import (
    checkpoint_asset_key,
    checkpoint_check_result,
    checkpoint_check_spec,
    checkpoint_metadata,
    level_stats,
)
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.assets.stream_run import run_epochs
from dkvstream.operators.api.job import Job
from dkvstream.operators.io import dead_letter
from dkvstream.operators.runtime.branches import job_to_run
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.progress import ProgressTracker, epoch_line

__all__ = ["RunJobConfig", "checkpoint_asset_key", "continuous_by_default", "job_assets", "pool_name"]


class RunJobConfig(Config):
    """Launch configuration of a job run.

    Attributes:
        max_epochs: stop after this many committed epochs (0: no limit).
        continuous: True: a continuous run (on a live source, an epoch per
            ``Job.trigger_interval_ms`` while there is input, waiting otherwise, until
            the run is terminated); False: a short run (until the source is drained or,
            live, has nothing new). None (default): the job's mode (``job_assets``'s
            ``continuous``). A bounded source's run ends once it is drained either way.
    """

    max_epochs: int = 0
    continuous: bool | None = None


def continuous_by_default(job: Job) -> bool:
    """The default mode of ``job``'s runs: continuous for a live source (a stream is one
    long-running run, as a Flink job or a Structured Streaming query is), short runs for
    a bounded one (it is drained once)."""
    return not job.source.bounded


def pool_name(job: Job) -> str:
    """Dagster concurrency pool of the job's runs: one driver per job at a time (two
    would race for the same checkpoints); dagster.yaml limits every pool to 1."""
    return f"dkvstream-{job.name}"


def asset_name(name: str) -> str:
    """The Dagster asset name of a source or sink: its name with each character Dagster
    refuses (anything but letters, digits and ``_``) as ``_``, so ``kafka:payments`` (a
    ``KafkaSource``) becomes ``kafka_payments`` and ``payment-totals`` ``payment_totals``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def job_assets(job: Job, group_name: str | None = None, continuous: bool | None = None,
               sink_metadata: Mapping[str, Callable[[pa.Table], dict]] | None = None,
               branches: Mapping[str, Job] | None = None) -> list:
    """Assets of ``job`` (see module docstring).

    Args:
        job: the job definition.
        group_name: Dagster asset group (default: the job name).
        continuous: the mode of runs whose launch config leaves ``continuous`` unset
            (None: ``continuous_by_default(job)``).
        sink_metadata: sink name -> a function of the sink's whole table returning more
            metadata for the sink's materialization at the end of a run (e.g. a plot,
            ``dkvstream.examples.flights_plot.delay_plot_metadata``).
        branches: branch job name -> ``Job``: once the job was promoted to one of them
            (``dkvstream.operators.runtime.branches.promote``), its runs run that code.

    Returns:
        ``[source asset, multi-asset of the sinks and the checkpoint]``.
    """
    group = group_name or job.name
    source = job.source
    source_key = AssetKey(asset_name(source.name))
    ckpt_key = checkpoint_asset_key(job)

    default_continuous = continuous_by_default(job) if continuous is None else continuous

    @asset(name=asset_name(source.name), group_name=group,
           description=f"Source of job {job.name}: {type(source).__name__}")
    def source_asset(object_store: ObjectStoreResource) -> MaterializeResult:
        source.attach(object_store.open(), job.prefix)  # before any other call (Source.attach)
        ends = source.end_offsets()
        return MaterializeResult(metadata={
            "partitions": MetadataValue.json(source.partitions()),
            "end_offsets": MetadataValue.json(ends),
            "events": MetadataValue.int(sum(ends.values())),
            "bounded": MetadataValue.bool(source.bounded),
        })

    sink_specs = [
        AssetSpec(asset_name(sink.name), deps=[source_key], group_name=group,
                  description=f"Output '{output}' of job {job.name} ({type(sink).__name__})")
        for output, sink in job.sinks.items()
    ]

    # Skippable: its materializations are the epochs' (logged as they commit), not an output.
    ckpt_spec = AssetSpec(ckpt_key, deps=[source_key], group_name=group, skippable=True,
                          description=f"State checkpoints of job {job.name}: one materialization per committed epoch")
    check_spec = checkpoint_check_spec(job)

    @multi_asset(name=f"run_{job.name}", specs=[*sink_specs, ckpt_spec], check_specs=[check_spec], can_subset=True,
                 required_resource_keys=set(), pool=pool_name(job))
    def run_job(context: AssetExecutionContext, config: RunJobConfig, object_store: ObjectStoreResource,
                pyspark: PySparkResource, dkv: DKVSettingsResource):
        if context.selected_asset_keys:  # the sinks or the checkpoint: the epochs make them all
            yield from _run(context, config, object_store, pyspark, dkv)
        if check_spec.key in context.selected_asset_check_keys:
            yield checkpoint_check_result(object_store.open(), job)

    def _run(context: AssetExecutionContext, config: RunJobConfig, object_store: ObjectStoreResource,
             pyspark: PySparkResource, dkv: DKVSettingsResource):
        continuous = default_continuous if config.continuous is None else config.continuous
        # The store of the object_store resource, as the maintenance ops open it; the Spark
        # tasks receive it pickled (its configuration, credentials included), not a URI.
        store = object_store.open()
        code = job_to_run(store, job, branches) if branches else job  # a promotion switches the code
        runner = JobRunner(code, pyspark.spark_session, store, dkv_options=dkv.options(),
                           # Retention and compaction are the cleanup and compaction sensors' runs.
                           retain_checkpoints=dkv.retain_checkpoints if dkv.inline_retention else None)
        # Dagster's own reads (checkpoint shape) go through a store of their own, so the
        # driver's request counts in each checkpoint stay the driver's.
        stats_store = object_store.open()
        dead_letter_uri = stats_store.uri(job.dead_letter.sink.table_prefix(job.prefix))
        if continuous and not source.bounded:
            context.log.info(f"continuous run: an epoch at most every {job.trigger_interval_ms} ms while "
                             f"{source.name} has new input, until the run is terminated")

        tracker = ProgressTracker(source, job.events_per_epoch)

        def shape(result):  # on the epochs' thread, before the next epoch's retention
            return level_stats(stats_store, read_checkpoint(stats_store, job.prefix, result.epoch))

        def report(result, stats) -> None:
            progress = tracker.update(result)
            context.log_event(AssetMaterialization(
                asset_key=ckpt_key, metadata=checkpoint_metadata(result, stats, progress),
                description=f"epoch {result.epoch}"))
            # A sink that published rows is materialized now, not when the run ends: a
            # continuous run may last days, and Dagster's freshness and automation go by this.
            for output, sink in job.sinks.items():
                if result.output_rows.get(output, 0) > 0:
                    context.log_event(AssetMaterialization(
                        asset_key=asset_name(sink.name), description=f"epoch {result.epoch}",
                        metadata={"epoch": MetadataValue.int(result.epoch),
                                  "rows_published": MetadataValue.int(result.output_rows[output])}))
            context.log.info(epoch_line(result, progress))
            dead = result.dead_letter.get("total", 0)
            if dead:
                context.log.warning(
                    f"epoch {result.epoch}: {dead:,} records went to the dead-letter table "
                    f"{job.dead_letter.table!r} ({dead_letter.per_reason(result.dead_letter)}); "
                    f"(table at {dead_letter_uri})")

        outcome = run_epochs(runner, max_epochs=config.max_epochs or None, continuous=continuous,
                             after_commit=shape, on_epoch=report)  # closes the runner
        epochs = outcome.epochs
        store = runner.store
        latest = runner.latest()
        if outcome.terminated:
            context.log.info(f"stopped on a termination request ({', '.join(outcome.stop_signals)}) after "
                             f"{epochs} epochs; newest checkpoint: epoch {latest.epoch if latest else 0}")
        for sink in job.sinks.values():
            if AssetKey(asset_name(sink.name)) not in context.selected_asset_keys:
                continue
            table = sink.read(store, job.prefix)
            yield MaterializeResult(asset_key=asset_name(sink.name), metadata={
                "rows": MetadataValue.int(table.num_rows),
                "epochs_this_run": MetadataValue.int(epochs),
                "committed_epoch": MetadataValue.int(latest.epoch if latest else 0),
                "location": MetadataValue.path(store.uri(sink.table_prefix(job.prefix))),
                "preview": _preview(table.slice(0, 5)),
                **(sink_metadata or {}).get(sink.name, lambda table: {})(table),
            })

    return [source_asset, run_job]


def _preview(table) -> MetadataValue:
    """The first rows of a sink table as Dagster table metadata (values other than
    numbers, strings and booleans shown as text)."""
    def cell(v):
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

    schema = TableSchema(columns=[TableColumn(f.name, str(f.type)) for f in table.schema])
    return MetadataValue.table([TableRecord({k: cell(v) for k, v in row.items()}) for row in table.to_pylist()],
                               schema=schema)
