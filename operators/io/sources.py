"""Sources: partitioned, replayable event streams addressed by offsets.

A source partition is a sequence of events numbered by offset 0, 1, 2, ... The runtime
plans each epoch as one offset range ``[committed, end)`` per partition and commits the
new offsets with the epoch's checkpoint, so replaying from a checkpoint re-reads exactly
the same events (exactly-once needs a replayable source, as with Kafka offsets).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import pyarrow as pa

KEY_COLUMN = "key"
TIMESTAMP_COLUMN = "timestamp"
# Optional columns of ``Source.read`` for rows the source could not decode: the error
# message (null for a good row) and the raw bytes. Such rows go to the job's dead-letter
# table (``operators.runtime.dead_letter``); the columns never reach an operator.
ERROR_COLUMN = "_error"
RAW_VALUE_COLUMN = "_raw_value"


class Source(ABC):
    """A partitioned source of keyed events.

    ``read`` returns an Arrow table with a ``key`` column (binary), a ``timestamp``
    column (int64, ms since the Unix epoch, UTC) and the value columns of
    ``value_schema``; each row becomes ``KeyedEvent(key, timestamp, {value columns})``.
    A row the source cannot decode should not raise: set its ``_error`` column (and
    ``_raw_value``), and the runtime sends it to the dead-letter table, as it does rows
    with a null or empty key or a timestamp before the Unix epoch or too far in the future.
    """

    name: str = "source"

    @abstractmethod
    def partitions(self) -> list[str]:
        """Partition names, in a fixed order."""

    @abstractmethod
    def end_offsets(self) -> dict[str, int]:
        """The offset one past the last available event of each partition."""

    @property
    def bounded(self) -> bool:
        """True if the end offsets are final (a file); the job then ends its input
        with a watermark of +infinity once every partition is read."""
        return True

    @property
    @abstractmethod
    def value_schema(self) -> pa.Schema:
        """Schema of the value columns of ``read``."""

    @abstractmethod
    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """Events at offsets ``[start, end)`` of ``partition``, in offset order.

        Raises:
            KeyError: unknown partition.
            IndexError: range outside ``[0, end_offsets()[partition]]``.
        """
