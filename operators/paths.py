"""Every object key of a stream job, built in one place (as ``storage.dkv.paths`` for DKV).

Layout under the store root::

    jobs/<job>/
      checkpoints/epoch-<epoch:010d>.json       job checkpoint manifests (the commit point)
      checkpoints/committed-<epoch:010d>.json   commit record: epoch was committed (the newest
                                                 one is kept: which epoch was committed last)
      checkpoints/retired-<epoch:010d>.json     retention floor: every epoch up to it was
                                                 committed and retired (the newest one is kept)
      state/<operator>/<range label>/...         one DKV instance per operator and key-group
                                                 range (its own layout: storage.dkv.paths)
      staging/epoch=<epoch:010d>/<operator>/<range label>@<attempt>/<file>
                                                 task output, garbage until a checkpoint names it
      sinks/<name>/...                           published output (Parquet, Delta table)
      control/flush/<id>.json, control/lease.json
                                                 flush requests and the epoch lease
      quarantine/<UTC stamp>/epoch-<epoch>.json  checkpoints a recovery fell back from
      sources/<source>/...                       a source's own metadata (``Source.attach``),
                                                 e.g. a file source's list of discovered files

Every function returns a key or prefix relative to the store root; prefixes of a
"directory" end with ``/``, prefixes a caller extends with its own name do not (they say so).
"""
from __future__ import annotations

import re

_CHECKPOINT_NAME = re.compile(r"epoch-(\d{10})\.json$")
_COMMIT_RECORD_NAME = re.compile(r"committed-(\d{10})\.json$")
_RETIRED_NAME = re.compile(r"retired-(\d{10})\.json$")
_STAGED_EPOCH = re.compile(r"/staging/epoch=(\d+)/")


def job_prefix(name: str) -> str:
    """``jobs/<name>`` (no trailing slash): everything job ``name`` writes is under it.

    Raises:
        ValueError: ``name`` is empty or holds a ``/``.
    """
    if not name or "/" in name:
        raise ValueError(f"invalid stream job name {name!r}: non-empty, without '/'")
    return f"jobs/{name}"


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_prefix(job: str) -> str:
    """``<job>/checkpoints/``: the job checkpoint manifests."""
    return f"{job}/checkpoints/"


def checkpoint_key(job: str, epoch: int) -> str:
    """Key of the checkpoint manifest of ``epoch``."""
    return f"{checkpoint_prefix(job)}epoch-{epoch:010d}.json"


def epoch_of_checkpoint(key: str) -> int | None:
    """The epoch of a checkpoint manifest key, or None for another key."""
    m = _CHECKPOINT_NAME.search(key)
    return int(m.group(1)) if m else None


def commit_record_key(job: str, epoch: int) -> str:
    """Key of the commit record of ``epoch``: written after the epoch's checkpoint was
    committed and found newer than every epoch committed before (``operators.runtime.
    checkpoints``); the newest record says which epoch was committed last."""
    return f"{checkpoint_prefix(job)}committed-{epoch:010d}.json"


def epoch_of_commit_record(key: str) -> int | None:
    """The epoch of a commit record key, or None for another key."""
    m = _COMMIT_RECORD_NAME.search(key)
    return int(m.group(1)) if m else None


def retired_key(job: str, epoch: int) -> str:
    """Key of the retention floor marker ``epoch``: every epoch up to ``epoch`` was
    committed and its checkpoint is (being) deleted by retention."""
    return f"{checkpoint_prefix(job)}retired-{epoch:010d}.json"


def epoch_of_retired(key: str) -> int | None:
    """The epoch of a retention floor marker key, or None for another key."""
    m = _RETIRED_NAME.search(key)
    return int(m.group(1)) if m else None


def quarantine_key(job: str, stamp: str, checkpoint: str) -> str:
    """Where a recovery moves checkpoint manifest ``checkpoint`` (its key) that it fell back from."""
    return f"{job}/quarantine/{stamp}/{checkpoint.rsplit('/', 1)[1]}"


# ----------------------------------------------------------------------------------- state
def state_root(job: str) -> str:
    """``<job>/state/``: every DKV instance of the job."""
    return f"{job}/state/"


def state_prefix(job: str, operator: str, range_label: str) -> str:
    """Prefix of the DKV instance of ``operator`` over one key-group range (no trailing slash)."""
    return f"{state_root(job)}{operator}/{range_label}"


# --------------------------------------------------------------------------------- staging
def staging_root(job: str) -> str:
    """``<job>/staging/``: task output not yet published."""
    return f"{job}/staging/"


def staging_prefix(job: str, epoch: int, operator: str, range_label: str, attempt: str) -> str:
    """Prefix a task attempt writes its staged files under (no trailing slash): unique per
    epoch, operator, range and attempt, so retried and speculative attempts never collide."""
    return f"{staging_root(job)}epoch={epoch:010d}/{operator}/{range_label}@{attempt}"


def staged_epoch(key: str) -> int | None:
    """The epoch a staged file belongs to, or None for a key outside staging."""
    m = _STAGED_EPOCH.search(key)
    return int(m.group(1)) if m else None


def range_label_of(staged_key: str) -> str:
    """The key-group range label a staged file belongs to.

    Raises:
        ValueError: ``staged_key`` is not under a ``staging_prefix``.
    """
    parts = staged_key.split("/")
    if len(parts) < 5 or parts[-5] != "staging" or "@" not in parts[-2]:
        raise ValueError(f"not a staged output key: {staged_key!r}")
    return parts[-2].split("@", 1)[0]


# ----------------------------------------------------------------------------------- sinks
def source_prefix(job: str, source: str) -> str:
    """``jobs/<job>/sources/<source>/``: metadata a source keeps for the job."""
    return f"{job}/sources/{source}/"


def sinks_root(job: str) -> str:
    """``<job>/sinks/``: every published output of the job."""
    return f"{job}/sinks/"


def sink_prefix(job: str, name: str) -> str:
    """Prefix of the published output of sink ``name`` (no trailing slash)."""
    return f"{sinks_root(job)}{name}"


# --------------------------------------------------------------------------------- control
def control_prefix(job: str) -> str:
    """``<job>/control/``: flush requests and the epoch lease."""
    return f"{job}/control/"


def flush_request_prefix(job: str) -> str:
    """``<job>/control/flush/``: pending flush requests."""
    return f"{control_prefix(job)}flush/"


def lease_key(job: str) -> str:
    """Key of the job's epoch lease."""
    return f"{control_prefix(job)}lease.json"
