"""Shared fixtures for storage tests: one object-store fixture parametrized over implementations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from storage.objectstore import ObjectStore
from storage.objectstore.local import LocalObjectStore


def _local(tmp_path: Path) -> ObjectStore:
    return LocalObjectStore(tmp_path / "bucket")


# S3 (issue 5) adds an entry here; every test using `store` then runs against it too.
STORE_FACTORIES: dict[str, Callable[[Path], ObjectStore]] = {"local": _local}


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty object store of each available implementation."""
    return STORE_FACTORIES[request.param](tmp_path)
