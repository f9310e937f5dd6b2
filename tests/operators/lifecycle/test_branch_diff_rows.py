"""``diff_rows`` against a dict model, for any two sets of rows (Hypothesis)."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.runtime.branches import diff_rows

COLUMNS = ["k", "a", "b"]
values = st.one_of(st.none(), st.integers(0, 2), st.just(float("nan")), st.floats(0, 1, allow_nan=False))
rows = st.lists(st.tuples(st.integers(0, 5), values, st.integers(0, 1)), max_size=12)


def _table(rs: list[tuple]) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rs], pa.int64()),
                     "a": pa.array([r[1] for r in rs], pa.float64()),
                     "b": pa.array([r[2] for r in rs], pa.int64())})


def _norm(r: tuple) -> tuple:
    return tuple("NaN" if isinstance(v, float) and v != v else v for v in r)


@settings(max_examples=200, deadline=None)
@given(rows, rows)
def test_counts_match_a_dict_model(main: list[tuple], branch: list[tuple]) -> None:
    whole = diff_rows("out", 1, _table(main), _table(branch), COLUMNS, [])
    left, right = Counter(map(_norm, main)), Counter(map(_norm, branch))
    assert (whole.only_in_main, whole.only_in_branch, whole.changed) == (
        sum((left - right).values()), sum((right - left).values()), 0)

    keyed = diff_rows("out", 1, _table(main), _table(branch), COLUMNS, ["k"])
    # Model: per key, the rows left after equal ones cancel pair up as changed.
    changed = only_main = only_branch = 0
    for k in {r[0] for r in main} | {r[0] for r in branch}:
        lm = Counter(r for r in map(_norm, main) if r[0] == k)
        rb = Counter(r for r in map(_norm, branch) if r[0] == k)
        m, b = sum((lm - rb).values()), sum((rb - lm).values())
        changed += min(m, b)
        only_main += m - min(m, b)
        only_branch += b - min(m, b)
    assert (keyed.only_in_main, keyed.only_in_branch, keyed.changed) == (only_main, only_branch, changed)
    assert keyed.main_rows == len(main) and keyed.branch_rows == len(branch)
    assert sum(keyed.changed_columns.values()) >= keyed.changed  # each changed row differs somewhere
    assert "k" not in keyed.changed_columns
    assert keyed.differs == (left != right)
