"""Exceptions raised by the storage package, and ``DkvstreamError``, the root of every
error dkvstream raises.

One root (``DkvstreamError``) for the whole project: it is defined here, in the lowest
layer, because ``storage`` must not import ``operators``; ``dkvstream.operators.errors`` derives
the job API's and the runtime's errors from it. Each error keeps the built-in base that
says what kind of mistake it is (``ValueError``, ``LookupError``, ``FileNotFoundError``
...), so callers that only know the standard library still catch it.

Each class says whether trying the same thing again may work: ``retryable`` is True for
transient I/O (throttling, timeouts, a broker or object store not answering) and lost
races (``ManifestConflictError``: retry with a fresh name), False for corruption, invalid
jobs, user mistakes and fencing, where a retry fails the same way.
"""

from __future__ import annotations


class DkvstreamError(Exception):
    """Root of every error dkvstream raises; ``except DkvstreamError`` catches them all.

    Attributes:
        retryable: class attribute; True when the same call may succeed if tried again
            (transient I/O, a lost race), False when it fails the same way until
            something is changed (module docstring). An instance may override it
            (``e.retryable = True``) when only the instance knows, e.g. an HTTP status.
    """

    retryable: bool = False


class StorageError(DkvstreamError):
    """Raised when a storage operation fails; base of every error in this module but
    ``DkvstreamError``."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """Raised when an object-store key does not exist; the message names the key's URI."""


class ObjectExistsError(StorageError, FileExistsError):
    """Raised when ``put_if_absent`` finds the key already present."""


class CorruptionError(StorageError):
    """Raised when stored bytes fail a checksum or format check; names the URI and offset."""


class ManifestConflictError(StorageError):
    """Raised when a manifest name is already taken (retryable with a fresh name)."""

    retryable = True


class ClosedError(StorageError):
    """Raised when a closed DKV instance is used."""
