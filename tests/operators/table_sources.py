"""``TableSource``: a small in-memory source for tests, in an importable module so that
Spark's read tasks can unpickle it (a class defined in a test file cannot be)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.columns import OFFSET_COLUMN
from dkvstream.operators.io.sources import Source


class TableSource(Source):
    """Partitions given as Arrow tables of ``key``, ``timestamp`` and value columns.

    Args:
        name: the source's name.
        tables: ``{partition: table}``; a table with an ``_offset`` column has offsets
            with gaps (row i is at that offset), else row i is offset i.
        bounded: what ``bounded`` says (a test of ``UnionSource``'s checks).
    """

    def __init__(self, name: str, tables: dict[str, pa.Table], bounded: bool = True) -> None:
        self.name = name
        self.tables = tables
        self._bounded = bounded

    @property
    def bounded(self) -> bool:
        return self._bounded

    def partitions(self) -> list[str]:
        return list(self.tables)

    def end_offsets(self) -> dict[str, int]:
        return {p: (t.column(OFFSET_COLUMN)[-1].as_py() + 1 if len(t) else 0) if OFFSET_COLUMN in t.column_names
                else t.num_rows for p, t in self.tables.items()}

    @property
    def value_schema(self) -> pa.Schema:
        t = next(iter(self.tables.values()))
        return pa.schema([f for f in t.schema if f.name not in ("key", "timestamp", OFFSET_COLUMN)])

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        t = self.tables[partition]
        if OFFSET_COLUMN not in t.column_names:
            return t.slice(start, end - start)
        offsets = t.column(OFFSET_COLUMN)
        return t.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))
