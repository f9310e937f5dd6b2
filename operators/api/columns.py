"""The names of the columns of event tables: what sources return, what the runtime adds,
what operators receive. Every module that reads or writes one of these columns takes its
name from here.

==========================  ================  ===============================================  ========
name                        column            written by                                       type
==========================  ================  ===============================================  ========
``KEY_COLUMN``              ``key``           ``Source.read``; the runtime in a batch          binary
                                              operator's ``on_batch``/``on_timers`` tables
``TIMESTAMP_COLUMN``        ``timestamp``     the same: event time (timer time in            int64 ms
                                              ``on_timers``), ms since the Unix epoch, UTC
``KEY_GROUP_COLUMN``        ``key_group``     the runtime, in ``on_batch``/``on_timers``       int32
                                              tables; also the key group of the state
                                              reader's state and timer tables
``DOMAIN_COLUMN``           ``domain``        the runtime, in ``on_timers`` tables: the        string
                                              timers' ``TimeDomain`` (``event_time`` or
                                              ``processing_time``)
``ERROR_COLUMN``            ``_error``        ``Source.read``, optional: why a row could not   string
                                              be decoded (null for a good row)
``RAW_VALUE_COLUMN``        ``_raw_value``    ``Source.read``, optional: the raw bytes of      binary
                                              such a row
``OFFSET_COLUMN``           ``_offset``       ``Source.read``, optional, for offsets with      int64
                                              gaps; the read task otherwise
``INGEST_TIME_COLUMN``      ``_ingest_time``  ``Source.read``, optional: when the event        int64 ms
                                              became readable; the read task otherwise (null)
``PART_COLUMN``             ``_part``         the read task: the split's partition index       int32
``KG_COLUMN``               ``_kg``           the read task: the event's key group             int32
``RANGE_COLUMN``            ``_range``        the read task (an operator task for its          int32
                                              ``main`` output): the key-group range of the
                                              operator that reads the event
==========================  ================  ===============================================  ========

``_offset``: each row's offset, strictly increasing within the slice ``[start, end)`` read,
for a source whose offsets have gaps (a Kafka topic: transaction markers, compaction; a
compacted log topic); without it row i is offset ``start + i``. ``_ingest_time``: when
the event became readable (a Kafka record's broker timestamp, a file's modification
time), ms since the Unix epoch; the runtime measures end-to-end latency from it.

A source's value columns (``Source.value_schema``) are every other column; the names
beginning with ``_`` are the runtime's, so a value column should not begin with one. Rows
with ``_error`` set go to the dead-letter table (``dkvstream.operators.io.dead_letter``);
``_error`` and ``_raw_value`` never reach an operator, nor do the runtime's columns
(``INTERNAL_COLUMNS``): an operator sees ``key``, ``timestamp``, ``key_group`` (batch
form) and the value columns. Value columns a particular source adds by default are named
by that source (``TopicSource``'s ``value``, ``UnionSource``'s ``input``).
"""
from __future__ import annotations

KEY_COLUMN = "key"
TIMESTAMP_COLUMN = "timestamp"
KEY_GROUP_COLUMN = "key_group"
DOMAIN_COLUMN = "domain"

ERROR_COLUMN = "_error"
RAW_VALUE_COLUMN = "_raw_value"
OFFSET_COLUMN = "_offset"
INGEST_TIME_COLUMN = "_ingest_time"

PART_COLUMN = "_part"
KG_COLUMN = "_kg"
RANGE_COLUMN = "_range"

# The columns of the events a read task returns (``dkvstream.operators.runtime.splits``)
# that are not value columns.
INTERNAL_COLUMNS = (KEY_COLUMN, TIMESTAMP_COLUMN, PART_COLUMN, OFFSET_COLUMN, INGEST_TIME_COLUMN,
                    KG_COLUMN, RANGE_COLUMN)
