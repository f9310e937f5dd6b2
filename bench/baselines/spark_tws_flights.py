"""The flights route-daily-delays job on Spark 4's ``transformWithStateInPandas``.

The baseline the issue-4 benchmark compares dkvstream with: Spark Structured Streaming's
recommended stateful API, RocksDB state store provider, ``local[2]``, event-time timers,
watermark 1 hour, tumbling one-day windows aligned to UTC midnight, late events to a
side output (spec: ``shared/specs/flights-route-delays.md``).

Input: the Parquet files of ``bench/baselines/flights_input.py`` (one directory per
origin, one file per dkvstream epoch). Each origin is its own streaming file source with
``maxFilesPerTrigger=1`` and ``withWatermark(event_time, 1 hour)``; their union makes the
global watermark the minimum over origins (Spark's default
``spark.sql.streaming.multipleWatermarkPolicy=min``), which is the spec's watermark, and
each trigger reads one file per origin, i.e. exactly dkvstream's micro-batch. The
end-of-input row of each origin's last file moves the watermark past every window, and
Spark's no-data batch then fires the remaining timers.

Each micro-batch's rows of a route are first aggregated per window in pandas, so state
is touched per (route, window) per batch, never per event. Two processors (``--variant``):

- ``textbook`` (default; the form of Spark's docs and examples): a ``MapState``
  window_start -> aggregate (flights, cancelled, delay sum, delay count, delay max) and
  one event-time timer per window at its end; ``handleExpiredTimer`` emits that window
  and removes it. About three JVM round trips per (route, window) and batch.
- ``batched``: a ``ListState`` of the route's open windows, read and written whole once
  per route and batch, and one timer per route at its earliest open window end (kept in
  a ``ValueState``); on expiry every window the watermark has passed is emitted and the
  timer moves to the next window end. A handful of round trips per route and batch:
  the fastest form of this job we found on this API.

Output: one Parquet file sink (append mode) of ``OUTPUT_SCHEMA``; ``kind`` says whether
a row is a closed window (``window``) or a late event (``late``, with its event time and
the watermark it missed).

Usage: ``.venv/bin/python bench/baselines/spark_tws_flights.py --scale 1
[--events-per-epoch 50000] [--max-events N] [--variant textbook|batched]``
(checks the output against the oracle, prints events/s). ``bench/flights_throughput.py``
runs it next to dkvstream.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.baselines.flights_input import (
    END_OF_INPUT_ROUTE,
    EVENT_TIME_COLUMN,
    INPUT_SCHEMA,
    ROUTE_COLUMN,
    EpochPlan,
    add_run_arguments,
    check_output,
    run_engine_cli,
)
from dkvstream.examples.flights_data import DAY_MS

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
WATERMARK_DELAY = "1 hour"
VARIANTS = ("textbook", "batched")

OUTPUT_DDL = ("kind string, origin string, dest string, window_start timestamp, window_end timestamp, "
              "flights long, cancelled long, dep_delay_mean double, dep_delay_max double, "
              "event_time timestamp, watermark long, emitted_at_ms long")
OUTPUT_COLUMNS = [c.strip().split(" ")[0] for c in OUTPUT_DDL.split(",")]
WINDOW_KEY_DDL = "window_start long"
AGGREGATE_DDL = "flights long, cancelled long, delay_sum double, delay_count long, delay_max double"
TIMER_DDL = "expiry long"
# Columns the processor reads (a user selects them; Spark then reads only these from Parquet).
PROCESSOR_INPUT = [ROUTE_COLUMN, EVENT_TIME_COLUMN, "origin", "dest", "dep_time", "dep_delay"]


def _window_rows(route: str, aggs: list[tuple[int, tuple]]) -> pd.DataFrame:
    """Output rows for closed windows ``[(window_start_ms, aggregate tuple)]``."""
    origin, dest = route.split("-", 1)
    starts = np.array([s for s, _ in aggs], dtype=np.int64)
    flights, cancelled, dsum, dcount, dmax = (list(col) for col in zip(*(a for _, a in aggs)))
    dcount_arr = np.array(dcount, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(dcount_arr > 0, np.array(dsum, dtype=np.float64) / dcount_arr, np.nan)
    n = len(aggs)
    return pd.DataFrame({
        "kind": ["window"] * n, "origin": [origin] * n, "dest": [dest] * n,
        "window_start": pd.to_datetime(starts, unit="ms", utc=True),
        "window_end": pd.to_datetime(starts + DAY_MS, unit="ms", utc=True),
        "flights": np.array(flights, dtype=np.int64), "cancelled": np.array(cancelled, dtype=np.int64),
        "dep_delay_mean": mean, "dep_delay_max": np.array([np.nan if v is None else v for v in dmax], dtype=float),
        "event_time": pd.Series([pd.NaT] * n, dtype="datetime64[ns, UTC]"),
        "watermark": pd.Series([None] * n, dtype="Int64"),
        "emitted_at_ms": np.full(n, int(time.time() * 1000), dtype=np.int64),
    })


def _late_rows(pdf: pd.DataFrame, watermark: int) -> pd.DataFrame:
    n = len(pdf)
    return pd.DataFrame({
        "kind": ["late"] * n, "origin": pdf["origin"].to_numpy(), "dest": pdf["dest"].to_numpy(),
        "window_start": pd.Series([pd.NaT] * n, dtype="datetime64[ns, UTC]"),
        "window_end": pd.Series([pd.NaT] * n, dtype="datetime64[ns, UTC]"),
        "flights": pd.Series([None] * n, dtype="Int64"), "cancelled": pd.Series([None] * n, dtype="Int64"),
        "dep_delay_mean": np.full(n, np.nan), "dep_delay_max": np.full(n, np.nan),
        "event_time": pd.to_datetime(pdf["_ms"].to_numpy(), unit="ms", utc=True),
        "watermark": np.full(n, watermark, dtype=np.int64),
        "emitted_at_ms": np.full(n, int(time.time() * 1000), dtype=np.int64),
    })


def _batch_aggregates(pdf: pd.DataFrame) -> pd.DataFrame:
    """This micro-batch's rows of one route, aggregated per window (index window_start)."""
    g = pdf.groupby("_start", sort=True)
    return pd.DataFrame({
        "flights": g.size(),
        "cancelled": g["dep_time"].apply(lambda s: int(s.isna().sum())),
        "delay_sum": g["dep_delay"].sum(min_count=0),
        "delay_count": g["dep_delay"].count(),
        "delay_max": g["dep_delay"].max(),
    })


