"""Kafka topics as job sources and sinks, through ``confluent-kafka`` (librdkafka).

User documentation: docs/kafka.md.

``KafkaSource``: source partition ``<topic>-<n>`` is partition n of the topic and the
runtime's source offsets are the topic's offsets. They are kept in the job's checkpoint
(as Flink's Kafka source keeps them in its checkpoint), not in a consumer group: each
read assigns the partition at an exact offset, so a restart re-reads exactly the
committed ranges (exactly-once input). Kafka offsets have gaps (transaction markers,
aborted records under ``read_committed``, compaction), so ``read`` names each record's
offset in the ``_offset`` column.

The end of a partition. ``end_offsets`` asks the broker for the high watermark (the
last stable offset under ``read_committed``) with ListOffsets, then fetches from one
offset before it to the end of the partition and takes the larger of the two ends.
On Apache Kafka both agree. Tansu answers ListOffsets with the base offset of the last
record batch + 1 instead of its last offset + 1 (five single records, then one batch of
95: ListOffsets says 6, the log ends at 100), while its Fetch responses carry the right
high watermark; a source planning from ListOffsets alone would read offset 5 and then
believe itself caught up, never reading 6..99. The fetch reads at most the last batch
(plus whatever was appended since). It runs at a source object's first ``end_offsets``
(a bounded source's only plan, a one-off reader's only question), and later only when
ListOffsets answers what it answered the previous time (the partition has gone quiet)
and that answer has not been probed yet. While records keep arriving, an epoch reads up
to ListOffsets' answer, every offset below it readable on both brokers, and the rest of
the last batch with the next epoch: on a live topic the probe (a fetch round trip, 50-250 ms on Tansu,
before every epoch's plan) would otherwise sit on every epoch's critical path. Ends never
go backwards within a source object (Tansu answers ListOffsets under ``read_committed``
with 0 while a transaction is open).

``KafkaSink``: tasks stage their rows as Parquet; after the driver commits epoch e,
``publish`` produces the epoch's rows into the topic with an idempotent producer
(``enable.idempotence``: no duplicates or reordering from the producer's own retries)
and then writes a marker object ``<job>/sinks/<name>/published/epoch=<e>.json``; a
publish finding its marker does nothing. Each record carries the headers
``dkvstream-epoch``, ``dkvstream-range`` (the key-group range that emitted it) and
``dkvstream-seq`` (its index in that range's rows of the epoch). A crash after some or
all records of epoch e were produced but before the marker makes the restart produce
epoch e again: the topic then holds duplicates, which a consumer drops exactly with
``deduplicate`` (a record whose ``(range, epoch, seq)`` came before in its partition).
That needs a record's copies in one partition, so placement is a function of the record
alone: a key by murmur2 (the Java client's partitioner), a keyless record by its range
and seq (``keyless_partition``), never at random. The sink is thus exactly-once for a
consumer that deduplicates, and at-least-once for one that does not (docs/kafka.md says
why transactions are not used).
"""
from __future__ import annotations

import atexit
import collections
import functools
import io
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dkvstream.operators import paths
from dkvstream.operators.api.columns import (
    ERROR_COLUMN,
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    OFFSET_COLUMN,
    RAW_VALUE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.errors import KafkaIOError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import Sink, erase_from_parquet, staged_keys
from dkvstream.operators.io.sources import Source
from dkvstream.operators.io.topics import VALUE_COLUMN, columns_of_rows, decode_json_values
from dkvstream.operators.paths import range_label_of
from dkvstream.storage.objectstore import ObjectStore

VALUE_FORMATS = ("json", "bytes", "utf8")
EPOCH_HEADER = "dkvstream-epoch"
RANGE_HEADER = "dkvstream-range"
SEQ_HEADER = "dkvstream-seq"
# Consumer settings of every read; a user's ``config`` overrides them. No consumer
# group: partitions are assigned at exact offsets and nothing is committed to the broker.
_CONSUMER_DEFAULTS = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,  # the end of a partition is an event: how a read ends
    "auto.offset.reset": "error",  # a deleted offset is an error, never a silent skip
    "fetch.wait.max.ms": 100,  # a fetch at the end returns after 100 ms, not 500
}
_POLL_S = 0.2


def _partition_name(topic: str, n: int) -> str:
    return f"{topic}-{n}"


def keyless_partition(range_label: str, seq: int, partitions: int) -> int:
    """The partition of a keyless ``KafkaSink`` record: the range's records go round-robin
    over the partitions from a start fixed by the range label (CRC-32, the same in every
    process), so a re-produced epoch puts each record where its first copy went.

    Args:
        range_label: the key-group range that emitted the record (``dkvstream-range``).
        seq: its index among that range's rows of the epoch (``dkvstream-seq``).
        partitions: the topic's partition count (> 0).

    Returns:
        A partition number in ``[0, partitions)``.
    """
    return (zlib.crc32(range_label.encode()) + seq) % partitions


