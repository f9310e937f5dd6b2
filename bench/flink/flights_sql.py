"""The flights route-daily-delays job in Flink SQL (PyFlink 2.x), run under ``.venv-flink``.

``bench/baselines/flink_sql_flights.py`` (the project's venv) starts this script with
``.venv-flink/bin/python`` (made by ``bench/flink/setup.sh``) and checks what it writes
against the oracle; this script imports only PyFlink and pyarrow (PyFlink's own
dependency), never the project, so it runs in PyFlink's venv.

The job: one Flink filesystem source per origin (``WATERMARK FOR ts AS ts - INTERVAL '1'
HOUR``), their ``UNION ALL`` (the watermark at the window is the minimum over origins, the
spec's watermark, as in the Spark TWS baseline), a ``TUMBLE`` window of one day
(``table.local-time-zone`` UTC, so windows align to UTC midnight) grouped by origin and
dest, written by a filesystem sink. Streaming mode, ``parallelism.default`` 2, RocksDB
state backend, incremental checkpoints every second (like Bytewax's recovery snapshots);
at the end of the bounded input every window closes and the final checkpoint commits the
sink's files.

Input: Flink's Parquet format (``flink-sql-parquet``) is not among the jars the PyFlink
wheel ships (it has CSV and JSON), so the script first copies each origin's Parquet epoch
files, in epoch order, into one CSV file per origin with pyarrow, inside the clock. One
file per origin keeps each origin's events in order within its source (a file source
assigns the files of one directory to its readers in no fixed order, and an origin read
out of order would make its later files late).

Clock: from just before the Parquet files are read (the TableEnvironment, i.e. the
gateway JVM, already started, as every engine's session start-up is excluded) to the
INSERT job's end (its sink's last file committed); the job's local MiniCluster starts
inside it, on submission.

Usage: ``.venv-flink/bin/python bench/flink/flights_sql.py INPUT_DIR WORK_DIR RESULT_JSON``.
Writes ``{"seconds", "convert_seconds", "events", "output_dir"}`` to RESULT_JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

ORIGIN_COLUMNS = ("origin", "dest", "event_time_ms", "dep_time", "dep_delay")
PARALLELISM = 2
CHECKPOINT_INTERVAL = "1 s"
SINK_COLUMNS = ("origin", "dest", "window_start", "flights", "cancelled", "dep_delay_mean",
                "dep_delay_max")


def source_ddl(table: str, path: str) -> str:
    """``CREATE TABLE`` of one origin's CSV copy: event time ``ts`` from ``event_time_ms``
    (epoch ms), watermark one hour behind the largest event time read."""
    return f"""
        CREATE TABLE {table} (
            origin STRING, dest STRING, event_time_ms BIGINT, dep_time BIGINT, dep_delay BIGINT,
            ts AS TO_TIMESTAMP_LTZ(event_time_ms, 3),
            WATERMARK FOR ts AS ts - INTERVAL '1' HOUR
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'csv',
                'csv.null-literal' = '')"""


def sink_ddl(path: str) -> str:
    """``CREATE TABLE daily``: the filesystem sink, CSV, ``SINK_COLUMNS`` (window_start as
    ``yyyy-MM-dd HH:mm:ss`` UTC)."""
    return f"""
        CREATE TABLE daily (
            origin STRING, dest STRING, window_start STRING, flights BIGINT, cancelled BIGINT,
            dep_delay_mean DOUBLE, dep_delay_max DOUBLE
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'csv')"""


def union_view_sql(tables: list[str]) -> str:
    """``CREATE TEMPORARY VIEW flights``: the origins' sources, ``UNION ALL``."""
    union = "\n        UNION ALL ".join(f"SELECT * FROM {t}" for t in tables)
    return f"""
        CREATE TEMPORARY VIEW flights AS
        {union}"""


def insert_sql() -> str:
    """The job over the ``flights`` view: a one-day ``TUMBLE`` per (origin, dest);
    cancelled is a flight without a departure time; the delay mean and max skip unknown
    delays."""
    return """
        INSERT INTO daily
        SELECT origin, dest, DATE_FORMAT(window_start, 'yyyy-MM-dd HH:mm:ss'),
               COUNT(*), COUNT(*) - COUNT(dep_time),
               AVG(CAST(dep_delay AS DOUBLE)), CAST(MAX(dep_delay) AS DOUBLE)
        FROM TABLE(TUMBLE(TABLE flights, DESCRIPTOR(ts), INTERVAL '1' DAY))
        GROUP BY origin, dest, window_start, window_end"""


def copy_as_csv(input_dir: str, csv_dir: str) -> dict[str, tuple[str, int]]:
    """Each origin's Parquet epoch files (``<input_dir>/<origin>/*.parquet``, epoch order)
    as one CSV file ``<csv_dir>/<origin>/flights.csv`` (``ORIGIN_COLUMNS``, no header, an
    unknown value as an empty field), end-of-input rows (empty route) dropped.

    Returns:
        ``{origin: (its CSV directory, events)}``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    out = {}
    for origin in sorted(os.listdir(input_dir)):
        d = os.path.join(input_dir, origin)
        target = os.path.join(csv_dir, origin)
        os.makedirs(target)
        events = 0
        with open(os.path.join(target, "flights.csv"), "wb") as f:
            for name in sorted(os.listdir(d)):
                t = pq.read_table(os.path.join(d, name),
                                  columns=["route", "event_time", "origin", "dest", "dep_time", "dep_delay"])
                t = t.filter(pc.not_equal(t.column("route"), ""))
                t = t.select(["origin", "dest", "event_time", "dep_time", "dep_delay"]).rename_columns(
                    list(ORIGIN_COLUMNS))
                t = t.set_column(2, "event_time_ms", t.column(2).cast(pa.int64()))
                pcsv.write_csv(t, f, pcsv.WriteOptions(include_header=False))
                events += t.num_rows
        out[origin] = (target, events)
    return out


def main(argv: list[str]) -> int:
    input_dir, work_dir, result_json = argv
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    config = Configuration()
    # No restarts: a failure (e.g. a row it cannot parse) ends the run instead of looping.
    for k, v in {"parallelism.default": str(PARALLELISM), "table.local-time-zone": "UTC",
                 "restart-strategy.type": "none",
                 "state.backend.type": "rocksdb",
                 "execution.checkpointing.incremental": "true",
                 "execution.checkpointing.interval": CHECKPOINT_INTERVAL,
                 "execution.checkpointing.dir": "file://" + os.path.join(work_dir, "checkpoints")}.items():
        config.set_string(k, v)
    t_env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build())

    started = time.perf_counter()
    origins = copy_as_csv(input_dir, os.path.join(work_dir, "csv"))
    converted = time.perf_counter()
    tables = []
    for origin, (path, _) in origins.items():
        tables.append(f"flights_{origin.lower()}")
        t_env.execute_sql(source_ddl(tables[-1], path))
    output_dir = os.path.join(work_dir, "output")
    t_env.execute_sql(sink_ddl(output_dir))
    t_env.execute_sql(union_view_sql(tables))
    t_env.execute_sql(insert_sql()).wait()
    seconds = time.perf_counter() - started
    with open(result_json, "w") as f:
        json.dump({"seconds": seconds, "convert_seconds": converted - started,
                   "events": sum(n for _, n in origins.values()), "output_dir": output_dir}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
