"""One listing of what a job's tasks wrote (DKV files and staged output), in both key
layouts, shared by the sinks (``staged_keys``) and the full sweep; oracle: the keys as
written, by kind."""
from __future__ import annotations

from dkvstream.operators import paths
from dkvstream.operators.io.sinks import list_task_files, staged_keys
from dkvstream.storage.objectstore.memory import MemoryObjectStore


def test_list_task_files_splits_both_layouts() -> None:
    store = MemoryObjectStore()
    job = "jobs/j"
    state, staged = [], []
    for layout in (paths.LAYOUT_FLAT, paths.LAYOUT_HASHED):
        for label in ("kg-0000-0127", "kg-0128-0255"):
            state.append(paths.state_prefix(job, "op", label, layout) + f"/sst/{layout}.sst")
            staged.append(paths.staging_prefix(job, 3, "op", label, "a1", layout) + "/main.parquet")
    others = [paths.checkpoint_key(job, 3), paths.sink_prefix(job, "main") + "/epoch=3/x.parquet",
              paths.pin_key(job, "k", "fork")]
    for key in state + staged + others:
        store.put(key, b"x")
    got_state, got_staged = list_task_files(store, job)
    assert (sorted(got_state), sorted(got_staged)) == (sorted(state), sorted(staged))
    assert sorted(staged_keys(store, job)) == sorted(staged)
    assert list_task_files(store, job, with_state=False) == ([], staged_keys(store, job))
