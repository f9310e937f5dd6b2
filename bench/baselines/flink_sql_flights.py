"""The flights route-daily-delays job on Flink SQL (PyFlink 2.3), checked against the oracle.

Flink runs in its own venv, ``.venv-flink`` (PyFlink pins its own pyarrow and pandas;
``bash bench/flink/setup.sh`` makes it from ``bench/flink/requirements.txt``): this script,
in the project's venv, starts ``bench/flink/flights_sql.py`` with ``.venv-flink/bin/python``
on the same Parquet epoch files as the other engines, reads the CSV files its sink
committed and checks them against the oracle (``check_output``) before its time counts.

The job (see ``bench/flink/flights_sql.py``): one filesystem source per origin with a
one-hour bounded-out-of-orderness watermark, their union, a one-day ``TUMBLE`` window per
(origin, dest); streaming mode, parallelism 2, RocksDB state backend, incremental
checkpoints every second. Flink's Parquet format is not in the PyFlink wheel, so the job
first copies each origin's Parquet files into one CSV file with pyarrow, inside its clock
(``convert_seconds`` in the result says how long that took).

Clock: from just before the Parquet files are read (the gateway JVM started, as every
engine's session start-up is excluded) to the end of the INSERT job (its sink's last file
committed); the job's local MiniCluster starts inside it. Flink has no micro-batches, so
the result has no per-epoch times.

Usage: ``.venv/bin/python bench/baselines/flink_sql_flights.py --scale 1 [--max-events N]``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import pyarrow as pa

from bench.baselines.flights_input import EpochPlan, add_run_arguments, check_output, run_engine_cli
from bench.flink.flights_sql import SINK_COLUMNS
from dkvstream.examples.flights_data import DAY_MS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FLINK_PYTHON = os.path.join(ROOT, ".venv-flink", "bin", "python")
SETUP_COMMAND = "bash bench/flink/setup.sh"
JOB_TIMEOUT_S = 3600


def flink_missing() -> str | None:
    """None if ``.venv-flink`` has PyFlink, else what is missing and the command that makes it."""
    if not os.path.exists(FLINK_PYTHON):
        return f"{FLINK_PYTHON} not found; make it with: {SETUP_COMMAND}"
    probe = subprocess.run([FLINK_PYTHON, "-c", "import pyflink.table"], capture_output=True, text=True)
    if probe.returncode != 0:
        return (f"{FLINK_PYTHON} cannot import pyflink ({probe.stderr.strip().splitlines()[-1:]}); "
                f"reinstall with: {SETUP_COMMAND}")
    return None


def read_output(output_dir: str) -> pa.Table:
    """The CSV files the job's sink committed (``SINK_COLUMNS``, no header) as the spec's
    output table (``examples/flights_oracle.py`` columns: window_start and window_end as
    timestamp ms UTC). In-progress files (names starting with ``.``) are not output.

    Raises:
        AssertionError: the sink committed no file.
    """
    import pyarrow.csv as pcsv

    names = sorted(n for n in os.listdir(output_dir) if not n.startswith((".", "_")))
    assert names, f"flink-sql: no committed output file in {output_dir}"
    types = {"origin": pa.string(), "dest": pa.string(), "window_start": pa.timestamp("s"),
             "flights": pa.int64(), "cancelled": pa.int64(), "dep_delay_mean": pa.float64(),
             "dep_delay_max": pa.float64()}
    t = pa.concat_tables([pcsv.read_csv(
        os.path.join(output_dir, n), read_options=pcsv.ReadOptions(column_names=list(SINK_COLUMNS)),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False))
        for n in names])
    ts = pa.timestamp("ms", tz="UTC")
    start = t.column("window_start").cast(pa.int64()).to_numpy() * 1000
    return t.set_column(t.schema.get_field_index("window_start"), "window_start",
                        pa.array(start).cast(ts)).add_column(
        3, "window_end", pa.array(start + DAY_MS).cast(ts))


def run(plan: EpochPlan, input_dir: str, work_dir: str) -> dict:
    """Run the Flink SQL job on ``input_dir`` under ``.venv-flink``, check its output.

    Returns:
        ``{"events", "seconds", "convert_seconds", "epochs": 0, "epoch_seconds": [],
        "first_output_s": None, "late": 0, "correct": True}`` (Flink's sink cannot tell
        late events: the window drops them, and a dropped event shows as an oracle mismatch).

    Raises:
        RuntimeError: ``.venv-flink`` is missing (with the command to make it) or the job
            failed (with its last output lines).
        AssertionError: the output differs from the oracle.
    """
    missing = flink_missing()
    if missing:
        raise RuntimeError(f"flink-sql: {missing}")
    result_json = os.path.join(os.path.dirname(work_dir.rstrip("/")) or ".", "flink-result.json")
    job = subprocess.run([FLINK_PYTHON, os.path.join(ROOT, "bench", "flink", "flights_sql.py"), input_dir,
                          work_dir, result_json], capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if job.returncode != 0 or not os.path.exists(result_json):
        tail = "\n".join(line for line in (job.stdout + job.stderr).splitlines()
                         if not line.lstrip().startswith("at "))[-2000:]
        raise RuntimeError(f"flink-sql: the job failed (exit status {job.returncode}):\n{tail}")
    with open(result_json) as f:
        timing = json.load(f)
    assert timing["events"] == plan.events, \
        f"flink-sql read {timing['events']:,} events, the plan has {plan.events:,}"
    check_output(read_output(timing["output_dir"]), plan)
    print(f"flink-sql: of its {timing['seconds']:.1f} s, {timing['convert_seconds']:.1f} s went to "
          "copying the Parquet files to CSV", flush=True)
    return {"events": plan.events, "seconds": timing["seconds"], "convert_seconds": timing["convert_seconds"],
            "epochs": 0, "epoch_seconds": [], "first_output_s": None, "late": 0, "correct": True}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    missing = flink_missing()
    if missing:
        print(f"flink-sql: not available here: {missing}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"engine": "flink-sql", "error": missing}, f)
        return 2
    return run_engine_cli(args, "flink-sql", run)


if __name__ == "__main__":
    sys.exit(main())
