"""The flights benchmark's baselines stay correct: each engine's output on a small prefix
equals the oracle, and the shared epoch plan is the one dkvstream's runtime runs."""
from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from bench.baselines.flights_input import EpochPlan, plan_epochs, prefix_oracle, write_input_files
from examples.flights_data import FLIGHT_COUNT

# The first 3,000 flights in epochs of 1,500 (500 per origin): two micro-batches, so
# state and timers carry over a batch boundary.
SMALL = dict(scale=1, events_per_epoch=1_500, max_events=3_000)


def test_plan_is_dkvstreams_epoch_plan(tmp_path) -> None:
    """The runtime, run in-process on the prefix, reads exactly the planned offset ranges."""
    from bench.flights_throughput import run_dkvstream

    plan = plan_epochs(**SMALL)
    assert plan.events == 3_000 and len(plan.epochs) == 2 and not plan.full
    result = run_dkvstream(plan, str(tmp_path / "store"), spark=None)  # checks the oracle
    assert result["epochs"] == 2 and result["events"] == 3_000


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
    from examples.flights_oracle import assert_equals_oracle

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
