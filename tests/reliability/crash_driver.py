"""A job driver in its own process, for crash and fencing tests (run by ``harness``).

Usage: ``python crash_driver.py '<json config>'`` with keys

* ``store``: object-store URI of the job;
* ``trace``: file to which every fault point passed is appended (``dkvstream.storage.faults``);
* ``fault``: ``[point, hit]`` -- SIGKILL this process at the hit-th pass of point;
* ``barrier``: ``[point, ready_file, go_file]`` -- at the first pass of point, create
  ready_file and wait until go_file exists (two drivers meet before their commit);
* ``spark``: a Spark master (e.g. ``local[2]``, ``local[2,4]``); absent: in-process;
* ``spark_conf``: extra Spark settings;
* ``fail_first_attempt``: a directory; every task's first attempt fails (Spark retries
  it) and leaves a file there: in partitions 0, 2, ... after it wrote its staged files
  and DKV manifest, in the others while processing events. The run uses Spark stages per
  epoch, whose tasks Spark retries one by one (``JobRunner(long_lived_tasks=False)``);
* ``job``: keyword arguments of ``harness.job``.

Prints a JSON line to stdout per epoch committed (``{"epoch": n, "seconds": s}``) and
``{"completed": true}`` when the job ran to its end. Exit code 0 after the job's end; a
fenced driver exits 3 with the error on stderr.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dkvstream.examples.keyed_count import KeyedWindowCountBatch  # noqa: E402
from dkvstream.operators.runtime.driver import JobFencedError  # noqa: E402
from dkvstream.storage import faults  # noqa: E402
from tests.reliability import harness  # noqa: E402


class FailsOnFirstAttempt(KeyedWindowCountBatch):
    """The batch operator whose task attempt 0 fails (pickled by value: defined in
    __main__); each failure touches a file in ``log_dir``."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def on_batch(self, ctx, events):
        from pyspark import TaskContext

        from dkvstream.storage import faults as worker_faults

        tc = TaskContext.get()
        if tc is not None and tc.attemptNumber() == 0:
            Path(self.log_dir, f"stage{tc.stageId()}-part{tc.partitionId()}").touch()
            if tc.partitionId() % 2 == 0:
                def fail(point: str, epoch: int | None) -> None:
                    raise RuntimeError(f"injected failure of attempt 0 at {point}")
                worker_faults.arm("task_after_checkpoint", 1, fail)  # one shot, this task
            else:
                raise RuntimeError("injected failure of attempt 0 in on_batch")
        super().on_batch(ctx, events)


def _barrier(ready: str, go: str):
    def wait(point: str, epoch: int | None) -> None:
        Path(ready).touch()
        while not os.path.exists(go):
            time.sleep(0.01)
    return wait


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if cfg.get("trace"):
        faults.trace_to(cfg["trace"])
    if cfg.get("fault"):
        faults.arm(cfg["fault"][0], int(cfg["fault"][1]))
    if cfg.get("barrier"):
        point, ready, go = cfg["barrier"]
        faults.arm(point, 1, _barrier(ready, go))
    spark = None
    if cfg.get("spark"):
        from dkvstream.operators.spark.session import get_spark

        spark = get_spark({"spark.master": cfg["spark"], **cfg.get("spark_conf", {})})
    runner = harness.runner(cfg["store"], spark, **cfg.get("job", {}))
    if cfg.get("fail_first_attempt"):
        runner.job.operators = [FailsOnFirstAttempt(cfg["fail_first_attempt"])]
        runner.long_lived_tasks = False
    try:
        for res in runner.epochs():
            print(json.dumps({"epoch": res.epoch, "seconds": res.seconds}), flush=True)
    except JobFencedError as e:
        print(f"FENCED: {e}", file=sys.stderr, flush=True)
        return 3
    # The job ran to its end: a kill from outside after this line did not interrupt it.
    print(json.dumps({"completed": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
