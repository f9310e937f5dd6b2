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
    """Two commits over the first 25 records at 100 records/s (10 per 0.1-s tick): each
    record's latency is the first commit covering it minus its tick's release; a later
    commit of the same offsets adds nothing."""
    from bench.baselines.flights_live import record_latencies
    from dkvstream.examples.flights_producer import replay_order

    _, partition = replay_order()
    ends_1 = {p: int((partition[:12] == p).sum()) for p in range(3)}
    ends_2 = {p: int((partition[:25] == p).sum()) for p in range(3)}
    lat = record_latencies([(10.0, ends_1), (11.0, ends_2), (12.0, ends_2)], 25, 1, 100.0, schedule_start=9.0)
    expected = sorted([10.0 - (9.0 + (i // 10) * 0.1) for i in range(12)]
                      + [11.0 - (9.0 + (i // 10) * 0.1) for i in range(12, 25)])
    assert np.allclose(sorted(lat), expected)


def test_clock_ends_when_the_output_of_every_record_is_visible() -> None:
    """The clock of every engine: first record consumed to the commit whose output covers
    all N records, not to the N-th record folded. Commits of single partitions (Bytewax
    snapshots each partition) add up; a commit never lowers a partition's offset."""
    from bench.baselines.flights_live import Progress, peer_stats

    progress = Progress(10)
    progress.first_consumed = 1.0
    assert progress.processed(10) and progress.last_processed is not None  # folded: not the clock's end
    progress.output_visible({0: 4, 1: 2}, at=2.0)
    progress.output_visible({2: 3}, at=2.5)
    progress.output_visible({0: 1}, at=2.6)  # an older snapshot of partition 0
    assert progress.last_visible is None and progress.visible_count == 9
    with pytest.raises(RuntimeError, match="covers 9 of 10 records"):
        peer_stats(progress, 0, 0)
    progress.output_visible({1: 3}, at=3.0)
    assert progress.last_visible == 3.0
    assert progress.commits[-1] == (3.0, {0: 4, 1: 3, 2: 3})
    stats = peer_stats(progress, 0, 0)
    assert stats["seconds"] == 2.0 and stats["events_per_s"] == 5.0


def test_latency_summary_is_numpy_percentiles() -> None:
    from bench.baselines.flights_live import latency_summary

    values = np.arange(1, 102, dtype=float) / 100  # 0.01 .. 1.01
    assert latency_summary(values, "record_latency_") == {
        "record_latency_p50_s": 0.51, "record_latency_p99_s": 1.0, "record_latency_max_s": 1.01}
    assert latency_summary([], "latency_") == {}


def test_common_start_is_one_instant_on_both_clocks() -> None:
    """The producers' start: after the last one loaded, the same instant as wall time (sent
    to them) and as this process's perf_counter (the measures' clock)."""
    import time

    from bench.baselines.flights_live import common_start

    before_wall, before_perf = time.time(), time.perf_counter()
    wall, perf = common_start(before_wall, margin_s=0.5)
    after_wall, after_perf = time.time(), time.perf_counter()
    assert wall == before_wall + 0.5
    # perf - perf_now == wall - wall_now, within the time the two clocks were read apart.
    assert (before_perf + 0.5) - (after_wall - before_wall) <= perf <= after_perf + 0.5 + (after_wall - before_wall)


def test_producers_wait_at_the_barrier(kafka_broker) -> None:
    """``produce(start_at=...)``: the records are loaded, then the first tick waits for the
    common start time."""
    import time

    from dkvstream.examples.flights_producer import create_topic, produce

    topic = "live-bench-barrier"
    create_topic(kafka_broker.bootstrap, topic)
    asked: list[float] = []
    ticks: list[float] = []

    def start_at() -> float:
        asked.append(time.time())
        return asked[0] + 0.3

    assert produce(kafka_broker.bootstrap, topic, rate=1e6, limit=50, start_at=start_at, started=ticks.append) == 50
    assert len(asked) == 1 and ticks[0] >= asked[0] + 0.3


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
