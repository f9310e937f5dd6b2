"""Several sources as one job input: Flink's ``union`` and keyed ``connect``.

``UnionSource([flights, weather])`` is a ``Source`` whose partitions are every child's
partitions, named ``<child name>/<partition>``. The runtime plans, reads (in read tasks,
one per split, as for any source), checkpoints and aligns them as partitions of one
source, so:

* **Watermarks per source.** The watermark is the minimum over every partition of every
  child, as an operator with several inputs takes the minimum of its inputs' watermarks
  in Flink; each child's partitions keep their own event-time progress, idleness and
  watermark alignment (``Job.max_watermark_drift_ms`` keeps a fast child from running
  ahead of a slow one).
* **Union.** Children with the same value columns feed the first operator one stream.
* **Connect.** Children with different value columns are one keyed stream whose value
  columns are the union of theirs (a column a child lacks is null in its events), plus
  the ``input`` column naming the child an event came from. Events of both children with
  the same key reach the same key group, task and keyed state, as Flink's
  ``connect(...).keyBy(...)`` followed by a ``KeyedCoProcessFunction``: the operator
  tells the inputs apart by ``event.value["input"]`` (``examples/flights_weather.py``).

Value columns that two children both have must have the same type. The children must
be all bounded or all live (a bounded child finishing would otherwise hold back a live
job's watermark for good).
"""
from __future__ import annotations

import functools

import pyarrow as pa

from dkvstream.operators.api.columns import (
    ERROR_COLUMN,
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    OFFSET_COLUMN,
    RAW_VALUE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.io.sources import Source, check_slice

INPUT_COLUMN = "input"


class UnionSource(Source):
    """The union of ``sources`` as one source (module docstring).

    Args:
        sources: at least two sources with distinct names without ``/``.
        name: this source's name (the Dagster asset name); default the children's names
            joined by ``+``.
        input_column: the value column naming each event's child source (``"input"``).

    Raises:
        ValueError: fewer than two sources, a repeated or ``/``-holding name, or bounded
            and live children mixed. A child with a value column named ``input_column`` is
            refused when ``value_schema`` is first read (by the driver's first epoch, before
            anything is read or written), not here: reading a child's schema may load its
            data.
    """

    def __init__(self, sources: list[Source], name: str | None = None, input_column: str = INPUT_COLUMN) -> None:
        if len(sources) < 2:
            raise ValueError(f"UnionSource needs at least two sources, got {len(sources)}")
        names = [s.name for s in sources]
        if len(set(names)) != len(names) or any("/" in n for n in names):
            raise ValueError(f"UnionSource: source names must be distinct and without '/', got {names}; "
                             f"give each source its own name")
        if len({s.bounded for s in sources}) > 1:
            raise ValueError(f"UnionSource: sources {names} mix bounded and live ones; union only bounded or "
                             f"only live sources (a finished bounded source would hold a live job's watermark)")
        self.sources = list(sources)
        self.name = name or "+".join(names)
        self.input_column = input_column
        self._by_name = {s.name: s for s in sources}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("value_schema", None)  # the cached_property: recomputed where needed
        return state

    def _child(self, partition: str) -> tuple[Source, str]:
        name, sep, inner = partition.partition("/")
        if not sep or name not in self._by_name:
            raise KeyError(f"source {self.name}: unknown partition {partition!r} (partitions are "
                           f"'<source>/<partition>' of sources {list(self._by_name)})")
        return self._by_name[name], inner

    def attach(self, store, job_prefix: str) -> None:
        for s in self.sources:
            s.attach(store, job_prefix)

    def use_tasks(self, map_in_tasks) -> None:
        for s in self.sources:
            s.use_tasks(map_in_tasks)

    def partitions(self) -> list[str]:
        return [f"{s.name}/{p}" for s in self.sources for p in s.partitions()]

    def _child_offsets(self, child: Source, offsets: dict[str, int]) -> dict[str, int]:
        head = f"{child.name}/"
        return {p[len(head):]: o for p, o in offsets.items() if p.startswith(head)}

    def snapshot_state(self, offsets: dict[str, int]) -> dict | None:
        """``{child name: its snapshot_state}`` of the children that record one; None if
        none does."""
        states = {s.name: s.snapshot_state(self._child_offsets(s, offsets)) for s in self.sources}
        return {name: state for name, state in states.items() if state is not None} or None

    def restore_state(self, offsets: dict[str, int], state: dict | None) -> None:
        for s in self.sources:
            s.restore_state(self._child_offsets(s, offsets), (state or {}).get(s.name))

    def start_offset(self, partition: str) -> int:
        child, inner = self._child(partition)
        return child.start_offset(inner)

    def end_offsets(self) -> dict[str, int]:
        return {f"{s.name}/{p}": end for s in self.sources for p, end in s.end_offsets().items()}

    @property
    def bounded(self) -> bool:
        return self.sources[0].bounded

    @functools.cached_property
    def value_schema(self) -> pa.Schema:
        """``input_column`` (string), then each child's value columns in order, first
        appearance first, all nullable.

        Raises:
            TypeError: two children's columns of one name differ in type.
        """
        fields: dict[str, pa.Field] = {}
        owner: dict[str, str] = {}
        for s in self.sources:
            for f in s.value_schema:
                if f.name == self.input_column:
                    raise ValueError(f"UnionSource {self.name}: source {s.name} has a value column "
                                     f"{f.name!r}, the name of the input column; pass input_column=")
                if f.name in fields and fields[f.name].type != f.type:
                    raise TypeError(f"UnionSource {self.name}: column {f.name!r} is {fields[f.name].type} in "
                                    f"source {owner[f.name]} and {f.type} in source {s.name}; cast one in its "
                                    f"read so both have the same type")
                fields.setdefault(f.name, f.with_nullable(True))
                owner.setdefault(f.name, s.name)
        return pa.schema([pa.field(self.input_column, pa.string()), *fields.values()])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        child, inner = self._child(partition)
        table = check_slice(child, inner, start, end, child.read(inner, start, end))
        n = table.num_rows
        columns = {KEY_COLUMN: table.column(KEY_COLUMN), TIMESTAMP_COLUMN: table.column(TIMESTAMP_COLUMN)}
        for f in self.value_schema:
            if f.name == self.input_column:
                columns[f.name] = pa.array([child.name] * n, pa.string())
            else:
                columns[f.name] = table.column(f.name) if f.name in table.column_names else pa.nulls(n, f.type)
        for extra in (ERROR_COLUMN, RAW_VALUE_COLUMN, OFFSET_COLUMN, INGEST_TIME_COLUMN):
            if extra in table.column_names:
                columns[extra] = table.column(extra)
        return pa.table(columns)

    def close(self) -> None:
        errors = []
        for s in self.sources:
            try:
                s.close()
            except Exception as e:  # noqa: BLE001 - every child is closed; the first error is raised
                errors.append(e)
        if errors:
            raise errors[0]
