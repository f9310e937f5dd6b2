"""The example replay sources plan from metadata: their ``end_offsets`` and
``value_schema`` (what the driver calls each epoch) load nothing of the data set, and the
index they use (``dkvstream.examples.flights_index``) agrees with the data."""
from __future__ import annotations

import pytest

from dkvstream.examples import aircraft_rotations, flights, flights_data, flights_index, flights_weather
from dkvstream.examples.aircraft_rotations import AircraftSource
from dkvstream.examples.flights import FlightsSource
from dkvstream.examples.flights_weather import HourlyFlightsSource, WeatherSource, weather_partitions

SOURCES = [FlightsSource(2), HourlyFlightsSource(1), WeatherSource(2), AircraftSource(1, 4),
           AircraftSource(2, 400), AircraftSource(3)]


def test_driver_calls_load_nothing(monkeypatch) -> None:
    def loaded(*args, **kwargs):
        raise AssertionError("the driver loaded the data set")

    for module, name in [(flights_data, "flights_table"), (flights_data, "replay_partitions"),
                         (flights, "replay_partitions"), (aircraft_rotations, "replay_partitions"),
                         (flights_weather, "weather_table"), (flights_weather, "weather_partitions")]:
        monkeypatch.setattr(module, name, loaded)
    for source in SOURCES:
        assert set(source.end_offsets()) == set(source.partitions())
        assert len(source.value_schema) > 0


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: f"{type(s).__name__}")
def test_end_offsets_and_schema_agree_with_the_data(source) -> None:
    for partition, end in source.end_offsets().items():
        if isinstance(source, AircraftSource):
            rows = source.partition_table(partition).num_rows
        elif isinstance(source, WeatherSource):
            rows = weather_partitions(source.scale)[partition].num_rows
        else:
            rows = flights_data.replay_partitions(source.scale)[partition].num_rows
        assert end == rows, partition
        assert source.read(partition, end - 3, end).drop_columns(["key", "timestamp"]).schema == source.value_schema
        with pytest.raises(IndexError):
            source.read(partition, 0, end + 1)


def test_index_is_the_data_sets() -> None:
    index = flights_data.replay_index()
    assert index["flights"] == flights_index.FLIGHTS
    assert index["tailnum_per_day"] == flights_index.TAILNUM_PER_DAY
    assert {o: t.num_rows for o, t in weather_partitions(1).items()} == flights_weather.WEATHER_PER_ORIGIN
