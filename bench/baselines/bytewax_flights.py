"""The flights route-daily-delays job on Bytewax (``bytewax`` on PyPI, 0.21).

Bytewax is a Python-native dataflow engine (Timely Dataflow in Rust underneath, operator
logic in Python, one item at a time). The job uses its event-time windowing operators:
``EventClock`` (watermark = max event time seen - 1 hour; the "system time" that
normally advances it between items is frozen, so the watermark is event-time only, as in
the spec), ``TumblingWindower`` (one day, aligned to UTC midnight) and ``fold_window``
(flights, cancelled, delay sum, delay count, delay max per route and window); late items
come out of the window operator's ``late`` stream. At end of input Bytewax closes every
window (its EOF watermark is +infinity), as dkvstream does.

Input: the same Parquet files as the other engines (``bench/baselines/flights_input.py``):
a ``FixedPartitionedSource`` with one partition per origin whose ``next_batch`` hands
out one file (one dkvstream epoch's share) at a time. With ``--recovery`` (default on)
Bytewax snapshots state to its SQLite recovery store at the end of each epoch of
``--epoch-interval-s`` system time, the closest it has to dkvstream's and Spark's
per-micro-batch checkpoints.

Usage: ``.venv/bin/python bench/baselines/bytewax_flights.py --scale 1 [--max-events N]
[--workers 2] [--no-recovery]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import pyarrow as pa
import pyarrow.parquet as pq

from bench.baselines.flights_input import (
    END_OF_INPUT_ROUTE,
    EVENT_TIME_COLUMN,
    ROUTE_COLUMN,
    EpochPlan,
    add_run_arguments,
    check_output,
    run_engine_cli,
)
from bench.baselines.flights_window import fold, merge, new_accumulator, to_output_table
from dkvstream.examples.flights_data import DAY_MS


def bytewax_import_error() -> str | None:
    """None if ``bytewax`` imports, else the error text (for the benchmark table)."""
    try:
        import bytewax.operators.windowing  # noqa: F401
    except Exception as e:  # an ImportError, or a broken native extension
        return f"{type(e).__name__}: {e}"
    return None


ALIGN = datetime(2000, 1, 1, tzinfo=timezone.utc)  # a UTC midnight: windows align to midnights
ALIGN_MS = int(ALIGN.timestamp() * 1000)
# The frozen "system time" of the event clock (see the module docstring).
FROZEN_NOW = datetime(2000, 1, 1, tzinfo=timezone.utc)


def build_flow(input_dir: str, sink: list, late: list, marks: dict):
    """The dataflow over ``input_dir/<origin>/*.parquet``.

    Args:
        input_dir: ``write_input_files`` output.
        sink: closed windows are appended as ``(route, window_start_ms, aggregate list)``.
        late: late events are appended as ``(route, event_time_ms)``.
        marks: filled with ``first_output`` (``time.perf_counter()`` of the first closed
            window) and ``file_times`` (``{partition: [perf_counter after each file]}``).

    Returns:
        ``bytewax.dataflow.Dataflow``.
    """
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class FilesPartition(StatefulSourcePartition):
        def __init__(self, name: str, files: list[str], resume: int | None) -> None:
            self.name, self.files, self.next = name, files, resume or 0

        def next_batch(self):
            if self.next >= len(self.files):
                raise StopIteration
            t = pq.read_table(self.files[self.next], columns=[ROUTE_COLUMN, EVENT_TIME_COLUMN, "dep_time", "dep_delay"])
            self.next += 1
            marks["file_times"].setdefault(self.name, []).append(time.perf_counter())
            ms = t.column(EVENT_TIME_COLUMN).cast(pa.int64()).to_pylist()
            return [r for r in zip(t.column(ROUTE_COLUMN).to_pylist(), ms, t.column("dep_time").to_pylist(),
                                   t.column("dep_delay").to_pylist()) if r[0] != END_OF_INPUT_ROUTE]

        def snapshot(self) -> int:
            return self.next

    class FilesSource(FixedPartitionedSource):
        def list_parts(self) -> list[str]:
            return sorted(os.listdir(input_dir))

        def build_part(self, step_id, for_part, resume_state):
            d = os.path.join(input_dir, for_part)
            return FilesPartition(for_part, [os.path.join(d, f) for f in sorted(os.listdir(d))], resume_state)

    class ListSinkPartition(StatelessSinkPartition):
        def write_batch(self, items) -> None:
            if items and "first_output" not in marks:
                marks["first_output"] = time.perf_counter()
            for route, (window_id, acc) in items:
                sink.append((route, ALIGN_MS + window_id * DAY_MS, acc))

    class ListSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return ListSinkPartition()

    def folder(acc: list, item) -> list:
        return fold(acc, item[2], item[3])

    flow = Dataflow("flights_route_daily_delays")
    events = op.input("flights", flow, FilesSource())
    keyed = op.key_on("route", events, lambda item: item[0])
    clock = EventClock(lambda item: datetime.fromtimestamp(item[1] / 1000, timezone.utc),
                       wait_for_system_duration=timedelta(hours=1), now_getter=lambda: FROZEN_NOW,
                       to_system_utc=lambda ts: None)
    windows = fold_window("daily", keyed, clock, TumblingWindower(length=timedelta(days=1), align_to=ALIGN),
                          builder=new_accumulator, folder=folder, merger=merge, ordered=False)
    op.output("windows", windows.down, ListSink())
    op.inspect("late", windows.late, lambda step, item: late.append((item[0], item[1][1][1])))
    return flow


def run(plan: EpochPlan, input_dir: str, work_dir: str, workers: int = 1, recovery: bool = True,
        epoch_interval_s: float = 1.0) -> dict:
    """Run the dataflow to the end of the input, check it against the oracle, return timings.

    Args:
        plan: the epoch plan ``input_dir`` was written from.
        input_dir: ``write_input_files`` output.
        work_dir: scratch directory (recovery store), emptied first.
        workers: Bytewax worker threads in this process.
        recovery: snapshot state to Bytewax's SQLite recovery store every epoch.
        epoch_interval_s: Bytewax epoch length, s of system time.

    Returns:
        ``{"events", "seconds", "epochs", "epoch_seconds", "first_output_s", "late",
        "correct": True}``.

    Raises:
        AssertionError: the output differs from the oracle, or an event was late.
    """
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.run import cli_main

    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    recovery_config = None
    if recovery:
        init_db_dir(Path(work_dir), workers)
        recovery_config = RecoveryConfig(Path(work_dir))
    sink, late, marks = [], [], {"file_times": {}}
    flow = build_flow(input_dir, sink, late, marks)
    started = time.perf_counter()
    cli_main(flow, workers_per_process=workers, epoch_interval=timedelta(seconds=epoch_interval_s),
             recovery_config=recovery_config)
    seconds = time.perf_counter() - started
    check_output(to_output_table(sink), plan)
    assert not late, f"bytewax: {len(late)} late events (expected none), e.g. {late[:3]}"
    # An epoch's files are all handed out once its last partition's file is.
    per_part = list(marks["file_times"].values())
    done = [max(ts[i] for ts in per_part if i < len(ts)) for i in range(max(map(len, per_part)))]
    epoch_seconds = [b - a for a, b in zip([started] + done[:-1], done)]
    first = marks.get("first_output")
    return {"events": plan.events, "seconds": seconds, "epochs": len(epoch_seconds),
            "epoch_seconds": epoch_seconds, "first_output_s": None if first is None else first - started,
            "late": len(late), "correct": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(ap)
    ap.add_argument("--workers", type=int, default=1, help="Bytewax worker threads")
    ap.add_argument("--no-recovery", action="store_true", help="no state snapshots (in-memory only)")
    args = ap.parse_args(argv)

    error = bytewax_import_error()
    if error is not None:
        print(f"bytewax: not available here: {error}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"engine": "bytewax", "error": error}, f)
        return 2
    engine = f"bytewax-{args.workers}w" + ("" if args.no_recovery else "-recovery")
    return run_engine_cli(args, engine, lambda plan, input_dir, work_dir: run(
        plan, input_dir, work_dir, args.workers, not args.no_recovery))


if __name__ == "__main__":
    sys.exit(main())
