"""A live (unbounded) source: the epoch that catches up commits, and the watermark is
the minimum over every partition's max event time minus the bound, a caught-up
partition included (it may still receive older events), as in Flink without idleness.
In process, against a topic of the log."""

from __future__ import annotations

import json

import pyarrow as pa

from dkvstream.examples.keyed_count import KeyedWindowCount
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.topics import TopicSource
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.log import Log, TopicConfig
from dkvstream.storage.objectstore import open_object_store

BOUND_MS = 500
SCHEMA = pa.schema([("amount", pa.int64())])


def _append(root: str, partition_records: dict[int, list[tuple[str, int]]]) -> None:
    """Appends ``(key, timestamp ms)`` records to partitions of topic ``in`` (amount 1)."""
    log = Log(open_object_store(root))
    prod = log.producer()
    for p, records in partition_records.items():
        for key, ts in records:
            prod.send(
                "in", key.encode(), json.dumps({"amount": 1}).encode(), timestamp=ts, partition=p
            )
    prod.flush()


def _job(root: str) -> Job:
    op = KeyedWindowCount()
    return Job(
        name="live",
        source=TopicSource(root, "in", value_schema=SCHEMA, bounded=False),
        operators=[op],
        sinks={name: ParquetSink(name, schema) for name, schema in op.outputs.items()},
        key_groups=8,
        parallelism=1,
        events_per_epoch=100,
        max_out_of_orderness_ms=BOUND_MS,
    )


def _topic(root: str, partitions: int) -> None:
    Log(open_object_store(root)).create_topic("in", TopicConfig(partitions=partitions))


def test_catching_up_epoch_of_a_live_source_commits(tmp_path) -> None:
    """1 partition, 10 records, 100 events per epoch: the first epoch reads them all and
    catches up; it commits with watermark max ts - bound, and the next run continues."""
    root = str(tmp_path)
    _topic(root, 1)
    _append(root, {0: [(f"k{i % 3}", 1_000 * i) for i in range(10)]})
    results = JobRunner(_job(root), None, root).run()
    assert [(r.epoch, r.events, r.watermark, r.finished) for r in results] == [
        (1, 10, 9_000 - BOUND_MS - 1, False)
    ]
    # Caught up: a rerun has nothing to do and fails nothing.
    assert JobRunner(_job(root), None, root).run() == []
    _append(root, {0: [("k0", 12_000)]})
    [again] = JobRunner(_job(root), None, root).run()
    assert (again.epoch, again.events, again.watermark) == (2, 1, 12_000 - BOUND_MS - 1)


def test_caught_up_partition_still_holds_the_watermark(tmp_path) -> None:
    """Partition 0 is caught up at max ts 3 s while partition 1 reads on to 20 s: the
    watermark stays at 3 s - bound (partition 0 may still receive events after 3 s)."""
    root = str(tmp_path)
    _topic(root, 2)
    _append(
        root,
        {
            0: [("a", 1_000 * i) for i in range(4)],  # 4 records, max 3 s
            1: [("b", 100 * i) for i in range(201)],
        },
    )  # 201 records, max 20 s
    results = JobRunner(_job(root), None, root).run()
    # Epoch 1: 50 per partition (0 reads its 4); epoch 2: 100 of partition 1; epoch 3: the rest.
    assert [(r.events, r.watermark) for r in results] == [
        (54, 3_000 - BOUND_MS - 1),
        (100, 3_000 - BOUND_MS - 1),
        (51, 3_000 - BOUND_MS - 1),
    ]
    _append(root, {0: [("a", 30_000)]})
    [again] = JobRunner(_job(root), None, root).run()
    assert again.watermark == 20_000 - BOUND_MS - 1  # now partition 1's max is the lower one
