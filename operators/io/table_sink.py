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

Exactly-once, one table commit per epoch, no row through the driver (as Flink's Delta
sink: writers in tasks, one committer). A task stages its range's change rows as one
object, a Parquet file per hash bucket behind an index (``write_staged``; nothing
visible). Before the driver commits epoch e, ``prepare_in_tasks`` runs one task per
bucket with inserts (``check_bucket``): they are checked against the table, which then
holds exactly the epochs up to e-1 (a restart re-publishes the newest checkpoint before
it runs anything), so a duplicate key fails the epoch before its checkpoint exists,
naming the key and the table. After the commit, ``publish_in_tasks`` runs one task per
bucket with changes (``merge_bucket``): it reads the bucket's data files in the
partitions the changes touch, writes one new file per partition (the untouched rows of
the files holding a changed key, plus the upserts) and returns add/remove actions. The
driver reads only the staged objects' indexes and the Delta log, and commits the actions
as one log entry carrying the application transaction (``txn``)
``appId = <job prefix>/<sink>``, ``version = e`` and ``dkvstream.epoch = e`` in its
commit info. The commit is atomic (Delta's log entry ``_delta_log/<version>.json`` is
written put-if-absent) and must be the version after the one the tasks read; a publish
redone after a crash reads the table's transaction version first and skips an epoch
already applied. Files of a publish that never committed are not in the table (a vacuum
deletes them, ``table_maintenance.vacuum_table``). An epoch with no change rows writes no commit.