def _topic_partitions(client, topic: str, bootstrap: str, who: str, timeout_s: float) -> list[int]:
    """The partition numbers of ``topic``, sorted, from the metadata ``client`` (a
    librdkafka consumer or producer) fetches; errors begin with ``who``.

    Raises:
        KafkaIOError: the metadata request failed, or the topic does not exist.
    """
    from confluent_kafka import KafkaException

    try:
        md = client.list_topics(topic, timeout=timeout_s)
    except KafkaException as e:
        raise KafkaIOError(f"{who}: metadata of topic {topic!r} from {bootstrap}: {e}") from e
    found = md.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        why = found.error if found is not None and found.error is not None else "no partitions"
        raise KafkaIOError(f"{who}: topic {topic!r} not found on {bootstrap} ({why}); create it "
                           f"before running the job")
    return sorted(found.partitions)


def _produce_staged_file(sink: KafkaSink, store: ObjectStore, epoch: int, staged_key: str) -> int:
    """A publish task: the records of one staged file (``KafkaSink.publish_in_tasks``)."""
    return sink.produce(store, epoch, [staged_key])


# Per Spark Python worker process: the consumers of the read tasks it ran, by settings
# (metadata and end probes), and the partition readers (below), by settings and partition.
_TASK_CONSUMERS: dict[str, object] = {}
_TASK_READERS: collections.OrderedDict[tuple[str, str], _PartitionReader] = collections.OrderedDict()
_TASK_READERS_LOCK = threading.Lock()
# The most partition readers a process keeps; the least recently used is closed beyond it
# (a worker whose partitions changed, e.g. after a rescale, stops prefetching old ones).
MAX_PARTITION_READERS = 32
# A partition reader prefetches at most this much (librdkafka's default is 64 MiB per
# consumer, i.e. per partition here); a user's ``config`` overrides it.
_READER_DEFAULTS = {"queued.max.messages.kbytes": 16 * 1024}


class _PartitionReader:
    """A consumer kept assigned to one partition between reads, so that a read starting
    where the previous one ended takes the records librdkafka prefetched meanwhile instead
    of assigning again (an assignment's first fetch costs 40-130 ms on Tansu).

    Attributes:
        consumer: the ``confluent_kafka.Consumer``.
        next_offset: where the last read ended, while the reader stays assigned there;
            None otherwise (the next read assigns).
        leftover: the messages (and events) the last read took from the queue past
            ``next_offset``, in order: the next read's first.
    """

    __slots__ = ("consumer", "leftover", "next_offset")

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.next_offset: int | None = None
        self.leftover: list = []


@atexit.register
def _close_task_consumers() -> None:
    while _TASK_CONSUMERS:
        _TASK_CONSUMERS.popitem()[1].close()
    while _TASK_READERS:
        _TASK_READERS.popitem()[1].consumer.close()


