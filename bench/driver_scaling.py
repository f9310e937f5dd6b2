"""The driver's own object-store requests, bytes and time per epoch as the ranges grow.

Usage: ``.venv/bin/python bench/driver_scaling.py [--ranges 2 64 1000] [--epochs 7]
[--retain 3] [--latency-ms 10] [--full-sweep-every N] [--quick]``

For each number of key-group ranges P, the keyed counting job
(``dkvstream.examples.keyed_count``: one keyed operator, hourly tumbling windows) runs in process
(``JobRunner(job, None, store)``) with P ranges over max(256, P) key groups (1,024 at
P = 1,000), 20 keys and 20 events per range and epoch, each epoch closing an hourly
window, so every range stages an output file every epoch and the driver publishes P
files per epoch. Retention keeps ``--retain`` checkpoints (3 by default, so that it is
active from epoch 4 on in a short run; the job default of 10 costs the incremental
retention the same per epoch) and the periodic full sweep is off unless
``--full-sweep-every`` asks for it (then it shows what the full sweep costs).

The store is a local directory (in memory, under ``/dev/shm``, by default: a disk's
metadata work under other processes' fsyncs, an unlink taking 0.5 ms, is not what S3
charges the driver, whose deletes run on the server) wrapped so that every request the
driver makes waits ``--latency-ms`` first (10 ms: an in-region S3 small-object request), the tasks' requests
do not (in process they run one after another in the driver's thread; with the latency
they would dominate the run). Requests issued from a thread pool overlap their waits, so
the driver's time shows whether its requests are issued in parallel.

Per epoch, the driver's requests are the store's counts over the epoch minus those made
by the executors' side (``LocalExchange.read`` and ``run_operator``: in process, reading
the source splits and running each operator's tasks one after another, what Spark's
executors do on a cluster; the same
subtraction as the in-process runner's ``requests`` metric, ``driver._epoch_requests``,
but aligned to the epoch: the epoch's own commit, publish and retention). Driver seconds
are the epoch's wall time (``time.perf_counter``, a monotonic wall clock) minus the time
spent on the executors' side: planning, the commit, the publish, retention and the lease, with the local
directory's own costs (a hard link per published file, an unlink per deleted one) on top of the simulated
latency. Steady epochs are those in which a checkpoint expires; the table gives their medians, and the
target of at most 3P + 50 requests and under 1 s per epoch.

``--quick`` runs P = 2 and 16 for 5 epochs with retain 2 and no latency (seconds; the
counts are the same as with latency): tests/bench/test_driver_scaling.py runs it and
checks the request bound.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dkvstream.examples.keyed_count import WINDOW_MS, keyed_count_job
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.job import Job
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.exchange import LocalExchange
from dkvstream.storage.objectstore import REQUEST_KINDS, ForwardingObjectStore, subtract_requests
from dkvstream.storage.objectstore.local import LocalObjectStore

PARTITIONS = 2
KEYS_PER_RANGE = 20
EVENTS_PER_RANGE = 20
FIELDS = (*REQUEST_KINDS, "bytes_read", "bytes_written")


class LatencyStore(ForwardingObjectStore):
    """A ``LocalObjectStore`` whose requests wait ``latency_s`` first, except on the
    executors' side (``in_task``): a stand-in for S3's per-request latency on the
    driver's side. Counts are the inner store's (one per request, ``delete_many`` per
    1,000 keys)."""

    def __init__(self, root: str, latency_s: float) -> None:
        super().__init__(LocalObjectStore(root))
        self.latency_s = latency_s
        self.in_task = threading.local()

    def _wait(self, requests: int = 1) -> None:
        if self.latency_s and not getattr(self.in_task, "on", False):
            time.sleep(self.latency_s * requests)

    def put(self, key: str, data: bytes) -> None:
        self._wait()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._wait()
        self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        self._wait()
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._wait()
        return self.inner.get_range(key, start, length)

    def get_range_immutable(self, key: str, start: int, length: int) -> bytes:
        self._wait()
        return self.inner.get_range_immutable(key, start, length)

    def size(self, key: str) -> int:
        self._wait()
        return self.inner.size(key)

    def exists(self, key: str) -> bool:
        self._wait()
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        self._wait()
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._wait()
        self.inner.delete(key)

    def delete_many(self, keys: list[str]) -> None:
        self._wait(-(-len(keys) // 1000))
        self.inner.delete_many(keys)

    def copy(self, src_key: str, dst_key: str) -> None:
        self._wait()
        self.inner.copy(src_key, dst_key)

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        self._wait()
        return self.inner.remove_abandoned_writes(prefix, older_than_s)


def run(parallelism: int, epochs: int, retain: int, latency_ms: float,
        full_sweep_every: int | None, root_dir: str | None = None) -> dict:
    """One job at ``parallelism`` ranges; returns the steady epochs' medians."""
    events_per_epoch = EVENTS_PER_RANGE * parallelism
    # Each epoch advances event time by one window, so each closes one (and publishes).
    step_ms = PARTITIONS * WINDOW_MS // events_per_epoch
    # keyed_count_job's job, with key groups for P ranges (>= 1,000 at P = 1,000).
    like = keyed_count_job(1, 1, partitions=PARTITIONS)
    job = Job(name=f"scaling_p{parallelism}", operators=like.operators, sinks=like.sinks,
              source=SyntheticSource(events_per_epoch * epochs // PARTITIONS, KEYS_PER_RANGE * parallelism,
                                     partitions=PARTITIONS, step_ms=step_ms),
              parallelism=parallelism, key_groups=max(256, 1 << (parallelism - 1).bit_length()),
              events_per_epoch=events_per_epoch, max_out_of_orderness_ms=PARTITIONS * step_ms)
    with tempfile.TemporaryDirectory(prefix="driver-scaling-", dir=root_dir) as root:
        store = LatencyStore(root, latency_ms / 1000)
        task_requests: list[dict[str, int]] = []
        task_seconds = [0.0]
        real_stages = {"read": LocalExchange.read, "run_operator": LocalExchange.run_operator}

        def executor_side(step):
            # The in-process exchange (reading the source splits, running each operator's
            # tasks one after another) stands for Spark's executors: its time and
            # requests are the tasks'.
            def call(exchange, *args, **kwargs):
                store.in_task.on = True
                before, started = store.stats.snapshot(), time.perf_counter()
                try:
                    return step(exchange, *args, **kwargs)
                finally:
                    task_seconds[0] += time.perf_counter() - started
                    task_requests.append(subtract_requests(store.stats.snapshot(), before))
                    store.in_task.on = False
            return call

        LocalExchange.read, LocalExchange.run_operator = (executor_side(f) for f in real_stages.values())
        phases = {"commit": 0.0, "publish": 0.0, "retention": 0.0}
        real_steps = {"commit": JobRunner._commit, "publish": JobRunner._publish,
                      "retention": JobRunner._apply_retention}

        def timed(name, step):
            def call(runner, *args, **kwargs):
                started = time.perf_counter()
                try:
                    return step(runner, *args, **kwargs)
                finally:
                    phases[name] += time.perf_counter() - started
            return call

        JobRunner._commit, JobRunner._publish, JobRunner._apply_retention = (
            timed(name, step) for name, step in real_steps.items())
        rows = []
        try:
            with JobRunner(job, None, store, retain_checkpoints=retain,
                           full_sweep_every=full_sweep_every) as runner:
                stream = runner.epochs(max_epochs=epochs)
                while True:
                    before, started = store.stats.snapshot(), time.perf_counter()
                    task_requests.clear()
                    task_seconds[0] = 0.0
                    phases.update(dict.fromkeys(phases, 0.0))
                    result = next(stream, None)
                    if result is None:
                        break
                    wall = time.perf_counter() - started
                    spent = subtract_requests(store.stats.snapshot(), before)
                    tasks = {k: sum(t[k] for t in task_requests) for k in FIELDS}
                    driver = {k: spent[k] - tasks[k] for k in FIELDS}
                    rows.append({"epoch": result.epoch, "driver": driver,
                                 "driver_s": wall - task_seconds[0], "task_s": task_seconds[0],
                                 **{f"{k}_s": v for k, v in phases.items()},
                                 "published": len(result.published),
                                 "expired": runner.last_cleanup.checkpoints_deleted,
                                 "full_sweep": runner.last_cleanup.full_sweep})
                checkpoint_bytes = len(store.inner.get(checkpoint_key(job.prefix, rows[-1]["epoch"])))
        finally:
            LocalExchange.read, LocalExchange.run_operator = real_stages.values()
            JobRunner._commit, JobRunner._publish, JobRunner._apply_retention = real_steps.values()
    steady = [r for r in rows if r["expired"]]
    if not steady:
        raise SystemExit(f"P={parallelism}: no epoch expired a checkpoint; run more than --retain epochs")
    med = {k: statistics.median(r["driver"][k] for r in steady) for k in FIELDS}
    return {"P": parallelism, "key_groups": job.key_groups, "steady_epochs": len(steady),
            "driver": med, "max_total": max(sum(r["driver"][k] for k in REQUEST_KINDS) for r in steady),
            "driver_s": statistics.median(r["driver_s"] for r in steady),
            "task_s": statistics.median(r["task_s"] for r in steady),
            **{f"{k}_s": statistics.median(r[f"{k}_s"] for r in steady) for k in ("commit", "publish", "retention")},
            "published": statistics.median(r["published"] for r in steady),
            "checkpoint_bytes": checkpoint_bytes,
            "full_sweeps": sum(1 for r in steady if r["full_sweep"])}


