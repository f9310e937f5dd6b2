"""Erasure of a key everywhere a job keeps it (a GDPR request), with a report.

Steps (docs/erasure.md):

1. **Request** (``request_erasure``): a small JSON object
   ``jobs/<job>/control/erase/<id>.json`` naming the key (hex). A running job's driver
   lists the pending requests when it plans an epoch, as it does flush requests
   (``dkvstream.operators.runtime.control``). A stopped or finished job is served by
   ``apply_offline``, which commits one epoch of its own through the commit fence.
2. **State** (``erase_subjects``, in the epoch's task of the range holding the key's key
   group, in every operator, and of every range naming a table shared after a rescale
   whose file may hold the key: ``erasure_targets``): every DKV entry of the subject key under every schema byte
   (``dkvstream.operators.api.state``: state 0x00, event-time timers 0x01, TTL'd state
   0x02/0x03, processing-time timers 0x04; a timer's key holds the subject key after
   its timestamp) is purged physically (``DKV.erase_prefixes``): tables holding it are
   rewritten, the memtable is flushed, so the epoch's checkpoint names no table, WAL
   object or manifest holding the key. The erasure runs after the epoch's events and
   timers, so the epoch's own writes of the key are erased too.
3. **Retained checkpoints** (``finish_applied``, after the commit): older checkpoints
   still name the old tables and WAL objects. Their files holding the key are found
   before the epoch runs (``held_before``: only the files whose manifest key bounds may
   hold it are read, decoded with ``erasure_scan.object_holds``) and listed in the
   record; then retention keeps only the checkpoints from the erasure epoch on
   (``expire_before`` with ``retain`` = the epochs committed since: the retention floor
   rises to the epoch before it) and deletes their files: incrementally in the driver,
   with the full sweep in ``apply_offline`` and ``complete_erasure``. The request is
   replaced by the record ``jobs/<job>/erasures/<id>.json``, which holds the key's
   SHA-256, never the key.
4. **Sinks** (``complete_erasure``): each sink of the job and the dead-letter table
   erase the rows whose key column holds the key (``Sink.erase_rows``, by the column
   ``Sink.erasure_column`` names; a sink that cannot is reported as skipped).
5. **Pins and savepoints**: savepoints are never rewritten, and no pinned file is
   deleted. The report names each savepoint whose files still hold the key and the
   command that drops it, and for each file still present the pins keeping it (a
   savepoint of this or another job, a fork, a branch: ``pins_holding``) with the
   command releasing each; the status is ``held`` until nothing does.
6. **Scan** (``erasure_scan.scan_store``): every object under a prefix, raw and decoded.

A restart after an erasure runs from the erasure epoch's checkpoint (or a later one): the
key is not in it. A recovery may fall back only to checkpoints retention kept, none older
than the erasure epoch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dkvstream.operators import paths
from dkvstream.operators.api.keygroups import KeyGroupRange, key_group_of
from dkvstream.operators.api.state import SCHEMA_PROCESSING_TIMER, SCHEMA_TIMER, STATE_SCHEMAS, subject_prefix
from dkvstream.operators.errors import JobFailedError
from dkvstream.operators.runtime.checkpoints import (
    JobCheckpoint,
    commit_checkpoint,
    encode_objects,
    latest_checkpoint,
    list_epochs,
    read_checkpoint,
)
from dkvstream.operators.runtime.cleanup import CleanupReport, IncrementalRetention, cleanup_job
from dkvstream.operators.runtime.control import acquire_lease, read_lease, release_lease
from dkvstream.operators.runtime.erasure_scan import object_holds, scan_store
from dkvstream.operators.runtime.pins import Pin, read_pins
from dkvstream.operators.runtime.savepoints import list_savepoints
from dkvstream.storage.dkv import DKV
from dkvstream.storage.dkv.manifest import Manifest, decode_manifest, load_manifest
from dkvstream.storage.dkv.read import prefix_successor
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore, map_requests

if TYPE_CHECKING:
    from dkvstream.operators.api.job import Job

log = logging.getLogger(__name__)

_TIMER_SCHEMAS = (SCHEMA_TIMER, SCHEMA_PROCESSING_TIMER)
_TIMER_KEY_HEAD = 11  # key group u16, schema u8, timestamp u64 (dkvstream.operators.runtime.timers)
SAVEPOINT_DROP = "python -m dkvstream.operators.tools.savepoints --store {store} drop {job} {name}"
FORK_DROP = "python -m dkvstream.operators.tools.savepoints --store {store} drop-fork {child}"
SAVEPOINT_PIN = "savepoint-"  # a savepoint's pin's ``what`` (savepoints.py)
RESTORE_PIN = "restore-"  # a restore's pin on the job's own files (savepoints.restore); any other: a fork's
RESTORE_RELEASE = ("none needed: the job's next full retention sweep deletes it (the garbage_collection "
                   "job, or complete_erasure again)")


# ----------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class ErasureRequest:
    """A pending request: ``id``, the subject ``key``, ``requested_at_ms`` (ms since the
    Unix epoch), ``reason`` (free text) and ``object_key`` (where it is stored)."""

    id: str
    key: bytes
    requested_at_ms: int
    reason: str
    object_key: str


def request_erasure(store: ObjectStore, job_prefix: str, key: bytes, reason: str = "") -> str:
    """Asks for ``key`` to be erased from the job's state (served by the running job's
    next epoch, or by ``apply_offline`` for a stopped one).

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        key: the subject key, as the job's operators key their state (bytes, non-empty).
        reason: free text recorded in the report (e.g. the ticket number).

    Returns:
        The request's id (for ``read_report`` / ``complete_erasure``).

    Raises:
        ValueError: ``key`` is empty or not bytes.
    """
    if type(key) is not bytes or not key:
        raise ValueError(f"erasure key must be non-empty bytes, got {key!r}")
    rid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    body = {"id": rid, "key_hex": key.hex(), "requested_at_ms": time.time_ns() // 1_000_000, "reason": reason}
    store.put(f"{paths.erase_request_prefix(job_prefix)}{rid}.json", json.dumps(body, sort_keys=True).encode())
    return rid


def read_erasure_requests(store: ObjectStore, job_prefix: str) -> tuple[list[ErasureRequest], dict[str, str]]:
    """The requests not served yet, oldest first, and the objects under the request prefix
    that are not requests: ``(requests, {object key: why it was skipped})``.

    A malformed object is skipped, not raised: the driver lists the requests every epoch,
    and one bad object must not stop the job. ``request_erasure`` writes only valid ones;
    a skipped object was written by something else (delete it and request again).

    Cost: one LIST, one GET per object listed.
    """
    out, skipped = [], {}
    for key in sorted(k for k in store.list(paths.erase_request_prefix(job_prefix)) if k.endswith(".json")):
        try:
            body = json.loads(store.get(key))
            out.append(ErasureRequest(body["id"], bytes.fromhex(body["key_hex"]), int(body["requested_at_ms"]),
                                      body.get("reason", ""), key))
        except ObjectNotFoundError:  # served meanwhile
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            skipped[key] = (f"{store.uri(key)}: not an erasure request ({type(e).__name__}: {e}); skipped: "
                            "delete it and request the erasure again with request_erasure or "
                            "python -m dkvstream.operators.tools.erase request")
    return out, skipped


def pending_erasures(store: ObjectStore, job_prefix: str) -> list[ErasureRequest]:
    """The requests not served yet, oldest first (``read_erasure_requests``; each
    malformed object is skipped with a warning naming it)."""
    requests, skipped = read_erasure_requests(store, job_prefix)
    for why in skipped.values():
        log.warning("%s", why)
    return requests


def key_sha256(key: bytes) -> str:
    """How records and reports name the key (never the key itself)."""
    return hashlib.sha256(key).hexdigest()


# ---------------------------------------------------------------------------- DKV state
def subjects_of(requests: Sequence[ErasureRequest], key_groups: int) -> tuple[tuple[int, bytes], ...]:
    """``(key group, key)`` of each request's key, for the job's ``key_groups``."""
    return tuple((key_group_of(r.key, key_groups), r.key) for r in requests)


def in_range(subjects: Sequence[tuple[int, bytes]], krange: KeyGroupRange) -> tuple[tuple[int, bytes], ...]:
    """The subjects whose key group ``krange`` holds."""
    return tuple(s for s in subjects if s[0] in krange)


def writer_range(file_key: str) -> KeyGroupRange | None:
    """The key-group range of the DKV instance that wrote ``file_key`` (the range label in
    its path, ``paths.parse_state_key``): every key the file holds is of those key groups.
    None: not a range's file (its keys are then unknown)."""
    owner = paths.owner_of(file_key)
    parsed = None if owner is None else paths.parse_state_key(owner, file_key)
    try:
        return None if parsed is None else KeyGroupRange.from_label(parsed[1])
    except ValueError:  # not a range label
        return None


