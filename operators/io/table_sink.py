"""An upsert table sink: a Delta Lake table with a primary key (delta-rs, ``deltalake``).

What Kudu gives at the end of a stream: a table with a primary key that takes inserts, updates and deletes from a
job, answers point lookups, scans columns with projection and predicates, and reads a snapshot as
of a past commit. The table is a Delta Lake table under ``<job>/sinks/<name>/`` that
any Delta reader opens (pyarrow through ``deltalake``, DuckDB through that dataset,
Spark through ``to_spark`` or delta-spark).

Change rows. The operator output feeding the sink carries the table's columns plus an
optional ``_op`` column: ``"insert"`` (fails when the key exists, as Kudu's INSERT does),
``"upsert"`` (insert or replace the whole row) or ``"delete"`` (remove the key; a
missing key is a no-op, Kudu's DELETE_IGNORE). Without ``_op`` every row is an upsert.
Within one epoch a key's changes apply in emission order; only its net effect is
written. Emission order is only defined inside one key-group range: emit a table key's
rows from one range (key the emitting operator by the table's key); rows of one key from
several ranges apply in range order.

Partitioning (``_bucket`` hash buckets plus an optional range column) is in
``dkvstream.operators.io.table_layout``; reads (lookups, scans, time travel, Spark) in
``dkvstream.operators.io.table_reader``; compaction and vacuum in ``dkvstream.operators.io.table_maintenance``.
``TableSink`` has all of them: it is a ``TableReader``.

Exactly-once, one table commit per epoch. A task writes its change rows as Parquet
under its staging prefix (nothing visible). Before the driver commits epoch e it calls
``prepare``: the inserts of e are checked against the table, which then holds exactly
the epochs up to e-1 (a restart re-publishes the newest checkpoint before it runs
anything), so a duplicate key fails the epoch before its checkpoint exists, naming the
key and the table. After the commit, ``publish`` applies the epoch's net changes with
**one** Delta MERGE whose commit carries the application transaction
(``txn``) ``appId = <job prefix>/<sink>``, ``version = e`` and ``dkvstream.epoch = e``
in its commit info. The MERGE commit is atomic (Delta's log entry
``_delta_log/<version>.json`` is written put-if-absent), and a publish redone after a
crash reads the table's transaction version first and skips an epoch already applied.
An epoch with no change rows writes no commit.

Stores: a local directory or S3 (``storage_options`` passes the store's endpoint and
credentials to delta-rs). The table is written by the driver, one MERGE per epoch.
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dkvstream.operators.errors import InsertConflictError, SnapshotVacuumedError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.io.table_layout import (
    BUCKET_COLUMN,
    DELETE,
    EPOCH_METADATA,
    INSERT,
    OP_COLUMN,
    OPS,
    UPSERT,
    delta_uri,
    storage_options,
)
from dkvstream.operators.io.table_maintenance import compact_table, delta_tables, small_files, vacuum_table
from dkvstream.operators.io.table_reader import TableReader
from dkvstream.storage.objectstore import ObjectStore

# Names this module has always offered (``from dkvstream.operators.io.table_sink import ...``).
__all__ = [
    "BUCKET_COLUMN", "DELETE", "EPOCH_METADATA", "INSERT", "OP_COLUMN", "UPSERT",
    "InsertConflictError", "SnapshotVacuumedError", "TableSink", "compact_table", "delta_tables",
    "delta_uri", "small_files", "storage_options", "vacuum_table",
]

_MERGE_ATTEMPTS = 5


class TableSink(TableReader, Sink):
    """Writes an operator output into a Delta Lake table with a primary key, and reads
    it back (``TableReader``: lookups, scans, time travel).

    Args and raises: as ``TableLayout`` (name, schema, primary_key, hash_buckets,
    range_column).
    """

    # -------------------------------------------------------------- the task side
    def changes_of(self, table: pa.Table) -> pa.Table:
        """The change rows of an operator output: the schema's columns, ``_op`` and
        ``_bucket``.

        Raises:
            ValueError: an ``_op`` value is not insert/upsert/delete, a key is null, or
                a string/binary range column is empty.
        """
        n = table.num_rows
        ops = table.column(OP_COLUMN) if OP_COLUMN in table.column_names else pa.array([UPSERT] * n)
        bad = pc.invert(pc.is_in(pc.fill_null(ops, ""), pa.array(OPS)))
        if pc.any(bad).as_py():
            raise ValueError(f"table sink {self.name}: _op must be one of {OPS}, got "
                             f"{ops.filter(bad)[0].as_py()!r}")
        for c in self.primary_key:
            if table.column(c).null_count:
                raise ValueError(f"table sink {self.name}: key column {c!r} is null in a change row")
        cols = {f.name: (table.column(f.name).cast(f.type) if f.name in table.column_names
                         else pa.nulls(n, f.type)) for f in self.schema}
        self._check_range_values(cols)
        out = pa.table(cols).append_column(OP_COLUMN, pa.array(ops, pa.string()))
        return out.append_column(BUCKET_COLUMN, self.buckets_of(out))

    def _check_range_values(self, cols: dict[str, pa.ChunkedArray]) -> None:
        # Delta stores an empty partition value as null, and the MERGE then fails on the
        # non-nullable key column with an error naming neither the sink nor the row.
        if self.range_column is None:
            return
        values = cols[self.range_column]
        t = values.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            return
        if pc.any(pc.equal(pc.binary_length(values), 0)).as_py():
            raise ValueError(f"table sink {self.name}: range column {self.range_column!r} is empty "
                             f"in a change row; Delta Lake stores an empty partition value as null, "
                             f"so give the range column a non-empty value")

    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(self.changes_of(table), buf, compression="zstd")
        key = f"{staging_prefix}/{self.name}.changes.parquet"
        store.put(key, buf.getvalue())
        return key

    # ------------------------------------------------------------ the driver side
    def _read_staged(self, store: ObjectStore, staged: list[str]) -> pa.Table:
        tables = [pq.read_table(arrow_input(store.get(k))) for k in staged]
        return pa.concat_tables(tables) if tables else self.changes_of(self.schema.empty_table())

    def _existing(self, uri: str, opts: dict | None, changes: pa.Table) -> set[tuple]:
        """Keys among ``changes`` that the table holds now."""
        from deltalake import DeltaTable

        if changes.num_rows == 0 or not DeltaTable.is_deltatable(uri, storage_options=opts):
            return set()
        keys = changes.select([*self.primary_key, BUCKET_COLUMN])
        found = self._lookup(DeltaTable(uri, storage_options=opts), keys, self.primary_key)
        return set(zip(*(found.column(c).to_pylist() for c in self.primary_key)))

    def net_changes(self, changes: pa.Table, existing: set[tuple], epoch: int, where: str) -> pa.Table:
        """Collapses an epoch's change rows (in order) into one row per key: the last
        upsert or insert as ``upsert``, or a ``delete``.

        Raises:
            InsertConflictError: an insert of a key that exists at that point.
        """
        keys = list(zip(*(changes.column(c).to_pylist() for c in self.primary_key)))
        ops = changes.column(OP_COLUMN).to_pylist()
        exists: dict[tuple, bool] = {}
        last: dict[tuple, int] = {}
        for i, (k, op) in enumerate(zip(keys, ops)):
            present = exists.get(k, k in existing)
            if op == INSERT and present:
                raise InsertConflictError(
                    f"table sink {self.name}: epoch {epoch} inserts primary key "
                    f"{dict(zip(self.primary_key, k))} which {where} already holds")
            exists[k] = op != DELETE
            last[k] = i
        rows = changes.take(pa.array(sorted(last.values()), pa.int64()))
        net_ops = pc.if_else(pc.equal(rows.column(OP_COLUMN), DELETE), DELETE, UPSERT)
        return rows.set_column(rows.schema.get_field_index(OP_COLUMN), OP_COLUMN, net_ops)

    def prepare(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> None:
        """Before epoch ``epoch`` commits: check its inserts against the table.

        Raises:
            InsertConflictError: an insert names a key that exists (the epoch fails,
                nothing is committed).
        """
        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        changes = self._read_staged(store, staged)
        inserts = changes.filter(pc.equal(changes.column(OP_COLUMN), INSERT))
        self.net_changes(changes, self._existing(uri, opts, inserts), epoch, f"the table {uri}")

    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            write_deltalake(uri, self.stored_schema().empty_table(), partition_by=self.partition_columns,
                            mode="ignore", storage_options=opts)
        app = self.app_id(job_prefix)
        changes = self._read_staged(store, staged)
        inserts = changes.filter(pc.equal(changes.column(OP_COLUMN), INSERT))
        for attempt in range(_MERGE_ATTEMPTS):
            dt = DeltaTable(uri, storage_options=opts)
            applied = dt.transaction_version(app)
            if applied is not None and applied >= epoch:
                return []  # redone after a crash: this epoch is in the table already
            existing = self._existing(uri, opts, inserts)
            net = self.net_changes(changes, existing, epoch, f"the table {uri}")
            try:
                return self._merge(dt, uri, net, app, epoch)
            except CommitFailedError:
                # A compaction (table_compaction op) rewrote files this MERGE read:
                # re-read the table and merge again; the txn check above stays exact.
                if attempt == _MERGE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _merge(self, dt, uri: str, net: pa.Table, app: str, epoch: int) -> list[str]:
        from deltalake import CommitProperties, Transaction

        # Partition columns first so delta-rs prunes the target to the touched buckets.
        on = " AND ".join(f"t.{c} = s.{c}"
                          for c in dict.fromkeys([*self.partition_columns, *self.primary_key]))
        values = {c: f"s.{c}" for c in [*self.schema.names, BUCKET_COLUMN]}
        props = CommitProperties(app_transactions=[Transaction(app, epoch)],
                                 custom_metadata={EPOCH_METADATA: str(epoch)})
        (dt.merge(net, predicate=on, source_alias="s", target_alias="t", commit_properties=props)
           .when_matched_delete(predicate=f"s.{OP_COLUMN} = '{DELETE}'")
           .when_matched_update(updates=values, predicate=f"s.{OP_COLUMN} = '{UPSERT}'")
           .when_not_matched_insert(updates=values, predicate=f"s.{OP_COLUMN} = '{UPSERT}'")
           .execute())
        dt.update_incremental()
        return [f"{uri}@v{dt.version()}"]

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        from deltalake import DeltaTable

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            return []
        applied = DeltaTable(uri, storage_options=opts).transaction_version(self.app_id(job_prefix))
        if applied is not None and applied > epoch:
            return [f"Delta table {uri}: epoch {applied} applied"]
        return []
