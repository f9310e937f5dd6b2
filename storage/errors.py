"""Exceptions raised by the storage package.

One flat module, shallow hierarchy. Object-store errors also subclass the built-in
``FileNotFoundError`` / ``FileExistsError`` so callers that only know the standard library
still catch them. ``ManifestConflictError`` is the only retryable one: a task attempt that
hits it should pick a fresh checkpoint name (or give up, because another attempt won).
"""

from __future__ import annotations


class StorageError(Exception):
    """Raised when a storage operation fails; base of every error in this module."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """Raised when an object-store key does not exist; the message names the key's URI."""


class ObjectExistsError(StorageError, FileExistsError):
    """Raised when ``put_if_absent`` finds the key already present."""


class CorruptionError(StorageError):
    """Raised when stored bytes fail a checksum or format check; names the URI and offset."""


class ManifestConflictError(StorageError):
    """Raised when a manifest name is already taken (retryable with a fresh name)."""


class ClosedError(StorageError):
    """Raised when a closed DKV instance is used."""
