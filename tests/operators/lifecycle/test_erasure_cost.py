"""What the driver reads to name the files holding an erased key (``erasure.held_before``):
only the files whose manifest key bounds overlap the key's entries, never every file of
its range; and it finds exactly what a scan of the files the retained checkpoints name
finds (the oracle)."""
from __future__ import annotations

import dataclasses

from dkvstream.operators import paths
from dkvstream.operators.runtime import erasure
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.erasure_scan import scan_store
from dkvstream.operators.runtime.pins import files_by_owner
from tests.operators import small_keyed_count as skc

KEY = b"k199"
# Small tables: each holds a few key groups, so the bounds tell most of them apart.
OPTIONS = dataclasses.replace(skc.OPTIONS, target_file_bytes=1 << 10, level_base_bytes=4 << 10)


def _record(store, method: str) -> list[str]:
    """Makes ``store.<method>`` record the key (or prefix) of each call in the list returned."""
    calls: list[str] = []
    real = getattr(store, method)

    def recording(key, *a, **kw):
        calls.append(key)
        return real(key, *a, **kw)

    setattr(store, method, recording)
    return calls


def test_held_before_reads_only_files_whose_bounds_may_hold_the_key(tmp_path):
    with JobRunner(skc.job(), None, str(tmp_path), dkv_options=OPTIONS, retain_checkpoints=3) as r:
        r.run(max_epochs=4)
        store, prefix, key_groups = r.store, r.job.prefix, r.job.key_groups
    named = set()
    for e in list_epochs(store, prefix):
        named |= set(files_by_owner(store, read_checkpoint(store, prefix, e)).get(prefix, {}))
    want = {h.key for h in scan_store(store, KEY, f"{prefix}/state/").holding} & named
    assert want
    erasure.request_erasure(store, prefix, KEY)
    requests = erasure.pending_erasures(store, prefix)
    got_keys = _record(store, "get")
    [held] = erasure.held_before(store, prefix, requests, key_groups).values()
    assert set(held) == want
    kg_range = erasure.writer_range(next(iter(want)))
    of_range = {k for k in named if k.endswith((".sst", ".wal")) and erasure.writer_range(k) == kg_range}
    read = {k for k in got_keys if k.endswith((".sst", ".wal"))}
    assert want - {k for k in want if k.endswith(".json")} <= read
    assert len(read) * 2 < len(of_range)  # the bounds excluded most files of the key's range


def test_a_damaged_manifest_is_reported_not_skipped(tmp_path):
    """A retained checkpoint's range manifest that does not read: the files it names could
    hold the key unseen, so the report names the manifest instead of under-reporting."""
    with skc.runner(str(tmp_path), retain=3) as r:
        r.run(max_epochs=3)
        store, prefix, key_groups = r.store, r.job.prefix, r.job.key_groups
    first = list_epochs(store, prefix)[0]
    mkey = sorted(read_checkpoint(store, prefix, first).operators["keyed_window_count"].values())[0]
    store.put(mkey, b"not a manifest")
    held = erasure.files_holding(store, prefix, KEY, key_groups)
    assert "damaged manifest" in held[mkey]["how"] and first in held[mkey]["named_by"]


def test_the_erasure_epoch_expires_older_checkpoints_without_listing_the_state(tmp_path):
    """The driver's retention after the erasure epoch is incremental (what the checkpoints
    recorded as dropped): no LIST of the job's state files, and the state holds the key
    nowhere afterwards (the scan, the oracle)."""
    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store, prefix = r.store, r.job.prefix
        erasure.request_erasure(store, prefix, KEY)
        listed = _record(store, "list")
        [result] = r.run(max_epochs=1)
        del store.list  # the class's again
    assert list_epochs(store, prefix) == [result.epoch]
    assert not set(listed) & set(paths.state_listing_roots(prefix)), listed  # the full sweep's LIST
    assert scan_store(store, KEY, f"{prefix}/state/").holding == []