def _shared_writers(store: ObjectStore, manifest_key: str) -> list[KeyGroupRange | None]:
    """``writer_range`` of each clipped (shared, after a rescale) table ``manifest_key`` names."""
    return [writer_range(t.key) for t in load_manifest(store, manifest_key).levels.all_tables()
            if t.clip is not None]


def erasure_targets(store: ObjectStore, previous: dict[str, str], ranges: Sequence[KeyGroupRange],
                    subjects: Sequence[tuple[int, bytes]]) -> list[tuple[tuple[int, bytes], ...]]:
    """The subjects each of ``ranges`` erases in an epoch over one operator's ``previous``
    range manifests (``{range label: manifest key}``; the epoch may rescale them to
    ``ranges``).

    A range erases the subjects of its own key groups, and also those a file it names may
    hold physically: after a rescale, a range names its parent's tables clipped to its
    own keys, but the file still holds its siblings' keys (``storage/dkv/purge.py``). So a
    range also erases the subjects of every old range it opens from (a rescale in this
    epoch) or of the writer of each clipped table its manifest names (an earlier rescale,
    or a fork); there the purge finds the key in the file and rewrites the table as the
    range's own. WAL objects are never shared: a range opened from parents replays their
    records in its key range into its own (``rescale.wal_in_range``).

    Args:
        store: the job's object store.
        previous: the operator's range manifests in the checkpoint the epoch starts from.
        ranges: the operator's ranges in the epoch.
        subjects: ``(key group, key)`` of each request (``subjects_of``).

    Returns:
        Per range of ``ranges``, in order: the subjects its task erases.

    Cost: with subjects, one GET per manifest of ``previous`` (none without).

    Raises:
        ObjectNotFoundError / CorruptionError: a manifest of ``previous`` is missing or damaged
            (the epoch could not open it either).
    """
    if not subjects:
        return [() for _ in ranges]
    labels = sorted(previous)
    writers = dict(zip(labels, map_requests(lambda label: _shared_writers(store, previous[label]), labels)))
    out = []
    for kr in ranges:
        mine = set(in_range(subjects, kr))
        for label, shared in writers.items():
            old = KeyGroupRange.from_label(label)
            if old.start < kr.end and kr.start < old.end:
                mine.update(s for s in subjects if s[0] in old or any(w is None or s[0] in w for w in shared))
        out.append(tuple(s for s in subjects if s in mine))
    return out


