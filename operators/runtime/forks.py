"""Zero-copy forks: a new job that starts from another job's checkpoint or savepoint.

``fork_job(store, parent, child)`` writes the child's first checkpoint: the parent's
(same epoch number, source offsets, watermark, timers, state schemas; no output) whose
``operators`` name the parent's range manifests, so no state file is copied. It pins
every file they name at its owner (``dkvstream.operators.runtime.pins``: the parent's,
and a grandparent's for a fork of a fork), so the parent's retention never deletes them,
and records the owners in ``jobs/<child>/fork.json``, written only if absent (the
claim of the child's name: of two forks into one child, the loser writes no pin)::

    {"parent": str, "epoch": int, "savepoint": str | null, "forked_at_ms": int,
     "owners": [job prefix, ...],      # where the child holds its checkpoint pin
     "dropped_at_ms": int}             # once dropped (``drop_fork``): it never runs again

The child runs with its own code and parallelism: its first epoch opens each key-group
range from the parent's manifests with ``DKV.open_from_parents`` (the driver does this
whenever a previous manifest lies outside the job's prefix, for equal or other
parallelism); its new files go under its own prefix, and its state schemas are checked
against its code as on any restart. The child's retention never deletes outside its own
prefix; its full sweep shrinks its pins to what its retained checkpoints and savepoints
still name and deletes a pin that names nothing (``dkvstream.operators.runtime.cleanup``),
so a fork does not hold its parent's storage once compaction has rewritten it.

Costs: one LIST (the child's commit log), one LIST and GET (the parent's checkpoint or
savepoint), one LIST of the parent's ``erasures/``, one GET per range manifest, the fork
record's put-if-absent and GET, one LIST of ``pins/`` and one PUT per owner, one HEAD or
GET (the re-check), and the commit (two PUTs and a LIST); 0 bytes of state copied,
whatever its size.
"""
from __future__ import annotations

import dataclasses
import json
import time

from dkvstream.operators import paths
from dkvstream.operators.api.job import Job, job_name
from dkvstream.operators.api.state_schema import evolve_job
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.runtime import pins
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, commit_checkpoint, read_commit_log
from dkvstream.operators.runtime.control import read_lease
from dkvstream.operators.runtime.savepoints import (
    refuse_if_erased_after,
    retained_checkpoint,
    still_there,
    usable_savepoint,
)
from dkvstream.storage.errors import ObjectExistsError
from dkvstream.storage.objectstore import ObjectStore, as_store


def fork_job(store: ObjectStore | str, parent: Job | str, child: Job | str, *,
             savepoint: str | None = None, epoch: int | None = None) -> JobCheckpoint:
    """Forks job ``child`` from ``parent``'s savepoint, or its checkpoint ``epoch``
    (default: the newest). See the module docstring.

    Args:
        store: the object store (or its root URI).
        parent: the parent job or its name.
        child: the new job or its name; with a ``Job``, its key groups and state
            declarations are checked against the parent's state before anything is written.
        savepoint: a savepoint of the parent to start from.
        epoch: a retained checkpoint of the parent (only without ``savepoint``).

    Returns:
        The child's first checkpoint (committed).

    Raises:
        ValueError: the child has checkpoints or a fork record already (another fork into
            it, or a dropped fork), the same name as the parent, both ``savepoint`` and
            ``epoch`` are given, no such savepoint or checkpoint (or it is still being
            taken), or the key groups differ.
        RecoveryRefusedError: an erasure was applied to the parent after the savepoint's
            or checkpoint's epoch (the erased keys would come back; the message names it).
        StateSchemaError: the child's state declarations cannot read the parent's state.
        PinError: the parent's checkpoint expired, or its savepoint was dropped, while
            its files were being pinned.
    """
    store, pname, cname = as_store(store), job_name(parent), job_name(child)
    cprefix = paths.job_prefix(cname)
    if pname == cname:
        raise ValueError(f"fork of job {pname}: the new job needs another name")
    if savepoint is not None and epoch is not None:
        raise ValueError(f"fork of job {pname}: give a savepoint or an epoch, not both")
    if read_commit_log(store, cprefix).newest_committed:
        raise ValueError(f"fork of job {pname}: job {cname} has checkpoints already "
                         f"({store.uri(paths.checkpoint_prefix(cprefix))}); choose a new name")
    sp = None
    if savepoint is not None:
        sp = usable_savepoint(store, pname, savepoint)
        ckpt = sp.checkpoint
    else:
        ckpt = retained_checkpoint(store, pname, epoch)
        refuse_if_erased_after(store, pname, ckpt.epoch, f"checkpoint epoch {ckpt.epoch}")
    if isinstance(child, Job):
        if child.key_groups != ckpt.key_groups:
            raise ValueError(f"fork of job {pname} into {cname}: the parent has key_groups="
                             f"{ckpt.key_groups}, the new job {child.key_groups}; a fork keeps them")
        evolve_job(child.operators, ckpt.state_schemas, ckpt.epoch)
    by_owner = pins.files_by_owner(store, ckpt)
    record = {"parent": pname, "epoch": ckpt.epoch, "savepoint": savepoint,
              "forked_at_ms": time.time_ns() // 1_000_000,
              "owners": sorted(o for o, files in by_owner.items() if o != cprefix and files)}
    try:  # claim the child first: of two forks into one child, the loser writes no pin
        store.put_if_absent(paths.fork_record_key(cprefix), json.dumps(record, sort_keys=True).encode())
    except ObjectExistsError:
        raise ValueError(f"fork of job {pname}: job {cname} was forked already "
                         f"({store.uri(paths.fork_record_key(cprefix))}: {forked_from(store, cname)}); "
                         "choose a new name (or drop_fork it first)") from None
    pin_keys = pins.hold_for_checkpoints(store, cname, by_owner, record)
    try:
        if sp is not None:
            still_there(store, sp, pin_keys)
        else:
            pins.require_still_there(store, paths.checkpoint_key(paths.job_prefix(pname), ckpt.epoch),
                                     pin_keys, f"checkpoint epoch {ckpt.epoch} of job {pname}")
    except pins.PinError:  # the child never ran: its pins and claim go, the name is free again
        pins.delete_pins(store, pin_keys)
        store.delete(paths.fork_record_key(cprefix))
        raise
    first = dataclasses.replace(
        ckpt, job=cname, outputs={}, output_checksums={},
        dropped=None, unkept=None,  # the parent's files: never the child's to delete
        metrics={"forked_from": {"job": pname, "epoch": ckpt.epoch, "savepoint": savepoint}})
    commit_checkpoint(store, cprefix, first)
    return first


