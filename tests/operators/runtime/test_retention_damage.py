"""Damage only retention trips over: a range manifest of an older retained checkpoint
that no longer reads. The epochs after it commit (the damage cannot be repaired by
failing them); retention keeps what the damaged manifest could name, logs a warning,
reports it in its ``CleanupReport`` and in the next checkpoint's metrics, and the
Dagster ``verified`` check fails naming that checkpoint. Once the checkpoint expires the
job is clean again. The full sweep (``cleanup_job``) reads the damaged manifest and
reports it; the driver's incremental retention never reads retained manifests, so it
neither trips over the damage nor deletes anything the damaged manifest names before its
checkpoint expires. In process; oracle: the pandas answer of the job."""

from __future__ import annotations

import logging
from pathlib import Path

from dkvstream.assets.checkpoints import checkpoint_check_result
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from tests.operators import small_keyed_count as small

RETAIN = 3


def _damage_epoch_2_manifest(runner) -> str:
    store, prefix = runner.store, runner.job.prefix
    manifest = min(read_checkpoint(store, prefix, 2).operators["keyed_window_count"].values())
    path = Path(store.uri(manifest).removeprefix("file://"))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    return manifest


def test_damaged_older_manifest_does_not_fail_later_epochs(tmp_path, caplog) -> None:
    root = str(tmp_path)
    runner = small.runner(root, retain=RETAIN, full_sweep_every=1)  # the full sweep every epoch
    runner.run(max_epochs=3)  # retained: 1, 2, 3
    store, prefix = runner.store, runner.job.prefix
    manifest = _damage_epoch_2_manifest(runner)

    with caplog.at_level(logging.WARNING, logger="dkvstream.operators.runtime.cleanup"):
        [fourth] = runner.run(max_epochs=1)  # retention keeps 2, 3, 4: reads the damaged manifest
    assert fourth.epoch == 4 and runner.latest().epoch == 4
    [damage] = runner.last_cleanup.damaged
    assert "retained checkpoint epoch 2" in damage and store.uri(manifest) in damage, damage
    assert "no file of operator keyed_window_count is collected" in damage, damage
    assert store.exists(manifest)  # kept, with everything it may name
    assert any(store.uri(manifest) in r.getMessage() for r in caplog.records), caplog.text

    verified = checkpoint_check_result(ObjectStoreResource(root_uri=root).open(), runner.job)
    assert not verified.passed
    assert verified.metadata["damaged_epochs"].value == [2]
    assert any(
        e.startswith("epoch 2: ") and store.uri(manifest) in e
        for e in verified.metadata["errors"].value
    )

    assert [r.epoch for r in runner.run(max_epochs=1)] == [5]  # epoch 2 expires now
    assert read_checkpoint(store, prefix, 5).metrics["retention_damage"] == [damage]
    assert runner.last_cleanup.damaged == [] and not store.exists(manifest)
    assert checkpoint_check_result(ObjectStoreResource(root_uri=root).open(), runner.job).passed
    runner.run()
    assert "retention_damage" not in runner.latest().metrics
    small.assert_output_exact(runner, "after retention met a damaged manifest")


def test_incremental_retention_passes_a_damaged_manifest_by(tmp_path) -> None:
    root = str(tmp_path)
    runner = small.runner(root, retain=RETAIN, full_sweep_every=None)
    runner.run(max_epochs=3)
    store = runner.store
    manifest = _damage_epoch_2_manifest(runner)
    [fourth] = runner.run(max_epochs=1)  # expires epoch 1: what epoch 2 dropped goes
    assert fourth.epoch == 4
    assert runner.last_cleanup.full_sweep == "" and runner.last_cleanup.damaged == []
    assert runner.last_cleanup.checkpoints_deleted == 1 and store.exists(manifest)
    verified = checkpoint_check_result(ObjectStoreResource(root_uri=root).open(), runner.job)
    assert verified.metadata["damaged_epochs"].value == [2]  # found by the check, not retention
    runner.run(max_epochs=1)  # epoch 2 expires: its manifest was dropped by epoch 3
    assert runner.last_cleanup.full_sweep == "" and not store.exists(manifest)
    assert checkpoint_check_result(ObjectStoreResource(root_uri=root).open(), runner.job).passed
    runner.run()
    small.assert_output_exact(runner, "after incremental retention passed a damaged manifest")
