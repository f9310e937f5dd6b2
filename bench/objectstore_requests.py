"""Object-store requests per epoch and per compaction as the state grows.

Usage: ``.venv/bin/python bench/objectstore_requests.py [--keys 10000 100000 1000000]
[--epochs 4] [--events-per-epoch 20000] [--local] [--quick] [--plot PATH]``

For each state size K, one job (one operator keeping a running total per key in a
``ValueSpec``, 2 key-group ranges, run in-process) is driven against the object store:

1. load: one epoch of K events touching every key once, so the state holds K keys;
2. steady state: ``--epochs`` epochs of ``--events-per-epoch`` events on random keys;
   after each, ``dkvstream.operators.runtime.remote_compaction.compact_job`` (what the Dagster
   maintenance op runs) compacts what the epoch flushed. Tasks never compact inline
   (``max_inline_compaction_bytes=0``), so every compaction is measured on its own.

Per epoch: the checkpoint's ``requests`` metric (driver + tasks, by kind, and bytes).
Per compaction: the requests of ``compact_job`` divided by the compactions it published.
Medians over the steady epochs. The last columns are ratios against the smallest K of the
same run.

Requests are per object, never per key: a task GETs each table its reads touch (whole
tables are cached, ``table_cache_bytes``) and PUTs a WAL object or table and a manifest;
a compaction GETs its inputs and PUTs its outputs, a fan-in bounded by the level
multiplier. So counts follow the number of tables, i.e. state bytes / ``target_file_bytes``.
The run is repeated for DKV's default table size (8 MiB: a million keys are a few
tables, counts stay flat) and for tiny 256 KiB tables (counts follow the table count,
still orders of magnitude below the key count).

By default a SeaweedFS S3 server is started on loopback (``dkvstream.storage.objectstore.seaweedfs``)
and the job runs on ``s3://``; ``--local`` uses a temporary directory instead (the
counts are the same: tests/storage/dkv/test_dkv_s3.py checks that).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dkvstream.operators.api.codecs import IntCodec  # noqa: E402
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN  # noqa: E402
from dkvstream.operators.api.job import Job  # noqa: E402
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject  # noqa: E402
from dkvstream.operators.api.state import ValueSpec  # noqa: E402
from dkvstream.operators.io.sinks import ParquetSink  # noqa: E402
from dkvstream.operators.io.sources import Source  # noqa: E402
from dkvstream.operators.runtime.checkpoints import latest_checkpoint  # noqa: E402
from dkvstream.operators.runtime.driver import JobRunner  # noqa: E402
from dkvstream.operators.runtime.remote_compaction import compact_job  # noqa: E402
from dkvstream.storage.dkv import DKVOptions  # noqa: E402
from dkvstream.storage.objectstore import REQUEST_KINDS, open_object_store, subtract_requests, sum_requests  # noqa: E402

PARTITIONS = ("p0", "p1")
# Small tables and levels so that flushes and compactions happen at bench sizes; no
# inline compaction, so compact_job does all of it.


def dkv_options(table_bytes: int) -> DKVOptions:
    """DKV's defaults, except: every checkpoint flushes (the WAL limit is below an
    epoch's writes), two L0 tables trigger a compaction, no inline compaction (so
    compact_job does all of it), and tables (and L1) sized from ``table_bytes``."""
    return DKVOptions(wal_flush_bytes=16 << 10, l0_compaction_trigger=2, max_inline_compaction_bytes=0,
                      target_file_bytes=table_bytes, level_base_bytes=max(4 * table_bytes, 1 << 20))


class KeyLoadSource(Source):
    """Partition p, offset i: key ``k<2i+p>`` while ``2i+p < keys`` (the load touches
    every key once), then a uniformly random key in ``[0, keys)`` (seeded); event time
    = offset seconds; value ``amount = 1``."""

    name = "keyload"

    def __init__(self, keys: int, steady_events: int, seed: int = 11) -> None:
        self.keys, self.seed = keys, seed
        self.load = -(-keys // len(PARTITIONS))
        self.total = self.load + steady_events

    def partitions(self) -> list[str]:
        return list(PARTITIONS)

    def end_offsets(self) -> dict[str, int]:
        return {p: self.total for p in PARTITIONS}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field("amount", pa.int64())])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        p = PARTITIONS.index(partition)
        offsets = np.arange(start, end, dtype=np.int64)
        ids = np.minimum(offsets * len(PARTITIONS) + p, self.keys - 1)
        random = np.random.default_rng([self.seed, p, start]).integers(0, self.keys, end - start)
        ids = np.where(offsets < self.load, ids, random)
        keys = pa.array([b"k%d" % n for n in ids], pa.binary())
        return pa.table({KEY_COLUMN: keys, TIMESTAMP_COLUMN: offsets * 1000,
                         "amount": np.ones(end - start, dtype=np.int64)})


class KeyTotals(Operator):
    """A running event count per key: state grows to one entry per key, nothing emitted."""

    name = "key_totals"
    outputs = {"main": pa.schema([pa.field("key", pa.string()), pa.field("total", pa.int64())])}
    total = ValueSpec(IntCodec())

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        state = self.total.state_for(subject)
        state.set((state.get() or 0) + 1)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        pass


def _job(keys: int, events_per_epoch: int, steady_events: int) -> Job:
    return Job(name=f"keys{keys}", source=KeyLoadSource(keys, steady_events), operators=[KeyTotals()],
               sinks={"main": ParquetSink("totals")}, parallelism=2, events_per_epoch=events_per_epoch,
               max_out_of_orderness_ms=0)


def measure(root_uri: str, keys: int, epochs: int, events_per_epoch: int, table_bytes: int) -> dict:
    """Runs the load and steady epochs for ``keys``; returns medians per epoch/compaction."""
    OPTIONS = dkv_options(table_bytes)  # noqa: N806
    root_uri = f"{root_uri}/tables-{table_bytes}"
    steady = epochs * events_per_epoch
    job = _job(keys, keys, steady)
    load = JobRunner(job, None, root_uri, dkv_options=OPTIONS, retain_checkpoints=3)
    load.run(max_epochs=1)  # the load epoch: K keys in state
    compactor_store = open_object_store(root_uri)
    while compact_job(compactor_store, job.prefix, OPTIONS):  # settle the load's L0
        JobRunner(_job(keys, 1, steady), None, root_uri, dkv_options=OPTIONS,
                  retain_checkpoints=3).run(max_epochs=1)  # install the results

    job = _job(keys, events_per_epoch, steady)
    runner = JobRunner(job, None, root_uri, dkv_options=OPTIONS, retain_checkpoints=3)
    per_epoch, per_compaction = [], []
    compactions = 0
    started = time.perf_counter()
    epochs_iter = runner.epochs(max_epochs=epochs)
    for _ in epochs_iter:
        requests = latest_checkpoint(runner.store, job.prefix).metrics["requests"]
        per_epoch.append(sum_requests([requests["driver"], requests["tasks"]]))
        before = compactor_store.stats.snapshot()
        results = compact_job(compactor_store, job.prefix, OPTIONS)
        if results:
            delta = subtract_requests(compactor_store.stats.snapshot(), before)
            per_compaction.append({k: v / len(results) for k, v in delta.items()})
            compactions += len(results)
    ckpt = latest_checkpoint(runner.store, job.prefix)
    return {
        "keys": keys, "state_keys": ckpt.metrics["keys"], "tables": ckpt.metrics["tables"],
        "epoch": _median(per_epoch), "compaction": _median(per_compaction), "compactions": compactions,
        "seconds": time.perf_counter() - started,
    }


def _median(rows: list[dict]) -> dict:
    fields = (*REQUEST_KINDS, "bytes_read", "bytes_written")
    return {k: statistics.median(r[k] for r in rows) if rows else 0 for k in fields}


def _table(results: list[dict]) -> str:
    from tabulate import tabulate

    base = results[0]
    rows = []
    for r in results:
        e, c = r["epoch"], r["compaction"]
        epoch_requests = sum(e[k] for k in REQUEST_KINDS)
        comp_requests = sum(c[k] for k in REQUEST_KINDS)
        base_epoch = sum(base["epoch"][k] for k in REQUEST_KINDS)
        base_comp = sum(base["compaction"][k] for k in REQUEST_KINDS)
        rows.append([
            f"{r['keys']:,}", f"{r['state_keys']:,}", r["tables"],
            f"{e['GET']:.0f}/{e['PUT']:.0f}/{e['LIST']:.0f}/{e['DELETE']:.0f}/{e['HEAD']:.0f}",
            f"{e['bytes_read'] / 2**20:.2f}/{e['bytes_written'] / 2**20:.2f}",
            f"{c['GET']:.0f}/{c['PUT']:.0f}/{c['LIST']:.0f}/{c['DELETE']:.0f}/{c['HEAD']:.0f}",
            f"{c['bytes_read'] / 2**20:.2f}/{c['bytes_written'] / 2**20:.2f}", r["compactions"],
            f"{epoch_requests / base_epoch:.2f}" if base_epoch else "-",
            f"{comp_requests / base_comp:.2f}" if base_comp else "-",
        ])
    headers = ["keys", "entries in tables", "tables", "epoch G/P/L/D/H", "epoch MiB r/w",
               "compaction G/P/L/D/H", "compaction MiB r/w", "compactions",
               "epoch requests / base", "compaction requests / base"]
    return tabulate(rows, headers=headers, tablefmt="github")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--events-per-epoch", type=int, default=20_000)
    parser.add_argument("--table-bytes", type=int, nargs="+", default=[8 << 20, 256 << 10],
                        help="DKV target_file_bytes settings to compare (default: DKV's 8 MiB and 256 KiB)")
    parser.add_argument("--local", action="store_true", help="a temporary directory instead of S3")
    parser.add_argument("--quick", action="store_true", help="keys 5,000 50,000 200,000; 3 epochs")
    parser.add_argument("--plot", metavar="PATH",
                        help="write requests per epoch and per compaction as a PNG")
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.epochs = [5_000, 50_000, 200_000], 3
    with tempfile.TemporaryDirectory(prefix="objectstore-requests-") as tmp:
        server = None
        if args.local:
            root = str(Path(tmp) / "store")
        else:
            import os

            from dkvstream.storage.objectstore.seaweedfs import SeaweedFSServer

            server = SeaweedFSServer(Path(tmp) / "seaweedfs", stop_timeout_s=3.0).start()
            os.environ.update(server.env())
            root = f"s3://{server.bucket}/bench"
        try:
            print(f"store: {root}; {args.epochs} steady epochs of {args.events_per_epoch:,} events, "
                  f"2 ranges", file=sys.stderr)
            results = {}
            for table_bytes in args.table_bytes:
                results[table_bytes] = []
                for keys in sorted(args.keys):
                    results[table_bytes].append(
                        measure(root, keys, args.epochs, args.events_per_epoch, table_bytes))
                    print(f"  tables of {table_bytes:,} B, {keys:,} keys: "
                          f"{results[table_bytes][-1]['seconds']:.1f} s", file=sys.stderr)
        finally:
            if server is not None:
                server.stop()
    for table_bytes, rows in results.items():
        print(f"\nDKV tables of {table_bytes / 2**20:g} MiB ({dkv_options(table_bytes)}).\n"
              f"Object-store requests per epoch ({args.events_per_epoch:,} events, driver + 2 tasks) and "
              f"per compaction (compact_job), medians of {args.epochs} steady epochs; ratios against "
              f"{min(args.keys):,} keys:")
        print(_table(rows))
    if args.plot:
        from bench.plot import bar_panels

        panels = []
        for table_bytes, rows in results.items():
            labels = [f"{r['keys']:,} keys" for r in rows]
            for what in ("epoch", "compaction"):
                panels.append({"title": f"tables of {table_bytes / 2**20:g} MiB: per {what}",
                               "labels": labels, "xlabel": "object-store requests (all kinds)",
                               "values": [sum(r[what][k] for k in REQUEST_KINDS) for r in rows]})
        bar_panels(args.plot, "Object-store requests as the state grows", panels, columns=2,
                   caption=f"Counts, not times; medians of {args.epochs} steady epochs; "
                           f"{args.events_per_epoch:,} events per epoch, 2 ranges.")
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