def _subject_filter(key_group: int, key: bytes) -> tuple[list[bytes], Callable[[bytes], bool]]:
    """``(prefixes, where)`` matching every DKV entry of the subject (module docstring)."""
    head = key_group.to_bytes(2, "big")
    prefixes = [subject_prefix(key_group, key, s) for s in STATE_SCHEMAS]
    prefixes += [head + bytes((s,)) for s in _TIMER_SCHEMAS]

    def where(dkv_key: bytes) -> bool:  # state prefixes are exact; a timer key ends with its subject
        return dkv_key[2] not in _TIMER_SCHEMAS or dkv_key[_TIMER_KEY_HEAD:] == key

    return prefixes, where


def erase_subjects(db: DKV, subjects: Sequence[tuple[int, bytes]]) -> dict:
    """Purges every entry of each ``(key group, key)`` from ``db`` (module docstring, step 2).

    Returns:
        ``{"entries": n, "tables_rewritten": {old: new or None}, "wal_dropped": [keys]}``
        (JSON-ready; object keys, never key bytes).
    """
    summary = {"entries": 0, "tables_rewritten": {}, "wal_dropped": []}
    for key_group, key in subjects:
        result = db.erase_prefixes(*_subject_filter(key_group, key))
        summary["entries"] += result.entries
        summary["tables_rewritten"].update(result.tables_rewritten)
        summary["wal_dropped"] += result.wal_dropped
    return summary