def _merge(old: tuple | None, new) -> tuple:
    flights, cancelled, dsum, dcount, dmax = old if old is not None else (0, 0, 0.0, 0, None)
    nmax = None if pd.isna(new.delay_max) else float(new.delay_max)
    if nmax is not None and (dmax is None or nmax > dmax):
        dmax = nmax
    return (int(flights + new.flights), int(cancelled + new.cancelled), float(dsum + new.delay_sum),
            int(dcount + new.delay_count), dmax)


def make_processor(variant: str = "textbook"):
    """The ``StatefulProcessor`` of the job.

    Args:
        variant: ``textbook`` or ``batched`` (see the module docstring).

    Returns:
        A ``pyspark.sql.streaming.StatefulProcessor`` instance.

    Raises:
        ValueError: unknown ``variant``.
    """
    from pyspark.sql.streaming import StatefulProcessor

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")

    def late_split(pdf: pd.DataFrame, watermark: int) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """Window starts added; events of windows the watermark passed split off."""
        ms = pdf[EVENT_TIME_COLUMN].to_numpy().astype("datetime64[ms]").astype(np.int64)
        pdf["_ms"] = ms
        pdf["_start"] = ms - ms % DAY_MS
        late = (pdf["_start"] + DAY_MS).to_numpy() <= watermark
        if not late.any():
            return pdf, None
        return pdf[~late], _late_rows(pdf[late], watermark)

    class Textbook(StatefulProcessor):
        """MapState window_start -> aggregate, one event-time timer per window."""

        def init(self, handle) -> None:
            self.handle = handle
            self.windows = handle.getMapState("windows", WINDOW_KEY_DDL, AGGREGATE_DDL)

        def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
            pdf = pd.concat(list(rows), ignore_index=True)
            if key[0] == END_OF_INPUT_ROUTE:
                return  # the end-of-input marker: its only job is to move the watermark
            pdf, late = late_split(pdf, timerValues.getCurrentWatermarkInMs())
            if late is not None:
                yield late
            for start, new in _batch_aggregates(pdf).iterrows():
                start = int(start)
                old = self.windows.getValue((start,))
                self.windows.updateValue((start,), _merge(old, new))
                if old is None:
                    self.handle.registerTimer(start + DAY_MS)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
            start = expiredTimerInfo.getExpiryTimeInMs() - DAY_MS
            agg = self.windows.getValue((start,))
            if agg is not None:
                self.windows.removeKey((start,))
                yield _window_rows(key[0], [(start, agg)])

        def close(self) -> None:
            pass

    class Batched(StatefulProcessor):
        """ListState of (window_start, aggregate...) rows read and written whole once per
        route and batch; one timer per route at its earliest open window end."""

        def init(self, handle) -> None:
            self.handle = handle
            self.windows = handle.getListState("windows", f"{WINDOW_KEY_DDL}, {AGGREGATE_DDL}")
            self.next_timer = handle.getValueState("next_timer", TIMER_DDL)

        def _open_windows(self) -> dict[int, tuple]:
            return {int(r[0]): tuple(r[1:]) for r in self.windows.get()}

        def _store(self, windows: dict[int, tuple]) -> None:
            current = self.next_timer.get()
            wanted = min(windows) + DAY_MS if windows else None
            if current is not None and current[0] != wanted:
                self.handle.deleteTimer(current[0])
            if wanted is None:
                self.windows.clear()
                self.next_timer.clear()
                return
            self.windows.put([(s, *a) for s, a in sorted(windows.items())])
            if current is None or current[0] != wanted:
                self.handle.registerTimer(wanted)
                self.next_timer.update((wanted,))

        def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
            pdf = pd.concat(list(rows), ignore_index=True)
            if key[0] == END_OF_INPUT_ROUTE:
                return
            pdf, late = late_split(pdf, timerValues.getCurrentWatermarkInMs())
            if late is not None:
                yield late
            if pdf.empty:
                return
            windows = self._open_windows()
            for start, new in _batch_aggregates(pdf).iterrows():
                windows[int(start)] = _merge(windows.get(int(start)), new)
            self._store(windows)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
            watermark = max(timerValues.getCurrentWatermarkInMs(), expiredTimerInfo.getExpiryTimeInMs())
            windows = self._open_windows()
            closed = sorted((s, a) for s, a in windows.items() if s + DAY_MS <= watermark)
            for s, _ in closed:
                del windows[s]
            self.next_timer.clear()  # this timer has fired
            self._store(windows)
            if closed:
                yield _window_rows(key[0], closed)

        def close(self) -> None:
            pass

    return Textbook() if variant == "textbook" else Batched()


