"""Job checkpoint manifests: the atomic commit point of an epoch.

One JSON object per committed epoch at ``jobs/<job>/checkpoints/epoch-<epoch:010d>.json``,
written with ``put_if_absent`` so two drivers can never both commit an epoch. Layout::

    {"crc32c": <crc32c of body as compact sorted JSON>, "body": {
        "format": 1, "job": str, "epoch": int,
        "watermark": int (ms),                      # reached at the end of the epoch
        "source_offsets": {partition: int},         # next offset to read
        "partition_max_ts": {partition: int (ms)},  # watermark inputs
        "finished": bool,                           # bounded source fully read
        "key_groups": int, "parallelism": int,
        "operators": {op_name: {range_label: dkv manifest key}},
        "outputs": {output_name: [staged object keys]},
        "metrics": {...,                            # events, tables, bytes, ...
            "requests": {"driver": {...}, "tasks": {...}}}}}  # object-store requests
            # by kind and bytes since the previous commit (RequestStats.snapshot() shape)

Everything a task wrote is garbage until a checkpoint names it (docs/design.md, "Epochs and
checkpoints").
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import crc32c

from operators.paths import checkpoint_key, checkpoint_prefix, epoch_of_checkpoint
from storage.errors import CorruptionError
from storage.objectstore import ObjectStore

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


def list_epochs(store: ObjectStore, job_prefix: str) -> list[int]:
    """Committed epochs, ascending."""
    epochs = (epoch_of_checkpoint(key) for key in store.list(checkpoint_prefix(job_prefix)))
    return sorted(e for e in epochs if e is not None)


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
    """Atomically commit ``checkpoint``; returns its object key.

    Raises:
        ObjectExistsError: the epoch was already committed (another driver won).
    """
    key = checkpoint_key(job_prefix, checkpoint.epoch)
    store.put_if_absent(key, checkpoint.encode())
    return key