# ------------------------------------------------------------------- after the commit
def expire_before(store: ObjectStore, job_prefix: str, epoch: int, *, full_sweep: bool = True) -> CleanupReport:
    """Retention with its floor just below ``epoch``: keeps the checkpoints of ``epoch``
    and later, deletes the older ones and then every file only they named.

    ``full_sweep``: with the full sweep (``cleanup.cleanup_job``, concurrent: it LISTs
    the job's files and defers file deletion while another epoch is in flight; run it
    again then); else incrementally (``cleanup.IncrementalRetention``: one GET per
    retained checkpoint, the files the checkpoints recorded as dropped deleted in
    batches, no LIST of the job's files; it falls back to the full sweep when the drops
    are unknown, e.g. the erasure epoch also rescaled). Both never delete a pinned file.
    """
    retain = max(1, sum(1 for e in list_epochs(store, job_prefix) if e >= epoch))
    if full_sweep:
        return cleanup_job(store, job_prefix, retain, concurrent=True)
    return IncrementalRetention(store, job_prefix, retain).apply()


def _holding(store: ObjectStore, keys: Sequence[str], key: bytes) -> dict[str, str]:
    """``{object: how}`` of the objects among ``keys`` holding ``key`` (one GET each)."""
    def how(k: str) -> str | None:
        try:
            return object_holds(store, k, store.get(k), key)
        except ObjectNotFoundError:
            return None

    return {k: h for k, h in zip(keys, map_requests(how, list(keys))) if h is not None}


def release_command(store: ObjectStore, pin: Pin) -> str:
    """The command that releases ``pin``: drop the holder's savepoint, or drop the holder
    (a fork or branch) with its pins; a restore's pin needs none (``RESTORE_RELEASE``)."""
    if pin.what.startswith(SAVEPOINT_PIN):
        return SAVEPOINT_DROP.format(store=store.root_uri, job=pin.holder, name=pin.what[len(SAVEPOINT_PIN):])
    if pin.what.startswith(RESTORE_PIN):
        return RESTORE_RELEASE
    return FORK_DROP.format(store=store.root_uri, child=pin.holder)


def pins_holding(store: ObjectStore, job_prefix: str, keys: Sequence[str]) -> dict[str, list[dict]]:
    """Why retention keeps each of the job's objects ``keys``: ``{object: [{"holder",
    "what", "pin", "release"}]}``, one entry per pin protecting it (``pins.read_pins``:
    a savepoint of this or another job, a fork or a branch of this job; ``release``: the
    command that drops it). An object no pin protects maps to ``[]``: only a deferred
    sweep kept it (``expire_before`` again deletes it).

    Cost: none without ``keys``; else one LIST of the job's pins and one GET per pin.

    Raises:
        CorruptionError: a pin record does not read (names it; retention deletes nothing
            while it is there).
    """
    if not keys:
        return {}
    pins = read_pins(store, job_prefix)
    return {k: [{"holder": p.holder, "what": p.what, "pin": p.key, "release": release_command(store, p)}
                for p in pins if k in set(p.keys)] for k in keys}


def _may_hold(m: Manifest, key_group: int, key: bytes) -> list[str]:
    """The files ``m`` names that may hold the subject, from the manifest alone (no
    request): a table whose key bounds overlap the subject's entries; a clipped table
    (shared after a rescale, its bounds only its visible keys) or a WAL object written by
    a range holding the key group (``writer_range``; unknown: kept)."""
    intervals = [(p, prefix_successor(p)) for p in _subject_filter(key_group, key)[0]]
    out = []
    for t in m.levels.all_tables():
        if t.clip is not None:
            writer = writer_range(t.key)
            hit = writer is None or key_group in writer
        else:
            hit = any(t.max_key >= lo and (hi is None or t.min_key < hi) for lo, hi in intervals)
        if hit:
            out.append(t.key)
    for w in m.wal:
        writer = writer_range(w.key)
        if writer is None or key_group in writer:
            out.append(w.key)
    return out


