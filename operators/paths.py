"""Every object key of a stream job, built in one place (as ``dkvstream.storage.dkv.paths`` for DKV).

Layout under the store root::

    jobs/<job>/
      checkpoints/epoch-<epoch:010d>.json       job checkpoint manifests (the commit point)
      checkpoints/committed-<epoch:010d>.json   commit record: epoch was committed (the newest
                                                 one is kept: which epoch was committed last)
      checkpoints/retired-<epoch:010d>.json     retention floor: every epoch up to it was
                                                 committed and retired (the newest one is kept)
      state/<operator>/<range label>/...         one DKV instance per operator and key-group
                                                 range (its own layout: dkvstream.storage.dkv.paths)
      staging/epoch=<epoch:010d>/<operator>/<range label>@<attempt>/<file>
                                                 task output, garbage until a checkpoint names it
      r/<hh>/state/<operator>/<range label>/...  the same two under ``LAYOUT_HASHED``: hh =
      r/<hh>/staging/<operator>/<range label>/epoch=<epoch:010d>@<attempt>/<file>
                                                 xxh3_64("<operator>/<range label>") mod 256,
                                                 two hex digits, first (``range_hash``)
      sinks/<name>/...                           published output (Parquet, Delta table)
      control/flush/<id>.json, control/lease.json
                                                 flush requests and the epoch lease
      control/erase/<id>.json                    erasure requests (the key, hex) until served
      erasures/<id>.json                         erasure records and reports (the key's SHA-256)
      quarantine/<UTC stamp>/epoch-<epoch>.json  checkpoints a recovery fell back from
      branch.json, promoted.json                 a branch job's mark; a main job's promotion
      sources/<source>/...                       a source's own metadata (``Source.attach``),
                                                 e.g. a file source's list of discovered files
      savepoints/<name>.json                     savepoint records (dkvstream.operators.runtime.savepoints)
      fork.json                                  owners the job holds checkpoint pins at, and
                                                 its fork origin if forked (...runtime.forks)
      pins/<holder job>--<what>.json             pins: files of this job another record (a
                                                 savepoint, a fork) still names; retention and
                                                 GC never delete them (dkvstream.operators.runtime.pins)

Every function returns a key or prefix relative to the store root; prefixes of a
"directory" end with ``/``, prefixes a caller extends with its own name do not (they say so).

Key layouts of the tasks' files (a job's layout is fixed at its first epoch and recorded
in its checkpoints, ``JobCheckpoint.layout``; ``Job.key_layout`` chooses it for a new job):

* ``LAYOUT_FLAT`` (1): ``state/`` and ``staging/`` as above. Staging keys start with the
  epoch, so each epoch writes a new, increasing key range.
* ``LAYOUT_HASHED`` (2): a two-hex-digit hash of the operator and range label first, so an
  epoch's task requests spread evenly over 256 prefixes from the first epoch on, and a
  rescale's new ranges land on the same 256; S3 scales request rates per prefix (as
  Iceberg's object-storage location provider does it for data files). Checkpoints, the
  lease and published sinks stay where they are in both.
"""
from __future__ import annotations

import re
import uuid

import xxhash

_CHECKPOINT_NAME = re.compile(r"epoch-(\d{10})\.json$")
_COMMIT_RECORD_NAME = re.compile(r"committed-(\d{10})\.json$")
_RETIRED_NAME = re.compile(r"retired-(\d{10})\.json$")
_STAGED_EPOCH = re.compile(r"/staging/(?:[^/]+/[^/]+/)?epoch=(\d+)[/@]")

