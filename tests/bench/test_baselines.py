"""The flights benchmark's baselines stay correct: each engine's output on a small prefix
equals the oracle, and the shared epoch plan is the one dkvstream's runtime runs."""
from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from bench.baselines.flights_input import (
    EpochFilesSource,
    EpochPlan,
    plan_epochs,
    prefix_oracle,
    write_input_files,
)
from dkvstream.examples.flights_data import FLIGHT_COUNT

# The first 3,000 flights in epochs of 1,500 (500 per origin): two micro-batches, so
# state and timers carry over a batch boundary.
SMALL = dict(scale=1, events_per_epoch=1_500, max_events=3_000)


def test_plan_is_dkvstreams_epoch_plan(tmp_path) -> None:
    """The runtime, run in-process on the prefix's files, reads exactly the planned offset
    ranges, and its source reads each file once."""
    from bench.flights_throughput import run_dkvstream

    plan = plan_epochs(**SMALL)
    assert plan.events == 3_000 and len(plan.epochs) == 2 and not plan.full
    write_input_files(plan, str(tmp_path / "input"))
    # run_dkvstream checks the output against the oracle
    result = run_dkvstream(plan, str(tmp_path / "input"), str(tmp_path / "store"), spark=None)
    assert result["epochs"] == 2 and result["events"] == 3_000


def test_files_source_serves_the_replay_rows(tmp_path) -> None:
    """EpochFilesSource over the written files returns what FlightsSource returns for the
    same offsets, across file boundaries and without the end-of-input rows."""
    from dkvstream.examples.flights import FlightsSource

    plan = plan_epochs(**SMALL)
    write_input_files(plan, str(tmp_path))
    files, replay = EpochFilesSource(str(tmp_path)), FlightsSource(1)
    assert files.end_offsets() == plan.ends == {"EWR": 1_000, "JFK": 1_000, "LGA": 1_000}
    ranges = [("EWR", 0, 500), ("JFK", 300, 1_000), ("LGA", 499, 501), ("EWR", 1_000, 1_000)]
    for part, start, end in ranges:
        got, want = files.read(part, start, end), replay.read(part, start, end)
        assert got.num_rows == end - start
        assert got.select(want.column_names).equals(want), (part, start, end)
    assert files.value_schema.names == replay.value_schema.names
    with pytest.raises(IndexError, match="EWR"):
        files.read("EWR", 900, 1_001)
    with pytest.raises(KeyError, match="SFO"):
        files.read("SFO", 0, 1)


def test_files_source_refuses_input_without_the_end_row(tmp_path) -> None:
    import os

    import pyarrow.parquet as pq

    plan = plan_epochs(**SMALL)
    files = write_input_files(plan, str(tmp_path))
    last = files["EWR"][-1]
    pq.write_table(pq.read_table(last).slice(0, 500), last)  # the end-of-input row cut off
    source = EpochFilesSource(str(tmp_path))
    with pytest.raises(ValueError, match=os.path.basename(last)):
        source.read("EWR", 500, 999)


def test_every_ratio_has_a_reference_over_the_same_events() -> None:
    """Spark's prefix gets dkvstream rows over that prefix; ratios pair rows by events."""
    from bench.flights_throughput import ratio_columns, run_list

    runs = run_list(["dkvstream", "spark-tws-textbook", "bytewax"], 10, None, 100_000)
    assert runs == [("dkvstream", None), ("spark-tws-textbook", 100_000), ("bytewax", None),
                    ("dkvstream", 100_000)]

    def row(engine, events, seconds, epochs):
        return {"engine": engine, "events": events, "seconds": seconds, "epoch_seconds": epochs}

    rows = [row("dkvstream", 1_000, 10.0, [5.0, 1.0, 1.0]),
            row("spark-tws-textbook", 100, 50.0, [30.0, 20.0]),
            row("bytewax", 1_000, 20.0, [2.0, 2.0, 2.0]), row("dkvstream", 100, 5.0, [4.0, 1.0])]
    headers, ratios = ratio_columns(rows)
    assert headers == ["dkvstream / engine, whole run", "dkvstream / engine, steady s/epoch"]
    assert ratios[1] == [10.0, 20.0]  # against the 100-event dkvstream row, not the full one
    assert ratios[2] == [2.0, 2.0]
    assert ratios[0] == [1.0, 1.0]


def test_uneven_partitions_take_the_finished_ones_share() -> None:
    plan = plan_epochs(1, 10, partitions=("EWR", "JFK"), max_per_partition=7)
    # 5 + 5, then 2 + 2, then nothing left: the plan never reads past a partition's end.
    assert plan.epochs[0] == {"EWR": (0, 5), "JFK": (0, 5), "LGA": (0, 0)}
    assert plan.epochs[1] == {"EWR": (5, 7), "JFK": (5, 7), "LGA": (0, 0)}
    assert len(plan.epochs) == 2 and plan.ends == {"EWR": 7, "JFK": 7, "LGA": 0}
    with pytest.raises(ValueError, match="SFO"):
        plan_epochs(1, 10, partitions=("SFO",))


