"""Key groups: stable hashing and contiguous ranges (Flink's assignment)."""
from __future__ import annotations

import pyarrow as pa
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from dkvstream.operators.api.keygroups import (
    key_group_of,
    key_group_ranges,
    key_groups_of,
    key_groups_of_column,
    range_index_of,
)


def test_key_group_is_xxh3_mod_k_and_stable() -> None:
    # A fixed value: changing the hash would move every key's state.
    assert key_group_of(b"EWR-IAH", 256) == xxhash.xxh3_64_intdigest(b"EWR-IAH") % 256
    assert key_group_of(b"EWR-IAH", 256) == 188
    assert list(key_groups_of([b"a", b"EWR-IAH"], 256)) == [key_group_of(b"a", 256), 188]


@given(st.integers(1, 1024), st.data())
def test_ranges_partition_key_groups_and_agree_with_range_index(k, data) -> None:
    p = data.draw(st.integers(1, k))
    ranges = key_group_ranges(k, p)
    assert len(ranges) == p
    covered = [g for r in ranges for g in r]
    assert covered == list(range(k))
    for i, r in enumerate(ranges):
        for g in (r.start, r.end - 1):
            assert range_index_of(g, k, p) == i


@given(st.lists(st.lists(st.binary(max_size=6), max_size=30), max_size=4), st.integers(1, 300))
def test_key_groups_of_a_column_hash_each_key_as_the_list_form_does(chunks, k) -> None:
    keys = [key for chunk in chunks for key in chunk]  # few distinct: repeats are the case
    column = pa.chunked_array([pa.array(c, pa.binary()) for c in chunks], pa.binary())
    got = key_groups_of_column(column, k)
    assert got.dtype.name == "int32"
    assert got.tolist() == [key_group_of(key, k) for key in keys]
    assert key_groups_of_column(pa.array(keys, pa.binary()), k).tolist() == got.tolist()


@given(st.lists(st.binary(max_size=6), min_size=1, max_size=8, unique=True),
       st.lists(st.integers(0, 7), min_size=1, max_size=600), st.integers(1, 300))
def test_key_groups_of_repeated_keys_through_the_dictionary(distinct, picks, k) -> None:
    keys = [distinct[i % len(distinct)] for i in picks]
    got = key_groups_of_column(pa.chunked_array([pa.array(keys, pa.binary())]), k)
    assert got.tolist() == [key_group_of(key, k) for key in keys]


def test_key_groups_of_a_column_hashes_distinct_keys_once_only_when_they_repeat(monkeypatch) -> None:
    import dkvstream.operators.api.keygroups as kg

    hashed = []
    real = kg.key_groups_of
    monkeypatch.setattr(kg, "key_groups_of", lambda keys, k: hashed.append(len(keys)) or real(keys, k))
    routes = pa.array([b"EWR-IAH", b"JFK-LAX", b"EWR-IAH"] * 10_000, pa.binary())
    assert kg.key_groups_of_column(routes, 256).tolist() == [188, key_group_of(b"JFK-LAX", 256), 188] * 10_000
    assert hashed == [2]  # the two routes, not 30,000 events
    hashed.clear()
    users = pa.array([b"user-%d" % i for i in range(10_000)], pa.binary())
    assert kg.key_groups_of_column(users, 256).tolist() == [key_group_of(b"user-%d" % i, 256) for i in range(10_000)]
    assert hashed == [10_000]  # no dictionary where nothing repeats
