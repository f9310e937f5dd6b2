"""The flights benchmark input shared by dkvstream and the baselines: epoch plan, files, oracle.

Every engine sees the same events in the same micro-batches: dkvstream's planning rule
(``operators/runtime/driver.py``: each epoch reads an equal share, ``ceil(events_per_epoch /
open partitions)``, of every unfinished source partition) is replayed here, and epoch
``i``'s share of partition ``p`` becomes the Parquet file ``<dir>/<p>/<i:06d>.parquet``.
A streaming reader that takes one file per partition per trigger (Spark:
``maxFilesPerTrigger=1`` on one source per partition) then runs exactly dkvstream's
micro-batches. dkvstream reads the same files through ``EpochFilesSource``.

``--max-events N`` runs a prefix: the whole epochs that cover the first N events of
the plan. The prefix oracle is a pandas groupby over exactly those rows with every
window closed, the same end-of-input semantics as the full run (watermark to +infinity).
"""
from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

# Columns of the input files: the route key, the event time and the columns the
# dkvstream job carries with each event (examples/flights.py EVENT_COLUMNS).
from dkvstream.examples.flights import EVENT_COLUMNS
from dkvstream.examples.flights_data import DAY_MS, ORIGINS, replay_partitions
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.io.sources import Source

ROUTE_COLUMN = "route"
EVENT_TIME_COLUMN = "event_time"
# A row with this route is an end-of-input marker, not a flight (see ``write_input_files``).
END_OF_INPUT_ROUTE = ""
# 2200-01-01T00:00Z: past any scaled year, inside pandas' nanosecond range (< 2262).
END_OF_INPUT_MS = 7_258_118_400_000

INPUT_SCHEMA = pa.schema(
    [pa.field(ROUTE_COLUMN, pa.string()), pa.field(EVENT_TIME_COLUMN, pa.timestamp("ms", tz="UTC"))]
    + [pa.field(c, pa.string() if c in ("carrier", "origin", "dest") else pa.int64())
       for c in EVENT_COLUMNS])


@dataclass(frozen=True)
class EpochPlan:
    """Offset ranges per epoch: ``epochs[i][partition] = (start, end)``.

    Attributes:
        scale: copies of the 2013 data.
        events_per_epoch: micro-batch size, events over all partitions.
        epochs: per epoch, ``{partition: (start, end)}``, end exclusive.
        ends: end offset per partition (the run's input is rows ``[0, end)``).
    """

    scale: int
    events_per_epoch: int
    epochs: list[dict[str, tuple[int, int]]]
    ends: dict[str, int]

    @property
    def events(self) -> int:
        """Events in the run."""
        return sum(self.ends.values())

    @property
    def full(self) -> bool:
        """True when the run covers every flight of every partition."""
        return self.ends == {p: t.num_rows for p, t in replay_partitions(self.scale).items()}


