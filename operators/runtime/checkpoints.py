"""Job checkpoint manifests: the atomic commit point of an epoch, and the commit fence.

One JSON object per committed epoch at ``jobs/<job>/checkpoints/epoch-<epoch:010d>.json``,
written with ``put_if_absent`` so two drivers can never both commit an epoch while its
checkpoint exists. Layout::

    {"crc32c": <crc32c of body as compact sorted JSON>, "body": {
        "format": 1, "job": str, "epoch": int,
        "watermark": int (ms),                      # reached at the end of the epoch
        "source_offsets": {partition: int},         # next offset to read
        "partition_max_ts": {partition: int (ms)},  # watermark inputs
        "partition_active_at_ms": {partition: int},  # wall clock (ms) the partition's
            # quiet time counts from (when the end offsets of the last epoch that read
            # it came back): partition idleness (dkvstream.operators.runtime.event_time.
            # partition_activity, idle_partitions); a partition missing has not
            # started it (no epoch read events since it appeared), nor has any in
            # checkpoints written before idleness existed (read as {})
        "finished": bool,                           # bounded source fully read, or drained
        "processing_time_ms": int | null,           # the epoch's processing time (wall
            # clock when planned, never below the previous epoch's): processing-time
            # timers up to it fired; null in checkpoints written before it existed
        "next_event_timer_ms": int | null,          # lower bounds of the timers left,
        "next_processing_timer_ms": int | null,     # per domain, over every range (ms;
            # null: none). The driver runs an epoch without input when one is due.
            # Absent in checkpoints written before they existed: -2**63 (due at once)
        "key_groups": int, "parallelism": int,
        "operators": {op_name: {range_label: dkv manifest key}},
        "outputs": {output_name: [staged object keys]},
        "output_checksums": {staged object key: [bytes, crc32c]},
            # taken by the task as it staged the file (Sink.stage, ObjectChecksum), for
            # the outputs whose sink takes one; a restart checks them before it publishes
            # again (Sink.check_staged, Sink.republish). Absent in checkpoints written
            # before checksums existed (read as {}: not checked)
        "dropped": {op_name: {range_label: [[name, bytes], ...]} | null} | null,
            # what the epoch's range manifests stopped naming compared with the previous
            # checkpoint's (DKV.dropped_at_checkpoint): garbage once the previous
            # checkpoint expires (incremental retention, dkvstream.operators.runtime.cleanup).
            # ``name`` is relative to the range's state prefix, or "/" + the whole key
            # for an object elsewhere (a parent range's table after a rescale). null for
            # an operator: unknown (a rescale epoch, a shared table dropped); null
            # (or absent, in checkpoints written before it existed): unknown for all.
        "unkept": {op_name: {range_label: [[name, bytes], ...]}} | null,
            # what the epoch's tasks wrote and their manifests do not name
            # (DKV.unkept_at_checkpoint): garbage once this checkpoint is committed
        "layout": int,                              # key layout of the tasks' files, fixed
            # at the job's first epoch (dkvstream.operators.paths: 1 flat, 2 hashed; absent: 1)
        "state_schemas": {op_name: {state_id: {"kind": str, "key_codec": str | null,
            "value_codec": str, "versions": [[[field, type], ...], ...]}}},
            # each state's codecs and, for a RecordCodec, every version of its fields
            # (dkvstream.operators.api.state_schema); a restart checks the job's
            # declarations against it. Absent in checkpoints written before it (read as
            # {}: the declared schemas are taken as version 0)
        "source_state": {...} | null,               # the source's record of what maps
            # source_offsets to events (Source.snapshot_state; a file source: how many
            # files its log held and their checksum), checked on restart
            # (Source.restore_state); null: none (absent in checkpoints written before it)
        "metrics": {...,                            # events, tables, bytes, ...
            "drained": true,                        # only in a drain epoch (JobRunner.stop)
            "requests": {"driver": {...}, "tasks": {...}},  # object-store requests
            # by kind and bytes since the previous commit (RequestStats.snapshot() shape)
            "live": {...}}}}                        # rates, lag, latency, watermark delay
            # at the commit (dkvstream.operators.runtime.live.epoch_metrics)

Everything a task wrote is garbage until a checkpoint names it (docs/design.md, "Epochs and
checkpoints").

**The fence.** Retention deletes old checkpoints, so ``put_if_absent`` alone cannot stop a
driver that fell behind by the retention count from committing an old epoch number into
the gap. Two kinds of small marker objects next to the checkpoints close it, both written
before anything could depend on them and listed with the checkpoints in one LIST:

* ``checkpoints/retired-<F>.json``, the **retention floor**: written by retention
  (``dkvstream.operators.runtime.cleanup``) *before* it deletes the checkpoints of epochs up to F.
  Epochs at or below the newest floor are not listed as committed (``read_commit_log``).
* ``checkpoints/committed-<N>.json``, the **commit record**: written by the driver once
  its checkpoint N passed the fence, before it publishes or cleans up anything; the
  newest one says which epoch was committed last (a restart that finds checkpoints
  missing after it refuses or falls back, ``dkvstream.operators.runtime.recovery``).

``commit_checkpoint`` writes checkpoint N with ``put_if_absent`` and then lists: if N is at
or below the floor or the newest commit record, or a newer checkpoint exists, the epoch
was committed before (its checkpoint was retired meanwhile), so it deletes the object it
just wrote and raises ``JobFencedError``. Why this is race-free: the gap at N only opens
when retention deletes checkpoint N, after it wrote a floor >= N; so a ``put_if_absent``
that succeeds in the gap is followed by a listing that shows that floor (stores list
what was written before, as S3 and a local directory do). Retention never deletes the
newest floor nor the newest commit record (older ones are deleted as garbage), so the
markers do not grow with the job's age.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import crc32c

from dkvstream.operators import paths
from dkvstream.operators.errors import JobFencedError
from dkvstream.operators.paths import checkpoint_key, checkpoint_prefix, epoch_of_checkpoint
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore import ObjectStore
from dkvstream.storage.objectstore.checksum import ObjectChecksum

FORMAT_VERSION = 1


@dataclass
class JobCheckpoint:
    """A committed epoch (see module docstring for field meanings and units)."""

    job: str
    epoch: int
    watermark: int
    source_offsets: dict[str, int]
    partition_max_ts: dict[str, int]
    finished: bool
    key_groups: int
    parallelism: int
    operators: dict[str, dict[str, str]]
    outputs: dict[str, list[str]]
    metrics: dict = field(default_factory=dict)
    format: int = FORMAT_VERSION
    partition_active_at_ms: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, dict[str, list] | None] | None = None
    unkept: dict[str, dict[str, list] | None] | None = None
    layout: int = paths.LAYOUT_FLAT  # the key layout of the tasks' files (dkvstream.operators.paths)
    source_state: dict | None = None  # Source.snapshot_state at source_offsets
    output_checksums: dict[str, list[int]] = field(default_factory=dict)
    state_schemas: dict[str, dict[str, dict]] = field(default_factory=dict)  # api.state_schema
    processing_time_ms: int | None = None
    next_event_timer_ms: int | None = -(1 << 63)  # unknown: due at once
    next_processing_timer_ms: int | None = -(1 << 63)

    def staged_checksums(self) -> dict[str, ObjectChecksum]:
        """``output_checksums`` as ``{staged key: ObjectChecksum}``."""
        return {k: ObjectChecksum.from_json(v) for k, v in self.output_checksums.items()}

    def encode(self) -> bytes:
        """Checksummed JSON bytes."""
        body = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return json.dumps({"crc32c": crc32c.crc32c(body.encode()), "body": json.loads(body)},
                          sort_keys=True, indent=1).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str) -> JobCheckpoint:
        """Parse and verify ``data`` read from ``uri``.

        Raises:
            CorruptionError: bad JSON, checksum mismatch or unknown format, naming ``uri``.
        """
        try:
            doc = json.loads(data)
        except ValueError as e:  # a truncated object ends inside the JSON document
            pos = getattr(e, "pos", 0)
            raise CorruptionError(f"{uri}: job checkpoint is not valid JSON at offset {pos} of "
                                  f"{len(data)} bytes (truncated?): {e}") from e
        try:
            body = doc["body"]
            canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
            if crc32c.crc32c(canon) != doc["crc32c"]:
                # The crc32c covers the canonical body, not the stored bytes, so the damage
                # can only be narrowed to the body's span of the object.
                body_at = data.find(b'"body"')
                raise CorruptionError(f"{uri}: job checkpoint checksum mismatch over the body at "
                                      f"offset {body_at} of {len(data)} bytes")
            if body.get("format") != FORMAT_VERSION:
                raise CorruptionError(f"{uri}: unknown job checkpoint format {body.get('format')!r}")
            return cls(**body)
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(f"{uri}: unreadable job checkpoint ({len(data)} bytes): {e}") from e


def encode_objects(job_prefix: str, by_operator: dict[str, dict[str, dict[str, int] | None]],
                   layout: int = paths.LAYOUT_FLAT
                   ) -> dict[str, dict[str, list] | None]:
    """The checkpoint's ``dropped`` or ``unkept`` field from each range's
    ``DKV.dropped_at_checkpoint`` or ``DKV.unkept_at_checkpoint``.

    Args:
        job_prefix: ``jobs/<job name>``.
        layout: the job's key layout (``dkvstream.operators.paths``), which places the range prefixes.
        by_operator: ``{operator: {range label: {object key: bytes} or None}}``; an
            operator with an unknown (None) range is unknown as a whole.

    Returns:
        ``{operator: {range label: [[name, bytes], ...]} or None}``, names relative to
        the range's state prefix where they lie under it (the compact form: about 60
        bytes per object, so tens of KB per epoch at P = 1,000).
    """
    out: dict[str, dict[str, list] | None] = {}
    for op, ranges in by_operator.items():
        if any(d is None for d in ranges.values()):
            out[op] = None
            continue
        out[op] = {}
        for label, objects in ranges.items():
            if not objects:
                continue
            base = paths.state_prefix(job_prefix, op, label, layout) + "/"
            out[op][label] = sorted([k[len(base):] if k.startswith(base) else "/" + k, n]
                                    for k, n in objects.items())
    return out


def decode_objects(field_value: dict | None, job_prefix: str, layout: int = paths.LAYOUT_FLAT
                   ) -> dict[str, int] | None:
    """``{object key: bytes}`` of a checkpoint's ``dropped`` or ``unkept`` field; None if
    unknown for any operator (or the field is absent).

    Raises:
        ValueError / TypeError / AttributeError: a malformed field.
    """
    if field_value is None or any(ranges is None for ranges in field_value.values()):
        return None
    out: dict[str, int] = {}
    for op, ranges in field_value.items():
        for label, entries in ranges.items():
            base = paths.state_prefix(job_prefix, op, label, layout) + "/"
            for name, size in entries:
                out[name[1:] if name.startswith("/") else base + name] = int(size)
    return out


@dataclass(frozen=True)
class CommitLog:
    """What one listing of ``checkpoints/`` says about a job's commits (module docstring).

    Attributes:
        epochs: epochs whose checkpoint exists and is above the retention floor, ascending.
        retired_through: every epoch up to this one was committed and retired (0: none).
        last_recorded: epoch of the newest commit record (0: none; stores written before
            commit records existed have none until their next commit).
        withdrawn: keys of checkpoint objects at or below the floor (a fenced driver's
            write it did not delete), garbage for retention.
        old_markers: keys of commit records and floors older than the newest of their
            kind, garbage for retention.
    """

    epochs: list[int]
    retired_through: int = 0
    last_recorded: int = 0
    withdrawn: list[str] = field(default_factory=list)
    old_markers: list[str] = field(default_factory=list)

    @property
    def newest_committed(self) -> int:
        """The newest epoch known to have been committed (0: none): a checkpoint, a
        commit record or the retention floor, whichever is newest."""
        return max(self.epochs[-1] if self.epochs else 0, self.retired_through, self.last_recorded)


def read_commit_log(store: ObjectStore, job_prefix: str) -> CommitLog:
    """Lists the job's checkpoints, commit records and retention floors (one LIST)."""
    checkpoints, records, floors = {}, {}, {}
    parsers = ((checkpoints, epoch_of_checkpoint), (records, paths.epoch_of_commit_record),
               (floors, paths.epoch_of_retired))
    for key in store.list(checkpoint_prefix(job_prefix)):
        for found, parse in parsers:
            epoch = parse(key)
            if epoch is not None:
                found[epoch] = key
                break
    floor = max(floors, default=0)
    last = max(records, default=0)
    old = [k for e, k in records.items() if e < last] + [k for e, k in floors.items() if e < floor]
    withdrawn = sorted(k for e, k in checkpoints.items() if e <= floor)
    return CommitLog(epochs=sorted(e for e in checkpoints if e > floor), retired_through=floor,
                     last_recorded=last, withdrawn=withdrawn, old_markers=sorted(old))


