"""Restart from the newest checkpoint that verifies, falling back only where that is correct.

On start, ``JobRunner.run`` asks ``restart_checkpoint`` which checkpoint to continue
from. It checks the newest job checkpoint (``check_checkpoint``): the checkpoint object
itself (crc32c), every range manifest it names (crc32c, invariants) and every file those
name, and every staged output file. ``"names"`` (the default) checks each table and WAL
object exists with the size its manifest records (one HEAD each: catches missing files
and torn or truncated objects); ``"full"`` reads and verifies every block and record as
the Dagster ``verified`` asset check does (one GET of the whole state).

Staged output files are checked by their sink (``Sink.check_staged``) against the
checksums the checkpoint recorded when the tasks staged them: a file whose published
copy already matches is fine (it is left alone); otherwise the staged file itself must
match, since the restart is about to copy it. A staged file damaged since, whose
published copy is missing or differs, makes the checkpoint unusable like a damaged
table, so the fallback rule below applies: the epoch is recomputed if none of its
output is visible, and otherwise the restart refuses, naming the file.

When the newest checkpoint N is unusable, the restart falls back to the newest earlier
retained checkpoint M whose files all verify, **only if no output of an epoch after M is
visible**: a sink's published files (``Sink.published_after``) or the dead-letter table.
Why that rule: a fallback replays epochs M+1..N. Publishing is idempotent per epoch and
range (an existing published file is kept, a topic producer's sequence is not re-applied),
so a replay whose plan or code differs from the original (another ``events_per_epoch``,
``parallelism``, a grown unbounded source, a fixed operator) would pair the *old*
visible output with *new* state: duplicated or lost rows that nothing detects. With no
output of M+1..N visible, the replay is simply the first computation of those epochs and
exactly-once holds as after a crash before publishing. Otherwise the restart refuses
(``RecoveryRefusedError``) and says what to do: restore the named objects, or delete the
published output of epochs M+1..N so they are recomputed.

**The source's own metadata** (a file source's file log) is checked against the
checkpoint continued from (``restore_source``, ``Source.restore_state``) before the
source discovers new input; a refusal is a ``RecoveryRefusedError`` naming its objects.

**Missing checkpoints** are treated the same way: the newest commit record
(``dkvstream.operators.runtime.checkpoints``) says which epoch was committed last; when it is newer
than the newest checkpoint left (someone deleted the newest checkpoint objects), the
epochs in between count as unusable, so the restart refuses if their output is visible
and otherwise recomputes them. A store without commit records (written before they
existed, or with them deleted too) cannot tell: the restart refuses if any sink has
published output of an epoch after the newest checkpoint.

A fallback moves the checkpoints after M to ``jobs/<job>/quarantine/`` (so epoch M+1
can be committed again; their files become garbage for cleanup) and deletes their
commit records, logs a warning naming every bad object and the epoch fallen back to,
and the next committed checkpoint records it under ``metrics["recovery"]``. A corrupt
table shared by every retained checkpoint cannot be fallen back from: the restart
refuses, naming it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dkvstream.operators import paths
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.checkpoints import CommitLog, JobCheckpoint, read_checkpoint, read_commit_log
from dkvstream.storage.dkv.invariants import check_manifest
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.verify import verify_manifest
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    from dkvstream.operators.api.job import Job

log = logging.getLogger(__name__)

VERIFY_MODES = ("names", "full")



@dataclass
class Fallback:
    """A restart that skipped unusable checkpoints.

    Attributes:
        from_epoch: the newest committed epoch, which was unusable.
        to_epoch: the epoch the job continues from.
        bad: one message per bad object (URI and offset or reason), prefixed by its epoch.
        quarantined: object keys the unusable checkpoints were moved to.
    """

    from_epoch: int
    to_epoch: int
    bad: list[str]
    quarantined: list[str]

    def as_metrics(self) -> dict:
        """The ``metrics["recovery"]`` entry of the next checkpoint."""
        return {"fell_back_from_epoch": self.from_epoch, "fell_back_to_epoch": self.to_epoch,
                "bad_objects": self.bad, "quarantined": self.quarantined}


def check_files(store: ObjectStore, manifest_key: str) -> list[str]:
    """Cheap check of one range manifest: it verifies, and its files exist at their size
    (one GET of the manifest, one HEAD per SSTable and WAL object).

    Returns:
        One message per problem, naming the object's URI (and the offset a torn object
        ends at); empty: the manifest and every file it names are fine.
    """
    muri = store.uri(manifest_key)
    try:
        m = load_manifest(store, manifest_key)
        check_manifest(m, muri)
    except (ObjectNotFoundError, CorruptionError) as e:
        return [str(e)]
    errors = []
    named = [("SSTable", t.key, t.size) for t in m.levels.all_tables()]
    named += [("WAL object", w.key, w.size) for w in m.wal]
    for kind, key, size in named:
        try:
            got = store.size(key)
        except ObjectNotFoundError:
            errors.append(f"{store.uri(key)}: {kind} named by manifest {muri} is missing")
            continue
        if got != size:
            errors.append(f"{store.uri(key)}: {kind} has {got} bytes, manifest {muri} says {size} "
                          f"(torn or extended at offset {min(got, size)})")
    return errors


def check_checkpoint(store: ObjectStore, job_prefix: str, epoch: int,
                     mode: str = "names", job: Job | None = None) -> tuple[JobCheckpoint | None, list[str]]:
    """Checks job checkpoint ``epoch`` and the files it names (module docstring).

    Args:
        store: the job's object store.
        job_prefix: ``jobs/<job>``.
        epoch: the committed epoch to check.
        mode: ``"names"`` or ``"full"``.
        job: the job, whose sinks then check their staged outputs against the
            checksums the checkpoint recorded (``Sink.check_staged``: publishable
            again); without it, each staged output must exist.

    Returns:
        ``(checkpoint or None if unreadable, errors)``; each error names a URI.
    """
    try:
        ckpt = read_checkpoint(store, job_prefix, epoch)
    except (ObjectNotFoundError, CorruptionError) as e:
        return None, [str(e)]
    errors: list[str] = []
    for ranges in ckpt.operators.values():
        for manifest_key in ranges.values():
            errors += verify_manifest(store, manifest_key).errors if mode == "full" \
                else check_files(store, manifest_key)
    if job is None:
        for keys in ckpt.outputs.values():
            errors += [f"{store.uri(k)}: staged output named by epoch {epoch} is missing"
                       for k in keys if not store.exists(k)]
        return ckpt, errors
    checksums = ckpt.staged_checksums()
    for name, keys in ckpt.outputs.items():
        errors += job.output_sink(name).check_staged(store, job_prefix, epoch, keys, checksums, mode == "full")
    return ckpt, errors


def visible_output_after(store: ObjectStore, job: Job, epoch: int,
                          unknown_is_visible: bool = True) -> list[str]:
    """What the job's sinks published of epochs after ``epoch``; a sink that cannot tell
    counts as visible output unless ``unknown_is_visible`` is False."""
    sinks = [*job.sinks.values(), job.dead_letter.sink]
    out = []
    for sink in sinks:
        found = sink.published_after(store, job.prefix, epoch)
        if found is None:
            if unknown_is_visible:
                out.append(f"sink {sink.name}: cannot tell which epochs it published")
        else:
            out += found
    return out


def _quarantine(store: ObjectStore, job_prefix: str, epochs: list[int],
                records_after: int) -> list[str]:
    """Moves the checkpoints of ``epochs`` aside and deletes the commit records of every
    epoch after ``records_after``: those epochs are to be committed again."""
    moved = []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for key in store.list(paths.checkpoint_prefix(job_prefix)):
        recorded = paths.epoch_of_commit_record(key)
        if recorded is not None and recorded > records_after:
            store.delete(key)
    for e in epochs:
        key = checkpoint_key(job_prefix, e)
        dest = paths.quarantine_key(job_prefix, stamp, key)
        try:
            store.put(dest, store.get(key))
            moved.append(dest)
        except ObjectNotFoundError:
            pass
        store.delete(key)
    return moved


def restart_checkpoint(
    store: ObjectStore, job: Job, mode: str = "names"
) -> tuple[JobCheckpoint | None, Fallback | None]:
    """The checkpoint a restart continues from (module docstring).

    Args:
        store: the job's object store.
        job: the job.
        mode: ``"names"`` or ``"full"`` verification of each checkpoint tried.

    Returns:
        ``(checkpoint, None)`` when the newest verifies (None, None for a job that never
        committed); ``(older checkpoint, Fallback)`` after a fallback.

    Raises:
        RecoveryRefusedError: no retained checkpoint verifies, or falling back would
            replay epochs whose output is already visible.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify mode must be one of {VERIFY_MODES}, got {mode!r}")
    commits = read_commit_log(store, job.prefix)
    epochs = commits.epochs
    if not epochs:
        if commits.newest_committed:
            raise RecoveryRefusedError(
                f"job {job.name}: epochs up to {commits.newest_committed} were committed, but no "
                f"checkpoint is left under {store.uri(paths.checkpoint_prefix(job.prefix))}. "
                "Restore the checkpoint objects, or delete everything under "
                f"{store.uri(job.prefix + '/')} (state and output) to run the job from the start.")
        return None, None
    bad: list[str] = _missing(store, job.prefix, commits)
    for epoch in reversed(epochs):
        ckpt, errors = check_checkpoint(store, job.prefix, epoch, mode, job)
        if not errors:
            break
        bad += [f"epoch {epoch}: {msg}" for msg in errors]
    else:
        raise RecoveryRefusedError(
            f"job {job.name}: no retained checkpoint (epochs {epochs[0]}..{epochs[-1]}) verifies; "
            f"restore these objects: {'; '.join(bad)}")
    newest = commits.newest_committed
    if epoch == newest:
        if not commits.last_recorded:  # no record to go by: published output says it all
            visible = visible_output_after(store, job, epoch, unknown_is_visible=False)
            if visible:
                raise RecoveryRefusedError(
                    f"job {job.name}: output of epochs after the newest checkpoint, epoch {epoch}, "
                    f"is visible ({_first(visible)}), so newer checkpoints were committed and are "
                    f"missing from {store.uri(paths.checkpoint_prefix(job.prefix))}; continuing from "
                    f"epoch {epoch} would duplicate or lose rows. Restore the missing checkpoint "
                    "objects, or delete that output to have those epochs recomputed, and restart.")
        return ckpt, None
    visible = visible_output_after(store, job, epoch)
    if visible:
        raise RecoveryRefusedError(
            f"job {job.name}: checkpoint epoch {newest} cannot be used ({'; '.join(bad)}); falling "
            f"back to epoch {epoch} would replay epochs {epoch + 1}..{newest}, whose output is already "
            f"visible ({_first(visible)}), and a replay that differs would duplicate or lose rows. "
            "Restore the named objects, or delete that output to have those epochs recomputed, and "
            "restart.")
    moved = _quarantine(store, job.prefix, [e for e in epochs if e > epoch], records_after=epoch)
    fallback = Fallback(newest, epoch, bad, moved)
    log.warning("job %s: checkpoint epoch %d is unusable (%s); fell back to epoch %d, moved %s aside; "
                "no output of the skipped epochs was visible, so they are recomputed exactly once",
                job.name, newest, "; ".join(bad), epoch, ", ".join(moved) or "nothing")
    return ckpt, fallback


