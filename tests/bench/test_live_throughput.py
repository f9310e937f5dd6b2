"""The live throughput benchmark (``bench/live_throughput.py``) on the session's Tansu broker:
dkvstream in process (no Spark), tiny rates and durations. The outputs are checked against
the complete-window oracle; the figures are not asserted (shared machine)."""
from __future__ import annotations

import json

import numpy as np
import pytest

RECORDS = 6_000


def test_dkvstream_complete_windows_equal_oracle(kafka_broker, tmp_path) -> None:
    """A continuous run on a pre-filled topic stops after N records; its complete windows
    equal the oracle over exactly those records, each stamped with its epoch's publish."""
    from bench.baselines.flights_live import (
        Progress,
        check_complete_windows,
        complete_window_cutoff_ms,
    )
    from bench.live_throughput import run_dkvstream
    from dkvstream.examples.flights_producer import create_topic, produce

    topic = "live-bench-filled"
    create_topic(kafka_broker.bootstrap, topic)
    assert produce(kafka_broker.bootstrap, topic, rate=1e9, limit=RECORDS) == RECORDS
    progress = Progress(RECORDS)
    output, stats, epochs = run_dkvstream(kafka_broker.bootstrap, topic, progress, None, str(tmp_path / "store"),
                                          trigger_interval_ms=0, events_per_epoch=2_500)
    assert check_complete_windows(output, RECORDS) > 100
    assert stats["records"] == RECORDS and progress.count == RECORDS and stats["epochs"] == len(epochs) >= 3
    assert sum(epochs[-1][1].values()) == RECORDS  # the last epoch's offsets: every record, none more
    cutoff = complete_window_cutoff_ms(RECORDS)
    assert len(progress.emitted) == len(output)
    published = {at for at, _ in epochs}
    assert all(at in published for _, at in progress.emitted)
    assert sum(end <= cutoff for end, _ in progress.emitted) > 100


def test_record_latencies_by_hand() -> None:
    """Two epochs over the first 25 records at 100 records/s (10 per 0.1-s tick): each
    record's latency is its epoch's publish minus its tick's release."""
    from bench.live_throughput import record_latencies
    from dkvstream.examples.flights_producer import replay_order

    _, partition = replay_order()
    ends_1 = {f"t-{p}": int((partition[:12] == p).sum()) for p in range(3)}
    ends_2 = {f"t-{p}": int((partition[:25] == p).sum()) for p in range(3)}
    lat = record_latencies([(10.0, ends_1), (11.0, ends_2)], 25, 1, 100.0, schedule_start=9.0)
    expected = sorted([10.0 - (9.0 + (i // 10) * 0.1) for i in range(12)]
                      + [11.0 - (9.0 + (i // 10) * 0.1) for i in range(12, 25)])
    assert np.allclose(sorted(lat), expected)


def test_sustained_rule() -> None:
    from bench.live_throughput import sustained

    row = {"mode": "live", "rate": 10_000, "producer_rate": 9_990, "events_per_s": 9_700, "drain_s": 1.5}
    assert sustained(row) is True
    assert sustained({**row, "drain_s": 2.5}) is False
    assert sustained({**row, "events_per_s": 9_000}) is False
    # Producers short of the nominal rate: the engine is judged against what they offered.
    assert sustained({**row, "producer_rate": 8_000, "events_per_s": 7_700}) is True
    assert sustained({**row, "producer_rate": 8_000, "events_per_s": 7_500}) is False
    assert sustained({"engine": "quix", "rate": 10_000, "error": "killed"}) is False


def test_cli_prints_the_tables_and_checks_every_run(kafka_broker, tmp_path, capsys) -> None:
    """The command line: a live run and a pre-filled run of dkvstream in process, both
    checked against the oracle in their child process (a wrong output is a FAILED row
    and exit status 1)."""
    pytest.importorskip("tabulate")
    from bench.live_throughput import main

    out_json = tmp_path / "runs.json"
    assert main(["--bootstrap", kafka_broker.bootstrap, "--engines", "dkvstream-in-process", "--rates", "2000",
                 "--duration-s", "2", "--throughput-records", "5000", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "Live: producers at a fixed rate" in out and "Throughput: the topic filled" in out
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["engine"], r["mode"]) for r in rows] == [("dkvstream-in-process", "live"),
                                                        ("dkvstream-in-process", "throughput")]
    assert all(r["correct"] and r["windows_compared"] > 0 for r in rows)
    live = rows[0]
    assert live["records"] == 4_000 and live["lag_series"] and live["windows_measured"] == live["windows_compared"]
    assert "record_latency_p99_s" in live
