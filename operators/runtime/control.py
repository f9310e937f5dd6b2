"""Talking to a running job through its object store: flush requests and the epoch lease.

Both are small JSON objects under ``jobs/<job>/control/``, so a process that shares only
the bucket with the job (a Dagster op, a shell) can use them:

* ``control/flush/<id>.json`` -- a **flush request**. The driver lists them when it plans
  an epoch; that epoch's tasks flush their memtables to level-0 SSTables before their
  DKV checkpoint, and after the commit the driver deletes exactly the requests it saw
  (one written meanwhile is served by the next epoch). Body: ``{"id", "requested_at_ms",
  "reason"}``.
* ``control/lease.json`` -- the **epoch lease**, written by the driver before its tasks
  write anything and deleted after the epoch's commit and inline cleanup (or its
  failure). Body: ``{"epoch", "acquired_at_ms", "expires_at_ms", "owner"}``. A cleanup
  from another process (``dkvstream.operators.runtime.cleanup.cleanup_job(..., concurrent=True)``) deletes
  no unreferenced file while a live lease exists, because the tasks' flushed tables and
  staged files are unreferenced until the commit. A lease is *stale* (ignored) once its
  epoch is committed (the driver died between commit and release) or its
  ``expires_at_ms`` passed (the driver died mid-epoch; its files are garbage then).
"""
from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import asdict, dataclass

from dkvstream.operators.paths import flush_request_prefix, lease_key
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

# An epoch longer than this loses its lease's protection; epochs take seconds to minutes.
DEFAULT_LEASE_MS = 30 * 60 * 1000


def request_flush(store: ObjectStore, job_prefix: str, reason: str = "") -> str:
    """Asks the running job to flush its memtables at its next epoch.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        reason: free text recorded in the request (e.g. the Dagster run id).

    Returns:
        The request's object key; it disappears once an epoch has served it.
    """
    rid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    key = f"{flush_request_prefix(job_prefix)}{rid}.json"
    body = {"id": rid, "requested_at_ms": time.time_ns() // 1_000_000, "reason": reason}
    store.put(key, json.dumps(body, sort_keys=True).encode())
    return key


def pending_flush_requests(store: ObjectStore, job_prefix: str) -> list[str]:
    """Keys of the flush requests not served yet, oldest first."""
    return sorted(k for k in store.list(flush_request_prefix(job_prefix)) if k.endswith(".json"))


def consume_flush_requests(store: ObjectStore, keys: list[str]) -> None:
    """Deletes served flush requests (idempotent)."""
    for key in keys:
        store.delete(key)


@dataclass(frozen=True)
class EpochLease:
    """A driver's claim that epoch ``epoch`` is in flight (times in ms since the Unix epoch)."""

    epoch: int
    acquired_at_ms: int
    expires_at_ms: int
    owner: str

    def is_live(self, newest_committed: int, now_ms: int | None = None) -> bool:
        """True while the epoch is not committed and the lease has not expired."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return self.epoch > newest_committed and now_ms < self.expires_at_ms


def acquire_lease(store: ObjectStore, job_prefix: str, epoch: int,
                  duration_ms: int = DEFAULT_LEASE_MS) -> EpochLease:
    """Writes the lease for ``epoch`` (replacing a stale one; one driver per job)."""
    now = time.time_ns() // 1_000_000
    lease = EpochLease(epoch, now, now + duration_ms, f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    store.put(lease_key(job_prefix), json.dumps(asdict(lease), sort_keys=True).encode())
    return lease


def release_lease(store: ObjectStore, job_prefix: str, lease: EpochLease) -> None:
    """Deletes ``lease`` if it is still the current one."""
    if read_lease(store, job_prefix) == lease:
        store.delete(lease_key(job_prefix))


def read_lease(store: ObjectStore, job_prefix: str) -> EpochLease | None:
    """The current lease, or None.

    Raises:
        CorruptionError: the lease object is not a lease (names its URI).
    """
    key = lease_key(job_prefix)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    try:
        return EpochLease(**json.loads(data))
    except (ValueError, TypeError) as e:
        raise CorruptionError(f"{store.uri(key)}: unreadable epoch lease: {e}") from None