def start_query(spark, input_dir: str, output_dir: str, checkpoint_dir: str, variant: str = "textbook"):
    """Start the streaming query over ``input_dir/<origin>/*.parquet``.

    Args:
        spark: a SparkSession (its ``spark.sql.streaming.stateStore.providerClass`` is set
            to RocksDB here, before the query starts; a query keeps the provider it
            started with).
        input_dir: directory written by ``write_input_files``.
        output_dir: Parquet file sink directory.
        checkpoint_dir: the query's checkpoint location (offsets, commits, state).
        variant: ``textbook`` or ``batched``.

    Returns:
        The running ``StreamingQuery`` (trigger ``availableNow``: it stops by itself
        once every file is processed and the last no-data batch has fired the timers).
    """
    from pyspark.sql.types import StructType

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    schema = StructType.fromJson(json.loads(_spark_schema_json()))
    streams = []
    for origin in sorted(os.listdir(input_dir)):
        streams.append(
            spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
            .parquet(os.path.join(input_dir, origin))
            .select(*PROCESSOR_INPUT)
            .withWatermark(EVENT_TIME_COLUMN, WATERMARK_DELAY))
    if not streams:
        raise ValueError(f"{input_dir}: no partition directories")
    events = streams[0]
    for s in streams[1:]:
        events = events.unionByName(s)
    out = events.groupBy(ROUTE_COLUMN).transformWithStateInPandas(
        statefulProcessor=make_processor(variant), outputStructType=OUTPUT_DDL,
        outputMode="Append", timeMode="EventTime")
    return (out.writeStream.format("parquet").option("path", output_dir)
            .option("checkpointLocation", checkpoint_dir).outputMode("append")
            .trigger(availableNow=True).queryName("flights_tws").start())


