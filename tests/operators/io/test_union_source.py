"""``UnionSource``: partitions, offsets and reads of two small in-memory sources, and the
definitions it refuses. Oracle: the children's own tables."""
from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from dkvstream.operators.api.columns import OFFSET_COLUMN
from dkvstream.operators.io.sources import check_slice
from dkvstream.operators.io.union import UnionSource
from tests.operators.table_sources import TableSource


def _table(keys: list[bytes], stamps: list[int], **values) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.binary()), "timestamp": pa.array(stamps, pa.int64()), **values})


def _flights() -> TableSource:
    return TableSource("flights", {
        "EWR": _table([b"a", b"b", b"a"], [10, 20, 30], delay=pa.array([1.5, None, 3.0]),
                      carrier=pa.array(["UA", "B6", "AA"])),
        "JFK": _table([b"c"], [15], delay=pa.array([4.0]), carrier=pa.array(["DL"])),
    })


def _weather() -> TableSource:
    # Offsets with gaps (as a compacted Kafka topic's): rows at offsets 2, 5 and 6 of 7.
    return TableSource("weather", {
        "EWR": _table([b"a", b"b", b"a"], [10, 20, 30], temp=pa.array([40.0, 41.0, 42.0]),
                      **{OFFSET_COLUMN: pa.array([2, 5, 6], pa.int64())}),
    })


def test_partitions_offsets_and_schema() -> None:
    union = UnionSource([_flights(), _weather()])
    assert union.name == "flights+weather"
    assert union.partitions() == ["flights/EWR", "flights/JFK", "weather/EWR"]
    assert union.end_offsets() == {"flights/EWR": 3, "flights/JFK": 1, "weather/EWR": 7}
    assert union.start_offset("weather/EWR") == 0
    assert union.bounded
    assert union.value_schema == pa.schema([("input", pa.string()), ("delay", pa.float64()),
                                            ("carrier", pa.string()), ("temp", pa.float64())])
    # Pickled for the read tasks: the cached schema is not carried, and is the same again.
    again = pickle.loads(pickle.dumps(union))
    assert "value_schema" not in again.__dict__ and again.value_schema == union.value_schema
    with pytest.raises(KeyError, match="unknown partition 'LGA'"):
        union.read("LGA", 0, 1)
    with pytest.raises(KeyError, match="unknown partition 'trains/EWR'"):
        union.start_offset("trains/EWR")


def test_read_adds_input_and_fills_other_columns_with_nulls() -> None:
    union = UnionSource([_flights(), _weather()])
    got = check_slice(union, "flights/EWR", 1, 3, union.read("flights/EWR", 1, 3))
    assert got.to_pylist() == [
        {"key": b"b", "timestamp": 20, "input": "flights", "delay": None, "carrier": "B6", "temp": None},
        {"key": b"a", "timestamp": 30, "input": "flights", "delay": 3.0, "carrier": "AA", "temp": None},
    ]
    got = check_slice(union, "weather/EWR", 0, 7, union.read("weather/EWR", 0, 7))
    assert got.column("input").to_pylist() == ["weather"] * 3
    assert got.column("temp").to_pylist() == [40.0, 41.0, 42.0]
    assert got.column("delay").null_count == got.column("carrier").null_count == 3


def test_offsets_with_gaps_pass_through() -> None:
    union = UnionSource([_flights(), _weather()])
    got = check_slice(union, "weather/EWR", 3, 7, union.read("weather/EWR", 3, 7))
    assert got.column(OFFSET_COLUMN).to_pylist() == [5, 6]
    assert got.column("timestamp").to_pylist() == [20, 30]
    assert union.read("weather/EWR", 0, 2).num_rows == 0  # offsets 0 and 1 are gaps
    # A child's slice that breaks the offset contract is refused naming the child.
    with pytest.raises(ValueError, match="source flights partition EWR offsets"):
        UnionSource([TableSource("flights", {"EWR": _table([b"a"], [1], delay=pa.array([1.0]))}),
                     _weather()]).read("flights/EWR", 0, 2)


def test_same_column_in_both_children_is_one_column() -> None:
    other = TableSource("trains", {"NWK": _table([b"a"], [5], delay=pa.array([9.0]))})
    union = UnionSource([_flights(), other], name="arrivals")
    assert union.name == "arrivals"
    assert union.value_schema.names == ["input", "delay", "carrier"]
    got = union.read("trains/NWK", 0, 1).to_pylist()
    assert got == [{"key": b"a", "timestamp": 5, "input": "trains", "delay": 9.0, "carrier": None}]


def test_type_conflict_is_refused_naming_both_sources() -> None:
    other = TableSource("trains", {"NWK": _table([b"a"], [5], delay=pa.array([9], pa.int64()))})
    union = UnionSource([_flights(), other])
    with pytest.raises(TypeError, match=r"column 'delay' is double in source flights and int64 in source trains"):
        union.value_schema  # noqa: B018 - the property raises


def test_refused_definitions() -> None:
    live = TableSource("live", {"p": _table([b"a"], [1], x=pa.array([1]))}, bounded=False)
    with pytest.raises(ValueError, match="mix bounded and live"):
        UnionSource([_flights(), live])
    with pytest.raises(ValueError, match="at least two sources"):
        UnionSource([_flights()])
    with pytest.raises(ValueError, match="distinct"):
        UnionSource([_flights(), _flights()])
    clash = TableSource("tagged", {"p": _table([b"a"], [1], input=pa.array(["x"]))})
    with pytest.raises(ValueError, match="input_column="):
        UnionSource([_flights(), clash]).value_schema  # noqa: B018 - the property raises
    assert UnionSource([_flights(), clash], input_column="source").value_schema.names[0] == "source"
    both_live = UnionSource([live, TableSource("live2", {"q": _table([b"b"], [2], y=pa.array([2]))},
                                               bounded=False)])
    assert not both_live.bounded