def drop_fork(store: ObjectStore | str, child: Job | str) -> dict:
    """Drops fork ``child`` (a branch job too): deletes the pins its checkpoints hold at
    every owner its fork record lists, then marks the record dropped and deletes its
    branch record, if any. The owners' next full sweeps collect what no other record
    names. The child's own checkpoints stay, but they may name files its parent now
    collects, so the child never runs again: its driver and ``fork_job`` into its name
    refuse (delete ``jobs/<child>/`` to reuse the name). The child's savepoints keep
    their own pins until dropped (``drop_savepoint``).

    Cost: one GET (the fork record), the lease's GET and the commit log's LIST, one
    LIST of each owner's ``pins/``, one batch DELETE, one PUT and one DELETE.

    Returns:
        The fork record as it was.

    Raises:
        ValueError: ``child`` was not forked (no fork record).
        RecoveryRefusedError: a driver of the child holds its lease (stop it first).
    """
    store, cname = as_store(store), job_name(child)
    cprefix = paths.job_prefix(cname)
    record = forked_from(store, cname)
    if not record:  # (a promoted main's pins are for its own checkpoints: never dropped here)
        raise ValueError(f"job {cname} is not a fork ({store.uri(paths.fork_record_key(cprefix))} names "
                         "no parent); nothing to drop")
    lease = read_lease(store, cprefix)
    if lease is not None and lease.is_live(read_commit_log(store, cprefix).newest_committed):
        raise RecoveryRefusedError(f"job {cname}: a driver ({lease.owner}) is running epoch {lease.epoch}; "
                                   "stop it (JobRunner.stop) and drop the fork again")
    pins.delete_by_name(store, record.get("owners", []), cname, pins.CHECKPOINTS_PIN)
    dropped = {**record, "owners": [], "dropped_at_ms": time.time_ns() // 1_000_000}
    store.put(paths.fork_record_key(cprefix), json.dumps(dropped, sort_keys=True).encode())
    store.delete(paths.branch_record_key(cprefix))
    return record


def refuse_if_dropped(store: ObjectStore, job: Job | str) -> None:
    """Refuses running a dropped fork (``drop_fork``): its checkpoints may name files
    its parent has collected since.

    Raises:
        RecoveryRefusedError: naming the record and what to do.
    """
    name = job_name(job)
    record = pins.read_fork_record(store, paths.job_prefix(name))
    if record.get("dropped_at_ms") is not None:
        raise RecoveryRefusedError(
            f"job {name} is a dropped fork of job {record.get('parent')} "
            f"({store.uri(paths.fork_record_key(paths.job_prefix(name)))}); its checkpoints may name "
            f"files job {record.get('parent')} has deleted since, so it cannot run. Fork a new job "
            f"instead, or delete everything under {store.uri(paths.job_prefix(name) + '/')} to reuse the name.")


def forked_from(store: ObjectStore | str, job: Job | str) -> dict:
    """The job's fork record (module docstring), {} for a job not forked (one whose
    record only lists the owners it holds checkpoint pins at, e.g. a promoted main)."""
    record = pins.read_fork_record(as_store(store), paths.job_prefix(job_name(job)))
    return record if "parent" in record else {}
