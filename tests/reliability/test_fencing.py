"""Two drivers on one job: the commit of an epoch is a put-if-absent of its checkpoint
manifest, so when both run the same epoch exactly one commits it and the other stops
with ``JobFencedError`` naming the job, the epoch and the checkpoint object; it publishes
nothing. Real processes, on a local directory and on the S3 server (SeaweedFS)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.reliability import harness


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> harness.Reference:
    return harness.reference_run(tmp_path_factory.mktemp("reference"))


def _race_to_commit(store_uri: str, tmp_path: Path) -> list[harness.DriverRun]:
    """Two drivers meet before their first commit (both ran epoch 1's tasks), then both
    commit; returns both runs."""
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        ready = tmp_path / f"ready{i}"
        cfg = {"store": store_uri, "barrier": ["after_tasks", str(ready), str(go)]}
        procs.append((*harness.start_driver(cfg, tmp_path / f"driver{i}"), ready))
    deadline = time.monotonic() + 300
    while not all(ready.exists() for _, _, ready in procs):
        assert all(p.poll() is None for p, _, _ in procs), [p.communicate()[1][-2000:] for p, _, _ in procs]
        assert time.monotonic() < deadline, "drivers never reached their commit"
        time.sleep(0.01)
    go.touch()
    runs = []
    for p, trace, _ in procs:
        _, err = p.communicate(timeout=300)
        runs.append(harness.DriverRun(p.returncode, trace.read_text().split(), err))
    return runs


def _check_fenced(runs: list[harness.DriverRun], store_uri: str, reference: harness.Reference) -> None:
    codes = sorted(r.returncode for r in runs)
    assert codes == [0, 3], f"exit codes {codes}: " + "\n".join(r.stderr[-2000:] for r in runs)
    winner, loser = sorted(runs, key=lambda r: r.returncode)
    assert "FENCED: job keyed_count: epoch 1 was committed by another driver" in loser.stderr, loser.stderr
    assert "checkpoints/epoch-0000000001.json already exists" in loser.stderr, loser.stderr
    assert store_uri.split("://")[-1].rstrip("/") in loser.stderr  # the object's full URI
    # The loser stopped at its commit: it never published or cleaned up anything.
    assert "after_commit" not in loser.passed and "publish_file" not in loser.passed
    assert winner.passed.count("after_commit") == reference.epochs
    harness.check_recovery(store_uri, reference)  # the winner's state and output are exact


def test_second_driver_is_fenced(reference, tmp_path) -> None:
    store = str(tmp_path / "store")
    _check_fenced(_race_to_commit(store, tmp_path), store, reference)


def test_second_driver_is_fenced_on_s3(reference, s3_store, tmp_path) -> None:
    _check_fenced(_race_to_commit(s3_store.root_uri, tmp_path), s3_store.root_uri, reference)


def test_unsynchronised_drivers_never_both_commit(reference, tmp_path) -> None:
    """Started together and left alone: each epoch is committed once (each driver either
    finishes or is fenced) and the output is exact."""
    store = str(tmp_path / "store")
    procs = [harness.start_driver({"store": store}, tmp_path / f"driver{i}") for i in range(2)]
    runs = []
    for p, trace in procs:
        _, err = p.communicate(timeout=300)
        runs.append(harness.DriverRun(p.returncode, trace.read_text().split(), err))
    for r in runs:
        assert r.returncode in (0, 3), r.stderr[-2000:]
    commits = sum(r.passed.count("after_commit") for r in runs)
    assert commits == reference.epochs, f"{commits} commits of {reference.epochs} epochs"
    harness.check_recovery(store, reference)
