"""``CI`` is parsed, not merely tested for being non-empty: ``CI=false`` is not CI; the
long runs' scale is checked."""
from __future__ import annotations

import pytest

from tests.ci_env import in_ci, long_run_scale, scaled
from tests.reliability import harness


@pytest.mark.parametrize("value", ["1", "true", "True", "TRUE", "yes", " true "])
def test_true_values_are_ci(value) -> None:
    assert in_ci({"CI": value})


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", " "])
def test_false_values_and_unset_are_not_ci(value) -> None:
    assert not in_ci({} if value is None else {"CI": value})


def test_fault_seed_is_random_when_ci_is_false(monkeypatch) -> None:
    """The crash tests' seed is 0 in CI only: with ``CI=false`` each run draws a new one."""
    monkeypatch.delenv("DKVSTREAM_FAULT_SEED", raising=False)
    monkeypatch.setenv("CI", "true")
    assert {harness.rng()[1] for _ in range(3)} == {0}
    monkeypatch.setenv("CI", "false")
    seeds = {harness.rng()[1] for _ in range(3)}
    assert 0 not in seeds and len(seeds) > 1, seeds


def test_hypothesis_profile_follows_ci() -> None:
    """tests/conftest.py loads the derandomized ``ci`` profile exactly when ``in_ci()``."""
    from hypothesis import settings

    assert settings.default.derandomize == in_ci()


@pytest.mark.parametrize(("value", "full", "expected"), [(None, 200, 200), ("0.5", 200, 100), ("0.001", 200, 1)])
def test_scaled_takes_the_long_run_scale(value, full, expected) -> None:
    environ = {} if value is None else {"DKVSTREAM_LONG_RUN_SCALE": value}
    assert scaled(full, environ) == expected


@pytest.mark.parametrize("value", ["0", "2", "half", ""])
def test_a_long_run_scale_outside_0_1_says_what_to_give(value) -> None:
    with pytest.raises(ValueError, match=r"give a number in \(0, 1\]"):
        long_run_scale({"DKVSTREAM_LONG_RUN_SCALE": value})
