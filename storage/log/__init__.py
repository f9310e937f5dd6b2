"""The log: Kafka-style topics on an object store, WarpStream-style files.

* ``records.py``: CRC-checked record batches (the unit of storage).
* ``index.py``: per-chunk offset and time indexes, Kafka's warm/cold binary search.
* ``segment.py``: segment files holding chunks of many partitions, their directory.
* ``metadata.py``: the metadata (partition offset ranges -> file byte ranges): versions
  committed with ``put_if_absent``, deltas between snapshots, entries sealed into pages,
  so a flush's commit costs the same after millions of flushes.
* ``producer.py`` / ``consumer.py``: produce (a file per flush), fetch, offsets for
  times, consumer-group offsets in the compacted ``__consumer_offsets`` topic.
* ``offset_map.py`` / ``cleaner.py``: compacted topics: the fixed-memory key-hash map
  and the two-pass cleaner (two GETs per input file, complete deduplication).
* ``log.py``: ``Log``, the facade. ``dump.py``: the command-line dump tool;
  ``console.py``: the console producer, consumer and consumer-groups tool.

Seeds: ``kafka-index-binary-search.txt``, ``kafka-log-compaction-design.txt``,
``warpstream-compacted-topics.txt``.
"""
from dkvstream.storage.log.cleaner import Cleaner, CleaningReport
from dkvstream.storage.log.config import COMPACT, DELETE, CleanerConfig, ProducerConfig, TopicConfig
from dkvstream.storage.log.consumer import Consumer, FetchResult
from dkvstream.storage.log.errors import (
    InvalidConfigError,
    InvalidRecordError,
    LogError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownTopicError,
)
from dkvstream.storage.log.log import Log
from dkvstream.storage.log.producer import Producer
from dkvstream.storage.log.records import Record

__all__ = [
    "COMPACT",
    "DELETE",
    "Cleaner",
    "CleanerConfig",
    "CleaningReport",
    "Consumer",
    "FetchResult",
    "InvalidConfigError",
    "InvalidRecordError",
    "Log",
    "LogError",
    "OffsetOutOfRangeError",
    "Producer",
    "ProducerConfig",
    "Record",
    "TopicConfig",
    "TopicExistsError",
    "UnknownTopicError",
]
