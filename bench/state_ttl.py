"""State TTL keeps the state of a deduplication over ever-new keys flat.

Usage: ``.venv/bin/python bench/state_ttl.py [--epochs 40] [--epoch-events 20000]
[--ttl-epochs 5] [--plot PATH]``

The job: a vectorised deduplication (``FirstSeen``): each event whose key has no state
is emitted, and its key's state (the event's timestamp) is written. Every key is new
(``NewKeys``: key i is a 64-bit hash of i, so keys spread over the whole key space as
real ids do), one partition, one event per ms of event time, ``--epoch-events`` events
per epoch. It runs twice in process (``JobRunner(job, None)``), with the state declared
without a TTL and with ``StateTtl(ttl-epochs x epoch-events ms)`` (event time), on
small DKV sizes (1 MiB memtable, 4 MiB L1) so that compaction runs within a few epochs.

Printed per epoch for both runs: the state bytes, i.e. the bytes of every file (SSTables
and WAL objects) the checkpoint's DKV manifests name. Without a TTL they grow with the
keys seen; with one they stop growing once keys expire: compaction drops expired
entries (the manifests' compaction filter), no scan deletes them. The outputs of both
runs are checked against the oracle (every event is a first sighting) before anything
is printed. ``--plot PATH`` draws both series as a PNG.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plot import line_chart, load_average  # noqa: E402
from dkvstream.operators.api.batch import BatchContext, BatchOperator  # noqa: E402
from dkvstream.operators.api.codecs import IntCodec  # noqa: E402
from dkvstream.operators.api.job import Job  # noqa: E402
from dkvstream.operators.api.state import StateTtl, ValueSpec  # noqa: E402
from dkvstream.operators.io.sinks import ParquetSink  # noqa: E402
from dkvstream.operators.io.sources import Source  # noqa: E402
from dkvstream.operators.runtime.driver import JobRunner  # noqa: E402
from dkvstream.storage.dkv import DKVOptions  # noqa: E402
from dkvstream.storage.dkv.manifest import files_of, load_manifest  # noqa: E402

OPTIONS = DKVOptions(memtable_bytes=1 << 20, wal_flush_bytes=1 << 20, target_file_bytes=1 << 20,
                     level_base_bytes=4 << 20, l0_compaction_trigger=4)
SCHEMA = pa.schema([("key", pa.binary()), ("timestamp", pa.int64())])


class NewKeys(Source):
    """``events`` events on one partition, each with a key never seen before: key i is
    ``(i * golden ratio) mod 2**64`` as 8 big-endian bytes; event i is at ms i."""

    name = "new_keys"

    def __init__(self, events: int) -> None:
        self.events = events

    def partitions(self) -> list[str]:
        return ["p0"]

    def end_offsets(self) -> dict[str, int]:
        return {"p0": self.events}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([("n", pa.int64())])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        i = np.arange(start, end, dtype=np.uint64)
        keys = (i * np.uint64(0x9E3779B97F4A7C15)).astype(">u8")
        offsets = np.arange(0, 8 * (len(i) + 1), 8, dtype=np.int32)
        key = pa.Array.from_buffers(pa.binary(), len(i), [None, pa.py_buffer(offsets), pa.py_buffer(keys.tobytes())])
        return pa.table({"key": key, "timestamp": pa.array(i.astype(np.int64)), "n": pa.array(i.astype(np.int64))})


class FirstSeen(BatchOperator):
    """Emits each event whose key has no state, and stores the key's timestamp."""

    name = "first_seen"
    outputs = {"main": SCHEMA}
    seen = ValueSpec(IntCodec())

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        keys, kgs, stamps = events.column("key"), events.column("key_group"), events.column("timestamp")
        state = ctx.state(self.seen)
        new = pa.array([v is None for v in state.get(keys, kgs)])
        ctx.emit({"key": keys.filter(new), "timestamp": stamps.filter(new)},
                 keys=keys.filter(new).to_pylist(), timestamps=stamps.filter(new).to_pylist())
        state.set(keys, kgs, stamps.to_pylist())


def first_seen_with_ttl(ttl_ms: int) -> FirstSeen:
    """A ``FirstSeen`` whose state has an event-time TTL of ``ttl_ms`` (in process only:
    the class is made here, so Spark workers could not unpickle it)."""
    cls = type("FirstSeenTtl", (FirstSeen,), {"seen": ValueSpec(IntCodec(), ttl=StateTtl(ttl_ms))})
    return cls()


def state_bytes(runner: JobRunner, operator: str) -> int:
    """Bytes of the files the newest checkpoint's DKV manifests of ``operator`` name."""
    total = 0
    for manifest_key in runner.latest().operators[operator].values():
        total += sum(files_of(load_manifest(runner.store, manifest_key)).values())
    return total


def run(op: FirstSeen, events: int, epoch_events: int, root: str, options: DKVOptions = OPTIONS) -> list[int]:
    """State bytes after each epoch with events (the last, end-of-input epoch left out:
    its watermark of +infinity expires everything).

    Raises:
        SystemExit: the output is not the oracle's (every event emitted once).
    """
    job = Job(name=f"dedup_{type(op).__name__}", source=NewKeys(events), operators=[op],
              sinks={"main": ParquetSink("first_seen", SCHEMA)}, parallelism=1, events_per_epoch=epoch_events)
    out = []
    with JobRunner(job, None, root, dkv_options=options) as runner:
        for r in runner.epochs():
            if r.events and r.watermark < (1 << 62):
                out.append(state_bytes(runner, op.name))
        emitted = job.sinks["main"].read(runner.store, job.prefix)
    if emitted.num_rows != events:  # oracle: every key is new, so every event is emitted
        raise SystemExit(f"{type(op).__name__}: {emitted.num_rows} rows emitted, expected {events}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--epoch-events", type=int, default=20_000)
    parser.add_argument("--ttl-epochs", type=int, default=5)
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    events = args.epochs * args.epoch_events
    ttl_ms = args.ttl_epochs * args.epoch_events
    print(f"load average before: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        plain = run(FirstSeen(), events, args.epoch_events, f"{tmp}/plain")
        ttl = run(first_seen_with_ttl(ttl_ms), events, args.epoch_events, f"{tmp}/ttl")
    print(f"deduplication over {events:,} new keys, {args.epoch_events:,} per epoch, TTL {ttl_ms:,} ms "
          f"({args.ttl_epochs} epochs of event time)")
    print(f"{'epoch':>5} {'no TTL, KiB':>12} {'TTL, KiB':>10}")
    for i, (a, b) in enumerate(zip(plain, ttl), 1):
        print(f"{i:>5} {a / 1024:>12,.0f} {b / 1024:>10,.0f}")
    print(f"load average after: {load_average()}")
    if args.plot:
        epochs = list(range(1, len(plain) + 1))
        line_chart(args.plot, "Deduplication over ever-new keys: state bytes per epoch",
                   epochs, {"no TTL": [b / 2**20 for b in plain],
                            f"TTL {args.ttl_epochs} epochs": [b / 2**20 for b in ttl]},
                   xlabel="epoch", ylabel="state, MiB (files the checkpoint's DKV manifests name)",
                   caption=f"in process, {args.epoch_events:,} new keys per epoch; load {load_average()}")
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
