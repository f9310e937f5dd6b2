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
