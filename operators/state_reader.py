"""Read a job's operator state at a committed checkpoint without running the job.

The first piece of the state reader (like Spark's ``statestore`` data source): raw DKV
entries and decoded timers per operator and key-group range.
"""
from __future__ import annotations

from collections.abc import Iterator

from operators.checkpoints import latest_checkpoint, read_checkpoint
from operators.state import SCHEMA_TIMER
from storage.dkv import DKV
from storage.objectstore import ObjectStore


def checkpoint_entries(store: ObjectStore, job_prefix: str, epoch: int | None = None
                       ) -> Iterator[tuple[str, str, bytes, bytes]]:
    """Every live DKV entry of a checkpoint, in (operator, range, key) order.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        epoch: committed epoch to read (None: the newest).

    Yields:
        ``(operator name, range label, dkv key, value)``; timers have schema byte 0x01
        at key offset 2 and empty values (see ``operators.timers``).

    Raises:
        LookupError: the job has no committed checkpoint.
    """
    ckpt = latest_checkpoint(store, job_prefix) if epoch is None else read_checkpoint(store, job_prefix, epoch)
    if ckpt is None:
        raise LookupError(f"{store.uri(job_prefix)}: no committed checkpoint")
    for op_name in sorted(ckpt.operators):
        for label, manifest_key in sorted(ckpt.operators[op_name].items()):
            db = DKV.open(store, f"{job_prefix}/state/{op_name}/{label}", manifest_key)
            try:
                for k, v in db.scan_range(b"", None):
                    yield op_name, label, k, v
            finally:
                db.close()


def is_timer(dkv_key: bytes) -> bool:
    """True if ``dkv_key`` is a timer entry."""
    return len(dkv_key) > 2 and dkv_key[2] == SCHEMA_TIMER