Stores: a local directory or S3 (``storage_options`` passes the store's endpoint and
credentials to delta-rs; the tasks write data files through the job's object store).
"""
from __future__ import annotations

import datetime
import functools
import io
import json
import struct
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from dkvstream.operators.errors import InsertConflictError, SnapshotVacuumedError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sinks import Sink, erase_value_set, staged_keys
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
from dkvstream.operators.io.table_reader import TableReader, delta_dataset
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import REQUEST_THREADS, ObjectStore, map_requests

# Names this module has always offered (``from dkvstream.operators.io.table_sink import ...``).
__all__ = [
    "BUCKET_COLUMN", "DELETE", "EPOCH_METADATA", "INSERT", "OP_COLUMN", "UPSERT",
    "InsertConflictError", "SnapshotVacuumedError", "TableSink", "compact_table", "delta_tables",
    "delta_uri", "small_files", "storage_options", "vacuum_table",
]

_MERGE_ATTEMPTS = 5
# Commit-info key of an erasure's commit (``TableSink.erase_rows``): the data files it
# rewrote. The commit carries no key, no predicate and no app transaction.
ERASURE_METADATA = "dkvstream.erasure_files"


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
        # Delta stores an empty partition value as null, which the non-nullable key
        # column cannot hold: refuse it here, naming the sink and the column.
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
        """Stages one range's change rows (in the task): one object holding a Parquet file
        per hash bucket (the bucket's rows in emission order), behind an index of each
        bucket's byte range, rows and inserts (``_encode_staged``). The driver reads only
        the indexes; each merge task reads only its bucket's bytes.

        Returns:
            the staged object's key, ``<staging_prefix>/<name>.changes``.

        Raises:
            ValueError: as ``changes_of``.
        """
        key = f"{staging_prefix}/{self.name}.changes"
        store.put(key, _encode_staged(self.changes_of(table)))
        return key

    # ---------------------------------------------------- the merge tasks' side
    def read_bucket_changes(self, store: ObjectStore, bucket: int, slices: list[StagedSlice]) -> pa.Table:
        """The change rows of hash bucket ``bucket`` in emission order: the ``slices``
        (in range order), one ranged GET each.

        Returns:
            the change rows (``changes_of``'s columns) of that bucket.
        """
        tables = []
        for s in slices:
            if s.length is None:  # a whole Parquet file staged by an older version
                t = pq.read_table(arrow_input(store.get(s.key)))
                tables.append(t.filter(pc.equal(t.column(BUCKET_COLUMN), bucket)))
            else:
                tables.append(pq.read_table(arrow_input(store.get_range(s.key, s.start, s.length))))
        schema = pa.schema([*self.schema, pa.field(OP_COLUMN, pa.string()),
                            pa.field(BUCKET_COLUMN, pa.int32())])
        return pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()

    def _existing(self, dt, changes: pa.Table) -> set[tuple]:
        """Keys among ``changes`` (with ``_bucket``) that table version ``dt`` holds."""
        if changes.num_rows == 0 or dt is None:
            return set()
        keys = changes.select([*self.primary_key, BUCKET_COLUMN])
        found = self._lookup(dt, keys, self.primary_key)
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
        """``prepare_in_tasks`` in this process."""
        self.prepare_in_tasks(store, job_prefix, epoch, staged, _in_process)

    def prepare_in_tasks(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                         map_in_tasks: Callable[[Callable, list], list]) -> None:
        """Before epoch ``epoch`` commits: the inserts of each hash bucket are checked
        against the table's current version, one task per bucket with inserts
        (``check_bucket``). The driver reads only the staged objects' indexes.

        Raises:
            InsertConflictError: an insert names a key that exists (the epoch fails,
                nothing is committed).
        """
        from deltalake import DeltaTable

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        items = [(b, s) for b, s in sorted(staged_slices(store, staged, self.hash_buckets).items())
                 if any(x.inserts != 0 for x in s)]
        if not items:
            return
        version = DeltaTable(uri, storage_options=opts).version() \
            if DeltaTable.is_deltatable(uri, storage_options=opts) else None
        map_in_tasks(functools.partial(_check_bucket, self, store, uri, opts, version, epoch), items)

    def check_bucket(self, store: ObjectStore, uri: str, opts: dict | None, version: int | None,
                     epoch: int, bucket: int, slices: list[StagedSlice]) -> int:
        """In a task: the inserts of one bucket against table version ``version`` (None:
        no table yet) and the epoch's own earlier changes. Returns the inserts checked.

        Raises:
            InsertConflictError: an insert of a key that exists at that point.
        """
        from deltalake import DeltaTable

        changes = self.read_bucket_changes(store, bucket, slices)
        inserts = changes.filter(pc.equal(changes.column(OP_COLUMN), INSERT))
        dt = None if version is None else DeltaTable(uri, storage_options=opts, version=version)
        self.net_changes(changes, self._existing(dt, inserts), epoch, f"the table {uri}")
        return inserts.num_rows

    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        """``publish_in_tasks`` in this process."""
        return self.publish_in_tasks(store, job_prefix, epoch, staged, _in_process)

    def publish_in_tasks(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                         map_in_tasks: Callable[[Callable, list], list]) -> list[str]:
        """Applies a committed epoch: one merge task per hash bucket with changes
        (``merge_bucket``) rewrites that bucket's touched files and returns file actions;
        the driver commits them as one Delta log entry with the epoch's app transaction.
        Skips an epoch the table holds already (idempotent). The commit must directly
        follow the version the tasks read; after another commit (a compaction) the tasks
        run again on the new version, ``_MERGE_ATTEMPTS`` times at most.

        Returns:
            ``["<table uri>@v<version>"]``, or ``[]`` if nothing was committed.

        Raises:
            InsertConflictError: from a task, as ``check_bucket``.
            CommitFailedError: another commit came first ``_MERGE_ATTEMPTS`` times.
        """
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            write_deltalake(uri, self.stored_schema().empty_table(), partition_by=self.partition_columns,
                            mode="ignore", storage_options=opts)
        app = self.app_id(job_prefix)
        items = sorted(staged_slices(store, staged, self.hash_buckets).items())
        for attempt in range(_MERGE_ATTEMPTS):
            dt = DeltaTable(uri, storage_options=opts)
            applied = dt.transaction_version(app)
            if applied is not None and applied >= epoch:
                return []  # redone after a crash: this epoch is in the table already
            actions = [a for bucket in map_in_tasks(
                functools.partial(_merge_bucket, self, store, self.table_prefix(job_prefix), uri, opts,
                                  dt.version(), epoch), items) for a in bucket]
            if not actions:
                return []
            try:
                return self._commit(dt, uri, actions, app, epoch)
            except CommitFailedError:
                # Another commit (table_compaction op) came after the version the tasks
                # read: their new files stay unreferenced (a vacuum deletes them); merge
                # again from the new version. The txn check above stays exact.
                if attempt == _MERGE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def merge_bucket(self, store: ObjectStore, table_prefix: str, uri: str, opts: dict | None,
                     version: int, epoch: int, bucket: int, slices: list[StagedSlice]) -> list[dict]:
        """In a task: applies one bucket's change rows to table version ``version``.

        Reads the bucket's files in the partitions the net changes touch, writes one new
        Parquet file per partition holding the untouched rows of the files that hold a
        changed key plus the upserts, under the table's prefix with a unique name (not
        visible until the driver commits it).

        Returns:
            file actions for the driver's commit: ``{"remove": path, "size": bytes}`` per
            replaced file and ``{"add": path, "size", "partition_values", "stats"}`` per
            new file (paths relative to the table).

        Raises:
            InsertConflictError: an insert of a key that exists at that point.
        """
        from deltalake import DeltaTable

        changes = self.read_bucket_changes(store, bucket, slices)
        if changes.num_rows == 0:
            return []
        dt = DeltaTable(uri, storage_options=opts, version=version)
        ds = delta_dataset(dt)
        where = pc.field(BUCKET_COLUMN) == bucket
        if self.range_column is not None:
            where = where & pc.field(self.range_column).isin(pc.unique(changes.column(self.range_column)))
        stored = self.stored_schema()
        fragments = list(ds.get_fragments(filter=where))
        olds = [_as_stored(f.to_table(), f.partition_expression, stored) for f in fragments]
        existing = {k for t in olds for k in self._keys(t)}
        net = self.net_changes(changes, existing, epoch, f"the table {uri}")
        touched = set(self._keys(net))
        sizes = {a["path"]: a["size_bytes"] for a in pa.table(dt.get_add_actions(flatten=True))
                 .select(["path", "size_bytes"]).to_pylist()}
        actions, rows = [], []
        for fragment, old in zip(fragments, olds):
            hit = pa.array([k in touched for k in self._keys(old)], pa.bool_())
            if not pc.any(hit).as_py():
                continue
            path = _log_path(fragment.path, sizes)
            actions.append({"remove": path, "size": sizes.get(path)})
            rows.append(old.filter(pc.invert(hit)))
        upserts = net.filter(pc.equal(net.column(OP_COLUMN), UPSERT)).drop_columns([OP_COLUMN])
        rows.append(upserts.select(stored.names).cast(stored))
        actions += self._write_partitions(store, table_prefix, bucket, epoch, pa.concat_tables(rows))
        return actions

    def _keys(self, table: pa.Table) -> list[tuple]:
        return list(zip(*(table.column(c).to_pylist() for c in self.primary_key)))

    def _write_partitions(self, store: ObjectStore, table_prefix: str, bucket: int, epoch: int,
                          rows: pa.Table) -> list[dict]:
        """Writes ``rows`` (the stored schema, one bucket) as one Parquet file per range
        value; returns their add actions."""
        if rows.num_rows == 0:
            return []
        groups = ([(None, rows)] if self.range_column is None else
                  [(v, rows.filter(pc.equal(rows.column(self.range_column), v)))
                   for v in pc.unique(rows.column(self.range_column)).to_pylist()])
        actions = []
        for value, part in groups:
            values = {BUCKET_COLUMN: str(bucket)}
            if self.range_column is not None:
                values[self.range_column] = _partition_text(value)
            data_rows = part.drop_columns(self.partition_columns)
            buf = io.BytesIO()
            pq.write_table(data_rows, buf, compression="zstd")
            dirs = "/".join(f"{c}={quote(v, safe='')}" for c, v in values.items())
            path = f"{dirs}/part-{epoch:010d}-{uuid.uuid4()}.zstd.parquet"
            data = buf.getvalue()
            store.put(f"{table_prefix}/{path}", data)
            actions.append({"add": path, "size": len(data), "partition_values": values,
                            "stats": _file_stats(data_rows)})
        return actions

    def _commit(self, dt, uri: str, actions: list[dict], app: str, epoch: int) -> list[str]:
        """Commits the tasks' file actions as one log entry carrying the epoch's app
        transaction; returns ``["<uri>@v<version>"]``.

        Raises:
            CommitFailedError: another commit (a compaction, a vacuum) came after the
                version the tasks read.
        """
        from deltalake import CommitProperties, Transaction

        # No retries: the commit must be version read + 1. delta-rs checks no conflict for
        # these actions, so committing after another writer (a compaction that rewrote a
        # file the tasks replaced) would keep both the compacted and the replacing rows.
        props = CommitProperties(app_transactions=[Transaction(app, epoch)], max_commit_retries=0,
                                 custom_metadata={EPOCH_METADATA: str(epoch)})
        return self._commit_actions(dt, uri, actions, props)

    def _commit_actions(self, dt, uri: str, actions: list[dict], props) -> list[str]:
        """Commits file actions (``merge_bucket``'s) with delta-rs ``CommitProperties``
        ``props``; returns ``["<uri>@v<version>"]``."""
        from deltalake.transaction import AddAction, RemoveAction

        now = int(time.time() * 1000)
        log = [AddAction(a["add"], a["size"], a["partition_values"], now, True, a["stats"])
               if "add" in a else RemoveAction(a["remove"], True, now, a["size"])
               for a in actions]
        dt.create_write_transaction(log, mode="append", schema=self.stored_schema(),
                                    partition_by=self.partition_columns, commit_properties=props)
        dt.update_incremental()
        return [f"{uri}@v{dt.version()}"]

    # ------------------------------------------------------------------ erasure
    def erase_rows(self, store: ObjectStore, job_prefix: str, column: str, values: list) -> list[str]:
        """Erasure: removes the rows whose ``column`` is one of ``values`` from the table
        and from its history, and from the job's staged change objects of the sink.

        1. Staged change objects (``<name>.changes`` under the job's staging prefixes)
           holding such a change row are rewritten without it (one PUT each): a
           restart that publishes a committed epoch not yet applied applies it without
           the key; an epoch already applied is skipped by its app transaction.
        2. One table commit replaces each data file holding such a row by a file of its
           other rows (``merge_bucket``'s way: the commit must follow the version read,
           retried on a new version ``_MERGE_ATTEMPTS`` times). It carries no app
           transaction, so the table's epoch (``transaction_version``) stays and the
           job's next epoch publishes as usual. delta-rs's ``DELETE`` is not used: its
           commit records the predicate, the key itself, in the log.
        3. The history goes: a VACUUM with retention 0 deletes every data file no
           longer in the current version (those of older versions may hold the key);
           then a checkpoint of the newest version, and every log entry and checkpoint
           before it is deleted (their add actions' statistics may hold the key as a
           min or max). The checkpoint keeps the app transactions, so exactly-once
           publishing goes on. Time travel (``as_of_epoch``) then reaches no version
           before the erasure.

        Files a publish wrote and never committed (a crash) are not read: the usual
        vacuum (``vacuum_table``) deletes them once ``UNCOMMITTED_FILE_HOURS`` old. Erase
        by a key column that is the range column and the partition directory named by
        the key is emptied but may remain on a local store.

        Cost: one LIST of the staging prefixes, one GET per staged change object of the
        sink and one PUT per rewritten one; one GET per data file of the current
        version, one PUT per file rewritten and one log commit; one GET per data file
        the vacuum deletes (to report those that held the key) and a DELETE each; one
        GET and DELETE per log entry before the checkpoint; a checkpoint (one PUT).

        Args and returns: as ``Sink.erase_rows`` (the keys of data files, log entries,
        checkpoints and staged objects that held a matching row).

        Raises:
            ValueError: ``column`` is not a column of the table, or a value does not
                convert to its type.
            CommitFailedError: other commits came first ``_MERGE_ATTEMPTS`` times.
        """
        from deltalake import DeltaTable

        if column not in self.schema.names:
            raise ValueError(f"table sink {self.name}: no column {column!r} (columns: {self.schema.names}); "
                             f"erase by one of the table's columns")
        value_set = erase_value_set(values, self.schema.field(column).type, f"table sink {self.name}", column)
        held = self._erase_staged(store, job_prefix, column, value_set)
        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if DeltaTable.is_deltatable(uri, storage_options=opts):
            replaced = self._erase_in_table(store, job_prefix, uri, opts, column, value_set)
            held += replaced + self._drop_history(store, job_prefix, uri, opts, column, value_set, bool(replaced))
        return sorted(set(held))

    def _erase_staged(self, store: ObjectStore, job_prefix: str, column: str, value_set: pa.Array) -> list[str]:
        """Step 1 of ``erase_rows``: the rewritten staged change objects."""
        def one(key: str) -> str | None:
            try:
                slices = staged_slices(store, [key], self.hash_buckets)
                changes = pa.concat_tables([self.read_bucket_changes(store, b, s) for b, s in sorted(slices.items())]
                                           or [self.read_bucket_changes(store, 0, [])])
            except ObjectNotFoundError:  # collected meanwhile
                return None
            hit = _matches(changes, column, value_set)
            if not pc.any(hit).as_py():
                return None
            store.put(key, _encode_staged(changes.filter(pc.invert(hit))))
            return key

        keys = [k for k in staged_keys(store, job_prefix) if k.endswith(f"/{self.name}.changes")]
        return [k for k in map_requests(one, keys, REQUEST_THREADS) if k is not None]

    def _erase_in_table(self, store: ObjectStore, job_prefix: str, uri: str, opts: dict | None, column: str,
                        value_set: pa.Array) -> list[str]:
        """Step 2 of ``erase_rows``: the replaced data files' keys."""
        from deltalake import CommitProperties, DeltaTable
        from deltalake.exceptions import CommitFailedError

        table_prefix = self.table_prefix(job_prefix)
        stored = self.stored_schema()
        for attempt in range(_MERGE_ATTEMPTS):
            dt = DeltaTable(uri, storage_options=opts)
            epoch = dt.transaction_version(self.app_id(job_prefix)) or 0
            sizes = {a["path"]: a["size_bytes"] for a in pa.table(dt.get_add_actions(flatten=True))
                     .select(["path", "size_bytes"]).to_pylist()}
            actions, held = [], []
            for fragment in delta_dataset(dt).get_fragments():
                old = _as_stored(fragment.to_table(), fragment.partition_expression, stored)
                hit = _matches(old, column, value_set)
                if not pc.any(hit).as_py():
                    continue
                path = _log_path(fragment.path, sizes)
                held.append(f"{table_prefix}/{path}")
                actions.append({"remove": path, "size": sizes.get(path)})
                bucket = int(pads.get_partition_keys(fragment.partition_expression)[BUCKET_COLUMN])
                actions += self._write_partitions(store, table_prefix, bucket, epoch, old.filter(pc.invert(hit)))
            if not actions:
                return []
            # No app transaction: the table's epoch stays the job's. The metadata names
            # no key (a GDPR erasure must not write the key it erases).
            props = CommitProperties(max_commit_retries=0, custom_metadata={ERASURE_METADATA: str(len(held))})
            try:
                self._commit_actions(dt, uri, actions, props)
                return held
            except CommitFailedError:
                if attempt == _MERGE_ATTEMPTS - 1:  # an epoch's publish came first each time
                    raise
        raise AssertionError("unreachable")

    def _drop_history(self, store: ObjectStore, job_prefix: str, uri: str, opts: dict | None, column: str,
                      value_set: pa.Array, committed: bool) -> list[str]:
        """Step 3 of ``erase_rows`` (skipped when step 2 committed nothing and no data
        file to vacuum nor log entry holds a matching value: the erasure is
        idempotent): of the deleted data files, log entries and checkpoints, those that
        held a matching value."""
        from deltalake import DeltaTable

        table_prefix = self.table_prefix(job_prefix)
        dt = DeltaTable(uri, storage_options=opts)
        # The checkpoint's remove actions outlive the files a vacuum deleted: keep those left.
        gone = [k for k in (f"{table_prefix}/{p}" for p in
                            dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False))
                if store.exists(k)]
        held = [k for k in gone if self._file_holds(store, k, column, value_set)]
        values = value_set.to_pylist()

        def log_holds(key: str) -> bool:
            try:
                return _history_holds(store.get(key), key, column, values)
            except ObjectNotFoundError:
                return False

        def log_before(version: int) -> list[str]:
            return [k for k in store.list(f"{table_prefix}/_delta_log/")
                    if (name := k.rsplit("/", 1)[1])[:20].isdigit() and int(name[:20]) < version]

        held += [k for k in log_before(dt.version() + 1) if log_holds(k)]
        if not (committed or gone or held):
            return []  # nothing of the key in the history: no vacuum, no checkpoint
        dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
        dt = DeltaTable(uri, storage_options=opts)  # the vacuum committed
        dt.create_checkpoint()
        for key in log_before(dt.version()):
            store.delete(key)
        return held

    def _file_holds(self, store: ObjectStore, key: str, column: str, value_set: pa.Array,
                    data: bytes | None = None) -> bool:
        """Whether data file ``key`` holds a value of ``value_set`` in ``column`` (its
        partition directory counts for the range column)."""
        try:
            data = store.get(key) if data is None else data
        except ObjectNotFoundError:
            return False
        if column == self.range_column and any(f"/{column}={quote(_partition_text(v), safe='')}/" in key
                                               for v in value_set.to_pylist()):
            return True
        table = pq.read_table(arrow_input(data))
        return column in table.column_names and bool(pc.any(_matches(table, column, value_set)).as_py())

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        from deltalake import DeltaTable

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            return []
        applied = DeltaTable(uri, storage_options=opts).transaction_version(self.app_id(job_prefix))
        if applied is not None and applied > epoch:
            return [f"Delta table {uri}: epoch {applied} applied"]
        return []


# ----------------------------------------------------------------- staged objects
# A staged change object: magic, the index's length (4 bytes, big-endian), the index
# (JSON: {"buckets": [[bucket, offset, length, rows, inserts], ...]}, offsets from the
# end of the index), then one Parquet file per bucket. The driver reads the first
# _INDEX_PROBE bytes (one ranged GET; two if the index is longer), a merge task one
# bucket's bytes.
_STAGED_MAGIC = b"DKVTCHG1"
_INDEX_PROBE = 16 << 10


class StagedSlice(NamedTuple):
    """One bucket's change rows inside a staged object: bytes ``[start, start + length)``
    of ``key`` (a Parquet file), with its insert count; ``length`` None for a whole
    Parquet file of all buckets (staged by an older version), ``inserts`` None if unknown."""

    key: str
    start: int
    length: int | None
    inserts: int | None


def _encode_staged(changes: pa.Table) -> bytes:
    """The staged object of one range's change rows (the layout above)."""
    buckets = changes.column(BUCKET_COLUMN)
    entries, blobs, offset = [], [], 0
    for b in sorted(pc.unique(buckets).to_pylist()):
        rows = changes.filter(pc.equal(buckets, b))  # keeps emission order
        buf = io.BytesIO()
        pq.write_table(rows, buf, compression="zstd")
        blob = buf.getvalue()
        inserts = int(pc.sum(pc.equal(rows.column(OP_COLUMN), INSERT)).as_py() or 0)
        entries.append([b, offset, len(blob), rows.num_rows, inserts])
        blobs.append(blob)
        offset += len(blob)
    index = json.dumps({"buckets": entries}).encode()
    return b"".join([_STAGED_MAGIC, struct.pack(">I", len(index)), index, *blobs])


def staged_slices(store: ObjectStore, staged: list[str], hash_buckets: int) -> dict[int, list[StagedSlice]]:
    """Driver side: which bytes of the staged objects hold each hash bucket's change rows,
    from the objects' indexes only (one or two ranged GETs each, ``REQUEST_THREADS`` at a
    time; no row is read).

    Args:
        staged: an epoch's staged keys of the sink, in range order.
        hash_buckets: the sink's bucket count (for files staged by an older version,
            which hold every bucket).

    Returns:
        ``{bucket: [StagedSlice, ...]}`` for the buckets with change rows; each list in
        the order of ``staged``.

    Raises:
        CorruptionError: a staged object does not start with its index (damaged).
    """
    def index(key: str) -> list[tuple[int, StagedSlice]]:
        if key.endswith(".parquet"):
            return [(b, StagedSlice(key, 0, None, None)) for b in range(hash_buckets)]
        head = store.get_range(key, 0, _INDEX_PROBE)
        if head[:len(_STAGED_MAGIC)] != _STAGED_MAGIC or len(head) < len(_STAGED_MAGIC) + 4:
            raise CorruptionError(f"{store.uri(key)}: not a table sink's staged change object (damaged?); "
                                  f"restore it, or fall back to an older checkpoint")
        n = struct.unpack(">I", head[len(_STAGED_MAGIC):len(_STAGED_MAGIC) + 4])[0]
        start = len(_STAGED_MAGIC) + 4
        raw = head[start:start + n]
        if len(raw) < n:
            raw = store.get_range(key, start, n)
        data = start + n
        return [(b, StagedSlice(key, data + off, length, inserts))
                for b, off, length, _, inserts in json.loads(raw)["buckets"]]

    out: dict[int, list[StagedSlice]] = {}
    for entries in map_requests(index, staged, REQUEST_THREADS):
        for bucket, piece in entries:
            out.setdefault(bucket, []).append(piece)
    return out


# -------------------------------------------------------------- task entry points
def _check_bucket(sink: TableSink, store: ObjectStore, uri: str, opts: dict | None, version: int | None,
                  epoch: int, item: tuple[int, list[StagedSlice]]) -> int:
    """A prepare task (``TableSink.check_bucket``); pickled to Spark tasks."""
    return sink.check_bucket(store, uri, opts, version, epoch, *item)


def _merge_bucket(sink: TableSink, store: ObjectStore, table_prefix: str, uri: str, opts: dict | None,
                  version: int, epoch: int, item: tuple[int, list[StagedSlice]]) -> list[dict]:
    """A merge task (``TableSink.merge_bucket``); pickled to Spark tasks."""
    return sink.merge_bucket(store, table_prefix, uri, opts, version, epoch, *item)


def _in_process(fn: Callable, items: list) -> list:
    return [fn(item) for item in items]


def _history_holds(data: bytes, key: str, column: str, values: list) -> bool:
    """Whether a Delta log entry (``<v>.json``) or checkpoint (``<v>.checkpoint*.parquet``)
    holds one of ``values`` of ``column``: as the min or max of an add or remove
    action's statistics, as its partition value, or (text values, in a log entry) in
    any text, such as another writer's DELETE predicate in its commit info."""
    texts = {_partition_text(v) for v in values}
    if key.endswith(".json"):
        if any(isinstance(v, str) and json.dumps(v)[1:-1].encode() in data for v in values):
            return True
        actions = [json.loads(line) for line in data.splitlines() if line.strip()]
    elif key.endswith(".parquet"):
        actions = pq.read_table(arrow_input(data)).to_pylist()
    else:
        return False
    for action in actions:
        for kind in ("add", "remove"):
            f = action.get(kind)
            if not f:
                continue
            parts = f.get("partitionValues") or {}
            if (dict(parts) if isinstance(parts, list) else parts).get(column) in texts - {None}:
                return True
            stats = json.loads(f["stats"]) if f.get("stats") else {}
            if any((stats.get(bound) or {}).get(column) in values for bound in ("minValues", "maxValues")):
                return True
    return False


def _matches(table: pa.Table, column: str, value_set: pa.Array) -> pa.ChunkedArray:
    """Rows of ``table`` whose ``column`` is in ``value_set`` (null: no)."""
    return pc.fill_null(pc.is_in(table.column(column), value_set=value_set), False)


# ------------------------------------------------------------------- data files
def _as_stored(table: pa.Table, partition_expression: pc.Expression, stored: pa.Schema) -> pa.Table:
    """A data file's rows with the partition columns (from its partition expression) in
    the stored schema's types (files delta-rs's MERGE or OPTIMIZE wrote may hold view
    types)."""
    values = pads.get_partition_keys(partition_expression)
    cols = [table.column(f.name) if f.name in table.column_names
            else pa.array([values.get(f.name)] * table.num_rows) for f in stored]
    return pa.table(dict(zip(stored.names, cols))).cast(stored)


def _log_path(fragment_path: str, paths: dict[str, int]) -> str:
    """The log's path of a dataset fragment (the log may keep it percent-encoded)."""
    if fragment_path in paths:
        return fragment_path
    decoded = {unquote(p): p for p in paths}
    return decoded.get(unquote(fragment_path), fragment_path)


def _partition_text(value) -> str | None:
    """A partition value as the Delta log writes it (protocol: "Partition Value Serialization")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _file_stats(rows: pa.Table) -> str:
    """The add action's statistics (Delta protocol "Per-file Statistics"). Readers prune
    files by them, so they are exact or absent: ``numRecords`` always; null counts and
    min/max (strings untruncated) only when every column is an integer, finite float or
    string column with a value, since deltalake's pyarrow dataset turns a column missing
    from ``minValues`` into a predicate no row satisfies, skipping the file."""
    stats: dict = {"numRecords": rows.num_rows}
    low, high = {}, {}
    for f in rows.schema:
        col = rows.column(f.name)
        exact = pa.types.is_integer(f.type) or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        if pa.types.is_floating(f.type):
            exact = pc.all(pc.is_finite(col)).as_py() is not False
        if not exact or col.null_count == rows.num_rows:
            return json.dumps(stats)
        mm = pc.min_max(col).as_py()
        low[f.name], high[f.name] = mm["min"], mm["max"]
    stats.update(minValues=low, maxValues=high,
                 nullCount={f.name: rows.column(f.name).null_count for f in rows.schema})
    return json.dumps(stats)