def _spark_schema_json() -> str:
    """``INPUT_SCHEMA`` as a Spark schema (timestamps are Spark ``timestamp``, UTC)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(INPUT_SCHEMA).json()


def read_output(spark, output_dir: str) -> tuple[pa.Table, pa.Table, int | None]:
    """The sink's committed rows as ``(windows, late, first_emitted_ms)``: Arrow tables
    (window columns in the spec's types: timestamps ms UTC) and the wall-clock time (ms)
    the processor emitted its first window (None without windows)."""
    df = spark.read.parquet(output_dir)
    table = df.toArrow()
    kind = table.column("kind")
    windows = table.filter(pa.compute.equal(kind, "window"))
    late = table.filter(pa.compute.equal(kind, "late"))
    first_emitted_ms = pa.compute.min(windows.column("emitted_at_ms")).as_py()
    ts = pa.timestamp("ms", tz="UTC")
    windows = pa.table({
        "origin": windows.column("origin"), "dest": windows.column("dest"),
        "window_start": windows.column("window_start").cast(ts),
        "window_end": windows.column("window_end").cast(ts),
        "flights": windows.column("flights"), "cancelled": windows.column("cancelled"),
        "dep_delay_mean": windows.column("dep_delay_mean"), "dep_delay_max": windows.column("dep_delay_max"),
    })
    return windows, late, first_emitted_ms


def run(spark, plan: EpochPlan, input_dir: str, work_dir: str, variant: str = "textbook",
        progress=print) -> dict:
    """Run the query to the end of the input, check it against the oracle, return timings.

    Args:
        spark: the SparkSession.
        plan: the epoch plan ``input_dir`` was written from.
        input_dir: ``write_input_files`` output.
        work_dir: scratch directory for the sink and the checkpoint (emptied first).
        variant: ``textbook`` or ``batched``.
        progress: called with a progress line every ~10 s.

    Returns:
        ``{"events", "seconds", "epochs", "epoch_seconds" (list, s), "first_output_s",
        "late", "dropped_by_watermark", "correct": True}``; seconds exclude session start.

    Raises:
        AssertionError: the output differs from the oracle, or an event was late.
    """
    shutil.rmtree(work_dir, ignore_errors=True)
    out_dir, ckpt_dir = os.path.join(work_dir, "out"), os.path.join(work_dir, "checkpoint")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(len(plan.epochs) + 10))
    previous_provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    started, started_wall = time.perf_counter(), time.time()
    query = start_query(spark, input_dir, out_dir, ckpt_dir, variant)
    try:
        last_report = started
        while query.isActive:
            query.awaitTermination(1.0)
            if time.perf_counter() - last_report >= 10:
                last_report = time.perf_counter()
                p = query.lastProgress or {}
                progress(f"spark-tws: batch {p.get('batchId', '-')} of ~{len(plan.epochs) + 1}, "
                         f"{last_report - started:.0f} s")
        seconds = time.perf_counter() - started
        if query.exception() is not None:
            raise RuntimeError(f"spark-tws query failed: {query.exception()}")
        progresses = query.recentProgress
    finally:
        if query.isActive:
            query.stop()
        if previous_provider is not None:
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", previous_provider)
        else:
            spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    windows, late, first_emitted_ms = read_output(spark, out_dir)
    check_output(windows, plan)
    dropped = sum(op.get("numRowsDroppedByWatermark", 0) for p in progresses for op in p.get("stateOperators", []))
    assert late.num_rows == 0 and dropped == 0, \
        f"spark-tws: {late.num_rows} late events, {dropped} rows dropped by the watermark (expected none)"
    epoch_seconds = [p["batchDuration"] / 1000 for p in progresses if p.get("numInputRows", 0) > 0]
    # The file sink reports no row counts (numOutputRows -1): the first window's output
    # is committed at the end of the batch that was running when the processor emitted it.
    first_output_s = None
    if first_emitted_ms is not None:
        for p in progresses:
            end_s = pd.Timestamp(p["timestamp"]).timestamp() + p["batchDuration"] / 1000
            if end_s * 1000 >= first_emitted_ms:
                first_output_s = end_s - started_wall
                break
    return {"events": plan.events, "seconds": seconds, "epochs": len(epoch_seconds),
            "epoch_seconds": epoch_seconds, "first_output_s": first_output_s, "late": late.num_rows,
            "dropped_by_watermark": dropped, "correct": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(ap)
    ap.add_argument("--variant", choices=VARIANTS, default="textbook")
    args = ap.parse_args(argv)

    def run_on_spark(plan: EpochPlan, input_dir: str, work_dir: str) -> dict:
        from dkvstream.operators.spark.session import get_spark

        spark = get_spark({"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"})
        return dict(run(spark, plan, input_dir, work_dir, args.variant,
                        progress=lambda line: print(line, file=sys.stderr, flush=True)),
                    engine=f"spark-tws-{args.variant}")

    return run_engine_cli(args, f"spark-tws-{args.variant}", run_on_spark)


if __name__ == "__main__":
    sys.exit(main())