def _holding_named(store: ObjectStore, manifests: dict[str, list[int]], key: bytes,
                   key_group: int) -> dict[str, dict]:
    """The objects holding ``key`` among ``manifests`` (``{manifest key: [epochs naming
    it]}``) and the files they name: ``{object: {"how", "named_by": [epochs]}}``. Only
    files the manifests' key bounds say may hold it are read (``_may_hold``). A manifest
    that does not read is reported, not skipped: the files it names are unchecked."""
    data = dict(zip(manifests, map_requests(lambda k: _get_or_none(store, k), list(manifests))))
    out: dict[str, dict] = {}
    candidates: dict[str, set[int]] = {}
    for mkey, body in data.items():
        if body is None:  # deleted meanwhile (retention): it names nothing any more
            continue
        epochs = manifests[mkey]
        try:
            m = decode_manifest(body, store.uri(mkey))
        except CorruptionError as e:
            out[mkey] = {"how": f"damaged manifest ({e}): the files it names were not checked; "
                                "restore or delete the checkpoints naming it, then scan the store",
                         "named_by": sorted(epochs)}
            continue
        how = object_holds(store, mkey, body, key)  # a table's bounds, in hex, may be the key's
        if how is not None:
            out[mkey] = {"how": how, "named_by": sorted(epochs)}
        for f in _may_hold(m, key_group, key):
            candidates.setdefault(f, set()).update(epochs)
    for f, how in _holding(store, sorted(candidates), key).items():
        out[f] = {"how": how, "named_by": sorted(candidates[f])}
    return out