def list_epochs(store: ObjectStore, job_prefix: str) -> list[int]:
    """Committed epochs whose checkpoint exists, ascending (retired ones excluded)."""
    return read_commit_log(store, job_prefix).epochs


def read_checkpoint(store: ObjectStore, job_prefix: str, epoch: int) -> JobCheckpoint:
    """Read and verify the checkpoint of ``epoch``.

    Raises:
        ObjectNotFoundError: no such epoch. CorruptionError: see ``JobCheckpoint.decode``.
    """
    key = checkpoint_key(job_prefix, epoch)
    return JobCheckpoint.decode(store.get(key), store.uri(key))


def latest_checkpoint(store: ObjectStore, job_prefix: str) -> JobCheckpoint | None:
    """The newest committed checkpoint, or None for a job that never committed."""
    epochs = list_epochs(store, job_prefix)
    return read_checkpoint(store, job_prefix, epochs[-1]) if epochs else None


def commit_checkpoint(store: ObjectStore, job_prefix: str, checkpoint: JobCheckpoint) -> str:
    """Atomically commit ``checkpoint`` if its epoch is newer than every epoch committed
    before (module docstring, "The fence"); returns its object key.

    Cost: one PUT (the checkpoint), one LIST (the fence), one PUT (the commit record).

    Raises:
        ObjectExistsError: the epoch's checkpoint exists (another driver committed it).
        JobFencedError: the epoch was committed before and its checkpoint retired since
            (this driver fell behind another by the retention count), or a newer epoch
            was committed; the object this driver wrote is deleted again (at or below the
            retention floor no reader ever lists it).
    """
    key = checkpoint_key(job_prefix, checkpoint.epoch)
    store.put_if_absent(key, checkpoint.encode())
    commits = read_commit_log(store, job_prefix)
    epoch = checkpoint.epoch
    newest = commits.newest_committed
    if epoch < newest or epoch <= max(commits.retired_through, commits.last_recorded):
        store.delete(key)  # our own object
        raise JobFencedError(
            f"job {checkpoint.job}: epoch {epoch} was committed before by another driver (the job "
            f"has committed up to epoch {newest}, and had deleted the old "
            f"checkpoint {store.uri(key)}, as retention does: this driver's write of it was "
            "withdrawn); this driver fell behind and stops without publishing. Run one driver "
            "per job.")
    record_commit(store, job_prefix, epoch)
    return key


def record_commit(store: ObjectStore, job_prefix: str, epoch: int) -> None:
    """Writes the commit record of ``epoch`` (idempotent); the newest record tells a
    restart which epoch was committed last."""
    body = {"epoch": epoch, "checkpoint": checkpoint_key(job_prefix, epoch),
            "recorded_at_ms": time.time_ns() // 1_000_000}
    store.put(paths.commit_record_key(job_prefix, epoch), json.dumps(body, sort_keys=True).encode())


def retire_through(store: ObjectStore, job_prefix: str, epoch: int) -> None:
    """Raises the retention floor to ``epoch``: call before deleting the checkpoints of
    epochs up to it, so a driver that writes one of them again finds itself fenced."""
    body = {"retired_through": epoch, "written_at_ms": time.time_ns() // 1_000_000}
    store.put(paths.retired_key(job_prefix, epoch), json.dumps(body, sort_keys=True).encode())
