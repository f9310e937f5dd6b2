"""The single Dagster ``Definitions`` of dkvstream (loaded by ``dagster dev``).

Per stream job: its assets (``job_assets``), the ``verified`` check on its checkpoint
asset, an asset job running its epochs, and its compaction, cleanup and source sensors.
Once for all stream jobs: the ``compaction``, ``flush`` and ``cleanup`` jobs.
"""
import os

from dagster import AssetSelection, Definitions, define_asset_job

from assets.checkpoints import make_checkpoint_check
from assets.job_assets import job_assets
from assets.jobs import MAINTENANCE_JOBS
from assets.resources import default_resources
from assets.sensors import (
    STREAM_JOB_TAG,
    make_cleanup_sensor,
    make_compaction_sensor,
    make_source_sensor,
    make_table_compaction_sensor,
)
from examples.aircraft_rotations import aircraft_job
from examples.flights import flights_job
from operators.api.job import Job


def stream_job_definitions(job: Job) -> dict:
    """Assets, checks, the epochs job and sensors of one stream job, as ``Definitions`` kwargs."""
    assets = job_assets(job)
    epochs_job = define_asset_job(
        job.name, selection=AssetSelection.assets(*[s.name for s in job.sinks.values()]),
        tags={STREAM_JOB_TAG: job.name}, description=f"Run the epochs of stream job {job.name}")
    return {
        "assets": assets,
        "asset_checks": [make_checkpoint_check(job)],
        "jobs": [epochs_job],
        "sensors": [make_compaction_sensor(job), make_cleanup_sensor(job), make_source_sensor(job, epochs_job),
                    *filter(None, [make_table_compaction_sensor(job)])],
    }


def dkvstream_definitions(*jobs: Job, resources: dict | None = None) -> Definitions:
    """The ``Definitions`` of the given stream jobs plus the maintenance jobs.

    Args:
        jobs: stream jobs (names must differ).
        resources: Dagster resources (default: ``assets.resources.default_resources()``).
    """
    parts = [stream_job_definitions(job) for job in jobs]
    return Definitions(
        assets=[a for p in parts for a in p["assets"]],
        asset_checks=[c for p in parts for c in p["asset_checks"]],
        jobs=[*(j for p in parts for j in p["jobs"]), *MAINTENANCE_JOBS],
        sensors=[s for p in parts for s in p["sensors"]],
        resources=resources if resources is not None else default_resources(),
    )


flights = flights_job(
    scale=int(os.environ.get("DKVSTREAM_FLIGHTS_SCALE", "1")),
    events_per_epoch=int(os.environ.get("DKVSTREAM_EVENTS_PER_EPOCH", "50000")),
)
aircraft = aircraft_job(
    scale=int(os.environ.get("DKVSTREAM_FLIGHTS_SCALE", "1")),
    events_per_epoch=int(os.environ.get("DKVSTREAM_EVENTS_PER_EPOCH", "50000")),
)
defs = dkvstream_definitions(flights, aircraft)
