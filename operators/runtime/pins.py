"""Pins: records that protect files of one job (the *owner*) from its retention and GC
because another record (a savepoint, a fork's checkpoints) still names them.

A pin is one small JSON object under the owner's prefix,
``jobs/<owner>/pins/<holder job>--<what>.json`` (``dkvstream.operators.paths.pin_key``)::

    {"owner": str, "holder": str, "what": str,      # e.g. "savepoint-nightly", "fork"
     "reason": str, "created_at_ms": int,
     "keys": [object key, ...]}                     # the owner's files it protects, sorted:
                                                    # range manifests, SSTables, WAL objects

A holder that names files of several owners (a savepoint of a fork names its parent's
tables and its own) writes one pin per owner. Both cleanup paths
(``dkvstream.operators.runtime.cleanup``) LIST ``pins/`` after deleting expired
checkpoint manifests and before deleting any file, and never delete a pinned key; and
neither ever deletes an object outside its own job's prefix (another job's file named
through a fork is its owner's to collect).

**Why writing a pin is race-free.** The holder writes the pin first, then re-checks that
the checkpoint (or savepoint) whose files it copied still exists
(``require_still_there``); if not, it deletes the pin and fails. A cleanup deletes the
expired checkpoint manifest *before* it lists the pins. So either the re-check sees the
checkpoint gone (and the holder fails, nothing named), or the checkpoint was deleted
after the pin was written, and the cleanup's listing, later still, sees the pin.

**A pin key is written once.** A savepoint's and a restore's pins carry a unique token
in their keys (``paths.pin_key``); a job's checkpoint pin, when it grows or shrinks, is
written under a new key and the old one deleted (``replace_pins``). So a reader that
keeps the pins it read (``PinCache``, the driver's incremental retention) needs only a
LIST to know them again.

Cost: a pin is one PUT (about 100 bytes per key it lists); a full sweep pays one LIST
of ``pins/`` and one GET per pin, the driver's incremental retention one LIST and one
GET per pin written since its previous epoch.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from dkvstream.operators import paths
from dkvstream.operators.runtime.checkpoints import JobCheckpoint
from dkvstream.storage.dkv.manifest import encode_manifest, files_of, load_manifest
from dkvstream.storage.errors import CorruptionError, DkvstreamError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore, map_requests


class PinError(DkvstreamError):
    """A pin could not be taken: what it would protect is gone (the message says what to do)."""


@dataclass
class Pin:
    """One pin record (module docstring). ``owner`` and ``holder`` are job names."""

    owner: str
    holder: str
    what: str
    reason: str
    keys: list[str]
    created_at_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    token: str = ""  # unique per write of a savepoint's or a restore's pin ("" for a fork's)

    @property
    def key(self) -> str:
        """The pin's object key."""
        return paths.pin_key(paths.job_prefix(self.owner), self.holder, self.what, self.token)

    def encode(self) -> bytes:
        """JSON bytes."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str) -> Pin:
        """Parses a pin read from ``uri``.

        Raises:
            CorruptionError: not a pin record, naming ``uri``.
        """
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError) as e:
            raise CorruptionError(f"{uri}: unreadable pin record ({len(data)} bytes): {e}") from e


def files_by_owner(store: ObjectStore, ckpt: JobCheckpoint) -> dict[str, dict[str, int]]:
    """Every file the range manifests of ``ckpt`` name (themselves, their SSTables and
    WAL objects), with its size in bytes, grouped by the job prefix (``jobs/<name>``)
    that holds it: ``{owner prefix: {object key: bytes}}``.

    Cost: one GET per range manifest.

    Raises:
        ObjectNotFoundError / CorruptionError: a range manifest is missing or damaged.
    """
    manifests = [m for ranges in ckpt.operators.values() for m in ranges.values()]

    def named(key: str) -> dict[str, int]:
        m = load_manifest(store, key)
        return {key: len(encode_manifest(m)), **files_of(m)}

    out: dict[str, dict[str, int]] = {}
    for files in map_requests(named, manifests):
        for key, size in files.items():
            owner = paths.owner_of(key)
            if owner is not None:
                out.setdefault(owner, {})[key] = size
    return out


def write_pins(store: ObjectStore, holder: str, what: str, reason: str,
               by_owner: dict[str, dict[str, int]], token: str = "") -> list[str]:
    """Writes one pin per owner (replacing the holder's earlier pin for ``what`` and
    ``token``).

    Args:
        holder: the holder's job name.
        what: what holds it (``fork``, ``savepoint-<name>``, ``restore-<epoch>``).
        by_owner: ``{owner job prefix: {object key: bytes}}`` (``files_by_owner``).
        token: "" or a unique token (``paths.new_token``) the keys carry, so a pin
            another caller writes for the same ``what`` never replaces this one.

    Returns:
        The pin keys written.
    """
    pins = [Pin(owner=owner.split("/", 1)[1], holder=holder, what=what, reason=reason, keys=sorted(keys),
                token=token)
            for owner, keys in sorted(by_owner.items()) if keys]
    map_requests(lambda p: store.put(p.key, p.encode()), pins)
    return [p.key for p in pins]


def delete_pins(store: ObjectStore, keys: Iterable[str]) -> None:
    """Deletes pin records (absent ones are fine)."""
    keys = list(keys)
    if keys:
        store.delete_many(keys)


def delete_by_name(store: ObjectStore, owners: Iterable[str], holder: str, what: str) -> list[str]:
    """Deletes every pin of ``holder`` for ``what`` at ``owners`` (job prefixes), whatever
    its token: what a crash between deleting a record and its pins left. One LIST of
    each owner's ``pins/``.

    Returns:
        The pin keys deleted.
    """
    name = f"{holder}--{what}"
    keys = [k for owner in sorted(set(owners)) for k in store.list(paths.pins_prefix(owner))
            if k.endswith(".json") and paths.pin_name(k)[0] == name]
    delete_pins(store, keys)
    return keys


def require_still_there(store: ObjectStore, record_key: str, pin_keys: list[str], what: str) -> None:
    """The re-check after writing pins (module docstring): ``record_key`` (the checkpoint
    or savepoint the pins copy) must still exist; if not, the pins are deleted.

    Raises:
        PinError: the record is gone; ``what`` says what it was and the message what to do.
    """
    if not store.exists(record_key):
        delete_pins(store, pin_keys)
        raise PinError(f"{what} ({store.uri(record_key)}) expired meanwhile (retention deleted it); "
                       "take a newer one")


def read_pins(store: ObjectStore, owner_prefix: str) -> list[Pin]:
    """Every pin held on the files of the job under ``owner_prefix`` (one LIST, one GET each).

    Raises:
        CorruptionError: a pin record does not read (a cleanup must then delete nothing).
    """
    keys = [k for k in store.list(paths.pins_prefix(owner_prefix)) if k.endswith(".json")]

    def read(key: str) -> Pin | None:
        try:
            return Pin.decode(store.get(key), store.uri(key))
        except ObjectNotFoundError:  # dropped meanwhile: it protects nothing any more
            return None

    return [p for p in map_requests(read, keys) if p is not None]


def pinned_keys(store: ObjectStore, owner_prefix: str) -> set[str]:
    """The owner's files some pin protects (``read_pins``).

    Raises:
        CorruptionError: a pin record does not read.
    """
    return {k for p in read_pins(store, owner_prefix) for k in p.keys}


def held_by(store: ObjectStore, owner_prefix: str, holder: str, what: str) -> list[Pin]:
    """The pins ``holder`` holds for ``what`` at the job under ``owner_prefix``, whatever
    their tokens (one LIST, one GET each; a pin being replaced has two for a moment).

    Raises:
        CorruptionError: a pin record does not read.
    """
    name = f"{holder}--{what}"
    keys = [k for k in store.list(paths.pins_prefix(owner_prefix))
            if k.endswith(".json") and paths.pin_name(k)[0] == name]
    out = []
    for key in keys:
        try:
            out.append(Pin.decode(store.get(key), store.uri(key)))
        except ObjectNotFoundError:  # replaced meanwhile
            pass
    return out


def replace_pins(store: ObjectStore, owner_prefix: str, holder: str, what: str, reason: str,
                 old: list[Pin], keys: set[str]) -> list[str]:
    """Makes ``keys`` what ``holder``'s pin for ``what`` at ``owner_prefix`` protects,
    replacing the pins ``old`` (``held_by``): the new pin first, under a new key (a pin
    key is written once, so a reader may cache a pin by its key: ``PinCache``), then the
    old ones are deleted; none is written if one old pin names exactly ``keys``, all are
    deleted if ``keys`` is empty.

    Returns:
        The pin keys now protecting ``keys`` ([] if none).
    """
    if len(old) == 1 and set(old[0].keys) == keys:
        return [old[0].key]
    written = write_pins(store, holder, what, reason, {owner_prefix: dict.fromkeys(keys, 0)},
                         paths.new_token()) if keys else []
    delete_pins(store, [p.key for p in old])
    return written


def shrink_pins(store: ObjectStore, holder_prefix: str, what: str, owners: Iterable[str],
                named: dict[str, set[str]]) -> dict[str, int]:
    """Shrinks the holder's pins for ``what`` at ``owners`` (job prefixes) to the keys
    still named (``named``: ``{owner prefix: keys}``, what the holder's retained records
    name); a pin left naming nothing is deleted. A pin never gains a key here: the
    holder writes its new files under its own prefix. A shrunk pin is written under a
    new key (``replace_pins``).

    Call it only with ``named`` computed after the holder's expired checkpoints were
    deleted (the holder's full sweep, ``dkvstream.operators.runtime.cleanup``), so no
    record still being read names a key it drops.

    Returns:
        ``{owner prefix: keys its pins still protect}`` for every owner where a pin was
        found (0: deleted).
    """
    holder = holder_prefix.split("/", 1)[1]
    out: dict[str, int] = {}
    for owner in sorted(set(owners) - {holder_prefix}):
        old = held_by(store, owner, holder, what)
        if not old:
            continue
        keep = {k for p in old for k in p.keys} & named.get(owner, set())
        replace_pins(store, owner, holder, what, old[0].reason, old, keep)
        out[owner] = len(keep)
    return out


class PinCache:
    """The pins at one owner job, kept between calls by a long-lived reader (the
    driver's incremental retention): a pin key is written once (a changed pin gets a
    new key, ``replace_pins``; savepoints' and restores' carry unique tokens), so a
    pin read once is known by its key until the key is no longer listed. A call costs
    one LIST of ``pins/`` and one GET per pin written since the previous call.
    (``ObjectStore.list`` returns keys only, no ETag or size, hence keys written once.)
    """

    def __init__(self, store: ObjectStore, owner_prefix: str) -> None:
        self.store, self.owner_prefix = store, owner_prefix
        self._pins: dict[str, Pin] = {}

    def read(self) -> list[Pin]:
        """The owner's pins now (as ``read_pins``).

        Raises:
            CorruptionError: a pin record does not read.
        """
        listed = [k for k in self.store.list(paths.pins_prefix(self.owner_prefix)) if k.endswith(".json")]
        new = [k for k in listed if k not in self._pins]

        def read(key: str) -> Pin | None:
            try:
                return Pin.decode(self.store.get(key), self.store.uri(key))
            except ObjectNotFoundError:  # dropped meanwhile
                return None

        fresh = dict(zip(new, map_requests(read, new)))
        self._pins = {k: self._pins.get(k) or fresh.get(k) for k in listed}
        self._pins = {k: p for k, p in self._pins.items() if p is not None}
        return list(self._pins.values())

    def pinned_keys(self) -> set[str]:
        """The owner's files some pin protects now (``read``)."""
        return {k for p in self.read() for k in p.keys}


# ------------------------------------------------------------- a job's pins for its checkpoints
CHECKPOINTS_PIN = "fork"  # ``what`` of the pin a job holds for its own checkpoints' foreign files
RESTORE_PIN = "restore-"  # ``what`` of a restore's pin on the job's own files: restore-<epoch>


def released_restore_pins(held: list[Pin], job: str, newest_read: int) -> list[str]:
    """Keys of job ``job``'s restore pins (``savepoints.restore``) a cleanup may delete
    once done: those of a restore into an epoch <= ``newest_read``, the newest
    checkpoint the cleanup read as retained before it listed the pins (``held``). Every
    later cleanup reads that checkpoint, or a newer one, as retained, so the files it
    names need no pin any more."""
    out = []
    for p in held:
        epoch = p.what[len(RESTORE_PIN):] if p.holder == job and p.what.startswith(RESTORE_PIN) else ""
        if epoch.isdigit() and int(epoch) <= newest_read:
            out.append(p.key)
    return out


def held_at(store: ObjectStore, holder_prefix: str) -> list[str]:
    """The owner prefixes where the job under ``holder_prefix`` holds a pin for its
    checkpoints (recorded in its ``fork.json``, ``paths.fork_record_key``); [] for a job
    never forked nor restored from a foreign savepoint."""
    return read_fork_record(store, holder_prefix).get("owners", [])


def read_fork_record(store: ObjectStore, holder_prefix: str) -> dict:
    """The job's pin record (``paths.fork_record_key``): ``owners``, and the fork origin
    of a forked job (``dkvstream.operators.runtime.forks``); {} if none."""
    key = paths.fork_record_key(holder_prefix)
    try:
        return json.loads(store.get(key))
    except ObjectNotFoundError:
        return {}
    except ValueError as e:
        raise CorruptionError(f"{store.uri(key)}: unreadable fork record: {e}") from e


def hold_for_checkpoints(store: ObjectStore, holder: str, by_owner: dict[str, dict[str, int] | set[str]],
                         record: dict | None = None) -> list[str]:
    """Adds the files of other jobs a checkpoint of job ``holder`` is about to name to
    the holder's checkpoint pins (``CHECKPOINTS_PIN``, one per owner): first the owners
    into the holder's fork record (merged into ``record``, its other fields), then the
    pins (each extended pin under a new key, ``replace_pins``). The caller re-checks
    that what it copies still exists (``require_still_there``) unless another pin
    protects it throughout (a savepoint's).

    Returns:
        The pin keys protecting those files.
    """
    prefix = paths.job_prefix(holder)
    foreign = {o: set(keys) for o, keys in by_owner.items() if o != prefix and keys}
    if not foreign and record is None:
        return []
    current = read_fork_record(store, prefix)
    doc = {**current, **(record or {})}
    doc["owners"] = sorted(set(current.get("owners", [])) | set(foreign))
    if doc != current:  # (a fork claimed its record with these owners already)
        store.put(paths.fork_record_key(prefix), json.dumps(doc, sort_keys=True).encode())
    written = []
    for owner, keys in sorted(foreign.items()):
        old = held_by(store, owner, holder, CHECKPOINTS_PIN)
        written += replace_pins(store, owner, holder, CHECKPOINTS_PIN, f"checkpoints of job {holder}", old,
                                keys | {k for p in old for k in p.keys})
    return written
