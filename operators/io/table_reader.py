"""Reads of a table sink's Delta table: point lookups, scans, time travel, Spark.

Snapshot reads: ``version_as_of_epoch(e)`` is the newest table version whose epoch is
at most e; ``scan(..., as_of_epoch=e)`` reads it (Delta time travel), ``as_of_time``
the version current at a wall-clock time.

Filters and view types. delta-rs writes the files of a MERGE with string and binary
columns as Arrow ``string_view`` / ``binary_view`` (in the Parquet file's Arrow schema),
while the table's schema says ``string`` / ``binary``. pyarrow prunes a file's row groups
by comparing a filter's values with the statistics in the file's own types, and has no
kernel comparing ``string`` with ``string_view``: a filter on such a column fails once a
file holds two or more values. ``read_filtered`` therefore prunes files by the Delta
log's statistics and partition values (in the table's types), pushes the filter into
the files written with plain types, and filters the rows of view-typed files after
reading them (cast to the table's types).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pa_fs

from dkvstream.operators.errors import SnapshotVacuumedError
from dkvstream.operators.io.table_layout import BUCKET_COLUMN, EPOCH_METADATA, TableLayout, storage_options
from dkvstream.storage.objectstore import ObjectStore

_VIEW_TYPES = (pa.types.is_string_view, pa.types.is_binary_view)
# Footers read at once when deciding how to filter each file (one GET each on S3).
_FOOTER_READERS = 16


def _has_view_types(schema: pa.Schema) -> bool:
    return any(check(f.type) for f in schema for check in _VIEW_TYPES)


def delta_dataset(dt) -> pads.FileSystemDataset:
    """``dt.to_pyarrow_dataset()`` (``dt`` a ``deltalake.DeltaTable``), reading a table in
    a local directory through Arrow's own ``LocalFileSystem``.

    deltalake's default filesystem is a Python one (``pyarrow.fs.PyFileSystem``): every
    byte the scan reads arrives as a Python-owned buffer, and the scan's cleanup on
    Arrow's worker threads after ``to_table`` returns can then abort a script that exits
    right away (``dkvstream.operators.io.arrow_input`` says how). Arrow's own filesystem hands the
    scan Arrow-owned buffers. A table on S3 still reads through deltalake's filesystem.
    """
    uri = urlparse(dt.table_uri)
    if uri.scheme != "file":
        return dt.to_pyarrow_dataset()
    return dt.to_pyarrow_dataset(filesystem=pa_fs.SubTreeFileSystem(unquote(uri.path), pa_fs.LocalFileSystem()))


def read_filtered(ds: pads.FileSystemDataset, columns: list[str],
                  filter: pc.Expression | None = None) -> pa.Table:
    """``ds.to_table(columns=columns, filter=filter)`` that also works on files whose
    string or binary columns are stored as view types (see module docstring).

    Args:
        ds: a Delta table's dataset (``delta_dataset``): its fragments'
            partition expressions carry the partition values and the log's min/max stats.
        columns: columns to return, in this order.
        filter: a ``pyarrow.compute`` expression over the dataset's columns, or None.

    Returns:
        The matching rows (in no particular order), with the dataset's column types.
    """
    if filter is None:
        return ds.to_table(columns=columns)
    fragments = list(ds.get_fragments(filter=filter))  # pruned by partitions and Delta stats
    with ThreadPoolExecutor(min(_FOOTER_READERS, max(1, len(fragments)))) as pool:
        views = list(pool.map(lambda f: _has_view_types(f.physical_schema), fragments))

    def subset(pick: bool) -> pads.FileSystemDataset:
        return pads.FileSystemDataset([f for f, v in zip(fragments, views) if v == pick], ds.schema,
                                      ds.format, ds.filesystem)

    plain = subset(False).to_table(columns=columns, filter=filter)
    # Every column: the filter may name any (an Expression does not list its fields).
    viewed = subset(True).to_table().filter(filter).select(columns)
    return pa.concat_tables([plain, viewed])


class TableReader(TableLayout):
    """Reads of the Delta table of a ``TableLayout`` (``TableSink`` is one): the current
    table, a snapshot as of an epoch or a time, point lookups, scans, Spark.

    Args: as ``TableLayout``.
    """

    def open(self, store: ObjectStore, job_prefix: str, as_of_epoch: int | None = None,
             as_of_time: datetime | None = None):
        """The ``deltalake.DeltaTable``: current, as of a committed epoch, or as of a
        wall-clock time (the newest version whose commit timestamp is at or before it;
        a tz-aware datetime).

        Raises:
            LookupError: no table version holds an epoch <= ``as_of_epoch``, or none
                was committed by ``as_of_time``.
            SnapshotVacuumedError: (a ``LookupError``) a VACUUM may have deleted files
                of the version asked for.
            ValueError: both ``as_of_epoch`` and ``as_of_time`` given.
        """
        from deltalake import DeltaTable

        if as_of_epoch is not None and as_of_time is not None:
            raise ValueError(f"table sink {self.name}: give as_of_epoch or as_of_time, not both")
        dt = DeltaTable(self.table_uri(store, job_prefix), storage_options=storage_options(store))
        if as_of_epoch is None and as_of_time is None:
            return dt
        history = dt.history()
        if as_of_epoch is not None:
            version = self.version_as_of_epoch(dt, as_of_epoch, history)
            asked = f"epoch {as_of_epoch}"
            dt.load_as_version(version)
        else:
            # By the commits' own timestamps (what history() shows), not the log files'
            # modification times that delta-rs's datetime time travel uses: those trail
            # the commit by the write's duration, so a commit's own instant could resolve
            # to the version before it.
            at_ms = as_of_time.timestamp() * 1000
            asked = f"time {as_of_time.isoformat()}"
            version = max((h["version"] for h in history if h["timestamp"] <= at_ms), default=None)
            if version is None:
                raise LookupError(f"table sink {self.name}: no version of {dt.table_uri} as of {asked}")
            dt.load_as_version(version)
        self._check_not_vacuumed(dt.table_uri, history, version, asked)
        return dt

    def _check_not_vacuumed(self, uri: str, history: list[dict], version: int, asked: str) -> None:
        """Raises ``SnapshotVacuumedError`` if a VACUUM may have deleted files of ``version``.

        A VACUUM started at time T with retention R deletes the files that commits older
        than T - R removed. A file of ``version`` is removed, if ever, by a later commit,
        so the version is intact when the commit right after it is younger than T - R
        (or there is no later commit). Decided from the log's ``VACUUM START`` entries,
        without listing files."""
        following = next((h for h in history if h["version"] == version + 1), None)
        if following is None:
            return
        for h in history:
            if h.get("operation") != "VACUUM START" or h["version"] <= version:
                continue
            params = h.get("operationParameters") or {}
            retention_ms = int(params.get("specifiedRetentionMillis")
                               or params.get("defaultRetentionMillis") or 0)
            horizon_ms = h["timestamp"] - retention_ms
            if following["timestamp"] < horizon_ms:
                horizon = datetime.fromtimestamp(horizon_ms / 1000).astimezone().isoformat()
                raise SnapshotVacuumedError(
                    f"table sink {self.name}: {asked} reads version {version} of {uri}, whose "
                    f"files the VACUUM at version {h['version']} (retention "
                    f"{retention_ms / 3_600_000:g} h) may have deleted; time travel reaches only "
                    f"versions superseded after {horizon}")

    def version_as_of_epoch(self, dt, epoch: int, history: list[dict] | None = None) -> int:
        """The newest table version whose commit holds an epoch <= ``epoch`` (version 0,
        the empty table, when the first epochs wrote no rows).

        Args:
            dt: the ``DeltaTable``.
            epoch: a committed epoch.
            history: ``dt.history()``, if the caller has read it already.

        Raises:
            LookupError: the table's history no longer reaches back that far.
        """
        best = None
        for entry in dt.history() if history is None else history:
            e = entry.get(EPOCH_METADATA)
            v = entry["version"]
            if e is not None and int(e) <= epoch and (best is None or v > best):
                best = v
            if v == 0 and best is None:
                best = 0
        if best is None:
            raise LookupError(f"table sink {self.name}: no version of {dt.table_uri} as of epoch {epoch}")
        return best

    def dataset(self, store: ObjectStore, job_prefix: str, as_of_epoch: int | None = None,
                as_of_time: datetime | None = None) -> pads.Dataset:
        """A ``pyarrow.dataset.Dataset`` of the table (current, as of an epoch or a
        time); it still has the ``_bucket`` column. DuckDB reads it after
        ``con.register(name, ds)``. A filter on a string or binary column pushed into it
        (a DuckDB ``WHERE`` on such a column too) fails on view-typed files (module
        docstring) with pyarrow's ``NotImplemented ... (string, string_view)``: filter
        those columns through ``scan`` (or register its result)."""
        return delta_dataset(self.open(store, job_prefix, as_of_epoch, as_of_time))

    def scan(self, store: ObjectStore, job_prefix: str, columns: list[str] | None = None,
             filter: pc.Expression | None = None, as_of_epoch: int | None = None,
             as_of_time: datetime | None = None) -> pa.Table:
        """Rows of the table with projection and a predicate, current or as of an epoch.

        Args:
            columns: columns to read (default: the schema's).
            filter: a ``pyarrow.compute`` expression; files are pruned by partition
                values and the Delta log's statistics (``read_filtered``).
            as_of_epoch: read the snapshot of this committed epoch (time travel).
            as_of_time: or the snapshot current at this time (tz-aware datetime).

        Returns:
            The matching rows, in no particular order.
        """
        ds = self.dataset(store, job_prefix, as_of_epoch, as_of_time)
        return read_filtered(ds, columns or self.schema.names, filter)

    def to_spark(self, spark, store: ObjectStore, job_prefix: str, as_of_epoch: int | None = None):
        """A Spark DataFrame of the table (current or as of an epoch) without the
        delta-spark jars (they come from Maven, which this platform does not reach):
        the snapshot's Parquet files as the Delta log lists them, read with
        ``spark.read.parquet``. Exact because delta-rs writes neither deletion vectors
        nor column mapping. Partition columns are not inside the files: Spark restores
        them from the ``col=value`` directories (``basePath``); they are cast back to
        the schema's types."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        dt = self.open(store, job_prefix, as_of_epoch)
        files = dt.file_uris()
        if not files:
            from pyspark.sql.pandas.types import from_arrow_schema

            return spark.createDataFrame([], from_arrow_schema(self.schema))
        df = spark.read.option("basePath", dt.table_uri).parquet(*files)
        return df.select(*[F.col(f.name).cast(from_arrow_type(f.type)).alias(f.name)
                           for f in self.schema])

    def lookup(self, store: ObjectStore, job_prefix: str, keys: pa.Table,
               columns: list[str] | None = None, as_of_epoch: int | None = None) -> pa.Table:
        """Rows for the given primary keys, reading only their hash buckets' files.

        Args:
            keys: a table of the key columns (one row per key asked for).
            columns: columns to return (default: the schema's).
            as_of_epoch: look up in the snapshot of this committed epoch.

        Returns:
            The rows found; keys not in the table are absent from the result.
        """
        keys = keys.append_column(BUCKET_COLUMN, self.buckets_of(keys))
        dt = self.open(store, job_prefix, as_of_epoch)
        return self._lookup(dt, keys, columns or self.schema.names)

    def _lookup(self, dt, keys: pa.Table, columns: list[str]) -> pa.Table:
        """Rows of ``dt`` whose key is among ``keys`` (key columns and ``_bucket``)."""
        filt = pc.field(BUCKET_COLUMN).isin(pc.unique(keys.column(BUCKET_COLUMN)))
        for c in self.primary_key:
            filt = filt & pc.field(c).isin(pc.unique(keys.column(c)))
        wanted = list(dict.fromkeys([*self.primary_key, *columns]))
        found = read_filtered(delta_dataset(dt), wanted, filt)
        # isin per column over-selects for composite keys: keep exact tuples only.
        if len(self.primary_key) > 1:
            exact = keys.select(self.primary_key).group_by(self.primary_key).aggregate([])
            found = found.join(exact, self.primary_key, join_type="inner")
        return found.select(columns)

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """The whole current table (the schema's columns; empty before the first commit)."""
        from deltalake import DeltaTable

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            return self.schema.empty_table()
        return delta_dataset(DeltaTable(uri, storage_options=opts)).to_table(
            columns=self.schema.names)
