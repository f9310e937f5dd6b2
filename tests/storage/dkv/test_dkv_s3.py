"""DKV end to end on the S3 store (a real SeaweedFS server): state equal to a dict
replaying the writes after every checkpoint and reopen, and the same object-store
requests, kind by kind, as on the local directory store."""
from __future__ import annotations

import random
from pathlib import Path

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc import collect_garbage
from dkvstream.storage.objectstore import ObjectStore, open_object_store
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.random_writes import random_writes

PREFIX = "jobs/j/state/op/kg-0000-0255"
# Small memtables and an eager L0 trigger: every checkpoint flushes and compacts.
OPTIONS = DKVOptions(memtable_bytes=16_000, l0_compaction_trigger=2, wal_flush_bytes=8_000,
                     target_file_bytes=32_000, level_base_bytes=64_000)
KINDS = ("GET", "PUT", "LIST", "DELETE", "HEAD")


def _workload(root_uri: str, seed: int = 7, epochs: int = 6) -> tuple[dict[bytes, bytes], list[str], dict]:
    """Writes, checkpoints and reopens DKV like one task per epoch, checking every epoch
    against a dict. Returns the final model, the manifest keys and the object-store
    requests of the whole run by kind."""
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    manifests: list[str] = []
    manifest = None
    opened: list[ObjectStore] = []

    def reopen() -> ObjectStore:  # from the URI alone, as a Spark task does
        opened.append(open_object_store(root_uri))
        return opened[-1]

    for epoch in range(1, epochs + 1):
        db = DKV.open(reopen(), PREFIX, manifest, OPTIONS)
        random_writes(db, model, rng, 1500, keys=range(3000), key_format=b"key-%05d",
                      delete_share=0.15, value_bytes=(1, 39))
        manifest = db.checkpoint(f"e{epoch:08d}-a")
        manifests.append(manifest)
        db.close()
        reopened = DKV.open(reopen(), PREFIX, manifest, OPTIONS)
        assert dict(reopened.scan_prefix(b"")) == model, f"state differs after epoch {epoch}"
        probe = b"key-%05d" % rng.randrange(3000)
        assert reopened.get(probe) == model.get(probe)
        reopened.close()
    requests = {k: sum(s.stats.snapshot()[k] for s in opened) for k in KINDS}
    return model, manifests, requests


def test_dkv_on_s3_equals_dict_and_counts_like_local(s3_store, tmp_path: Path) -> None:
    model, manifests, s3_requests = _workload(s3_store.root_uri)
    local = LocalObjectStore(tmp_path / "local")
    local_model, _, local_requests = _workload(local.root_uri)
    assert model == local_model

    db = DKV.open(s3_store, PREFIX, manifests[-1], OPTIONS)
    assert sum(db.stats()["tables_per_level"][1:]) > 0, "the workload must compact into L1+"
    db.close()
    # The same work issues the same requests of each kind on both stores.
    assert s3_requests == local_requests
    assert s3_requests["GET"] > 0 and s3_requests["PUT"] > 0
    keys = s3_store.list("")
    assert len(keys) == len(local.list(""))

    # Garbage collection keeping only the newest manifest deletes on S3 too, and the
    # state survives it.
    report = collect_garbage(s3_store, [PREFIX], [manifests[-1]])
    assert report["deleted"] > 0
    assert len(s3_store.list("")) == len(keys) - report["deleted"]
    again = DKV.open(s3_store, PREFIX, manifests[-1], OPTIONS)
    assert dict(again.scan_prefix(b"")) == model