class KafkaSource(Source):
    """Reads a Kafka topic (module docstring: offsets, ends, the Tansu quirk).

    Args:
        bootstrap: ``bootstrap.servers``, e.g. ``"127.0.0.1:9092"``.
        topic: the topic; it must exist when the source is first used.
        value_format: how a record value becomes the value columns: ``"json"`` (a JSON
            object, decoded into ``value_schema`` with the checks of
            ``dkvstream.operators.io.topics.decode_json_values``), ``"bytes"`` (one binary
            ``value`` column), ``"utf8"`` (one string ``value`` column), or a callable
            taking the value (bytes, or None for a null value) and returning a dict of
            ``value_schema`` fields.
        value_schema: the value columns (required for ``"json"`` and a callable; must be
            None for ``"bytes"`` and ``"utf8"``).
        key: None: the record key is the event key (bytes); else the name of a string
            or binary column of ``value_schema`` whose value (UTF-8) is the event key.
        timestamp: None: the record timestamp (ms) is the event time; else the name of
            an integer column of ``value_schema`` holding ms since the Unix epoch.
        headers: ``{header name: column name}``: these record headers become binary
            columns after the value columns (null when absent; the last value when a
            header repeats). Other headers are dropped.
        bounded: False (default): a live topic, the job stops when caught up. True: the
            end offsets found by this object's first ``end_offsets`` call are final.
        isolation_level: ``"read_committed"`` (default; records of open and aborted
            transactions are not read, on a broker that supports it) or
            ``"read_uncommitted"``.
        config: more librdkafka consumer settings (security, timeouts), overriding the
            defaults.
        name: the source's name in checkpoints and dead-letter rows (default
            ``kafka:<topic>``).
        timeout_s: how long a read, an end probe or a metadata request may wait for
            the broker before ``KafkaIOError``, s.

    Event time and ingest time: the event timestamp is the record timestamp (whatever
    the topic's ``message.timestamp.type`` put there); ``_ingest_time`` is the record
    timestamp when it is a LogAppendTime (the broker's), else the record timestamp too
    (CreateTime: the producer's clock), else the time of the read. With ``timestamp``
    None both are the same value, so the runtime reports now minus it as event-time lag,
    not latency (``dkvstream.operators.runtime.live.ingest_sketches``).

    Bad records do not raise: a value that does not decode gets ``_error`` and
    ``_raw_value``, and the runtime sends it to the dead-letter table with topic
    partition and offset; a null key becomes a ``missing_key`` dead letter.

    Picklable: the librdkafka consumer is created lazily and not pickled.

    Raises:
        ValueError: an inconsistent argument (the message says which).
    """

    def __init__(self, bootstrap: str, topic: str, *,
                 value_format: str | Callable[[bytes | None], dict] = "json",
                 value_schema: pa.Schema | None = None, key: str | None = None,
                 timestamp: str | None = None, headers: dict[str, str] | None = None,
                 bounded: bool = False, isolation_level: str = "read_committed",
                 config: dict | None = None, name: str | None = None,
                 timeout_s: float = 30.0) -> None:
        if not callable(value_format) and value_format not in VALUE_FORMATS:
            raise ValueError(f"KafkaSource({topic!r}): value_format must be one of {VALUE_FORMATS} "
                             f"or a callable, got {value_format!r}")
        if value_format in ("bytes", "utf8"):
            if value_schema is not None:
                raise ValueError(f"KafkaSource({topic!r}): value_format={value_format!r} yields one "
                                 f"{VALUE_COLUMN!r} column; leave value_schema unset")
            value_schema = pa.schema([pa.field(
                VALUE_COLUMN, pa.binary() if value_format == "bytes" else pa.string())])
        elif value_schema is None:
            raise ValueError(f"KafkaSource({topic!r}): value_format={value_format!r} needs a "
                             f"value_schema (the columns the values decode into)")
        if key is not None:
            if key not in value_schema.names:
                raise ValueError(f"KafkaSource({topic!r}): key column {key!r} is not in value_schema")
            t = value_schema.field(key).type
            if not (pa.types.is_string(t) or pa.types.is_binary(t)):
                raise ValueError(f"KafkaSource({topic!r}): key column {key!r} is {t}; the key "
                                 f"column must be string or binary")
        if timestamp is not None:
            if timestamp not in value_schema.names:
                raise ValueError(f"KafkaSource({topic!r}): timestamp column {timestamp!r} is not "
                                 f"in value_schema")
            if not pa.types.is_integer(value_schema.field(timestamp).type):
                raise ValueError(f"KafkaSource({topic!r}): timestamp column {timestamp!r} must be "
                                 f"an integer column of ms since the Unix epoch")
        headers = dict(headers or {})
        clash = set(headers.values()) & set(value_schema.names)
        if clash:
            raise ValueError(f"KafkaSource({topic!r}): header columns {sorted(clash)} are also in "
                             f"value_schema; give the headers other column names")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"KafkaSource({topic!r}): isolation_level must be read_committed or "
                             f"read_uncommitted, got {isolation_level!r}")
        self.bootstrap, self.topic = bootstrap, topic
        self.value_format = value_format
        self._decoded_schema = value_schema
        self.key, self.timestamp, self.headers = key, timestamp, headers
        self._bounded = bounded
        self.isolation_level = isolation_level
        self.config = dict(config or {})
        self.name = name or f"kafka:{topic}"
        self.timeout_s = timeout_s
        self._reset()

    def _reset(self) -> None:
        self._consumer = None
        self._readers: dict[str, _PartitionReader] = {}
        # partition -> (what ListOffsets answered last, the end known then, whether an end
        # probe ran at that answer): see the module docstring for when a probe runs.
        self._probed: dict[str, tuple[int, int, bool]] = {}
        self._final_ends: dict[str, int] | None = None

    def __getstate__(self) -> dict:
        # The ends found so far travel with the copy (small dicts): a read task then
        # trusts the ends the driver planned with instead of asking the broker again,
        # which would put an end probe per task back on every epoch's path.
        state = dict(self.__dict__)
        state.update(_consumer=None, _readers={}, _probed=dict(self._probed))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        # A copy unpickled in a read task shares its worker process's consumer (below).
        self._pooled = True

    # ------------------------------------------------------------- the consumer
    def _settings(self) -> dict:
        return {"bootstrap.servers": self.bootstrap, "group.id": f"dkvstream-{self.name}",
                "isolation.level": self.isolation_level, **_CONSUMER_DEFAULTS, **self.config}

    def _client(self):
        if self._consumer is None:
            from confluent_kafka import Consumer

            settings = self._settings()
            if getattr(self, "_pooled", False):
                # Read tasks get the source unpickled, once per task: one consumer per
                # worker process and settings, not a connection per task. A worker runs
                # one task at a time, and each read assigns its own partition and offset.
                key = repr(sorted(settings.items()))
                if key not in _TASK_CONSUMERS:
                    _TASK_CONSUMERS[key] = Consumer(settings)
                self._consumer = _TASK_CONSUMERS[key]
            else:
                self._consumer = Consumer(settings)
        return self._consumer

    def _reader(self, partition: str) -> _PartitionReader:
        """The partition's reader: one per partition of this source object, or in a read
        task one per worker process, settings and partition (``_TASK_READERS``)."""
        from confluent_kafka import Consumer

        settings = {**_CONSUMER_DEFAULTS, **_READER_DEFAULTS, **self._settings()}
        if not getattr(self, "_pooled", False):
            if partition not in self._readers:
                self._readers[partition] = _PartitionReader(Consumer(settings))
            return self._readers[partition]
        key = (repr(sorted(settings.items())), partition)
        with _TASK_READERS_LOCK:
            reader = _TASK_READERS.get(key)
            if reader is None:
                reader = _TASK_READERS[key] = _PartitionReader(Consumer(settings))
                while len(_TASK_READERS) > MAX_PARTITION_READERS:
                    _TASK_READERS.popitem(last=False)[1].consumer.close()
            _TASK_READERS.move_to_end(key)
            return reader

    def close(self) -> None:
        """Closes the consumers (a later call opens new ones). Idempotent. A read task's
        copy leaves its worker's shared consumers open."""
        if not getattr(self, "_pooled", False):
            if self._consumer is not None:
                self._consumer.close()
            while self._readers:
                self._readers.popitem()[1].consumer.close()
        self._consumer = None
        self._readers = {}

    def _partition_ids(self) -> list[int]:
        return _topic_partitions(self._client(), self.topic, self.bootstrap, self.name, self.timeout_s)

    def _partition_index(self, name: str) -> int:
        prefix, _, n = name.rpartition("-")
        if prefix != self.topic or not n.isdigit():
            raise KeyError(f"{self.name}: unknown partition {name!r}")
        return int(n)

    def _tp(self, partition: str, offset: int = -1001):
        from confluent_kafka import TopicPartition

        return TopicPartition(self.topic, self._partition_index(partition), offset)

    def _watermarks(self, partition: str) -> tuple[int, int]:
        """``(log start offset, high watermark)`` by ListOffsets (the last stable offset
        instead of the high watermark under ``read_committed``)."""
        from confluent_kafka import KafkaException

        try:
            low, high = self._client().get_watermark_offsets(self._tp(partition), timeout=self.timeout_s,
                                                             cached=False)
        except KafkaException as e:
            raise KafkaIOError(f"{self.name}: ListOffsets of {partition} from {self.bootstrap}: {e}") from e
        return low, high

    # ------------------------------------------------------------------ Source
    def partitions(self) -> list[str]:
        return [_partition_name(self.topic, n) for n in self._partition_ids()]

    def start_offset(self, partition: str) -> int:
        """The partition's log start offset (older records were deleted by retention)."""
        return self._watermarks(partition)[0]

    @property
    def bounded(self) -> bool:
        return self._bounded

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([*self._decoded_schema,
                          *(pa.field(c, pa.binary()) for c in self.headers.values())])

    def end_offsets(self) -> dict[str, int]:
        """One past the last readable offset of each partition: ListOffsets, corrected by
        an end probe (module docstring); never less than an end returned before.

        Raises:
            KafkaIOError: the broker failed or did not answer in ``timeout_s``.
        """
        if self._bounded and self._final_ends is not None:
            return dict(self._final_ends)
        ends, probe = {}, {}
        for p in self.partitions():
            low, high = self._watermarks(p)
            answered, known, probed = self._probed.get(p, (None, low, False))
            ends[p] = max(known, high)
            if self._bounded or answered is None or (high == answered and not probed):
                # One before ListOffsets' answer: on Tansu the last batch starts there; on
                # Kafka the last record is there. From ``known`` if that is further on.
                probe[p] = (high, max(high - 1, known, low))
            else:
                self._probed[p] = (high, ends[p], probed and high == answered)
        for p, end in self._probe_ends({p: start for p, (_, start) in probe.items()}).items():
            ends[p] = max(ends[p], end)
            self._probed[p] = (probe[p][0], ends[p], True)
        if self._bounded:
            self._final_ends = dict(ends)
        return ends

    def _known_end(self, partition: str) -> int:
        """The end ``end_offsets`` last returned for ``partition`` (0 before any)."""
        if self._final_ends is not None:
            return self._final_ends.get(partition, 0)
        return self._probed.get(partition, (None, 0, False))[1]

    def _probe_ends(self, starts: dict[str, int]) -> dict[str, int]:
        """``{partition: end}`` found by fetching each partition from ``starts[p]`` to
        the end-of-partition event (whose offset is the fetch response's high watermark
        or last stable offset)."""
        if not starts:
            return {}
        from confluent_kafka import KafkaError

        consumer = self._client()
        consumer.assign([self._tp(p, s) for p, s in starts.items()])
        ends = dict(starts)
        pending = set(starts)
        deadline = time.monotonic() + self.timeout_s
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaIOError(f"{self.name}: no end of partition {sorted(pending)} from "
                                       f"{self.bootstrap} within {self.timeout_s} s")
                for m in consumer.consume(10_000, _POLL_S):
                    p = _partition_name(m.topic(), m.partition())
                    if p not in pending:
                        continue
                    err = m.error()
                    if err is None:
                        ends[p] = max(ends[p], m.offset() + 1)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        ends[p] = max(ends[p], m.offset())
                        pending.discard(p)
                    else:
                        raise KafkaIOError(f"{self.name}: end probe of {p} from offset {starts[p]}: "
                                           f"{err.str()}")
        finally:
            consumer.unassign()
        return ends

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """The records at offsets ``[start, end)`` (fewer rows than offsets where the
        topic has gaps), with ``_offset`` and ``_ingest_time``.

        Raises:
            KeyError: not a partition of this topic.
            IndexError: ``end`` is beyond the partition's end (``end_offsets``).
            KafkaIOError: the broker failed, does not hold the range (deleted by
                retention: ``auto.offset.reset=error``), or did not deliver it within
                ``timeout_s``; the message names partition and offsets.
        """
        n = self._partition_index(partition)
        if start > end or start < 0:
            raise IndexError(f"{self.name}/{partition}: invalid offsets [{start}, {end})")
        if end > self._known_end(partition):
            # Normally end_offsets has just said where the end is; ask again only when not.
            known = self.end_offsets().get(partition, 0)
            if end > known:
                raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside "
                                 f"[0, {known}]")
        messages = list(self._fetch(partition, n, start, end)) if end > start else []
        return self._decode(messages)

    def _fetch(self, partition: str, n: int, start: int, end: int) -> Iterator:
        """The messages at offsets ``[start, end)`` from the partition's reader. After a
        read that got to ``end`` the reader stays assigned, keeping the messages it took
        past ``end`` (``leftover``), so the next epoch's read from ``end`` goes on from
        them and librdkafka's prefetched queue; after any other ending (an error, a caller
        that stopped early) it is unassigned and the next read assigns again."""
        from confluent_kafka import KafkaError

        reader = self._reader(partition)
        consumer = reader.consumer
        leftover = reader.leftover if reader.next_offset == start else None
        if leftover is None:
            consumer.assign([self._tp(partition, start)])
        reader.next_offset, reader.leftover = None, []  # until this read gets to ``end``
        where = f"{self.name}: {partition} offsets [{start}, {end})"
        last = start - 1
        deadline = time.monotonic() + self.timeout_s
        rest: list | None = None  # set once the range is complete: what was taken past it
        try:
            while rest is None:
                if time.monotonic() > deadline:
                    raise KafkaIOError(f"{where}: offsets from {last + 1} did not arrive within "
                                       f"{self.timeout_s} s; is the range still in the topic "
                                       f"(retention)?")
                batch = leftover or consumer.consume(min(end - last - 1, 10_000), _POLL_S)
                leftover = None
                for i, m in enumerate(batch):
                    if m.topic() != self.topic or m.partition() != n:
                        continue
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if m.offset() >= end:  # the range ends in a gap (a transaction marker)
                                rest = batch[i + 1:]
                                break
                            continue
                        raise KafkaIOError(f"{where}: {err.str()}")
                    offset = m.offset()
                    if offset >= end:  # past a gap at the range's end
                        rest = batch[i:]
                        break
                    if offset <= last:
                        continue  # a message fetched before this assignment
                    last = offset
                    if offset == end - 1:
                        rest = batch[i + 1:]
                    yield m
                    if rest is not None:
                        break
        finally:
            if rest is not None:
                reader.next_offset, reader.leftover = end, rest
            else:
                consumer.unassign()

    def _decode(self, messages: list) -> pa.Table:
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        now = int(time.time() * 1000)
        raw = [m.value() for m in messages]
        stamps = [m.timestamp() for m in messages]
        event_ts = [ts if kind != TIMESTAMP_NOT_AVAILABLE else None for kind, ts in stamps]
        # LogAppendTime is the broker's clock; CreateTime the producer's, the best a
        # record says about its arrival; a record without a timestamp: the read.
        ingest = [ts if kind != TIMESTAMP_NOT_AVAILABLE else now for kind, ts in stamps]
        columns, errors = self._values(raw)
        keys = pa.array([m.key() for m in messages], pa.binary())
        if self.key is not None:
            keys = columns[self.key].cast(pa.binary())
        ts = pa.array(event_ts, pa.int64())
        if self.timestamp is not None:
            ts = columns[self.timestamp].cast(pa.int64())
        for name, column in self.headers.items():
            columns[column] = pa.array([_header(m, name) for m in messages], pa.binary())
        return pa.table({
            KEY_COLUMN: keys, TIMESTAMP_COLUMN: ts, **columns, ERROR_COLUMN: errors,
            RAW_VALUE_COLUMN: pa.array(raw, pa.binary()),
            OFFSET_COLUMN: pa.array(np.fromiter((m.offset() for m in messages), np.int64, len(messages))),
            INGEST_TIME_COLUMN: pa.array(ingest, pa.int64()),
        })

    def _values(self, raw: list[bytes | None]) -> tuple[dict[str, pa.Array], pa.Array]:
        """The value columns and the error of each record (null if it decoded)."""
        if self.value_format == "bytes":
            return {VALUE_COLUMN: pa.array(raw, pa.binary())}, pa.nulls(len(raw), pa.string())
        if self.value_format == "json":
            return decode_json_values(raw, self._decoded_schema)
        rows, errors = [], []
        for value in raw:
            try:
                if self.value_format == "utf8":
                    row = {VALUE_COLUMN: value.decode("utf-8") if value is not None else None}
                else:
                    row = self.value_format(value)
                    if not isinstance(row, dict):
                        raise TypeError(f"the deserializer returned {type(row).__name__}, not a dict")
                rows.append(row)
                errors.append(None)
            except Exception as e:  # noqa: BLE001 - a user's deserializer may raise anything
                rows.append({})
                errors.append(f"{type(e).__name__}: {e}")
        return columns_of_rows(rows, errors, self._decoded_schema)


