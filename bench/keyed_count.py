"""Keyed counting throughput: events/s per core, state in memory and state capped.

Usage: ``.venv/bin/python bench/keyed_count.py [--events 10000000] [--keys 1000000]
[--epoch 1000000] [--event-form-events 1000000] [--skip-capped] [--plot PATH]``

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
4. ``on_event`` form (``KeyedWindowCount``) on the first ``--event-form-events`` events,
   the baseline the vectorised form is measured against.

Every run's output is checked against the pandas oracle before its time counts. Events/s
per core = events / wall seconds of the run (the runner uses one core); on a shared
machine the wall clock includes time spent waiting for a core, so events per CPU second
of the run's process (``time.process_time``, all its threads) is printed as well. Each
clock runs from the first epoch's start (``JobRunner`` constructed; the synthetic input
is generated before) to the last epoch's commit. The load average before and after the
runs is printed; ``--plot PATH`` writes events per CPU second per run as a PNG.
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
    for p in job.source.partitions():
        job.source.full_partition(p)  # generate input before the clock starts
    with tempfile.TemporaryDirectory() as root:
        runner = JobRunner(job, None, root, dkv_options=options)
        started = time.perf_counter()
        cpu_started = time.process_time()
        done = 0
        epochs = 0
        for res in runner.epochs():
            epochs += 1
            done += res.events
            el = time.perf_counter() - started
            print(f"[{kind}] epoch {epochs}: {done:,}/{events:,} events, {el:.1f} s, {done / el:,.0f} ev/s",
                  file=sys.stderr, flush=True)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        runner.close()
        got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
        tables = sum(1 for k in runner.store.list(job.prefix + "/state/") if k.endswith(".sst"))
    exp = keyed_count_oracle(job.source)
    cols = ["key", "window_start"]
    pd.testing.assert_frame_equal(got.sort_values(cols).reset_index(drop=True)[exp.columns],
                                  exp.sort_values(cols).reset_index(drop=True), check_dtype=False)
    conn.send({"kind": kind, "events": events, "seconds": seconds, "cpu_seconds": cpu_seconds, "epochs": epochs,
               "rows": len(got),
               "tables": tables, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10})


def run(kind: str, **kw) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_run, args=(kind,), kwargs={**kw, "conn": child})
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
    ap.add_argument("--plot", metavar="PATH", help="write events per CPU second per run as a PNG")
    ap.add_argument("--memtable-mib", type=int, default=1024,
                    help="uncapped runs: DKV memtable budget (MiB), sized so the state fits")
    ap.add_argument("--wal-flush-mib", type=int, default=256,
                    help="uncapped runs: WAL objects a checkpoint may list before it flushes (MiB)")
    a = ap.parse_args()
    load_before = load_average()
    common = {"keys": a.keys, "epoch": a.epoch, "memtable_mib": a.memtable_mib, "wal_flush_mib": a.wal_flush_mib}
    results = [
        run("vectorised, uniform", events=a.events, zipf=None, batch=True, capped=False, **common),
        run("vectorised, Zipf 1.1", events=a.events, zipf=1.1, batch=True, capped=False, **common),
    ]
    if not a.skip_capped:
        results.append(run("vectorised, uniform, 64 MiB cap", events=a.events, zipf=None, batch=True,
                           capped=True, **common))
    results.append(run("on_event, uniform", events=min(a.events, a.event_form_events), zipf=None, batch=False,
                       capped=False, **common))
    base = results[0]["events"] / results[0]["seconds"]
    print(f"\n{a.events:,} events, {a.keys:,} keys, {a.epoch:,} events per epoch, in-process (1 core); "
          f"uncapped: {a.memtable_mib} MiB memtable, WAL flushed at {a.wal_flush_mib} MiB; "
          "outputs checked against pandas")
    load = f"{load_before} before, {load_average()} after"
    print(f"wall clock: time.perf_counter, CPU: time.process_time of the run's process; "
          f"load average (1 / 5 / 15 min) {load}; {os.cpu_count()} cores, shared; "
          "target >= 100,000 events per CPU s")
    print(f"{'run':34s} {'events':>11s} {'seconds':>8s} {'events/s/core':>14s} {'vs vectorised':>14s} "
          f"{'CPU s':>7s} {'events/CPU s':>13s} {'epochs':>6s} {'SSTables':>8s} {'peak RSS':>9s}")
    for r in results:
        eps = r["events"] / r["seconds"]
        print(f"{r['kind']:34s} {r['events']:>11,} {r['seconds']:>8.1f} {eps:>14,.0f} {eps / base:>13.2f}x "
              f"{r['cpu_seconds']:>7.1f} {r['events'] / r['cpu_seconds']:>13,.0f} "
              f"{r['epochs']:>6} {r['tables']:>8} {r['peak_rss'] / 2**20:>8.0f}M")
    if a.plot:
        from bench.plot import bar_panels

        bar_panels(a.plot, f"Keyed count, {a.keys:,} keys, in process (1 core)", [
            {"title": "events per CPU second", "labels": [r["kind"] for r in results],
             "ref": 100_000, "xlabel": "events / CPU s",
             "values": [r["events"] / r["cpu_seconds"] for r in results]},
            {"title": "events per wall second", "labels": [r["kind"] for r in results],
             "values": [r["events"] / r["seconds"] for r in results], "xlabel": "events / s"}],
            caption=f"Dashed line: the 100,000 events per CPU s target. Load average {load}; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {a.plot}")

if __name__ == "__main__":
    main()
