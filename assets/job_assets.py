"""Turn a dkvstream ``Job`` into Dagster assets, with no Dagster code from the user.

For a job J with source S and sinks T1..Tn this yields:

- ``S`` (the source): materializing it records its partitions and end offsets.
- ``T1..Tn`` (one multi-asset, upstream ``S``): materializing runs the job's epochs
  until the source is drained (or ``max_epochs``). Each committed epoch is logged as a
  materialization of
- ``<J>_checkpoint`` (the job's state checkpoint), with metadata: epoch, watermark,
  source offsets, manifest URI, DKV tables, bytes and keys, events and duration, so
  the Dagster UI plots them over time.
"""

import datetime as dt

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)
from dagster_pyspark import PySparkResource

from assets.resources import ObjectStoreResource
from operators.api import WATERMARK_MAX, WATERMARK_MIN
from operators.job import Job
from operators.runtime import EpochResult, JobRunner


class RunJobConfig(Config):
    """Launch configuration of a job run.

    Attributes:
        max_epochs: stop after this many committed epochs (0: until the source is drained).
    """

    max_epochs: int = 0


def checkpoint_asset_key(job: Job) -> AssetKey:
    """Key of the job's state checkpoint asset."""
    return AssetKey(f"{job.name}_checkpoint")


def format_watermark(ms: int) -> str:
    """A watermark as ISO-8601 UTC, or ``-inf``/``+inf``."""
    if ms >= WATERMARK_MAX:
        return "+inf (end of input)"
    if ms <= WATERMARK_MIN:
        return "-inf (no events yet)"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def checkpoint_metadata(result: EpochResult) -> dict:
    """Dagster metadata of one committed epoch."""
    return {
        "epoch": MetadataValue.int(result.epoch),
        "watermark": MetadataValue.text(format_watermark(result.watermark)),
        "watermark_ms": MetadataValue.int(result.watermark if result.watermark < WATERMARK_MAX else -1),
        "source_offsets": MetadataValue.json(result.source_offsets),
        "manifest_uri": MetadataValue.path(result.checkpoint_uri),
        "tables": MetadataValue.int(result.tables),
        "table_bytes": MetadataValue.int(result.table_bytes),
        "keys": MetadataValue.int(result.keys),
        "events": MetadataValue.int(result.events),
        "duration_s": MetadataValue.float(round(result.seconds, 3)),
        "events_per_s": MetadataValue.float(round(result.events_per_second, 1)),
        "output_rows": MetadataValue.json(result.output_rows),
        "finished": MetadataValue.bool(result.finished),
    }


def job_assets(job: Job, group_name: str | None = None) -> list:
    """Assets of ``job`` (see module docstring).

    Args:
        job: the job definition.
        group_name: Dagster asset group (default: the job name).

    Returns:
        ``[source asset, sinks multi-asset, checkpoint AssetSpec]``.
    """
    group = group_name or job.name
    source = job.source
    source_key = AssetKey(source.name)
    ckpt_key = checkpoint_asset_key(job)

    @asset(name=source.name, group_name=group, description=f"Source of job {job.name}: {type(source).__name__}")
    def source_asset() -> MaterializeResult:
        ends = source.end_offsets()
        return MaterializeResult(metadata={
            "partitions": MetadataValue.json(source.partitions()),
            "end_offsets": MetadataValue.json(ends),
            "events": MetadataValue.int(sum(ends.values())),
            "bounded": MetadataValue.bool(source.bounded),
        })

    sink_specs = [
        AssetSpec(sink.name, deps=[source_key], group_name=group,
                  description=f"Output '{output}' of job {job.name} ({type(sink).__name__})")
        for output, sink in job.sinks.items()
    ]

    @multi_asset(name=f"run_{job.name}", specs=sink_specs, required_resource_keys=set())
    def run_job(context: AssetExecutionContext, config: RunJobConfig, object_store: ObjectStoreResource,
                pyspark: PySparkResource):
        runner = JobRunner(job, pyspark.spark_session, object_store.root_uri)
        epochs = 0
        for result in runner.run(max_epochs=config.max_epochs or None):
            epochs += 1
            context.log_event(AssetMaterialization(asset_key=ckpt_key, metadata=checkpoint_metadata(result),
                                                   description=f"epoch {result.epoch}"))
            context.log.info(
                f"epoch {result.epoch} committed: {result.events:,} events in {result.seconds:.1f} s "
                f"({result.events_per_second:,.0f} events/s), watermark {format_watermark(result.watermark)}")
        store = runner.store
        latest = runner.latest()
        for output, sink in job.sinks.items():
            table = sink.read(store, job.prefix)
            yield MaterializeResult(asset_key=sink.name, metadata={
                "rows": MetadataValue.int(table.num_rows),
                "epochs_this_run": MetadataValue.int(epochs),
                "committed_epoch": MetadataValue.int(latest.epoch if latest else 0),
                "location": MetadataValue.path(store.uri(sink.table_prefix(job.prefix))),
                "preview": MetadataValue.md(table.slice(0, 5).to_pandas().to_markdown(index=False))
                if table.num_rows else MetadataValue.text("(empty)"),
            })

    ckpt_spec = AssetSpec(ckpt_key, deps=[source_key], group_name=group,
                          description=f"State checkpoints of job {job.name}: one materialization per committed epoch")
    return [source_asset, run_job, ckpt_spec]
