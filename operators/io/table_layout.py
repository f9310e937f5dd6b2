"""How a table sink lays out its Delta table: columns, primary key, partitions, location.

Shared by the writer (``dkvstream.operators.io.table_sink``), the readers
(``dkvstream.operators.io.table_reader``) and the maintenance ops (``dkvstream.operators.io.table_maintenance``).

Partitioning like Kudu's: a hidden column ``_bucket`` = xxh3_64 of the primary key
columns mod ``hash_buckets``, plus an optional ``range_column`` (one of the key columns,
partitioned by value: give it a coarse value such as a day). Both are Delta partition
columns, so a point lookup or an epoch's merge touches one bucket's files.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import xxhash

from dkvstream.operators import paths
from dkvstream.storage.objectstore import ObjectStore

OP_COLUMN = "_op"
BUCKET_COLUMN = "_bucket"
INSERT, UPSERT, DELETE = "insert", "upsert", "delete"
OPS = (INSERT, UPSERT, DELETE)
EPOCH_METADATA = "dkvstream.epoch"


class TableLayout:
    """The shape and place of a table sink's Delta table.

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

    def __init__(self, name: str, schema: pa.Schema, primary_key: Sequence[str],
                 hash_buckets: int = 4, range_column: str | None = None) -> None:
        self.name = name
        self.schema = schema
        self.primary_key = list(primary_key)
        missing = [c for c in self.primary_key if c not in schema.names]
        if not self.primary_key or missing:
            raise ValueError(f"table sink {name}: primary key {self.primary_key} names columns "
                             f"not in the schema: {missing}")
        if hash_buckets < 1:
            raise ValueError(f"table sink {name}: hash_buckets must be >= 1, got {hash_buckets}")
        if range_column is not None and range_column not in self.primary_key:
            raise ValueError(f"table sink {name}: range column {range_column!r} must be a key "
                             f"column (as in Kudu), key is {self.primary_key}")
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
        """The Delta partition columns: ``_bucket``, then the range column if any."""
        return [BUCKET_COLUMN] + ([self.range_column] if self.range_column else [])

    def stored_schema(self) -> pa.Schema:
        """The Delta table's schema: the columns (keys non-nullable) plus ``_bucket``."""
        fields = [pa.field(f.name, f.type, nullable=f.name not in self.primary_key)
                  for f in self.schema]
        return pa.schema([*fields, pa.field(BUCKET_COLUMN, pa.int32(), nullable=False)])

    def buckets_of(self, table: pa.Table) -> pa.Array:
        """Hash bucket of each row's primary key: xxh3_64 over the key columns'
        values (str/bytes/int as their UTF-8 or decimal text, joined by 0x1f) mod
        ``hash_buckets``. Stable across processes and versions.

        Args:
            table: has the key columns (other columns are ignored).

        Returns:
            An int32 array, one bucket in ``[0, hash_buckets)`` per row.
        """
        cols = [table.column(c).to_pylist() for c in self.primary_key]
        digest, n = xxhash.xxh3_64_intdigest, self.hash_buckets
        out = np.fromiter((digest(b"\x1f".join(_key_bytes(v) for v in vals)) % n
                           for vals in zip(*cols)), dtype=np.int32, count=table.num_rows)
        return pa.array(out, pa.int32())


def _key_bytes(v) -> bytes:
    if isinstance(v, bytes):
        return v
    return str(v).encode()


def delta_uri(store: ObjectStore, key_prefix: str) -> str:
    """The Delta table URI of an object-store prefix.

    Raises:
        NotImplementedError: the store is neither a local directory nor S3.
    """
    from dkvstream.storage.objectstore.s3 import S3ObjectStore

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
    from dkvstream.storage.objectstore.s3 import S3ObjectStore

    if not isinstance(store, S3ObjectStore):
        return None
    cfg = store._config  # what the store was built with (endpoint, region, credentials)
    opts = {"AWS_REGION": store.region, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
    if store.endpoint_url:
        opts["AWS_ENDPOINT_URL"] = store.endpoint_url
        if store.endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    for key, name in (("access_key_id", "AWS_ACCESS_KEY_ID"),
                      ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                      ("session_token", "AWS_SESSION_TOKEN")):
        if cfg.get(key):
            opts[name] = cfg[key]
    return opts
