"""Object-store requests per epoch of the flights job on a Spark cluster, by parallelism.

Usage (a cluster and an S3 server running, the AWS variables of the server set; ``--plot
PATH`` writes requests per epoch as a PNG)::

    eval "$(platform/s3-server.sh start)"
    master=$(platform/spark-cluster.sh start)
    .venv/bin/python bench/cluster_requests.py --master "$master" --store "$DKVSTREAM_S3_URI/bench" \\
        --parallelism 2 4 --retain-checkpoints 3

For each parallelism P, one driver (``python -m dkvstream.operators.tools.run_job``) runs the flights
job to the end on a fresh prefix, keeping ``--retain-checkpoints`` checkpoints (so the
driver's cleanup runs as in production). Printed per P: the median over the steady
epochs (2 to the second-to-last: epoch 1 starts from empty state and the last one only
drains) of each request kind, for the driver and the tasks, then the size of the newest
job checkpoint and of one range manifest. The capacity estimate in
``docs/capacity.md`` starts from these numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dkvstream.examples.flights import flights_job  # noqa: E402
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint  # noqa: E402
from dkvstream.storage.objectstore import REQUEST_KINDS, open_object_store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(master: str, store_uri: str, parallelism: int, events: int, retain: int) -> list[dict]:
    """One driver to the end; its committed-epoch records."""
    cmd = [sys.executable, "-m", "dkvstream.operators.tools.run_job", "--job", "dkvstream.examples.flights:flights_job",
           "--store", store_uri, "--master", master, "--parallelism", str(parallelism),
           "--events-per-epoch", str(events), "--retain-checkpoints", str(retain), "--json",
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=1g"]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [r for r in map(json.loads, out.splitlines()) if r["event"] == "committed"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", required=True)
    p.add_argument("--store", required=True, help="s3://bucket/prefix; one fresh sub-prefix per run")
    p.add_argument("--parallelism", type=int, nargs="+", default=[2, 4])
    p.add_argument("--events-per-epoch", type=int, default=60_000)
    p.add_argument("--retain-checkpoints", type=int, default=3)
    p.add_argument("--plot", metavar="PATH",
                   help="write requests per epoch by parallelism as a PNG")
    a = p.parse_args()
    plotted: list[tuple[int, dict]] = []
    kinds = list(REQUEST_KINDS)
    print(f"| P | epochs | driver {'/'.join(kinds)} | tasks {'/'.join(kinds)} | tasks per range "
          f"| checkpoint bytes | range manifest bytes |")
    print("|---|---|---|---|---|---|---|")
    for parallelism in a.parallelism:
        uri = f"{a.store.rstrip('/')}/p{parallelism}-{uuid.uuid4().hex[:8]}"
        records = run(a.master, uri, parallelism, a.events_per_epoch, a.retain_checkpoints)
        steady = records[1:-1] or records
        med = {side: {k: statistics.median(r["requests"][side][k] for r in steady) for k in kinds}
               for side in ("driver", "tasks")}
        store, prefix = open_object_store(uri), flights_job().prefix
        newest = list_epochs(store, prefix)[-1]
        manifest = next(iter(read_checkpoint(store, prefix, newest).operators["route_daily_delays"].values()))
        fmt = lambda d: "/".join(f"{v:g}" for v in d.values())  # noqa: E731
        per_range = {k: v / parallelism for k, v in med["tasks"].items()}
        print(f"| {parallelism} | {len(records)} | {fmt(med['driver'])} | {fmt(med['tasks'])} | {fmt(per_range)} "
              f"| {store.size(checkpoint_key(prefix, newest)):,} | {store.size(manifest):,} |", flush=True)
        plotted.append((parallelism, med))
    if a.plot:
        from bench.plot import bar_panels

        labels = [f"P = {par}" for par, _ in plotted]
        bar_panels(a.plot, "Object-store requests per steady epoch of the flights job", [
            {"title": side, "labels": labels, "xlabel": "requests (all kinds, median)",
             "values": [sum(med[side].values()) for _, med in plotted]}
            for side in ("driver", "tasks")],
            caption=f"Counts, not times; {a.events_per_epoch:,} events per epoch.")
        print(f"plot written to {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
