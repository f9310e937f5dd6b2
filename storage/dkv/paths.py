"""Naming of every object a DKV instance writes under its prefix.

Layout under ``<prefix>``::

    <prefix>/sst/<instance>-<n:06d>.sst    SSTables (flushes and compaction outputs)
    <prefix>/wal/<checkpoint>-<instance>.wal   one WAL object per checkpoint
    <prefix>/manifests/<checkpoint>.json   one manifest per checkpoint
    <prefix>/compactions/<id>/<n:06d>.sst  outputs of remote compaction <id> (in progress
                                           until the result object below exists)
    <prefix>/compactions/<id>.json         published remote compaction result

``<instance>`` is a fresh uuid4 (hex) per ``DKV.open``, so a retried or speculative task
attempt that reopens the same checkpoint never writes over another attempt's files; only
the files named by a committed manifest count. Checkpoint names are chosen by the caller
(unique per epoch and task attempt) and restricted to ``[A-Za-z0-9._-]``.
"""

from __future__ import annotations

import re
import uuid

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def validate_name(name: str) -> str:
    """Returns ``name`` if it is a valid checkpoint name.

    Raises:
        ValueError: Empty, too long, or has characters outside ``[A-Za-z0-9._-]``.
    """
    if not _NAME_RE.match(name) or name in (".", ".."):
        raise ValueError(f"invalid checkpoint name {name!r}: use [A-Za-z0-9._-]")
    return name


class PathResolver:
    """Builds object keys for one DKV instance.

    Args:
        prefix: The instance's key prefix, e.g. ``jobs/flights/state/op/kg-0000-0127``.
        instance_id: Unique id of this open instance; a fresh uuid4 hex if omitted.
    """

    def __init__(
        self, prefix: str, instance_id: str | None = None, compaction_id: str | None = None
    ) -> None:
        self.prefix = prefix.strip("/")
        if not self.prefix:
            raise ValueError("DKV prefix must not be empty")
        self.instance_id = instance_id or uuid.uuid4().hex
        self._next_table = 0
        self._compaction_id = compaction_id

    def next_sst_key(self) -> str:
        """Returns a fresh, never-used SSTable key.

        For a resolver made with ``compaction_id``, keys lie in that compaction's directory.
        """
        self._next_table += 1
        if self._compaction_id is not None:
            return f"{compaction_dir(self.prefix, self._compaction_id)}{self._next_table:06d}.sst"
        return f"{self.prefix}/sst/{self.instance_id}-{self._next_table:06d}.sst"

    def wal_key(self, checkpoint: str) -> str:
        """Returns the WAL object key for checkpoint ``checkpoint``."""
        return f"{self.prefix}/wal/{validate_name(checkpoint)}-{self.instance_id}.wal"

    def manifest_key(self, checkpoint: str) -> str:
        """Returns the manifest key for checkpoint ``checkpoint``."""
        return f"{self.prefix}/manifests/{validate_name(checkpoint)}.json"


def compactions_dir(prefix: str) -> str:
    """Returns ``<prefix>/compactions/`` (results and in-progress output directories)."""
    return f"{prefix.strip('/')}/compactions/"


def compaction_dir(prefix: str, cid: str) -> str:
    """Returns the directory (ending in ``/``) of remote compaction ``cid``'s outputs."""
    return f"{compactions_dir(prefix)}{validate_name(cid)}/"


def compaction_result_key(prefix: str, cid: str) -> str:
    """Returns the key of remote compaction ``cid``'s result object."""
    return f"{compactions_dir(prefix)}{validate_name(cid)}.json"


def parse_result_key(prefix: str, key: str) -> str | None:
    """Returns the compaction id if ``key`` is a result object under ``prefix``, else None."""
    d = compactions_dir(prefix)
    if key.startswith(d) and key.endswith(".json"):
        cid = key[len(d) : -len(".json")]
        if "/" not in cid and _NAME_RE.match(cid):
            return cid
    return None
