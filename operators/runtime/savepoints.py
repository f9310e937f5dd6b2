"""Savepoints: a job checkpoint kept, with every file it names, until it is dropped.

``savepoint(store, job, name)`` copies a retained checkpoint's body (default: the
newest) into ``jobs/<job>/savepoints/<name>.json`` and pins every file its range
manifests name (``dkvstream.operators.runtime.pins``: one pin per owner job; a fork's
checkpoint names its parent's files too). Retention and garbage collection never
delete a pinned file, so the savepoint stays restorable however many epochs the job
runs; ``drop_savepoint`` deletes the record and then the pins, and the files no
retained checkpoint names become garbage for the next full sweep.

Record layout::

    {"name": str, "job": str, "epoch": int, "taken_at_ms": int,
     "pins": [pin key, ...], "files": int, "bytes": int,   # what the pins protect
     "token": str,       # in the pins' keys: unique to this taking of the name
     "pending": bool,    # true from the name's claim until the pins are written
     "checkpoint": <the job checkpoint object, as JobCheckpoint.encode writes it>}

``restore(store, job, name)`` makes the job continue from a savepoint: it commits a new
checkpoint (epoch = newest + 1, through the commit fence) holding the savepoint's
state, source offsets, watermark and timers. Refused (``RecoveryRefusedError``) while a
driver holds the job's lease, or while output of an epoch after the savepoint's is
visible in a sink or the dead-letter table (the restart fallback rule,
``dkvstream.operators.runtime.recovery``): a continuation from the savepoint would
publish those epochs' output again. To start from a savepoint with its later output
kept, fork a new job from it instead (``dkvstream.operators.runtime.forks``).

Costs: a savepoint is one LIST and GET of the commit log, two PUTs of the record
(claimed, completed), one GET per range manifest, one PUT per owner's pin and one HEAD
(the re-check); no file is copied. A drop is two GETs (the record, the fork record), one
DELETE and one batch DELETE of the pins.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from dkvstream.operators import paths
from dkvstream.operators.api.job import Job, job_name
from dkvstream.operators.api.state_schema import evolve_job
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime import pins
from dkvstream.operators.runtime.checkpoints import (
    JobCheckpoint,
    commit_checkpoint,
    read_checkpoint,
    read_commit_log,
)
from dkvstream.operators.runtime.control import read_lease
from dkvstream.operators.runtime.recovery import check_files, visible_output_after
from dkvstream.storage.errors import CorruptionError, ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore, as_store, map_requests


@dataclass
class Savepoint:
    """A savepoint record (module docstring).

    Attributes:
        name: its name. job: the job's name. epoch: the checkpoint's epoch.
        taken_at_ms: wall clock (ms) it was taken. pins: the pin keys it wrote.
        files: files pinned. bytes: their total size, bytes.
        checkpoint: the checkpoint it holds. token: the unique token its pin keys carry.
        pending: True while it is being taken (its pins may be incomplete).
    """

    name: str
    job: str
    epoch: int
    taken_at_ms: int
    pins: list[str]
    files: int
    bytes: int
    checkpoint: JobCheckpoint
    token: str = ""  # in its pins' keys: unique to this taking of the name
    pending: bool = False  # claimed, its pins not yet written (``savepoint``)

    def encode(self) -> bytes:
        """JSON bytes (the checkpoint as ``JobCheckpoint.encode`` writes it)."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "checkpoint"}
        body["checkpoint"] = json.loads(self.checkpoint.encode())
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str) -> Savepoint:
        """Parses a savepoint record read from ``uri``.

        Raises:
            CorruptionError: a bad record or checkpoint body, naming ``uri``.
        """
        try:
            doc = json.loads(data)
            ckpt = JobCheckpoint.decode(json.dumps(doc.pop("checkpoint")).encode(), uri)
            return cls(checkpoint=ckpt, **doc)
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptionError(f"{uri}: unreadable savepoint record ({len(data)} bytes): {e}") from e


