"""Names of staged task output: unique per (epoch, operator, range, attempt).

Layout: ``<job>/staging/epoch=<epoch:010d>/<operator>/<range label>@<attempt>/<file>``.
The task builds the prefix and a sink publishes from it; both go through this module,
so the format lives in one place.
"""
from __future__ import annotations


def staging_prefix(job_prefix: str, epoch: int, operator: str, range_label: str, attempt: str) -> str:
    """Prefix a task attempt writes its staged files under."""
    return f"{job_prefix}/staging/epoch={epoch:010d}/{operator}/{range_label}@{attempt}"


def range_label_of(staged_key: str) -> str:
    """The key-group range label a staged file belongs to.

    Raises:
        ValueError: ``staged_key`` is not under a ``staging_prefix``.
    """
    parts = staged_key.split("/")
    if len(parts) < 5 or parts[-5] != "staging" or "@" not in parts[-2]:
        raise ValueError(f"not a staged output key: {staged_key!r}")
    return parts[-2].split("@", 1)[0]
