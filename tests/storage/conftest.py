"""Shared fixtures for storage tests: one object-store fixture parametrized over implementations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dkvstream.storage.objectstore import ObjectStore
from dkvstream.storage.objectstore.local import LocalObjectStore


def _local(tmp_path: Path) -> ObjectStore:
    return LocalObjectStore(tmp_path / "bucket")


# The storage tests run on a local directory; the object-store contract suite
# (objectstore/test_objectstore.py) overrides `store` to run on S3 too, and DKV, the log and the
# flights job have their own S3 tests (dkv/test_dkv_s3.py, log/, ../operators/runtime/test_flights_s3.py).
STORE_FACTORIES: dict[str, Callable[[Path], ObjectStore]] = {"local": _local}


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty object store of each available implementation."""
    return STORE_FACTORIES[request.param](tmp_path)