def restore_source(job: Job, ckpt: JobCheckpoint) -> None:
    """Checks the source's own metadata against checkpoint ``ckpt``
    (``Source.restore_state``): call it before the source discovers anything.

    Raises:
        RecoveryRefusedError: the source refused, prefixed with the job and the epoch.
    """
    try:
        job.source.restore_state(ckpt.source_offsets, ckpt.source_state)
    except RecoveryRefusedError as e:
        raise RecoveryRefusedError(f"job {job.name}, checkpoint of epoch {ckpt.epoch}: {e}") from e


def _missing(store: ObjectStore, job_prefix: str, commits: CommitLog) -> list[str]:
    """One message if the newest commit record is newer than the newest checkpoint."""
    if commits.last_recorded <= commits.epochs[-1]:
        return []
    record = store.uri(paths.commit_record_key(job_prefix, commits.last_recorded))
    first, last = commits.epochs[-1] + 1, commits.last_recorded
    span = f"epoch {last}" if first == last else f"epochs {first}..{last}"
    message = (f"{span}: checkpoint {store.uri(checkpoint_key(job_prefix, last))} is missing (the "
               f"commit record {record} says epoch {last} was committed)")
    return [message]


def _first(visible: list[str], n: int = 5) -> str:
    return "; ".join(visible[:n]) + (" ..." if len(visible) > n else "")