def savepoint(store: ObjectStore | str, job: Job | str, name: str, epoch: int | None = None) -> Savepoint:
    """Takes savepoint ``name`` of ``job`` at checkpoint ``epoch`` (default: the newest).

    First claims the name (the record, ``pending``, written only if absent: of two
    callers taking one name, the loser writes no pin), then pins the checkpoint's files
    under the record's unique token, re-checks the checkpoint is still retained, and
    completes the record.

    Args:
        store: the object store (or its root URI).
        job: the job or its name.
        name: the savepoint's name, ``[A-Za-z0-9._-]``, unique per job.
        epoch: a retained checkpoint's epoch; None: the newest.

    Returns:
        The ``Savepoint`` written.

    Raises:
        ValueError: a bad or taken name, no checkpoint, or ``epoch`` not retained
            (the message lists the retained epochs).
        PinError: the checkpoint expired while its files were being pinned.
        ObjectNotFoundError / CorruptionError: a range manifest is missing or damaged.
    """
    store, jname = as_store(store), job_name(job)
    prefix = paths.job_prefix(jname)
    key = paths.savepoint_key(prefix, paths.valid_record_name(name, "savepoint name"))
    if store.exists(key):
        _taken(store, jname, name, key)
    ckpt = retained_checkpoint(store, jname, epoch)
    sp = Savepoint(name=name, job=jname, epoch=ckpt.epoch, taken_at_ms=time.time_ns() // 1_000_000,
                   pins=[], files=0, bytes=0, checkpoint=ckpt, token=paths.new_token(), pending=True)
    try:
        store.put_if_absent(key, sp.encode())
    except ObjectExistsError:  # another caller claimed the name meanwhile: no pin written
        _taken(store, jname, name, key)
    try:
        by_owner = pins.files_by_owner(store, ckpt)
        sp.pins = pins.write_pins(store, jname, f"savepoint-{name}", f"savepoint {name} of job {jname} "
                                  f"at epoch {ckpt.epoch}", by_owner, sp.token)
        pins.require_still_there(store, paths.checkpoint_key(prefix, ckpt.epoch), sp.pins,
                                 f"checkpoint epoch {ckpt.epoch} of job {jname}")
    except BaseException:
        pins.delete_pins(store, sp.pins)
        store.delete(key)
        raise
    sp.files = sum(len(f) for f in by_owner.values())
    sp.bytes = sum(sum(f.values()) for f in by_owner.values())
    sp.pending = False
    store.put(key, sp.encode())
    return sp


def _taken(store: ObjectStore, jname: str, name: str, key: str) -> None:
    taken = get_savepoint(store, jname, name)
    raise ValueError(f"job {jname}: savepoint {name!r} exists (epoch {taken.epoch}, {store.uri(key)}"
                     f"{', being taken' if taken.pending else ''}); choose another name, or drop it "
                     "first (drop_savepoint)")


def usable_savepoint(store: ObjectStore, jname: str, name: str) -> Savepoint:
    """``get_savepoint``, refusing a savepoint still being taken (or whose taking
    crashed) and one older than an erasure applied to the job (``erasures_after``).

    Raises:
        ValueError: no such savepoint, or it is pending; RecoveryRefusedError: an
            erasure was applied after its epoch (the message names the erasures).
    """
    sp = get_savepoint(store, jname, name)
    if sp.pending:
        raise ValueError(f"job {jname}: savepoint {name!r} is still being taken (or its taking "
                         f"crashed: drop it with drop_savepoint and take it again)")
    refuse_if_erased_after(store, jname, sp.epoch, f"savepoint {name!r}")
    return sp


def erasures_after(store: ObjectStore, jname: str, epoch: int) -> list[str]:
    """Ids of the erasures of job ``jname`` applied at an epoch after ``epoch``
    (records ``jobs/<job>/erasures/<id>.json`` with ``applied_epoch`` > ``epoch``): a
    checkpoint of ``epoch`` still holds the keys they erased. One LIST, one GET each.

    Raises:
        CorruptionError: a record does not read (naming it).
    """
    keys = [k for k in store.list(paths.erasures_prefix(paths.job_prefix(jname))) if k.endswith(".json")]

    def applied(key: str) -> int | None:
        try:
            return json.loads(store.get(key)).get("applied_epoch")
        except ObjectNotFoundError:
            return None
        except (ValueError, AttributeError) as e:
            raise CorruptionError(f"{store.uri(key)}: unreadable erasure record: {e}") from e

    return [k.rsplit("/", 1)[1].removesuffix(".json") for k, at in zip(keys, map_requests(applied, keys))
            if at is not None and at > epoch]


