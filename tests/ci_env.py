"""Whether the tests run in CI: the one place that reads the ``CI`` environment variable.

CI services set ``CI=true`` (GitHub Actions, GitLab CI, ...). In CI the tests draw their
random examples and fault seeds deterministically, so a red CI is reproducible.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

TRUE_VALUES = ("1", "true", "yes")


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``CI`` is ``1``, ``true`` or ``yes`` (any case, surrounding blanks
    ignored); False when it is unset or anything else (``false``, ``0``, ``no``, empty).

    Args:
        environ: the environment to read (default: this process's).
    """
    return environ.get("CI", "").strip().lower() in TRUE_VALUES


def long_run_scale(environ: Mapping[str, str] = os.environ) -> float:
    """The fraction of their full size that the slow tests' long runs take: Hypothesis
    examples of the long model runs and repetitions of the exit script
    (``DKVSTREAM_LONG_RUN_SCALE``, default 1; ``.ci/run`` sets less to stay within CI's
    budget, as it shortens the soaks).

    Args:
        environ: the environment to read (default: this process's).

    Raises:
        ValueError: the variable is not a number in (0, 1].
    """
    raw = environ.get("DKVSTREAM_LONG_RUN_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not 0 < scale <= 1:
        raise ValueError(f"DKVSTREAM_LONG_RUN_SCALE={raw!r}: give a number in (0, 1], e.g. 0.5")
    return scale


def scaled(full: int, environ: Mapping[str, str] = os.environ) -> int:
    """``full`` times ``long_run_scale()``, at least 1."""
    return max(1, round(full * long_run_scale(environ)))
