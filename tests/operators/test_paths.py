"""Staged output names: the range label survives the round trip; other keys are refused."""
from __future__ import annotations

import pytest

from dkvstream.operators.paths import range_label_of, staging_prefix


def test_range_label_round_trips() -> None:
    key = staging_prefix("jobs/flights", 7, "route_daily_delays", "kg-0128-0255", "a1b2") + "/late.parquet"
    assert range_label_of(key) == "kg-0128-0255"


def test_non_staged_key_is_refused() -> None:
    with pytest.raises(ValueError, match="not a staged output key"):
        range_label_of("jobs/flights/sinks/route_daily_delays/epoch=00000001/part-kg-0000-0127.parquet")