def test_prefix_oracle_agrees_with_the_spec_oracle_on_the_full_data(flights_oracle) -> None:
    """The pyarrow prefix oracle, forced onto the whole data set, is the pandas oracle."""
    from dkvstream.examples.flights_oracle import assert_equals_oracle

    full = plan_epochs(1, 120_000)
    assert full.full and full.events == FLIGHT_COUNT

    class NotFull(EpochPlan):
        full = False

    prefix = NotFull(**{f.name: getattr(full, f.name) for f in dataclasses.fields(full)})
    assert_equals_oracle(pa.Table.from_pandas(prefix_oracle(prefix), preserve_index=False), flights_oracle)


@pytest.mark.slow  # two micro-batches plus the timer batch take 1-3 minutes on 2 busy cores
@pytest.mark.parametrize("variant", ["textbook", "batched"])
def test_spark_tws_baseline_equals_oracle(spark, tmp_path, variant) -> None:
    """On the shared session: the query sets the RocksDB provider only for itself."""
    from bench.baselines.spark_tws_flights import ROCKSDB_PROVIDER, run

    plan = plan_epochs(**SMALL)
    write_input_files(plan, str(tmp_path / "input"))
    before = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    result = run(spark, plan, str(tmp_path / "input"), str(tmp_path / "work"), variant)  # checks the oracle
    assert result["events"] == 3_000 and result["epochs"] == 2 and result["late"] == 0
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass", None) == before != ROCKSDB_PROVIDER


def test_bytewax_baseline_equals_oracle(tmp_path) -> None:
    pytest.importorskip("bytewax", reason="bytewax comes with the bench extra")
    from bench.baselines.bytewax_flights import run

    plan = plan_epochs(**SMALL)
    write_input_files(plan, str(tmp_path / "input"))
    result = run(plan, str(tmp_path / "input"), str(tmp_path / "work"))  # checks the oracle
    assert result["events"] == 3_000 and result["late"] == 0


def test_flink_csv_copy_holds_each_origins_events_in_order(tmp_path) -> None:
    """The CSV copy Flink reads (Flink's Parquet format is not in the PyFlink wheel) is, per
    origin, the replay rows [0, end) in order, without the end-of-input rows."""
    import pyarrow.csv as pcsv

    from bench.flink.flights_sql import ORIGIN_COLUMNS, copy_as_csv
    from dkvstream.examples.flights_data import replay_partitions

    plan = plan_epochs(**SMALL)
    write_input_files(plan, str(tmp_path / "input"))
    copies = copy_as_csv(str(tmp_path / "input"), str(tmp_path / "csv"))
    assert {o: n for o, (_, n) in copies.items()} == plan.ends
    types = {"dep_time": pa.int64(), "dep_delay": pa.int64()}
    for origin, (directory, n) in copies.items():
        got = pcsv.read_csv(f"{directory}/flights.csv",
                            read_options=pcsv.ReadOptions(column_names=list(ORIGIN_COLUMNS)),
                            convert_options=pcsv.ConvertOptions(column_types=types))
        want = replay_partitions(1)[origin].slice(0, n)
        assert got.column("event_time_ms").to_pylist() == want.column("event_time_ms").to_pylist()
        for c in ("origin", "dest", "dep_time", "dep_delay"):
            assert got.column(c).to_pylist() == want.column(c).to_pylist(), (origin, c)


def test_flink_output_reads_back_as_the_oracle_table(tmp_path) -> None:
    """The sink's CSV lines (as Flink writes them) read back as the spec's output table;
    an empty output directory is an error naming it."""
    from bench.baselines.flink_sql_flights import read_output

    (tmp_path / "part-0-0").write_text('EWR,SFO,"2013-01-01 00:00:00",7,1,5.5,18.0\n'
                                       'JFK,LAX,"2013-01-02 00:00:00",2,2,,\n')
    (tmp_path / ".part-in-progress").write_text("garbage")
    t = read_output(str(tmp_path)).to_pandas()
    assert list(t.columns) == ["origin", "dest", "window_start", "window_end", "flights", "cancelled",
                               "dep_delay_mean", "dep_delay_max"]
    assert [str(x) for x in t["window_start"]] == ["2013-01-01 00:00:00+00:00", "2013-01-02 00:00:00+00:00"]
    assert (t["window_end"] - t["window_start"]).dt.days.tolist() == [1, 1]
    assert t["flights"].tolist() == [7, 2] and t["cancelled"].tolist() == [1, 2]
    assert t["dep_delay_mean"].iloc[0] == 5.5 and t["dep_delay_max"].isna().iloc[1]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AssertionError, match="empty"):
        read_output(str(empty))


@pytest.mark.slow  # the Flink job: about 30 s with its MiniCluster on 2 busy cores
def test_flink_sql_baseline_equals_oracle(tmp_path) -> None:
    from bench.baselines.flink_sql_flights import SETUP_COMMAND, flink_missing, run

    if flink_missing():
        pytest.skip(f"needs PyFlink in .venv-flink: {SETUP_COMMAND}")
    plan = plan_epochs(**SMALL)
    write_input_files(plan, str(tmp_path / "input"))
    result = run(plan, str(tmp_path / "input"), str(tmp_path / "work"))  # checks the oracle
    assert result["events"] == 3_000
