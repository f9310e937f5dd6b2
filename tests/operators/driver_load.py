"""One run of the keyed count job on local Spark, for the driver-footprint test
(``test_driver_carries_no_events.py``): prints, as one JSON line, the driver's bytes
received from tasks per epoch (checkpoint metric ``driver_bytes_received``), the events
per epoch and the driver process's peak RSS (KiB).

Usage: python -m tests.operators.driver_load <store root> <events per epoch> <epochs>
"""
from __future__ import annotations

import json
import resource
import sys

EVENTS_PER_PARTITION = 500_000
KEYS = 1_000


def main(root: str, events_per_epoch: int, epochs: int) -> None:
    from dkvstream.examples.keyed_count import keyed_count_job
    from dkvstream.operators.runtime.checkpoints import read_checkpoint
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.operators.spark.session import get_spark

    spark = get_spark({"spark.master": "local[2]"})
    job = keyed_count_job(EVENTS_PER_PARTITION, KEYS, events_per_epoch=events_per_epoch, parallelism=2)
    runner = JobRunner(job, spark, root, retain_checkpoints=None)
    results = runner.run(max_epochs=epochs)
    metrics = [read_checkpoint(runner.store, job.prefix, r.epoch).metrics for r in results]
    print(json.dumps({
        "events": [r.events for r in results],
        "driver_bytes_received": [m["driver_bytes_received"] for m in metrics],
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
