"""The Kafka peers of the live flights benchmark (Quix Streams, Bytewax's KafkaSource) on a
real Kafka-compatible broker (Tansu, in memory): the first 20,000 flights produced, each
peer's complete windows equal a pandas oracle over exactly those flights."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights_oracle import assert_equals_oracle

RECORDS = 20_000
TOPIC = "flights-peers"  # the broker is the session's: a name of this module's own
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def broker(kafka_broker) -> str:
    """The session's Tansu broker (``tests/conftest.py``), as ``host:port``."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="module")
def flights_topic(broker) -> str:
    """The topic ``flights`` holding the first ``RECORDS`` flights (producer's order)."""
    from dkvstream.examples.flights_producer import create_topic, produce

    create_topic(broker, TOPIC)
    assert produce(broker, TOPIC, rate=1e6, limit=RECORDS) == RECORDS
    return TOPIC


@pytest.fixture(scope="module")
def complete_oracle() -> tuple[pd.DataFrame, int]:
    """``(oracle rows of the complete windows, cutoff ms)``: a pandas groupby over the
    first ``RECORDS`` flights, restricted to windows ending at or before the smallest
    per-origin largest event time minus 1 h (the complete-window rule)."""
    from dkvstream.examples.flights_producer import replay_order

    table, _ = replay_order()
    df = table.slice(0, RECORDS).select(["origin", "dest", "dep_time", "dep_delay", "event_time_ms"]).to_pandas()
    cutoff = int(df.groupby("origin")["event_time_ms"].max().min()) - HOUR_MS
    df["window_start"] = df["event_time_ms"] // DAY_MS * DAY_MS
    g = df.groupby(["origin", "dest", "window_start"])
    out = pd.DataFrame({"flights": g.size(), "cancelled": g.size() - g["dep_time"].count(),
                        "dep_delay_mean": g["dep_delay"].mean(),
                        "dep_delay_max": g["dep_delay"].max().astype("float64")}).reset_index()
    out = out[out["window_start"] + DAY_MS <= cutoff]
    out["window_end"] = out["window_start"] + DAY_MS
    for c in ("window_start", "window_end"):
        out[c] = pd.to_datetime(out[c], unit="ms", utc=True).astype("datetime64[ms, UTC]")
    return out.astype({"flights": "int64", "cancelled": "int64"}).reset_index(drop=True), cutoff


def _check(output: pd.DataFrame, stats: dict, complete_oracle) -> None:
    expected, cutoff = complete_oracle
    assert len(expected) > 1_000  # the rule leaves a real set of windows to compare
    end_ms = output["window_end"].astype("datetime64[ms, UTC]").astype("int64")
    assert_equals_oracle(pa.Table.from_pandas(output[end_ms <= cutoff], preserve_index=False), expected)
    assert stats["records"] == RECORDS and stats["windows_emitted"] == len(output)
    assert stats["seconds"] > 0 and stats["peak_rss_mib"] > 0


def test_quix_exactly_once_complete_windows_equal_oracle(broker, flights_topic, complete_oracle) -> None:
    pytest.importorskip("quixstreams", reason="quixstreams comes with the bench extra")
    from bench.baselines.flights_live import Progress
    from bench.baselines.quix_flights import run

    output, stats = run(broker, flights_topic, Progress(RECORDS), guarantee="exactly-once")
    _check(output, stats, complete_oracle)
    # closing_strategy="partition" with grace 1 h: every emitted window is final, and the
    # only ones emitted are those before each partition's stream time - 1 h.
    assert len(output) == len(complete_oracle[0])


def test_bytewax_kafka_complete_windows_equal_oracle(broker, flights_topic, complete_oracle) -> None:
    pytest.importorskip("bytewax", reason="bytewax comes with the bench extra")
    from bench.baselines.bytewax_kafka_flights import run
    from bench.baselines.flights_live import Progress

    output, stats = run(broker, flights_topic, Progress(RECORDS))
    _check(output, stats, complete_oracle)
    # At the end of input Bytewax closes every window: all routes and days of the input.
    assert len(output) > len(complete_oracle[0])


def test_bytewax_kafka_live_cli_measures_every_compared_window(broker, capsys) -> None:
    """``--produce live``: the producer runs while the peer consumes a fresh topic; the
    JSON line has a latency per compared window and lag samples (counts, not times)."""
    pytest.importorskip("bytewax", reason="bytewax comes with the bench extra")
    import json

    from bench.baselines.bytewax_kafka_flights import main

    assert main(["--bootstrap", broker, "--topic", "live", "--records", "5000", "--produce", "live",
                 "--rate", "2000"]) == 0  # 2.5 s of production: many lag samples, even on a busy machine
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["correct"] and stats["mode"] == "live" and stats["records"] == 5_000
    assert stats["windows_measured"] == stats["windows_compared"] > 0
    assert stats["lag_samples"] > 0 and stats["lag_max"] <= 5_000
