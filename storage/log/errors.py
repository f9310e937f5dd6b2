"""Errors raised by the log, on top of ``dkvstream.storage.errors`` (``CorruptionError`` for bad
bytes, ``ObjectNotFoundError`` for missing files).

``MetadataConflictError`` is the only retryable one: another writer committed the same
metadata version first; reload and try again (``MetadataStore.commit`` does).
"""
from __future__ import annotations

from dkvstream.storage.errors import StorageError


class LogError(StorageError):
    """Raised when a log operation fails; base of the errors below."""


class UnknownTopicError(LogError, KeyError):
    """Raised when a topic or partition does not exist; names it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TopicExistsError(LogError):
    """Raised when creating a topic whose name is taken with another configuration."""


class InvalidRecordError(LogError, ValueError):
    """Raised when a record is rejected on produce (e.g. a keyless record for a compacted topic)."""


class InvalidConfigError(LogError, ValueError):
    """Raised when a topic, producer or cleaner setting is out of range; names the setting."""


class OffsetOutOfRangeError(LogError, IndexError):
    """Raised when a fetch asks for an offset outside [log start offset, next offset]."""


class MetadataConflictError(LogError):
    """Raised when a metadata commit lost the race too many times (retryable)."""

    retryable = True
