"""The single Dagster ``Definitions`` of dkvstream (loaded by ``dagster dev``)."""
from __future__ import annotations

import os

from dagster import Definitions

from assets.job_assets import job_assets
from assets.resources import default_resources
from operators.examples.flights import flights_job

flights = flights_job(
    scale=int(os.environ.get("DKVSTREAM_FLIGHTS_SCALE", "1")),
    events_per_epoch=int(os.environ.get("DKVSTREAM_EVENTS_PER_EPOCH", "50000")),
)

defs = Definitions(
    assets=job_assets(flights),
    resources=default_resources(),
)
