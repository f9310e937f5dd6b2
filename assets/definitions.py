"""The Dagster ``Definitions`` of stream jobs: ``dkvstream_definitions(*jobs)``.

A project lists its own jobs: ``defs = dkvstream_definitions(my_job)`` in the module its
``workspace.yaml`` (or ``dagster dev -m``) loads. Nothing here imports the example jobs;
the repository's demo ``Definitions`` (the flights jobs) are ``dkvstream.examples.definitions``.

Per stream job: its assets (``job_assets``; the ``verified`` check on its checkpoint
asset runs at the end of each run), an asset job running its epochs, and its
compaction, cleanup and source sensors.
Once for all stream jobs: the ``compaction``, ``flush`` and ``cleanup`` jobs,
``bootstrap_state`` (a new job's initial state from tables, ``dkvstream.assets.bootstrap``),
and the ``savepoint``, ``savepoint_drop`` and ``fork_stream_job`` jobs
(``dkvstream.assets.savepoints``; each stream job has a ``<job>_savepoints`` asset they
materialize).
Per branch (``branches``): its branch and diff assets and its branch, diff and promote
jobs (``dkvstream.assets.branches``); a main job promoted to a branch runs the branch's code.

A stream job runs in one of two modes (``continuous``; default: continuous for a live
source, short runs for a bounded one, ``dkvstream.assets.job_assets.continuous_by_default``):

* continuous: one long-running run commits an epoch per trigger interval while there is
  input, until it is terminated; its source sensor is off by default (on, it restarts
  the run when there is new input and none is running).
* short runs: each run processes the input there is and ends; on a live source the
  source sensor is on by default and starts a run whenever new input arrives.

Every run executes in process (``in_process_executor``): the epochs job is a single
step, so a step process of its own would only cost a second Python start, and a
terminated run's step then stops in the run worker itself (``dkvstream.assets.stream_run``), so a
stopped stream ends SUCCESS whichever way it was launched (the job, or the asset graph's
"Materialize").
"""
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from dkvstream.assets.bootstrap import bootstrap_state_job
from dkvstream.assets.branches import BranchSpec, branch_definitions
from dkvstream.assets.checkpoints import checkpoint_asset_key
from dkvstream.assets.erasure import erasure_job
from dkvstream.assets.job_assets import asset_name, continuous_by_default, job_assets
from dkvstream.assets.jobs import MAINTENANCE_JOBS
from dkvstream.assets.resources import default_resources
from dkvstream.assets.savepoints import SAVEPOINT_JOBS, savepoints_asset_spec
from dkvstream.assets.sensors import (
    STREAM_JOB_TAG,
    make_cleanup_sensor,
    make_compaction_sensor,
    make_source_sensor,
    make_table_compaction_sensor,
)
from dkvstream.operators.api.job import Job


def stream_job_definitions(job: Job, continuous: bool | None = None,
                           sink_metadata: Mapping[str, Callable[[pa.Table], dict]] | None = None,
                           branches: Mapping[str, Job] | None = None) -> dict:
    """Assets, the epochs job and sensors of one stream job, as ``Definitions`` kwargs.

    Args:
        job: the stream job.
        continuous: its mode (module docstring); None: ``continuous_by_default(job)``.
        sink_metadata: as ``job_assets``'s.
        branches: branch job name -> ``Job``: the code the job may be promoted to.
    """
    continuous = continuous_by_default(job) if continuous is None else continuous
    assets = job_assets(job, continuous=continuous, sink_metadata=sink_metadata, branches=branches)
    mode = "until terminated" if continuous and not job.source.bounded else "until the input is processed"
    epochs_job = define_asset_job(
        # The sinks and the checkpoint, so the checkpoint's check runs after the epochs.
        job.name,
        selection=AssetSelection.assets(*[asset_name(s.name) for s in job.sinks.values()], checkpoint_asset_key(job)),
        tags={STREAM_JOB_TAG: job.name}, executor_def=in_process_executor,
        description=f"Run the epochs of stream job {job.name} ({mode})")
    return {
        "assets": [*assets, savepoints_asset_spec(job)],
        "jobs": [epochs_job],
        "sensors": [make_compaction_sensor(job), make_cleanup_sensor(job),
                    make_source_sensor(job, epochs_job, continuous=continuous),
                    *filter(None, [make_table_compaction_sensor(job)])],
    }


def dkvstream_definitions(*jobs: Job, resources: dict | None = None,
                          continuous: dict[str, bool] | None = None,
                          sink_metadata: Mapping[str, Callable[[pa.Table], dict]] | None = None,
                          branches: Sequence[BranchSpec] = ()) -> Definitions:
    """The ``Definitions`` of the given stream jobs plus the maintenance jobs.

    Args:
        jobs: stream jobs (names must differ).
        resources: Dagster resources (default: ``dkvstream.assets.resources.default_resources()``).
        continuous: job name -> mode (module docstring); a job not named runs in its
            default mode (continuous for a live source, short runs for a bounded one).
        sink_metadata: sink name -> more metadata of that sink after each run
            (``job_assets``); the flights job's ``route_daily_delays`` gets its plot.
        branches: branches of these jobs (``dkvstream.assets.branches``).

    Raises:
        ValueError: ``continuous`` or a branch names a job not among ``jobs``.
    """
    modes = continuous or {}
    unknown = sorted(set(modes) - {job.name for job in jobs})
    if unknown:
        raise ValueError(f"continuous names jobs that are not defined here: {unknown}; "
                         f"defined: {sorted(job.name for job in jobs)}")
    by_name = {job.name: job for job in jobs}
    orphans = sorted(b.job.name for b in branches if b.main not in by_name)
    if orphans:
        raise ValueError(f"branches {orphans} name main jobs that are not defined here; defined: {sorted(by_name)}")
    parts = [stream_job_definitions(job, modes.get(job.name), sink_metadata,
                                    {b.job.name: b.job for b in branches if b.main == job.name})
             for job in jobs]
    parts += [branch_definitions(by_name[b.main], b.job, b.key_columns) for b in branches]
    return Definitions(
        assets=[a for p in parts for a in p["assets"]],
        jobs=[*(j for p in parts for j in p["jobs"]), *MAINTENANCE_JOBS, *SAVEPOINT_JOBS, bootstrap_state_job,
              erasure_job],
        sensors=[s for p in parts for s in p.get("sensors", [])],
        resources=resources if resources is not None else default_resources(),
        executor=in_process_executor,  # module docstring
    )