def print_table(results: list[dict], latency_ms: float, retain: int) -> None:
    print(f"\nDriver per steady epoch (medians; retain={retain}; {latency_ms:g} ms per driver request)")
    print("| P | key groups | GET | PUT | LIST | HEAD | DELETE | COPY | total | target 3P+50 "
          "| bytes read / written | checkpoint | driver s/epoch | of which commit / publish / retention "
          "| tasks s/epoch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        d = r["driver"]
        total = sum(d[k] for k in REQUEST_KINDS)
        print(f"| {r['P']:,} | {r['key_groups']:,} | {d['GET']:.0f} | {d['PUT']:.0f} | {d['LIST']:.0f} | "
              f"{d['HEAD']:.0f} | {d['DELETE']:.0f} | {d['COPY']:.0f} | {total:.0f} | {3 * r['P'] + 50:,} | "
              f"{d['bytes_read'] / 1024:.0f} / {d['bytes_written'] / 1024:.0f} KiB | "
              f"{r['checkpoint_bytes'] / 1024:.0f} KiB | "
              f"{r['driver_s']:.2f} | {r['commit_s']:.2f} / {r['publish_s']:.2f} / {r['retention_s']:.2f} | "
              f"{r['task_s']:.1f} |")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, nargs="+", default=[2, 64, 1000])
    parser.add_argument("--epochs", type=int, default=7)
    parser.add_argument("--retain", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--full-sweep-every", type=int, default=None)
    parser.add_argument("--root-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                        help="where the store's temporary directory goes (default: /dev/shm, in memory)")
    parser.add_argument("--quick", action="store_true", help="P = 2 and 16, 5 epochs, retain 2, no latency")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranges, args.epochs, args.retain, args.latency_ms = [2, 16], 5, 2, 0.0
    results = [run(p, args.epochs, args.retain, args.latency_ms, args.full_sweep_every, args.root_dir)
               for p in args.ranges]
    print_table(results, args.latency_ms, args.retain)
    return results


if __name__ == "__main__":
    main()