def _header(message, name: str) -> bytes | None:
    found = None
    for k, v in message.headers() or ():
        if k == name:
            found = v
    return found


# ------------------------------------------------------------------------ the sink
class KafkaSink(Sink):
    """Writes an operator output to a Kafka topic (module docstring: exactly-once by
    headers and ``deduplicate``).

    Args:
        bootstrap: ``bootstrap.servers``.
        topic: the topic (created by the caller).
        schema: Arrow schema of the output rows.
        key_column: column holding the record key (str or bytes; null: a keyless
            record); None: keyless records. Keys are partitioned by murmur2, as the Java
            client does, so a key lands in the same partition whoever produces it; a
            keyless record by its range and seq (``keyless_partition``), so its copies
            after a re-publish share its partition.
        timestamp_column: column holding the record timestamp (ms); None: the producer's
            clock at publish.
        serializer: ``row dict -> bytes`` for the record value; default the JSON object
            of the row's columns other than the key column (sorted keys, compact).
        name: the sink's name (its staging and marker names; default the topic).
        config: more librdkafka producer settings, overriding the defaults.
        timeout_s: how long a publish may wait for the broker's acknowledgements, s.
    """

    def __init__(self, bootstrap: str, topic: str, schema: pa.Schema, *,
                 key_column: str | None = None, timestamp_column: str | None = None,
                 serializer: Callable[[dict], bytes] | None = None, name: str | None = None,
                 config: dict | None = None, timeout_s: float = 60.0) -> None:
        for what, column in (("key_column", key_column), ("timestamp_column", timestamp_column)):
            if column is not None and column not in schema.names:
                raise ValueError(f"KafkaSink({topic!r}): {what} {column!r} is not in the schema")
        self.bootstrap, self.topic, self.schema = bootstrap, topic, schema
        self.key_column, self.timestamp_column = key_column, timestamp_column
        self.serializer = serializer
        self.name = name or topic
        self.config = dict(config or {})
        self.timeout_s = timeout_s

    # ---------------------------------------------------------------- the task side
    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(table.select(self.schema.names).cast(self.schema), buf, compression="zstd")
        key = f"{staging_prefix}/{self.name}.parquet"
        store.put(key, buf.getvalue())
        return key

    # -------------------------------------------------------------- the driver side
    def marker_key(self, job_prefix: str, epoch: int) -> str:
        """The object written once epoch ``epoch`` is fully produced into the topic."""
        return f"{paths.sink_prefix(job_prefix, self.name)}/published/epoch={epoch:010d}.json"

    def records_of(self, table: pa.Table, epoch: int, range_label: str,
                   partitions: Callable[[], int]) -> Iterator[dict]:
        """The records of one staged table: ``{key, value, timestamp, headers}`` dicts
        as ``Producer.produce`` takes them, a keyless one with its ``partition``
        (``keyless_partition``; ``partitions()`` gives the topic's partition count)."""
        for seq, row in enumerate(table.to_pylist()):
            key = row[self.key_column] if self.key_column else None
            if isinstance(key, str):
                key = key.encode()
            if self.serializer is not None:
                value = self.serializer(row)
            else:
                rest = {k: v for k, v in row.items() if k != self.key_column}
                value = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str).encode()
            record = {"key": key, "value": value,
                      "headers": [(EPOCH_HEADER, str(epoch).encode()),
                                  (RANGE_HEADER, range_label.encode()), (SEQ_HEADER, str(seq).encode())]}
            if key is None:
                record["partition"] = keyless_partition(range_label, seq, partitions())
            if self.timestamp_column and row[self.timestamp_column] is not None:
                record["timestamp"] = int(row[self.timestamp_column])
            yield record

    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        """``publish_in_tasks`` producing from this process."""
        return self.publish_in_tasks(store, job_prefix, epoch, staged,
                                     lambda fn, items: [fn(item) for item in items])

    def publish_in_tasks(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                         map_in_tasks) -> list[str]:
        """Produces the epoch's staged rows, one task per staged file (each with its own
        producer: the rows never pass through the driver), then writes the epoch's
        marker; nothing if the marker exists. Returns
        ``["kafka://<bootstrap>/<topic>#epoch=<e>"]`` (empty if already published).

        Raises:
            KafkaIOError: a record was not acknowledged within ``timeout_s`` (the marker
                is not written: a restart produces the epoch again).
        """
        marker = self.marker_key(job_prefix, epoch)
        if store.exists(marker):
            return []
        count = sum(map_in_tasks(functools.partial(_produce_staged_file, self, store, epoch), staged))
        store.put(marker, json.dumps({"epoch": epoch, "topic": self.topic, "records": count}).encode())
        return [f"kafka://{self.bootstrap}/{self.topic}#epoch={epoch}"]

    def produce(self, store: ObjectStore, epoch: int, staged: list[str]) -> int:
        """Produces the rows of the staged files of ``epoch`` and waits for every
        acknowledgement; returns the number of records. No marker (``publish``).

        Raises:
            KafkaIOError: a record failed or was not acknowledged within ``timeout_s``,
                or the topic's metadata (its partition count, for a keyless record) was
                not found.
        """
        producer = self._producer()
        partitions = functools.cache(lambda: len(_topic_partitions(
            producer, self.topic, self.bootstrap, f"kafka sink {self.name}", self.timeout_s)))
        failed: list[str] = []

        def delivered(err, msg) -> None:
            if err is not None:
                failed.append(f"partition {msg.partition()}: {err.str()}")

        count = 0
        for key in staged:
            table = pq.read_table(arrow_input(store.get(key)))
            for record in self.records_of(table, epoch, range_label_of(key), partitions):
                while True:
                    try:
                        producer.produce(self.topic, on_delivery=delivered, **record)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        producer.poll(0.1)
                count += 1
        left = producer.flush(self.timeout_s)
        if left or failed:
            raise KafkaIOError(f"kafka sink {self.name}: epoch {epoch} to topic {self.topic} at "
                               f"{self.bootstrap}: {left} of {count} records unacknowledged after "
                               f"{self.timeout_s} s, {len(failed)} failed"
                               f"{' (' + failed[0] + ')' if failed else ''}; the epoch is produced "
                               f"again on restart")
        return count

    def _producer(self):
        """An idempotent producer placing keys as the sink does (murmur2)."""
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "partitioner": "murmur2_random",
                         **self.config})

    def erase_rows(self, store: ObjectStore, job_prefix: str, column: str, values: list) -> list[str]:
        """Erasure by record key: the job's staged files of the sink are rewritten
        without the key's rows (so a restart does not produce them again), then, if the
        topic is compacted (``cleanup.policy`` contains ``compact``), a tombstone of
        each key is produced to the partition the key's records are in. The broker's
        log cleaner removes the key's records, and later the tombstones, on its own
        schedule: its ``min.compaction.lag.ms``/``max.compaction.lag.ms``, the active
        segment (never cleaned before ``segment.ms``/``segment.bytes`` rolls it) and
        ``delete.retention.ms``; a client cannot force it. A topic of
        ``cleanup.policy=delete`` gets no tombstone (it would be a record like any
        other): its records of the key stay until ``retention.ms`` expires them.

        Cost: one LIST of the staging prefixes, one GET per staged file of the sink
        and one PUT per rewritten one; a DescribeConfigs request and one produced
        record per key.

        Args and returns: as ``Sink.erase_rows``; ``column`` must be the sink's key
        column. The returned list names the staged files that held a row and, always,
        the topic as ``kafka://<bootstrap>/<topic>``: its records of the key stay until
        the broker removes them, as above.

        Raises:
            ValueError: ``column`` is not the key column.
            KafkaIOError: the topic's configuration could not be read, or a tombstone
                was not acknowledged within ``timeout_s``.
        """
        if column != self.key_column:
            raise ValueError(f"kafka sink {self.name}: records are erased by their key, column "
                             f"{self.key_column!r}, not {column!r}")
        staged = [k for k in staged_keys(store, job_prefix) if k.endswith(f"/{self.name}.parquet")]
        held = [k for k in staged if erase_from_parquet(store, k, column, values, f"kafka sink {self.name}")[1]]
        if self._compacted():
            producer = self._producer()
            for v in values:
                producer.produce(self.topic, key=v.encode() if isinstance(v, str) else bytes(v), value=None)
            if producer.flush(self.timeout_s):
                raise KafkaIOError(f"kafka sink {self.name}: tombstones for topic {self.topic} at "
                                   f"{self.bootstrap} unacknowledged after {self.timeout_s} s; erase again")
        return sorted(held) + [f"kafka://{self.bootstrap}/{self.topic}"]

    def _compacted(self) -> bool:
        """Whether the topic's ``cleanup.policy`` includes ``compact`` (DescribeConfigs).

        Raises:
            KafkaIOError: the request failed.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.config})
        try:
            (future,) = admin.describe_configs([ConfigResource("topic", self.topic)]).values()
            entry = future.result(self.timeout_s).get("cleanup.policy")
        except KafkaException as e:
            raise KafkaIOError(f"kafka sink {self.name}: configuration of topic {self.topic!r} from "
                               f"{self.bootstrap}: {e}") from e
        return entry is not None and "compact" in (entry.value or "")

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        prefix = f"{paths.sink_prefix(job_prefix, self.name)}/published/"
        later = []
        for k in store.list(prefix):
            e = int(k.rsplit("epoch=", 1)[1].split(".", 1)[0])
            if e > epoch:
                later.append(f"kafka://{self.bootstrap}/{self.topic}#epoch={e}")
        return later

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """Every record of the topic this job's sink wrote, duplicates dropped
        (``deduplicate``): ``partition``, ``offset``, ``key``, ``timestamp``, ``value``,
        ``epoch``, ``range``, ``seq``. Reads the whole topic: for tests and small topics."""
        source = KafkaSource(self.bootstrap, self.topic, value_format="bytes",
                             headers={EPOCH_HEADER: "epoch", RANGE_HEADER: "range", SEQ_HEADER: "seq"},
                             isolation_level="read_uncommitted", config=self.config)
        rows = []
        try:
            ends = source.end_offsets()
            for p in source.partitions():
                start = source.start_offset(p)
                if ends[p] > start:
                    t = source.read(p, start, ends[p])
                    n = int(p.rsplit("-", 1)[1])
                    rows += [{"partition": n, "offset": r[OFFSET_COLUMN], "key": r[KEY_COLUMN],
                              "timestamp": r[TIMESTAMP_COLUMN], "value": r[VALUE_COLUMN],
                              "epoch": int(r["epoch"]) if r["epoch"] is not None else None,
                              "range": r["range"].decode() if r["range"] is not None else None,
                              "seq": int(r["seq"]) if r["seq"] is not None else None}
                             for r in t.to_pylist()]
        finally:
            source.close()
        schema = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
                            ("timestamp", pa.int64()), ("value", pa.binary()), ("epoch", pa.int64()),
                            ("range", pa.string()), ("seq", pa.int64())])
        return pa.Table.from_pylist(list(deduplicate(rows)), schema=schema)


def deduplicate(records: Iterable[dict]) -> Iterator[dict]:
    """Drops the duplicates a re-produced epoch leaves in a ``KafkaSink`` topic.

    A record is a duplicate iff an earlier record of its topic partition has the same
    ``(range, epoch, seq)``. Epochs are produced one after the other (a re-produced
    epoch before the next epoch), so per partition and range only the newest epoch's
    ``seq`` values need remembering: a record of an older epoch is a duplicate. The rule
    holds whatever subset and order of an epoch's records a crashed attempt left.

    Args:
        records: dicts with ``partition``, ``epoch``, ``range`` and ``seq`` (the
            ``dkvstream-*`` headers, as ints and a str), in offset order within each
            partition. A record without the headers is kept.

    Yields:
        The records kept, in the order given.
    """
    newest: dict[tuple, tuple[int, set[int]]] = {}  # (partition, range) -> (epoch, seqs)
    for r in records:
        if r.get("epoch") is None or r.get("range") is None or r.get("seq") is None:
            yield r
            continue
        where = (r["partition"], r["range"])
        epoch, seqs = newest.get(where, (-1, set()))
        if r["epoch"] < epoch or (r["epoch"] == epoch and r["seq"] in seqs):
            continue
        if r["epoch"] > epoch:
            seqs = set()
            newest[where] = (r["epoch"], seqs)
        seqs.add(r["seq"])
        yield r