def _get_or_none(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get(key)
    except ObjectNotFoundError:
        return None


def files_holding(store: ObjectStore, job_prefix: str, key: bytes, key_groups: int,
                  before_epoch: int | None = None) -> dict[str, dict]:
    """The job's DKV files the retained checkpoints (before ``before_epoch`` if given)
    name that hold ``key``: ``{object: {"how": ..., "named_by": [epochs]}}``.

    Only the files whose manifest key bounds overlap the key's entries are read
    (``_may_hold``); files no retained checkpoint names (garbage) are not looked at:
    retention's sweep deletes them unread, and the final scan would find any left.

    Cost: one GET per retained checkpoint, one per distinct range manifest of the job they
    name, and one per candidate file.
    """
    kg = key_group_of(key, key_groups)
    manifests: dict[str, list[int]] = {}
    for e in list_epochs(store, job_prefix):
        if before_epoch is not None and e >= before_epoch:
            continue
        try:
            ckpt = read_checkpoint(store, job_prefix, e)
        except ObjectNotFoundError:  # expired meanwhile
            continue
        for ranges in ckpt.operators.values():
            for mkey in ranges.values():
                if mkey.startswith(f"{job_prefix}/"):  # another job's (a fork's parent) is its own to erase
                    manifests.setdefault(mkey, []).append(e)
    return _holding_named(store, manifests, key, kg)


def held_before(store: ObjectStore, job_prefix: str, requests: Sequence[ErasureRequest],
                key_groups: int, before_epoch: int | None = None) -> dict[str, dict[str, dict]]:
    """``files_holding`` of each request's key, by request id: what the driver records
    before the erasure epoch runs (the epoch's own retention may delete some of them)."""
    return {r.id: files_holding(store, job_prefix, r.key, key_groups, before_epoch) for r in requests}


def finish_applied(store: ObjectStore, job_prefix: str, requests: Sequence[ErasureRequest],
                   ckpt: JobCheckpoint, before: dict[str, dict[str, dict]] | None = None, *,
                   full_sweep: bool = True) -> list[dict]:
    """After the commit of erasure epoch ``ckpt``: records, per request, what held the key
    in the checkpoints before it, expires them (``expire_before``), writes the record
    ``erasures/<id>.json`` (status ``applied``) and deletes the request (module
    docstring, step 3). Idempotent: a crash before the request's deletion has the next
    epoch serve it again, finding nothing. ``before``: ``held_before`` from before the
    epoch ran (the checkpoints before it named the same files then); None: found now.
    ``full_sweep``: how retention runs (``expire_before``; the driver's is incremental,
    and ``complete_erasure`` then runs the full sweep).

    Returns:
        The records written.
    """
    if before is None:
        before = held_before(store, job_prefix, requests, ckpt.key_groups, ckpt.epoch)
    held = {r.id: before.get(r.id, {}) for r in requests}
    retention = expire_before(store, job_prefix, ckpt.epoch, full_sweep=full_sweep)
    state = ckpt.metrics.get("erasure", {}).get("ranges", {})
    records = []
    for r in requests:
        kg = key_group_of(r.key, ckpt.key_groups)
        ranges = {f"{op}/{label}": s for op, by_label in state.items() for label, s in by_label.items()
                  if kg in KeyGroupRange.from_label(label) or s.get("tables_rewritten")}  # or a sharer
        still = sorted(k for k in held[r.id] if store.exists(k))
        held_by = pins_holding(store, job_prefix, still)
        record = {
            "id": r.id, "key_sha256": key_sha256(r.key), "key_group": kg, "reason": r.reason,
            "requested_at_ms": r.requested_at_ms, "status": "applied", "applied_epoch": ckpt.epoch,
            "applied_at_ms": time.time_ns() // 1_000_000,
            "state": ranges,
            "held_before": held[r.id],
            "retention": {"retained_epochs": retention.retained_epochs,
                          "checkpoints_deleted": retention.checkpoints_deleted,
                          "files_deleted": retention.files_deleted, "deferred": retention.deferred,
                          "still_present": still, "held_by": held_by},
        }
        store.put(paths.erasure_key(job_prefix, r.id), json.dumps(record, sort_keys=True, indent=1).encode())
        store.delete(r.object_key)
        records.append(record)
        log.info("%s: erasure %s applied at epoch %d (%d state entries)", job_prefix, r.id, ckpt.epoch,
                 sum(s.get("entries", 0) for s in ranges.values()))
    return records


# -------------------------------------------------------------------- a stopped job
def apply_offline(store: ObjectStore, job_prefix: str, dkv_options=None) -> list[dict]:
    """Serves the pending requests of a job no driver is running (stopped, or finished:
    a finished job runs no more epochs): commits epoch N+1 over the newest checkpoint N
    with the same source offsets, watermark and state but for the erased keys, then
    ``finish_applied``. No operator code and no Spark are needed: only the job's store.

    The epoch goes through the commit fence: if a driver commits epoch N+1 meanwhile,
    this one is withdrawn (``JobFencedError``) and the running job serves the requests.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        dkv_options: DKV tuning for opening the ranges.

    Returns:
        The records written (``[]`` when nothing was pending).

    Raises:
        JobFailedError: the job has no committed checkpoint, or an epoch is in flight
            (a live lease: the running job serves the requests).
        JobFencedError / ObjectExistsError: a driver committed the epoch first (nothing
            of this one counts; its files are garbage for the next cleanup).
    """
    requests = pending_erasures(store, job_prefix)
    if not requests:
        return []
    ckpt = latest_checkpoint(store, job_prefix)
    if ckpt is None:
        raise JobFailedError(f"{job_prefix}: no committed checkpoint: the job has no state to erase from; "
                             "its first run serves the request")
    lease = read_lease(store, job_prefix)
    if lease is not None and lease.is_live(ckpt.epoch):
        raise JobFailedError(f"{job_prefix}: epoch {lease.epoch} is in flight (lease held by {lease.owner}): "
                             "the running job serves the erasure request at its next epoch")
    epoch = ckpt.epoch + 1
    lease = acquire_lease(store, job_prefix, epoch)
    try:
        before = held_before(store, job_prefix, requests, ckpt.key_groups)
        subjects = subjects_of(requests, ckpt.key_groups)
        operators: dict[str, dict[str, str]] = {}
        dropped: dict[str, dict[str, dict | None]] = {}
        unkept: dict[str, dict[str, dict]] = {}
        summary: dict[str, dict[str, dict]] = {}
        name = f"e{epoch:010d}-erase-{uuid.uuid4().hex[:8]}"
        for op, ranges in ckpt.operators.items():
            operators[op], dropped[op], unkept[op] = dict(ranges), {}, {}
            labels = list(ranges)
            targets = erasure_targets(store, ranges, [KeyGroupRange.from_label(label) for label in labels], subjects)
            for label, mine in zip(labels, targets):
                mkey = ranges[label]
                if not mine:
                    continue
                db = DKV.open(store, paths.state_prefix(job_prefix, op, label, ckpt.layout), mkey, dkv_options)
                try:
                    summary.setdefault(op, {})[label] = erase_subjects(db, mine)
                    operators[op][label] = db.checkpoint(name)
                    dropped[op][label], unkept[op][label] = db.dropped_at_checkpoint(), db.unkept_at_checkpoint()
                finally:
                    db.close()
        new = dataclasses.replace(
            ckpt, epoch=epoch, operators=operators, outputs={}, output_checksums={},
            metrics={"events": 0, "offline": True, "erasure": {"requests": [r.id for r in requests],
                                                               "ranges": summary}},
            dropped=encode_objects(job_prefix, dropped, ckpt.layout),
            unkept=encode_objects(job_prefix, unkept, ckpt.layout))
        commit_checkpoint(store, job_prefix, new)
        return finish_applied(store, job_prefix, requests, new, before)
    finally:
        release_lease(store, job_prefix, lease)


# ---------------------------------------------------------------------------- report
@dataclass
class ErasureReport:
    """The whole erasure of one key (``jobs/<job>/erasures/<id>.json``).

    Attributes:
        id: the request's id.
        key_sha256: SHA-256 of the key (hex); the report never holds the key.
        status: ``"pending"`` (not served yet), ``"applied"`` (state erased, retained
            checkpoints expired), ``"complete"`` (sinks erased, and no file of the job
            holds the key: none still present, no savepoint holding it, none under the
            job's prefix in the scan), or ``"held"`` (the same done, but something still
            holds it: ``retention["held_by"]`` and ``savepoints`` name the pins and the
            commands that release them; run ``complete_erasure`` again afterwards).
        applied_epoch: the epoch that erased the state, or None.
        state: per ``operator/range``: entries purged, tables rewritten (old -> new),
            WAL objects dropped, by the erasure epoch.
        held_before: the job's DKV files the checkpoints before the erasure epoch named
            that held the key, ``{object: {"how", "named_by": [older checkpoint epochs]}}``
            (``files_holding``; a damaged manifest is listed, its ``how`` says so);
            retention then deleted them unless pinned.
        retention: what that retention did; ``still_present``: those of them it could
            not delete; ``held_by``: per still-present object, the pins keeping it
            (``pins_holding``: holder, what, pin key, ``release`` command), ``[]`` for one
            only a deferred sweep kept (``complete_erasure`` runs the sweep again).
        sinks: per sink (and ``dead_letter``), the objects that held a row of the key,
            or ``{"skipped": why}``.
        savepoints: savepoints whose files still hold the key: ``{"name", "objects",
            "drop"}`` (``drop``: the command that drops it).
        scan: the whole-store (or prefix) scan after it all (``ScanResult.to_json``), or None.
    """

    id: str
    key_sha256: str
    status: str
    applied_epoch: int | None = None
    state: dict = field(default_factory=dict)
    held_before: dict = field(default_factory=dict)
    retention: dict = field(default_factory=dict)
    sinks: dict = field(default_factory=dict)
    savepoints: list = field(default_factory=list)
    scan: dict | None = None

    def objects_that_held(self) -> list[str]:
        """Every object named as having held the key (or holding it still: savepoints),
        sorted. WAL objects the erasure epoch stopped naming count only if ``held_before``
        found the key in them."""
        out = set()
        for s in self.state.values():
            out.update(s.get("tables_rewritten", {}))
        out.update(self.held_before)
        for objs in self.sinks.values():
            if isinstance(objs, list):
                out.update(objs)
        for sp in self.savepoints:
            out.update(sp["objects"])
        return sorted(out)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def read_report(store: ObjectStore, job_prefix: str, request_id: str) -> ErasureReport:
    """The report of request ``request_id``: its record if served, else ``pending``.

    Raises:
        KeyError: no request and no record of that id (names it).
    """
    try:
        body = json.loads(store.get(paths.erasure_key(job_prefix, request_id)))
    except ObjectNotFoundError:
        for r in pending_erasures(store, job_prefix):
            if r.id == request_id:
                return ErasureReport(r.id, key_sha256(r.key), "pending")
        raise KeyError(f"{job_prefix}: no erasure request or record with id {request_id!r} "
                       f"(listed under {paths.erase_request_prefix(job_prefix)} and "
                       f"{paths.erasures_prefix(job_prefix)})") from None
    known = {f.name for f in dataclasses.fields(ErasureReport)}
    return ErasureReport(**{k: v for k, v in body.items() if k in known})


def savepoints_holding(store: ObjectStore, job_prefix: str, key: bytes) -> list[dict]:
    """The job's savepoints (``savepoints.list_savepoints``) whose files hold ``key``:
    ``[{"name", "objects", "drop"}]`` (``drop``: the command that drops the savepoint)."""
    out = []
    job = job_prefix.split("/", 1)[1]
    for sp in list_savepoints(store, job):
        kg = key_group_of(key, sp.checkpoint.key_groups)
        manifests = {m: [sp.checkpoint.epoch] for ranges in sp.checkpoint.operators.values() for m in ranges.values()}
        objects = sorted(_holding_named(store, manifests, key, kg))
        if objects:
            out.append({"name": sp.name, "objects": objects,
                        "drop": SAVEPOINT_DROP.format(store=store.root_uri, job=job, name=sp.name)})
    return out


def job_sinks(job: Job) -> dict:
    """``{name: Sink}`` of everything ``job`` publishes rows to: its sinks and its
    dead-letter table (as ``"dead_letter"``), the ``sinks`` of ``complete_erasure``."""
    return {**job.sinks, "dead_letter": job.dead_letter.sink}


def complete_erasure(store: ObjectStore, job_prefix: str, request_id: str, key: bytes, *,
                     sinks: dict | None = None, key_column: str | None = None,
                     scan_prefix: str | None = "") -> ErasureReport:
    """Finishes an applied erasure: the full retention sweep (``expire_before``), sinks,
    savepoints, the scan, the report.

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job name>``.
        request_id: from ``request_erasure``.
        key: the subject key (the record holds only its hash; checked against it).
        sinks: ``{name: Sink}`` of the job, the dead-letter table's included (``Job.sinks``
            and ``Job.dead_letter.sink``); None: none.
        key_column: the sinks' column holding the subject key; None: sinks are skipped
            (reported as such).
        scan_prefix: prefix of the final scan ("" = the whole store), or None: no scan.

    Returns:
        The ``ErasureReport`` (also written to ``erasures/<id>.json``): status
        ``complete``, or ``held`` while a pin (a savepoint, a fork, a branch) still keeps
        a file holding the key (``ErasureReport.status``); it stays ``pending`` while the
        request is not served (nothing else is done then).

    Raises:
        ValueError: ``key`` is not the key of the request.
    """
    report = read_report(store, job_prefix, request_id)
    if report.key_sha256 != key_sha256(key):
        raise ValueError(f"{job_prefix}: erasure {request_id} is of another key (SHA-256 {report.key_sha256})")
    if report.status == "pending":
        return report
    # The full sweep, which the driver leaves to this call: it also deletes what no checkpoint
    # recorded (a failed task attempt's files); then say what still holds the key.
    cleanup = expire_before(store, job_prefix, report.applied_epoch)
    report.retention["deferred"] = cleanup.deferred
    report.retention["still_present"] = [k for k in report.retention.get("still_present", []) if store.exists(k)]
    report.retention["held_by"] = pins_holding(store, job_prefix, report.retention["still_present"])
    for name, sink in sorted((sinks or {}).items()):
        if key_column is None:
            report.sinks[name] = {"skipped": "no key column given"}
            continue
        try:  # a topic's or the dead-letter table's rows are keyed records: their key column
            report.sinks[name] = sink.erase_rows(store, job_prefix, sink.erasure_column(key_column), [key])
        except (NotImplementedError, ValueError) as e:  # a sink of its own; no such column
            report.sinks[name] = {"skipped": str(e)}
    report.savepoints = savepoints_holding(store, job_prefix, key)
    if scan_prefix is not None:
        report.scan = scan_store(store, key, scan_prefix).to_json()
    in_job = [h["key"] for h in (report.scan or {}).get("holding", []) if h["key"].startswith(f"{job_prefix}/")]
    held = report.retention.get("still_present") or report.savepoints or in_job
    report.status = "held" if held else "complete"
    if held:
        log.warning("%s: erasure %s: the key is still held by %s; release what holds it (the report's "
                    "retention.held_by and savepoints name the commands) and run it again", job_prefix,
                    request_id, sorted({*report.retention.get("still_present", []), *in_job,
                                        *(o for sp in report.savepoints for o in sp["objects"])}))
    body = json.dumps(report.to_json(), sort_keys=True, indent=1).encode()
    store.put(paths.erasure_key(job_prefix, request_id), body)
    return report

