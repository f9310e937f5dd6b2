"""Erasure after a rescale: the ranges a rescale split (or merged) name their parents'
tables clipped, so a file may hold the key while the range naming it does not own the
key's key group. The erasure epoch rewrites every such file (``erasure.erasure_targets``):
the whole store holds the key nowhere afterwards, and every other key's state is the model's
(the same runs without the erasure)."""
from __future__ import annotations

import dataclasses

import pytest

from dkvstream.operators.runtime import erasure
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.dkv.manifest import load_manifest
from tests.operators import small_keyed_count as skc
from tests.operators.lifecycle.erasure_model import checkpoint_state, subject_of

KEY = b"k199"
# Flushes every epoch, never compacts: the tables a rescale shares stay shared.
OPTIONS = dataclasses.replace(skc.OPTIONS, l0_compaction_trigger=1_000)


def _runner(root: str, parallelism: int) -> JobRunner:
    return JobRunner(skc.job(parallelism), None, root, dkv_options=OPTIONS, retain_checkpoints=2)


def _runs(root: str, scales: list[int], key: bytes | None):
    """One epoch per parallelism of ``scales``, then (with ``key``) the erasure's epoch."""
    for p in scales:
        with _runner(root, p) as r:
            r.run(max_epochs=1)
    with _runner(root, scales[-1]) as r:
        rid = erasure.request_erasure(r.store, r.job.prefix, key) if key else None
        r.run(max_epochs=1)
        return r.store, r.job.prefix, rid, r.job


@pytest.mark.parametrize("scales", [[2, 3], [3, 2]])
def test_erasure_after_a_rescale_leaves_no_byte_in_shared_files(tmp_path, scales):
    store, prefix, _, _ = _runs(str(tmp_path / "ref"), scales, None)
    last = list_epochs(store, prefix)[-1]
    model = {k: v for k, v in checkpoint_state(store, prefix, last).items() if subject_of(k[1]) != KEY}
    store, prefix, rid, job = _runs(str(tmp_path / "erased"), scales, KEY)
    assert list_epochs(store, prefix)[-1] == last
    clipped = [t for m in _manifests(store, prefix, last) for t in m.levels.all_tables() if t.clip is not None]
    assert clipped  # the case: files the rescale shares are still named
    assert checkpoint_state(store, prefix, last) == model
    report = erasure.complete_erasure(store, prefix, rid, KEY, sinks=erasure.job_sinks(job), key_column="key")
    assert report.scan["holding"] == [], report.scan["holding"]
    assert report.status == "complete"


def _manifests(store, prefix: str, epoch: int):
    ckpt = read_checkpoint(store, prefix, epoch)
    return [load_manifest(store, m) for ranges in ckpt.operators.values() for m in ranges.values()]