def refuse_if_erased_after(store: ObjectStore, jname: str, epoch: int, what: str) -> None:
    """Refuses starting from ``what`` (a savepoint or checkpoint of ``epoch``) of job
    ``jname`` if an erasure was applied after ``epoch``: the erased keys would come back.

    Raises:
        RecoveryRefusedError: naming the erasure ids and what to do.
    """
    erased = erasures_after(store, jname, epoch)
    if erased:
        raise RecoveryRefusedError(
            f"job {jname}: {what} (epoch {epoch}) is older than the erasure(s) {', '.join(erased)} "
            f"applied to the job after it; starting from it would bring the erased keys back. Drop it "
            f"(drop_savepoint) and start from a savepoint or checkpoint taken after the erasure.")


def retained_checkpoint(store: ObjectStore, jname: str, epoch: int | None) -> JobCheckpoint:
    """Job ``jname``'s retained checkpoint ``epoch`` (None: the newest).

    Raises:
        ValueError: no checkpoint, or ``epoch`` not retained (the message lists the retained ones).
    """
    prefix = paths.job_prefix(jname)
    epochs = read_commit_log(store, prefix).epochs
    if not epochs:
        raise ValueError(f"job {jname}: no checkpoint under {store.uri(paths.checkpoint_prefix(prefix))}; "
                         "run the job first")
    if epoch is None:
        epoch = epochs[-1]
    if epoch not in epochs:
        raise ValueError(f"job {jname}: checkpoint epoch {epoch} is not retained (retained: "
                         f"{epochs[0]}..{epochs[-1]}); take a savepoint of a retained one")
    return read_checkpoint(store, prefix, epoch)


def get_savepoint(store: ObjectStore | str, job: Job | str, name: str) -> Savepoint:
    """Reads savepoint ``name`` of ``job``.

    Raises:
        ValueError: no such savepoint (the message lists the job's savepoints).
        CorruptionError: the record does not read.
    """
    store, jname = as_store(store), job_name(job)
    key = paths.savepoint_key(paths.job_prefix(jname), name)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        names = [sp.name for sp in list_savepoints(store, jname)]
        raise ValueError(f"job {jname}: no savepoint {name!r} ({store.uri(key)} is missing); "
                         f"the job's savepoints: {', '.join(names) or 'none'}") from None
    return Savepoint.decode(data, store.uri(key))


def list_savepoints(store: ObjectStore | str, job: Job | str) -> list[Savepoint]:
    """The job's savepoints, by name (one LIST, one GET each)."""
    store, jname = as_store(store), job_name(job)
    keys = sorted(k for k in store.list(paths.savepoints_prefix(paths.job_prefix(jname))) if k.endswith(".json"))
    return [Savepoint.decode(store.get(k), store.uri(k)) for k in keys]


def drop_savepoint(store: ObjectStore | str, job: Job | str, name: str) -> Savepoint | None:
    """Drops savepoint ``name``: its record first, then its pins (a fork or restore from
    it that re-checks the record after writing its own pin therefore either fails or is
    covered by the savepoint's pins while it writes). A crash in between leaves orphan
    pins: dropping the name again deletes them (found by name at the job and the owners
    its fork record lists). Its files that no retained checkpoint, savepoint or fork
    names are collected by the owners' next full sweep.

    Drop a savepoint still being taken (``pending``) only once its taker is gone.

    Returns:
        The dropped ``Savepoint``, or None when only orphan pins were left (and deleted).

    Raises:
        ValueError: no such savepoint and no pin of it.
    """
    store, jname = as_store(store), job_name(job)
    prefix = paths.job_prefix(jname)
    try:
        sp = get_savepoint(store, jname, name)
    except ValueError:
        if not pins.delete_by_name(store, [prefix, *pins.held_at(store, prefix)], jname, f"savepoint-{name}"):
            raise
        return None
    store.delete(paths.savepoint_key(prefix, name))
    owners = {prefix, *pins.held_at(store, prefix), *(paths.owner_of(k) for k in sp.pins)}
    pins.delete_pins(store, {*sp.pins, *(paths.pin_key(o, jname, f"savepoint-{name}", sp.token)
                                         for o in owners if o and sp.token)})
    return sp


