"""An upsert table sink: a Delta Lake table with a primary key (delta-rs, ``deltalake``).

What Kudu gives at the end of a stream (``shared/seeds/kudu-architecture.txt``): a
table with a primary key that takes inserts, updates and deletes from a job, answers
point lookups, scans columns with projection and predicates, and reads a snapshot as
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

Partitioning like Kudu's: a hidden column ``_bucket`` = xxh3_64 of the primary key
columns mod ``hash_buckets``, plus an optional ``range_column`` (one of the key columns,
partitioned by value: give it a coarse value such as a day). Both are Delta partition
columns, so a point lookup or a MERGE touches one bucket's files.

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

Snapshot reads: ``version_as_of_epoch(e)`` is the newest table version whose epoch is
at most e; ``scan(..., as_of_epoch=e)`` reads it (Delta time travel).

Stores: a local directory or S3 (``storage_options`` passes the store's endpoint and
credentials to delta-rs). The table is written by the driver, one MERGE per epoch.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import xxhash

from operators import paths
from operators.errors import InsertConflictError, SnapshotVacuumedError
from operators.io.sinks import Sink
from storage.objectstore import ObjectStore

OP_COLUMN = "_op"
BUCKET_COLUMN = "_bucket"
INSERT, UPSERT, DELETE = "insert", "upsert", "delete"
_OPS = (INSERT, UPSERT, DELETE)
EPOCH_METADATA = "dkvstream.epoch"
_MERGE_ATTEMPTS = 5




class TableSink(Sink):
    """Writes an operator output into a Delta Lake table with a primary key.

    Args:
        name: table name; the table lives at ``<job>/sinks/<name>/``.
        schema: the table's columns (without ``_op`` and ``_bucket``).
        primary_key: key column names; non-null in every change row.
        hash_buckets: number of hash buckets over the key columns (>= 1).
        range_column: optional key column partitioned by value (Kudu's range partition).

    Raises:
        ValueError: a key column or the range column is not in ``schema``, or the range
            column is not a key column.
    """

    def __init__(self, name: str, schema: pa.Schema, primary_key: Sequence[str], hash_buckets: int = 4,
                 range_column: str | None = None) -> None:
        self.name = name
        self.schema = schema
        self.primary_key = list(primary_key)
        missing = [c for c in self.primary_key if c not in schema.names]
        if not self.primary_key or missing:
            raise ValueError(f"table sink {name}: primary key {self.primary_key} names columns not in the schema: "
                             f"{missing}")
        if hash_buckets < 1:
            raise ValueError(f"table sink {name}: hash_buckets must be >= 1, got {hash_buckets}")
        if range_column is not None and range_column not in self.primary_key:
            raise ValueError(f"table sink {name}: range column {range_column!r} must be a key column "
                             f"(as in Kudu), key is {self.primary_key}")
        self.hash_buckets = hash_buckets
        self.range_column = range_column

    # ------------------------------------------------------------------ naming
    def table_prefix(self, job_prefix: str) -> str:
        """Object-store prefix of the Delta table (no trailing slash)."""
        return paths.sink_prefix(job_prefix, self.name)

    def table_uri(self, store: ObjectStore, job_prefix: str) -> str:
        """The table's location for Delta readers: ``file:///...`` or ``s3://bucket/...``."""
        return delta_uri(store, self.table_prefix(job_prefix))

    def app_id(self, job_prefix: str) -> str:
        """The Delta application-transaction id of this sink in a job."""
        return f"{job_prefix}/{self.name}"

    @property
    def partition_columns(self) -> list[str]:
        return [BUCKET_COLUMN] + ([self.range_column] if self.range_column else [])

    def _stored_schema(self) -> pa.Schema:
        fields = [pa.field(f.name, f.type, nullable=f.name not in self.primary_key) for f in self.schema]
        return pa.schema([*fields, pa.field(BUCKET_COLUMN, pa.int32(), nullable=False)])

    # -------------------------------------------------------------- the task side
    def buckets_of(self, table: pa.Table) -> pa.Array:
        """Hash bucket of each row's primary key: xxh3_64 over the key columns'
        values (str/bytes/int as their UTF-8 or decimal text, joined by 0x1f) mod
        ``hash_buckets``. Stable across processes and versions."""
        cols = [table.column(c).to_pylist() for c in self.primary_key]
        digest, n = xxhash.xxh3_64_intdigest, self.hash_buckets
        out = np.fromiter((digest(b"\x1f".join(_key_bytes(v) for v in vals)) % n for vals in zip(*cols)),
                          dtype=np.int32, count=table.num_rows)
        return pa.array(out, pa.int32())

    def changes_of(self, table: pa.Table) -> pa.Table:
        """The change rows of an operator output: the schema's columns, ``_op`` and
        ``_bucket``.

        Raises:
            ValueError: an ``_op`` value is not insert/upsert/delete, or a key is null.
        """
        ops = table.column(OP_COLUMN) if OP_COLUMN in table.column_names else pa.array([UPSERT] * table.num_rows)
        bad = pc.invert(pc.is_in(pc.fill_null(ops, ""), pa.array(_OPS)))
        if pc.any(bad).as_py():
            raise ValueError(f"table sink {self.name}: _op must be one of {_OPS}, got "
                             f"{ops.filter(bad)[0].as_py()!r}")
        for c in self.primary_key:
            if table.column(c).null_count:
                raise ValueError(f"table sink {self.name}: key column {c!r} is null in a change row")
        cols = {f.name: (table.column(f.name).cast(f.type) if f.name in table.column_names
                         else pa.nulls(table.num_rows, f.type)) for f in self.schema}
        out = pa.table(cols).append_column(OP_COLUMN, pa.array(ops, pa.string()))
        return out.append_column(BUCKET_COLUMN, self.buckets_of(out))

    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(self.changes_of(table), buf, compression="zstd")
        key = f"{staging_prefix}/{self.name}.changes.parquet"
        store.put(key, buf.getvalue())
        return key

    # ------------------------------------------------------------ the driver side
    def _read_staged(self, store: ObjectStore, staged: list[str]) -> pa.Table:
        tables = [pq.read_table(io.BytesIO(store.get(k))) for k in staged]
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
        return rows.set_column(rows.schema.get_field_index(OP_COLUMN), OP_COLUMN,
                               pc.if_else(pc.equal(rows.column(OP_COLUMN), DELETE), DELETE, UPSERT))

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
            write_deltalake(uri, self._stored_schema().empty_table(), partition_by=self.partition_columns,
                            mode="ignore", storage_options=opts)
        app = self.app_id(job_prefix)
        changes = self._read_staged(store, staged)
        inserts = changes.filter(pc.equal(changes.column(OP_COLUMN), INSERT))
        for attempt in range(_MERGE_ATTEMPTS):
            dt = DeltaTable(uri, storage_options=opts)
            applied = dt.transaction_version(app)
            if applied is not None and applied >= epoch:
                return []  # redone after a crash: this epoch is in the table already
            net = self.net_changes(changes, self._existing(uri, opts, inserts), epoch, f"the table {uri}")
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
        on = " AND ".join(f"t.{c} = s.{c}" for c in dict.fromkeys([*self.partition_columns, *self.primary_key]))
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
        return [f"Delta table {uri}: epoch {applied} applied"] if applied is not None and applied > epoch else []

    # ------------------------------------------------------------------- reads
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
            version, asked = self.version_as_of_epoch(dt, as_of_epoch, history), f"epoch {as_of_epoch}"
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
            retention_ms = int(params.get("specifiedRetentionMillis") or params.get("defaultRetentionMillis") or 0)
            horizon_ms = h["timestamp"] - retention_ms
            if following["timestamp"] < horizon_ms:
                raise SnapshotVacuumedError(
                    f"table sink {self.name}: {asked} reads version {version} of {uri}, whose files the "
                    f"VACUUM at version {h['version']} (retention {retention_ms / 3_600_000:g} h) may have "
                    f"deleted; time travel reaches only versions superseded after "
                    f"{datetime.fromtimestamp(horizon_ms / 1000).astimezone().isoformat()}")

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
        ``con.register(name, ds)``."""
        return self.open(store, job_prefix, as_of_epoch, as_of_time).to_pyarrow_dataset()

    def scan(self, store: ObjectStore, job_prefix: str, columns: list[str] | None = None,
             filter: pc.Expression | None = None, as_of_epoch: int | None = None,  # noqa: A002
             as_of_time: datetime | None = None) -> pa.Table:
        """Rows of the table with projection and a predicate, current or as of an epoch.

        Args:
            columns: columns to read (default: the schema's).
            filter: a ``pyarrow.compute`` expression, pushed down to file statistics.
            as_of_epoch: read the snapshot of this committed epoch (time travel).
            as_of_time: or the snapshot current at this time (tz-aware datetime).
        """
        return self.dataset(store, job_prefix, as_of_epoch, as_of_time).to_table(
            columns=columns or self.schema.names, filter=filter)

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
        return df.select(*[F.col(f.name).cast(from_arrow_type(f.type)).alias(f.name) for f in self.schema])

    def lookup(self, store: ObjectStore, job_prefix: str, keys: pa.Table, columns: list[str] | None = None,
               as_of_epoch: int | None = None) -> pa.Table:
        """Rows for the given primary keys (a table of the key columns), reading only
        their hash buckets' files. Keys not in the table are absent from the result."""
        keys = keys.append_column(BUCKET_COLUMN, self.buckets_of(keys))
        return self._lookup(self.open(store, job_prefix, as_of_epoch), keys, columns or self.schema.names)

    def _lookup(self, dt, keys: pa.Table, columns: list[str]) -> pa.Table:
        ds = dt.to_pyarrow_dataset()
        filt = pc.field(BUCKET_COLUMN).isin(pc.unique(keys.column(BUCKET_COLUMN)))
        for c in self.primary_key:
            filt = filt & pc.field(c).isin(pc.unique(keys.column(c)))
        found = ds.to_table(columns=list(dict.fromkeys([*self.primary_key, *columns])), filter=filt)
        # isin per column over-selects for composite keys: keep exact tuples only.
        if len(self.primary_key) > 1:
            found = found.join(keys.select(self.primary_key).group_by(self.primary_key).aggregate([]),
                               self.primary_key, join_type="inner")
        return found.select(columns)

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        from deltalake import DeltaTable

        uri, opts = self.table_uri(store, job_prefix), storage_options(store)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            return self.schema.empty_table()
        return DeltaTable(uri, storage_options=opts).to_pyarrow_dataset().to_table(columns=self.schema.names)


def _key_bytes(v) -> bytes:
    if isinstance(v, bytes):
        return v
    return str(v).encode()


def delta_uri(store: ObjectStore, key_prefix: str) -> str:
    """The Delta table URI of an object-store prefix.

    Raises:
        NotImplementedError: the store is neither a local directory nor S3.
    """
    from storage.objectstore.s3 import S3ObjectStore

    if isinstance(store, S3ObjectStore):
        base = f"{store.prefix}/{key_prefix}" if store.prefix else key_prefix
        return f"s3://{store.bucket}/{base}"
    root = getattr(store, "root_uri", None)
    if root is None or not root.startswith("file://"):
        raise NotImplementedError(f"Delta tables need a local-directory or S3 store, got {store!r}")
    return f"{root.rstrip('/')}/{key_prefix}"


def storage_options(store: ObjectStore) -> dict[str, str] | None:
    """delta-rs ``storage_options`` reaching the same bucket as ``store`` (None for a
    local directory). Commits to ``_delta_log`` use S3 conditional puts
    (``If-None-Match``), which delta-rs 1.x does by default and SeaweedFS supports."""
    from storage.objectstore.s3 import S3ObjectStore

    if not isinstance(store, S3ObjectStore):
        return None
    cfg = store._config  # what the store was built with (endpoint, region, credentials)
    opts = {"AWS_REGION": store.region, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
    if store.endpoint_url:
        opts["AWS_ENDPOINT_URL"] = store.endpoint_url
        if store.endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    for key, name in (("access_key_id", "AWS_ACCESS_KEY_ID"), ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                      ("session_token", "AWS_SESSION_TOKEN")):
        if cfg.get(key):
            opts[name] = cfg[key]
    return opts


def delta_tables(store: ObjectStore, job_prefix: str) -> list[str]:
    """URIs of the Delta tables among a job's sinks (``<job>/sinks/<name>/_delta_log/``)."""
    from deltalake import DeltaTable

    depth = len(job_prefix.split("/")) + 1
    names = sorted({k.split("/")[depth] for k in store.list(paths.sinks_root(job_prefix)) if "/_delta_log/" in k})
    uris = [delta_uri(store, paths.sink_prefix(job_prefix, n)) for n in names]
    return [u for u in uris if DeltaTable.is_deltatable(u, storage_options=storage_options(store))]


def small_files(uri: str, target_bytes: int, opts: dict | None = None) -> int:
    """Data files of the table's current version smaller than ``target_bytes``."""
    from deltalake import DeltaTable

    # deltalake 1.x returns an arro3 table; pa.table converts it through the Arrow C interface.
    actions = DeltaTable(uri, storage_options=opts).get_add_actions(flatten=True)
    return sum(1 for s in pa.table(actions).column("size_bytes").to_pylist() if s < target_bytes)


def compact_table(uri: str, target_bytes: int, opts: dict | None = None) -> dict:
    """Rewrites the table's small files into files of about ``target_bytes``
    (delta-rs OPTIMIZE, bin-packing per partition; a ``dataChange=false`` commit, so
    readers and the job's next MERGE see the same rows; a MERGE that read a rewritten
    file fails its commit and ``TableSink.publish`` retries it). Old files stay for
    time travel until a vacuum. Returns delta-rs's metrics (``numFilesAdded``,
    ``numFilesRemoved``, ...) plus ``version``."""
    from deltalake import DeltaTable

    dt = DeltaTable(uri, storage_options=opts)
    metrics = dt.optimize.compact(target_size=target_bytes)
    dt.update_incremental()
    return {**metrics, "version": dt.version()}


def vacuum_table(uri: str, retention_hours: int, opts: dict | None = None) -> list[str]:
    """Deletes data files that no table version of the last ``retention_hours`` needs
    (delta-rs VACUUM). Time travel (``as_of_epoch`` / ``as_of_time``) then reaches only
    versions younger than that; an older one fails reading a deleted file.

    Returns:
        URIs (or paths) of the deleted files.
    """
    from deltalake import DeltaTable

    return DeltaTable(uri, storage_options=opts).vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)