LAYOUT_FLAT = 1
LAYOUT_HASHED = 2
LAYOUTS = {"flat": LAYOUT_FLAT, "hashed": LAYOUT_HASHED}
HASH_PREFIXES = 256


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
    committed and found newer than every epoch committed before (``dkvstream.operators.runtime.
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


# -------------------------------------------------------------------------------- branches
def branch_record_key(job: str) -> str:
    """``<job>/branch.json``: marks a branch job and says whether it was promoted
    (``dkvstream.operators.runtime.branches``); the job and checkpoint it was forked from
    are in its fork record (``fork_record_key``)."""
    return f"{job}/branch.json"


def promotion_key(job: str) -> str:
    """``<job>/promoted.json``: the branch whose state and code the job continues with
    since a promotion (``dkvstream.operators.runtime.branches``)."""
    return f"{job}/promoted.json"


# ----------------------------------------------------------------------------------- state
def state_root(job: str) -> str:
    """``<job>/state/``: every DKV instance of a job of ``LAYOUT_FLAT``."""
    return f"{job}/state/"


def hashed_root(job: str) -> str:
    """``<job>/r/``: every DKV instance and staged file of a job of ``LAYOUT_HASHED``."""
    return f"{job}/r/"


def range_hash(operator: str, range_label: str) -> str:
    """The two hex digits that lead a range's keys under ``LAYOUT_HASHED``:
    ``xxh3_64("<operator>/<range label>") mod 256`` (stable across processes)."""
    return f"{xxhash.xxh3_64_intdigest(f'{operator}/{range_label}'.encode()) % HASH_PREFIXES:02x}"


def state_prefix(job: str, operator: str, range_label: str, layout: int = LAYOUT_FLAT) -> str:
    """Prefix of the DKV instance of ``operator`` over one key-group range (no trailing slash)."""
    if layout == LAYOUT_HASHED:
        return f"{hashed_root(job)}{range_hash(operator, range_label)}/state/{operator}/{range_label}"
    return f"{state_root(job)}{operator}/{range_label}"


def state_listing_roots(job: str) -> list[str]:
    """The prefixes to LIST for every DKV file of a job, whatever its layout."""
    return [state_root(job), hashed_root(job)]


def parse_state_key(job: str, key: str) -> tuple[str, str, str] | None:
    """``(operator, range label, state prefix)`` of a DKV file's key in either layout,
    or None for a key that is not one."""
    if key.startswith(state_root(job)):
        parts = key[len(state_root(job)):].split("/", 2)
        if len(parts) == 3:
            return parts[0], parts[1], state_prefix(job, parts[0], parts[1], LAYOUT_FLAT)
    elif key.startswith(hashed_root(job)):
        parts = key[len(hashed_root(job)):].split("/", 4)
        if len(parts) == 5 and parts[1] == "state":
            return parts[2], parts[3], state_prefix(job, parts[2], parts[3], LAYOUT_HASHED)
    return None


# --------------------------------------------------------------------------------- staging
def staging_root(job: str) -> str:
    """``<job>/staging/``: task output not yet published, of a job of ``LAYOUT_FLAT``."""
    return f"{job}/staging/"


def staging_prefix(job: str, epoch: int, operator: str, range_label: str, attempt: str,
                   layout: int = LAYOUT_FLAT) -> str:
    """Prefix a task attempt writes its staged files under (no trailing slash): unique per
    epoch, operator, range and attempt, so retried and speculative attempts never collide."""
    if layout == LAYOUT_HASHED:
        return (f"{hashed_root(job)}{range_hash(operator, range_label)}/staging/{operator}/{range_label}/"
                f"epoch={epoch:010d}@{attempt}")
    return f"{staging_root(job)}epoch={epoch:010d}/{operator}/{range_label}@{attempt}"


def is_staged_key(job: str, key: str) -> bool:
    """True for a staged file's key of either layout."""
    return key.startswith(staging_root(job)) or (key.startswith(hashed_root(job)) and "/staging/" in key)


def staged_epoch(key: str) -> int | None:
    """The epoch a staged file belongs to, or None for a key outside staging."""
    m = _STAGED_EPOCH.search(key)
    return int(m.group(1)) if m else None


def range_label_of(staged_key: str) -> str:
    """The key-group range label a staged file belongs to (either layout).

    Raises:
        ValueError: ``staged_key`` is not under a ``staging_prefix``.
    """
    parts = staged_key.split("/")
    if len(parts) >= 5 and parts[-5] == "staging" and parts[-2].startswith("epoch=") and "@" in parts[-2]:
        return parts[-3]  # LAYOUT_HASHED: .../staging/<op>/<label>/epoch=<e>@<attempt>/<file>
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


# ------------------------------------------------------------------- savepoints and pins
_NAME = re.compile(r"[A-Za-z0-9._-]+$")


def valid_record_name(name: str, what: str) -> str:
    """``name`` if it is a valid savepoint or pin name (``[A-Za-z0-9._-]+``, without
    ``--``, which separates a pin key's holder from its reason).

    Raises:
        ValueError: naming ``what`` (e.g. "savepoint name") and the allowed characters.
    """
    if not _NAME.match(name or "") or "--" in name:
        raise ValueError(f"invalid {what} {name!r}: use letters, digits, '.', '_' and '-' "
                         "(no '--', no '/')")
    return name


def savepoints_prefix(job: str) -> str:
    """``<job>/savepoints/``: the job's savepoint records."""
    return f"{job}/savepoints/"


def savepoint_key(job: str, name: str) -> str:
    """Key of savepoint ``name`` of the job under ``job`` (``jobs/<name>``)."""
    return f"{savepoints_prefix(job)}{name}.json"


def pins_prefix(job: str) -> str:
    """``<job>/pins/``: pins other records hold on the job's files."""
    return f"{job}/pins/"


def pin_key(owner: str, holder: str, what: str, token: str = "") -> str:
    """Key of the pin job ``holder`` (a name) holds on files of the job under ``owner``
    (``jobs/<name>``), for ``what`` (``fork``, ``savepoint-<name>``, ``restore-<epoch>``):
    ``<holder>--<what>.json``, or ``<holder>--<what>--<token>.json`` for a pin written
    under a unique ``token`` (16 hex digits, ``new_token``), which no other write reuses."""
    return f"{pins_prefix(owner)}{holder}--{what}{f'--{token}' if token else ''}.json"


def new_token() -> str:
    """A unique token for a pin key (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def pin_name(key: str) -> tuple[str, str]:
    """``("<holder>--<what>", token)`` of a pin key (token "" for a pin without one)."""
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    head, sep, token = stem.rpartition("--")
    if sep and len(token) == 16 and all(c in "0123456789abcdef" for c in token) and "--" in head:
        return head, token
    return stem, ""


def fork_record_key(job: str) -> str:
    """Key of the job's pin record (``dkvstream.operators.runtime.pins``): the owners
    (other jobs) where the job holds pins for its checkpoints, and its fork origin if
    it was forked (``dkvstream.operators.runtime.forks``). A job never forked has one
    once its checkpoints name other jobs' files, e.g. after a promotion."""
    return f"{job}/fork.json"


def owner_of(key: str) -> str | None:
    """``jobs/<name>`` of the job whose prefix holds ``key``, or None for a key outside
    every job's prefix."""
    parts = key.split("/", 2)
    return f"{parts[0]}/{parts[1]}" if len(parts) == 3 and parts[0] == "jobs" else None


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


def erase_request_prefix(job: str) -> str:
    """``<job>/control/erase/``: pending erasure requests (``dkvstream.operators.runtime.erasure``)."""
    return f"{control_prefix(job)}erase/"


def erasures_prefix(job: str) -> str:
    """``<job>/erasures/``: the records and reports of served erasure requests."""
    return f"{job}/erasures/"


def erasure_key(job: str, request_id: str) -> str:
    """Key of the record (and report) of erasure request ``request_id``."""
    return f"{erasures_prefix(job)}{request_id}.json"