def plan_epochs(scale: int, events_per_epoch: int, max_events: int | None = None,
                partitions: tuple[str, ...] = ORIGINS, max_per_partition: int | None = None) -> EpochPlan:
    """dkvstream's epoch plan for the flights source, optionally cut to a prefix.

    Args:
        scale: copies of the year.
        events_per_epoch: micro-batch size (events over all partitions), >= 1.
        max_events: stop after the first epoch whose end reaches this many events
            (whole epochs; None: all).
        partitions: partitions that have input; the others count as empty.
        max_per_partition: cap each partition at this many rows (None: all).

    Returns:
        The ``EpochPlan``.

    Raises:
        ValueError: ``events_per_epoch`` < 1 or an unknown partition.
    """
    if events_per_epoch < 1:
        raise ValueError(f"events_per_epoch must be >= 1, got {events_per_epoch}")
    unknown = set(partitions) - set(ORIGINS)
    if unknown:
        raise ValueError(f"unknown flights partitions {sorted(unknown)}; known: {ORIGINS}")
    sizes = {p: t.num_rows for p, t in replay_partitions(scale).items()}
    limit = {p: (min(sizes[p], max_per_partition) if max_per_partition is not None else sizes[p])
             if p in partitions else 0 for p in ORIGINS}
    offsets = {p: 0 for p in ORIGINS}
    epochs: list[dict[str, tuple[int, int]]] = []
    total = 0
    while any(offsets[p] < limit[p] for p in ORIGINS):
        if max_events is not None and total >= max_events:
            break
        open_parts = [p for p in ORIGINS if offsets[p] < limit[p]]
        share = -(-events_per_epoch // len(open_parts))
        epoch = {p: (offsets[p], min(limit[p], offsets[p] + share)) for p in ORIGINS}
        epochs.append(epoch)
        for p, (a, b) in epoch.items():
            total += b - a
            offsets[p] = b
    return EpochPlan(scale, events_per_epoch, epochs, dict(offsets))


def input_rows(scale: int, partition: str, start: int, end: int) -> pa.Table:
    """Rows ``[start, end)`` of one partition in the input-file schema."""
    t = replay_partitions(scale)[partition].slice(start, end - start)
    route = pa.compute.binary_join_element_wise(t.column("origin"), t.column("dest"), "-")
    cols = {ROUTE_COLUMN: route,
            EVENT_TIME_COLUMN: t.column("event_time_ms").cast(pa.timestamp("ms", tz="UTC")),
            **{c: t.column(c) for c in EVENT_COLUMNS}}
    return pa.table(cols, schema=INPUT_SCHEMA)


def end_of_input_row(partition: str) -> pa.Table:
    """The marker row closing a partition: event time ``END_OF_INPUT_MS``, no flight."""
    cols = {f.name: pa.nulls(1, f.type) for f in INPUT_SCHEMA}
    cols[ROUTE_COLUMN] = pa.array([END_OF_INPUT_ROUTE])
    cols[EVENT_TIME_COLUMN] = pa.array([END_OF_INPUT_MS], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    cols["origin"] = pa.array([partition])
    return pa.table(cols, schema=INPUT_SCHEMA)


def write_input_files(plan: EpochPlan, directory: str) -> dict[str, list[str]]:
    """Write epoch ``i``'s share of partition ``p`` to ``<directory>/<p>/<i:06d>.parquet``.

    The last file of each partition ends with an end-of-input row (``end_of_input_row``):
    engines without an end-of-input signal (Spark's file source) need it to move the
    watermark past every window; engines read it as "this partition is done" and skip
    it. File modification times increase with the epoch, so "oldest first" is epoch order.

    Returns:
        ``{partition: [paths in epoch order]}`` (partitions without rows are absent).
    """
    files: dict[str, list[str]] = {}
    last = {p: max((i for i, e in enumerate(plan.epochs) if e[p][1] > e[p][0]), default=None)
            for p in ORIGINS}
    for i, epoch in enumerate(plan.epochs):
        for p, (a, b) in epoch.items():
            if b <= a:
                continue
            table = input_rows(plan.scale, p, a, b)
            if i == last[p]:
                table = pa.concat_tables([table, end_of_input_row(p)])
            os.makedirs(os.path.join(directory, p), exist_ok=True)
            path = os.path.join(directory, p, f"{i:06d}.parquet")
            pq.write_table(table, path)
            os.utime(path, ns=(1_700_000_000_000_000_000 + i * 1_000_000_000,) * 2)
            files.setdefault(p, []).append(path)
    return files


class EpochFilesSource(Source):
    """dkvstream's source over the files ``write_input_files`` wrote: the same Parquet
    files Spark and Bytewax read, read inside the run's clock.

    Nothing is read at construction: the first ``end_offsets`` call lists each
    partition's files and reads their footers (row counts); each ``read`` reads the
    files its offset range overlaps (every column the job carries, ``EVENT_COLUMNS``,
    plus the route and the event time) and converts them to the runtime's columns. The
    end-of-input row that closes each partition's last file is not an event: it is
    dropped, and the partition's end offset is one less than its files' rows. A run
    whose epochs follow the plan reads each file exactly once.

    Args:
        directory: ``write_input_files`` output (``<directory>/<partition>/*.parquet``).
    """

    name = "flights_files"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._index: dict[str, tuple[list[int], list[str]]] | None = None
        self._last: tuple[str, pa.Table] | None = None  # the file read last, for split reads

    def partitions(self) -> list[str]:
        return list(ORIGINS)

    def _files(self) -> dict[str, tuple[list[int], list[str]]]:
        """``{partition: (start offset of each file, paths)}``; the last start is the end."""
        if self._index is None:
            index = {}
            for p in ORIGINS:
                d = os.path.join(self.directory, p)
                names = sorted(os.listdir(d)) if os.path.isdir(d) else []
                paths = [os.path.join(d, f) for f in names]
                starts = [0]
                for path in paths:
                    starts.append(starts[-1] + pq.read_metadata(path).num_rows)
                if paths:
                    starts[-1] -= 1  # the end-of-input row
                index[p] = (starts, paths)
            self._index = index
        return self._index

    def end_offsets(self) -> dict[str, int]:
        return {p: starts[-1] for p, (starts, _) in self._files().items()}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([INPUT_SCHEMA.field(c) for c in EVENT_COLUMNS])

    def _read_file(self, path: str) -> pa.Table:
        if self._last is None or self._last[0] != path:
            self._last = (path, pq.read_table(path, columns=[f.name for f in INPUT_SCHEMA]))
        return self._last[1]

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """Events ``[start, end)`` of ``partition`` as ``key`` (binary route), ``timestamp``
        (int64 ms) and ``EVENT_COLUMNS``.

        Raises:
            KeyError: unknown partition.
            IndexError: range outside ``[0, end_offsets()[partition]]``.
            ValueError: a partition's last file does not end with the end-of-input row.
        """
        if partition not in ORIGINS:
            raise KeyError(f"{self.name}: unknown partition {partition!r}; known: {ORIGINS}")
        starts, paths = self._files()[partition]
        if not 0 <= start <= end <= starts[-1]:
            raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside "
                             f"[0, {starts[-1]}]")
        pieces = []
        i = bisect.bisect_right(starts, start) - 1
        while start < end:
            table = self._read_file(paths[i])
            if i == len(paths) - 1 and table.column(ROUTE_COLUMN)[-1].as_py() != END_OF_INPUT_ROUTE:
                raise ValueError(f"{paths[i]}: the last file of {partition} does not end with the "
                                 "end-of-input row; rewrite the input with write_input_files")
            stop = min(end, starts[i + 1])
            pieces.append(table.slice(start - starts[i], stop - start))
            start, i = stop, i + 1
        t = pa.concat_tables(pieces) if pieces else INPUT_SCHEMA.empty_table()
        return pa.table({KEY_COLUMN: t.column(ROUTE_COLUMN).cast(pa.binary()),
                         TIMESTAMP_COLUMN: t.column(EVENT_TIME_COLUMN).cast(pa.int64()),
                         **{c: t.column(c) for c in EVENT_COLUMNS}})


def prefix_oracle(plan: EpochPlan) -> pd.DataFrame:
    """Expected output of a run over the plan's rows, every window closed at the end.

    For a full run this is the spec's oracle (``route_daily_delays_oracle``, pandas over
    the CSV); for a prefix, the same grouping over the replay rows ``[0, end)`` with
    pyarrow's ``group_by`` (the smoke test checks the two agree on the full data).
    """
    from dkvstream.examples.flights_oracle import route_daily_delays_oracle

    if plan.full:
        return route_daily_delays_oracle(plan.scale)
    rows = pa.concat_tables([
        replay_partitions(plan.scale)[p].slice(0, n)
        .select(["origin", "dest", "dep_time", "dep_delay", "event_time_ms"])
        for p, n in plan.ends.items() if n])
    ms = rows.column("event_time_ms").to_numpy()
    rows = rows.append_column("window_start", pa.array(ms - ms % DAY_MS))
    agg = rows.group_by(["origin", "dest", "window_start"]).aggregate([
        ([], "count_all"), ("dep_time", "count"), ("dep_delay", "mean"), ("dep_delay", "max")])
    flights = agg.column("count_all")
    start = agg.column("window_start")
    ts = pa.timestamp("ms", tz="UTC")
    return pa.table({
        "origin": agg.column("origin"), "dest": agg.column("dest"),
        "window_start": start.cast(ts), "window_end": pa.compute.add(start, DAY_MS).cast(ts),
        "flights": flights, "cancelled": pa.compute.subtract(flights, agg.column("dep_time_count")),
        "dep_delay_mean": agg.column("dep_delay_mean"),
        "dep_delay_max": agg.column("dep_delay_max").cast(pa.float64()),
    }).to_pandas()


def check_output(output: pa.Table, plan: EpochPlan) -> None:
    """Assert an engine's output equals ``prefix_oracle(plan)`` (``flights_oracle.assert_equals_oracle`` rules:
    each route and window once, counts equal, means and maxima to 1e-9 relative).

    Raises:
        AssertionError: naming the first differing column and row.
    """
    from dkvstream.examples.flights_oracle import assert_equals_oracle

    assert_equals_oracle(output, prefix_oracle(plan))


def add_run_arguments(ap) -> None:
    """The command-line options every engine script shares (argparse ``ap``)."""
    ap.add_argument("--scale", type=int, default=1, help="copies of the 2013 data (336,776 events each)")
    ap.add_argument("--events-per-epoch", type=int, default=50_000, help="micro-batch size, events")
    ap.add_argument("--max-events", type=int, default=None,
                    help="run the whole epochs covering the first N events (oracle over exactly those)")
    ap.add_argument("--partitions", default=",".join(ORIGINS), help="partitions with input (others empty)")
    ap.add_argument("--max-per-partition", type=int, help="cap each partition at this many rows")
    ap.add_argument("--input-dir", help="reuse files write_input_files wrote for this plan")
    ap.add_argument("--work-dir", help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", help="write the result dict to this file")


def run_engine_cli(args, engine: str, run) -> int:
    """Plan, write the input files (unless ``--input-dir``), ``run(plan, input_dir,
    work_dir) -> result dict``, print the events/s line and write ``--json``.

    Returns:
        Exit status 0 (an ``AssertionError`` from the oracle check propagates).
    """
    plan = plan_epochs(args.scale, args.events_per_epoch, args.max_events,
                       tuple(args.partitions.split(",")), args.max_per_partition)
    tmp = tempfile.mkdtemp(prefix=f"{engine}-")
    try:
        input_dir = args.input_dir or os.path.join(tmp, "input")
        if not args.input_dir:
            write_input_files(plan, input_dir)
        result = run(plan, input_dir, args.work_dir or os.path.join(tmp, "work"))
        result.setdefault("engine", engine)
        result["full"] = plan.full
        what = "all" if plan.full else "a prefix of"
        print(f"{result['engine']}: {what} {result['events']:,} events, output equals the oracle, in "
              f"{result['seconds']:.1f} s = {result['events'] / result['seconds']:,.0f} events/s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
