"""Keyed counting throughput: events per CPU second, against a pyarrow group-by.

Usage: ``.venv/bin/python bench/keyed_count.py [--events 10000000] [--keys 1000000]
[--epoch 1000000] [--event-form-events 1000000] [--skip-capped] [--skip-zipf] [--plot PATH]``

The job (``examples/keyed_count.py``): per key and one-hour event-time window,
count events and sum an amount; a timer at the window's end emits the row and drops the
state. Input: ``SyntheticSource`` over two partitions (``--events`` in total), keys
uniform or Zipf 1.1 over ``--keys`` keys, one event per ms per partition.

Runs, each in its own process (so peak RSS is its own) and in-process (``JobRunner(job,
spark=None)``: one core, no Spark), and prints a table:

1. vectorised form (``KeyedWindowCountBatch``), uniform keys, state in memory: a
   ``--memtable-mib`` memtable (1 GiB) holds it, each epoch's checkpoint writes its
   WAL object (the changelog), and the memtable is flushed to SSTables once the WAL
   objects a checkpoint lists pass ``--wal-flush-mib`` (256 MiB);
2. vectorised form, Zipf 1.1 keys;
3. vectorised form, uniform keys, DKV memtable + block cache + table cache capped at 64
   MiB in total, so state lives mostly in SSTables (the slowdown is reported against 1);
4. ``on_event`` form (``KeyedWindowCount``) on the first ``--event-form-events`` events;
5. the named baseline, ``pyarrow group-by``: the same answer (count and sum per key and
   window) computed by one single-threaded pyarrow ``group_by`` over the same Parquet
   files, in its own process.

Input: the synthetic events are generated and written to one Parquet file per source
partition before any clock starts; every run reads them inside its clock (the job's
source reads a partition's file at its first read, then hands out slices). Every run's
output is checked against the pandas oracle before its time counts. Events/s per core =
events / wall seconds of the run (the runner uses one core); on a shared machine the wall
clock includes time spent waiting for a core, so events per CPU second of the run's
process (``time.process_time``, all its threads) is printed as well, and is the figure
the targets use. Each clock runs from ``JobRunner`` construction (nothing read yet) to
the return of ``JobRunner.close()`` after the last epoch's commit. The load average
before and after the runs is printed; ``--plot PATH`` writes events per CPU second per
run as a PNG.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plot import load_average  # noqa: E402

CAP_BYTES = 64 << 20
VECTORISED_TARGET = 1_000_000  # events per CPU second, the vectorised form, uniform keys
ON_EVENT_TARGET = 150_000  # events per CPU second, the on_event form


class _ParquetInput:
    """The job's ``SyntheticSource`` reading its partitions from Parquet files: a
    partition's file is read (``pq.read_table``) at its first ``full_partition`` call,
    which the source's first ``read`` of it makes, inside the run's clock."""

    def __init__(self, source, directory: str) -> None:
        import pyarrow.parquet as pq

        self.paths = {}
        for p in source.partitions():
            self.paths[p] = os.path.join(directory, f"{p}.parquet")
            pq.write_table(source.full_partition(p), self.paths[p])
        source._cache.clear()
        source.full_partition = self.full_partition  # an instance attribute: the job's own source
        self._source = source

    def full_partition(self, partition: str):
        import pyarrow.parquet as pq

        cache = self._source._cache
        if partition not in cache:
            cache[partition] = pq.read_table(self.paths[partition])
        return cache[partition]


def _run(kind: str, events: int, keys: int, epoch: int, zipf: float | None, batch: bool, capped: bool,
         memtable_mib: int, wal_flush_mib: int, conn) -> None:
    import pandas as pd

    from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.storage.dkv import DKVOptions

    if capped:
        # 64 MiB in all: 24 MiB memtable, 24 MiB decoded-block cache, 16 MiB of tables
        # kept whole in memory.
        options = DKVOptions(memtable_bytes=24 << 20, block_cache_bytes=24 << 20, table_cache_bytes=16 << 20)
    else:
        options = DKVOptions(memtable_bytes=memtable_mib << 20, wal_flush_bytes=wal_flush_mib << 20)
    job = keyed_count_job(events // 2, keys, batch=batch, zipf=zipf, events_per_epoch=epoch, parallelism=1,
                          name="bench")
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as input_dir:
        _ParquetInput(job.source, input_dir)  # generated and written before the clock
        started = time.perf_counter()
        cpu_started = time.process_time()
        runner = JobRunner(job, None, root, dkv_options=options)
        done = 0
        epochs = 0
        for res in runner.epochs():
            epochs += 1
            done += res.events
            el = time.perf_counter() - started
            print(f"[{kind}] epoch {epochs}: {done:,}/{events:,} events, {el:.1f} s, {done / el:,.0f} ev/s",
                  file=sys.stderr, flush=True)
        runner.close()
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
        tables = sum(1 for k in runner.store.list(job.prefix + "/state/") if k.endswith(".sst"))
        exp = keyed_count_oracle(job.source)
    cols = ["key", "window_start"]
    pd.testing.assert_frame_equal(got.sort_values(cols).reset_index(drop=True)[exp.columns],
                                  exp.sort_values(cols).reset_index(drop=True), check_dtype=False)
    conn.send({"kind": kind, "events": events, "seconds": seconds, "cpu_seconds": cpu_seconds, "epochs": epochs,
               "rows": len(got),
               "tables": tables, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10})


def _arrow_group_by(kind: str, events: int, keys: int, epoch: int, zipf: float | None, conn, **_) -> None:
    """The named baseline: the job's answer by one single-threaded pyarrow group-by over
    the same Parquet input, read inside the clock."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dkvstream.examples.keyed_count import WINDOW_MS, keyed_count_job, keyed_count_oracle

    job = keyed_count_job(events // 2, keys, zipf=zipf, events_per_epoch=epoch, parallelism=1, name="bench")
    with tempfile.TemporaryDirectory() as input_dir:
        files = _ParquetInput(job.source, input_dir)
        started = time.perf_counter()
        cpu_started = time.process_time()
        t = pa.concat_tables([pq.read_table(path) for path in files.paths.values()])
        ts = t.column("timestamp")
        start = pc.subtract(ts, pc.call_function("modulo", [ts, pa.scalar(WINDOW_MS)]))
        got = pa.table({"key": t.column("key"), "window_start": start, "amount": t.column("amount")}) \
            .group_by(["key", "window_start"], use_threads=False) \
            .aggregate([("amount", "count"), ("amount", "sum")])
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        exp = keyed_count_oracle(job.source)
    got = got.rename_columns(["key", "window_start", "count", "amount"]).to_pandas()
    got["key"] = got["key"].map(bytes.decode)
    cols = ["key", "window_start"]
    pd.testing.assert_frame_equal(got.sort_values(cols).reset_index(drop=True)[exp.columns],
                                  exp.sort_values(cols).reset_index(drop=True), check_dtype=False)
    conn.send({"kind": kind, "events": events, "seconds": seconds, "cpu_seconds": cpu_seconds, "epochs": 1,
               "rows": len(got), "tables": 0,
               "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10})


def run(kind: str, target=_run, **kw) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(kind,), kwargs={**kw, "conn": child})
    p.start()
    out = parent.recv() if parent.poll(None) else None
    p.join()
    if p.exitcode != 0 or out is None:
        raise SystemExit(f"{kind}: child failed with exit code {p.exitcode}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--epoch", type=int, default=1_000_000, help="events per epoch")
    ap.add_argument("--event-form-events", type=int, default=1_000_000)
    ap.add_argument("--skip-capped", action="store_true")
    ap.add_argument("--skip-zipf", action="store_true")
    ap.add_argument("--plot", metavar="PATH", help="write events per CPU second per run as a PNG")
    ap.add_argument("--memtable-mib", type=int, default=1024,
                    help="uncapped runs: DKV memtable budget (MiB), sized so the state fits")
    ap.add_argument("--wal-flush-mib", type=int, default=256,
                    help="uncapped runs: WAL objects a checkpoint may list before it flushes (MiB)")
    a = ap.parse_args()
    load_before = load_average()
    common = {"keys": a.keys, "epoch": a.epoch, "memtable_mib": a.memtable_mib, "wal_flush_mib": a.wal_flush_mib}
    results = [run("vectorised, uniform", events=a.events, zipf=None, batch=True, capped=False, **common)]
    if not a.skip_zipf:
        results.append(run("vectorised, Zipf 1.1", events=a.events, zipf=1.1, batch=True, capped=False, **common))
    if not a.skip_capped:
        results.append(run("vectorised, uniform, 64 MiB cap", events=a.events, zipf=None, batch=True,
                           capped=True, **common))
    results.append(run("on_event, uniform", events=min(a.events, a.event_form_events), zipf=None, batch=False,
                       capped=False, **common))
    results.append(run("pyarrow group-by (baseline)", target=_arrow_group_by, events=a.events, zipf=None,
                       **common))
    base = results[0]["events"] / results[0]["seconds"]
    arrow = results[-1]["events"] / results[-1]["cpu_seconds"]
    print(f"\n{a.events:,} events, {a.keys:,} keys, {a.epoch:,} events per epoch, in-process (1 core); "
          f"uncapped: {a.memtable_mib} MiB memtable, WAL flushed at {a.wal_flush_mib} MiB; "
          "outputs checked against pandas")
    load = f"{load_before} before, {load_average()} after"
    print(f"wall clock: time.perf_counter, CPU: time.process_time of the run's process; "
          f"load average (1 / 5 / 15 min) {load}; {os.cpu_count()} cores, shared; "
          f"targets: vectorised >= {VECTORISED_TARGET:,}, on_event >= {ON_EVENT_TARGET:,} events per CPU s")
    print(f"{'run':34s} {'events':>11s} {'seconds':>8s} {'events/s/core':>14s} {'vs vectorised':>14s} "
          f"{'CPU s':>7s} {'events/CPU s':>13s} {'vs pyarrow':>10s} {'epochs':>6s} {'SSTables':>8s} {'peak RSS':>9s}")
    for r in results:
        eps = r["events"] / r["seconds"]
        print(f"{r['kind']:34s} {r['events']:>11,} {r['seconds']:>8.1f} {eps:>14,.0f} {eps / base:>13.2f}x "
              f"{r['cpu_seconds']:>7.1f} {r['events'] / r['cpu_seconds']:>13,.0f} "
              f"{r['events'] / r['cpu_seconds'] / arrow:>9.2f}x "
              f"{r['epochs']:>6} {r['tables']:>8} {r['peak_rss'] / 2**20:>8.0f}M")
    if a.plot:
        from bench.plot import bar_panels

        bar_panels(a.plot, f"Keyed count, {a.keys:,} keys, in process (1 core)", [
            {"title": "events per CPU second", "labels": [r["kind"] for r in results],
             "ref": VECTORISED_TARGET, "xlabel": "events / CPU s",
             "values": [r["events"] / r["cpu_seconds"] for r in results]},
            {"title": "events per wall second", "labels": [r["kind"] for r in results],
             "values": [r["events"] / r["seconds"] for r in results], "xlabel": "events / s"}],
            caption=f"Dashed line: the vectorised form's target, {VECTORISED_TARGET:,} events per CPU s. "
                    f"Load average {load}; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {a.plot}")


if __name__ == "__main__":
    main()
