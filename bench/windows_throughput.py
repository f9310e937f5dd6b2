"""Window library throughput: the flights job on ``window_operator`` against today's
hand-written vectorised flights operator, and session windows per aircraft.

Usage: ``.venv/bin/python bench/windows_throughput.py [--scale 3] [--epoch 100000]``

Runs, one after another in this process, each in process (``JobRunner(job, spark=None)``:
one core, no Spark) on a fresh store, over ``--scale`` copies of the 2013 flights:

1. the named baseline, ``flights_job(batch=True)`` (``RouteDailyDelaysBatch``, the
   flights operator written by hand in vectorised form);
2. ``flights_windowed_job()`` (``examples/flights_windowed.py``): the same job as a
   ``window_operator`` over one-day tumbling windows; its ratio to 1 is printed (target
   >= 0.9x) and, at ``--scale 1``, its output is checked against the pandas oracle;
3. session windows per aircraft tail number with a 6-hour gap (``AircraftSource``,
   flights with a tail number), with three aggregates (target >= 100,000 events/s).

The replay's data is loaded before any clock starts. Each clock runs from ``JobRunner``
construction to the return of ``close()`` after the last commit. Events/s = events /
wall seconds (``time.perf_counter``); events per CPU second (``time.process_time`` of
this process, all threads) is printed beside it, as the machine may be shared. The
load average before and after is printed.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plot import load_average  # noqa: E402

WINDOWED_TARGET = 0.9  # the windowed flights job against the baseline, events/s ratio
SESSION_TARGET = 100_000  # events/s, sessions per aircraft


def sessions_job(scale: int, events_per_epoch: int, days: int | None = None):
    """Session windows per tail number, 6-hour gap: flights, mean delay, first origin
    (``days``: only the first days of the replay, for tests)."""
    import pyarrow as pa

    from dkvstream.examples.aircraft_rotations import AircraftSource
    from dkvstream.examples.flights import HOUR_MS
    from dkvstream.operators.api.job import Job
    from dkvstream.operators.api.windows import Count, First, Mean, SessionWindows, window_operator
    from dkvstream.operators.io.sinks import ParquetSink

    op = window_operator("aircraft_sessions", SessionWindows(6 * HOUR_MS), {
        "flights": Count(), "dep_delay_mean": Mean("dep_delay"), "first_origin": First("origin", pa.string())})
    return Job(name="sessions", source=AircraftSource(scale, days), operators=[op], max_out_of_orderness_ms=HOUR_MS,
               sinks={"main": ParquetSink("sessions", op.outputs["main"])}, events_per_epoch=events_per_epoch)


def _timed(job) -> dict:
    from dkvstream.operators.runtime.driver import JobRunner

    with tempfile.TemporaryDirectory() as store:
        started, cpu_started = time.perf_counter(), time.process_time()
        runner = JobRunner(job, None, store)
        results = runner.run()
        runner.close()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        output = job.sinks["main"].read(runner.store, job.prefix)
    events = sum(r.events for r in results)
    return {"events": events, "seconds": seconds, "cpu": cpu, "eps": events / seconds, "cpu_eps": events / cpu,
            "epochs": len(results), "output": output}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=3, help="copies of the 2013 flights (336,776 events each)")
    ap.add_argument("--epoch", type=int, default=100_000, help="events per epoch")
    args = ap.parse_args()

    from dkvstream.examples.flights import flights_job
    from dkvstream.examples.flights_data import replay_partitions
    from dkvstream.examples.flights_windowed import flights_windowed_job

    replay_partitions(args.scale)  # load before the clocks
    print(f"load average before: {load_average()}")
    runs = {
        "baseline: flights_job(batch=True)": _timed(flights_job(args.scale, args.epoch, batch=True)),
        "flights_windowed_job (tumbling 1 day)": _timed(flights_windowed_job(args.scale, events_per_epoch=args.epoch)),
        "sessions per tail number, 6 h gap": _timed(sessions_job(args.scale, args.epoch)),
    }
    if args.scale == 1:
        from dkvstream.examples.flights_oracle import assert_equals_oracle, route_daily_delays_oracle

        assert_equals_oracle(runs["flights_windowed_job (tumbling 1 day)"]["output"], route_daily_delays_oracle())
        print("flights_windowed_job output equals the oracle")
    print(f"load average after: {load_average()}")
    print("wall clock: time.perf_counter; CPU: time.process_time of this process; in process, one core")
    print(f"{'run':40} {'events':>10} {'epochs':>6} {'wall s':>8} {'events/s':>10} {'events/CPU s':>12}")
    for name, r in runs.items():
        print(f"{name:40} {r['events']:>10,} {r['epochs']:>6} {r['seconds']:>8.2f} {r['eps']:>10,.0f} "
              f"{r['cpu_eps']:>12,.0f}")
    base, windowed, sessions = runs.values()
    ratio = windowed["eps"] / base["eps"]
    cpu_ratio = windowed["cpu_eps"] / base["cpu_eps"]
    print(f"windowed flights / baseline: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU (target >= {WINDOWED_TARGET}x)")
    print(f"sessions: {sessions['eps']:,.0f} events/s wall, {sessions['cpu_eps']:,.0f} per CPU s "
          f"(target >= {SESSION_TARGET:,})")


if __name__ == "__main__":
    main()