def restore(store: ObjectStore | str, job: Job, name: str) -> JobCheckpoint:
    """Makes ``job`` continue from its savepoint ``name`` (module docstring): commits a
    new checkpoint, epoch = the newest committed + 1, holding the savepoint's state,
    source offsets, watermark and timers, and no output. The job's next run continues
    from it (its epochs after the savepoint's are computed again, with the job's
    current code and parallelism).

    Args:
        store: the object store (or its root URI).
        job: the job (its sinks tell what output is visible; its operators must read the
            savepoint's state, as on a restart).

    Returns:
        The checkpoint committed.

    Raises:
        RecoveryRefusedError: a driver of the job holds its lease, output of an epoch
            after the savepoint's is visible, or a file the savepoint names is missing
            (each message says what to do).
        StateSchemaError: the job's state declarations cannot read the savepoint's state.
        JobFencedError: a driver committed an epoch meanwhile.
        ValueError: no such savepoint; the job's key groups differ.
    """
    store = as_store(store)
    sp = usable_savepoint(store, job.name, name)
    prefix, ckpt = job.prefix, sp.checkpoint
    commits = read_commit_log(store, prefix)
    lease = read_lease(store, prefix)
    if lease is not None and lease.is_live(commits.newest_committed):
        raise RecoveryRefusedError(
            f"job {job.name}: a driver ({lease.owner}) is running epoch {lease.epoch}; stop it "
            f"(JobRunner.stop) and restore savepoint {name!r} again")
    if ckpt.key_groups != job.key_groups:
        raise ValueError(f"job {job.name}: savepoint {name!r} has key_groups={ckpt.key_groups}, the job "
                         f"{job.key_groups}; key groups are fixed for a job's lifetime")
    visible = visible_output_after(store, job, sp.epoch)
    if visible:
        raise RecoveryRefusedError(
            f"job {job.name}: output of epochs after savepoint {name!r} (epoch {sp.epoch}) is visible "
            f"({'; '.join(visible[:5])}{' ...' if len(visible) > 5 else ''}); continuing from the "
            f"savepoint would publish epochs {sp.epoch + 1}..{commits.newest_committed} again. Delete "
            f"the published output and dead letters of epochs {sp.epoch + 1}..{commits.newest_committed} "
            f"to restore, or fork a new job from the savepoint (fork_job(store, {job.name!r}, "
            f"<new job>, savepoint={name!r})) to keep that output.")
    manifests = [m for ranges in ckpt.operators.values() for m in ranges.values()]
    missing = [e for errors in map_requests(lambda m: check_files(store, m), manifests) for e in errors]
    if missing:
        raise RecoveryRefusedError(f"job {job.name}: savepoint {name!r} names files that are missing or "
                                   f"damaged: {'; '.join(missing[:5])}; restore them, or drop the savepoint")
    evolve_job(job.operators, ckpt.state_schemas, ckpt.epoch)  # the job's code must read the state
    new = dataclasses.replace(
        ckpt, job=job.name, epoch=commits.newest_committed + 1, outputs={}, output_checksums={},
        dropped=None, unkept=None,  # unknown: the first expiry after it takes the full sweep
        metrics={"restored_from": {"savepoint": name, "epoch": sp.epoch}})
    # Pin what the new checkpoint names before committing it, then re-check the savepoint
    # (whose pins protect those files until then) is still there: a drop deletes its
    # record before its pins. Files of other jobs get the job's checkpoint pin (shrunk by
    # its full sweeps); its own files a restore pin, which the job's first full sweep
    # that reads the new checkpoint as retained releases (cleanup_job).
    by_owner = pins.files_by_owner(store, ckpt)
    pins.hold_for_checkpoints(store, job.name, by_owner)  # (if it fails below: they only keep more)
    written = pins.write_pins(store, job.name, f"{pins.RESTORE_PIN}{new.epoch}", f"restore of savepoint "
                              f"{name} into epoch {new.epoch}", {prefix: by_owner.get(prefix, {})},
                              paths.new_token())
    still_there(store, sp, written)
    commit_checkpoint(store, prefix, new)
    return new


def still_there(store: ObjectStore, sp: Savepoint, pin_keys: list[str]) -> None:
    """The re-check after writing pins that copy savepoint ``sp``: its record is still
    there, the same taking of its name (its token).

    Raises:
        PinError: it was dropped meanwhile (``pin_keys`` deleted).
    """
    key = paths.savepoint_key(paths.job_prefix(sp.job), sp.name)
    try:
        same = Savepoint.decode(store.get(key), store.uri(key)).token == sp.token
    except ObjectNotFoundError:
        same = False
    if not same:
        pins.delete_pins(store, pin_keys)
        raise pins.PinError(f"savepoint {sp.name!r} of job {sp.job} ({store.uri(key)}) was dropped "
                            "meanwhile; take a new one")
