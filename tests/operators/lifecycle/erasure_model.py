"""Helpers of the erasure tests: a checkpoint's state as a dict (the model the erased run
is compared with) and the subject of a DKV key."""
from __future__ import annotations

from dkvstream.operators.api.state import SCHEMA_PROCESSING_TIMER, SCHEMA_TIMER, decode_state_key
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.storage.dkv import DKV
from dkvstream.storage.objectstore import ObjectStore


def subject_of(dkv_key: bytes) -> bytes:
    """The subject key of a state or timer entry."""
    if dkv_key[2] in (SCHEMA_TIMER, SCHEMA_PROCESSING_TIMER):
        return dkv_key[11:]
    return decode_state_key(dkv_key)[1]


def checkpoint_state(store: ObjectStore, job_prefix: str, epoch: int) -> dict[tuple[str, bytes], bytes]:
    """``{(operator, DKV key): value}`` of every range of checkpoint ``epoch``."""
    ckpt = read_checkpoint(store, job_prefix, epoch)
    out = {}
    for op, ranges in ckpt.operators.items():
        for manifest in ranges.values():
            db = DKV.open(store, manifest.rsplit("/manifests/", 1)[0], manifest)
            try:
                out.update(((op, k), v) for k, v in db.scan_range(b"", None))
            finally:
                db.close()
    return out
