"""Sinks: where an operator's outputs land, exactly once.

Tasks write output files under *staging* names unique to (epoch, range, attempt); the
driver names them in the epoch's checkpoint and only then *publishes* them to their
final, deterministic names. Publishing is idempotent and re-run on restart for the
newest checkpoint, so a crash between any two steps neither loses nor duplicates rows,
and readers of the sink directory never see a file of an uncommitted epoch.
"""
from __future__ import annotations

import io
import re
from abc import ABC, abstractmethod
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from operators import paths
from operators.io.arrow_input import arrow_input
from operators.paths import range_label_of
from storage.errors import ObjectNotFoundError
from storage.objectstore import REQUEST_THREADS, ObjectStore, map_requests

_EPOCH_DIR = re.compile(r"/epoch=(\d+)/")


class Sink(ABC):
    """Receives the records of one operator output."""

    name: str = "sink"

    @abstractmethod
    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        """Write ``table`` under ``staging_prefix`` (unique to the task attempt) in the
        task; return the staged object key."""

    def prepare(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> None:
        """Called by the driver before it commits ``epoch``, with the epoch's staged
        files; raising fails the epoch with nothing committed (e.g. an insert of an
        existing key into a table sink). Default: nothing to check."""

    @abstractmethod
    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        """Make the staged files of a committed epoch visible; idempotent. Returns the
        published keys."""

    def publish_in_tasks(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                         map_in_tasks: Callable[[Callable, list], list]) -> list[str]:
        """``publish``, for a sink whose publishing moves the staged rows (a Kafka
        producer): ``map_in_tasks(fn, items)`` returns ``[fn(item) for item in items]``
        computed in Spark tasks (in this process for an in-process runner), so the rows
        never pass through the driver; ``fn`` is pickled to the tasks. The runtime calls
        this one. Default: ``publish`` (a sink that only renames or copies objects)."""
        return self.publish(store, job_prefix, epoch, staged)

    @abstractmethod
    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """Everything published so far, as one table."""

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str] | None:
        """What this sink has made visible for epochs after ``epoch`` (URIs or a
        description; empty if nothing), or None if it cannot tell. A restart falls back
        to checkpoint ``epoch`` only when nothing is (``operators.runtime.recovery``)."""
        return None


class ParquetSink(Sink):
    """A Parquet table: one zstd-compressed file per (epoch, range) under
    ``<job>/sinks/<name>/epoch=<epoch>/``.

    Args:
        name: table name (the Dagster asset name of the sink).
        schema: Arrow schema of the records; read back with it even when empty.
    """

    def __init__(self, name: str, schema: pa.Schema | None = None) -> None:
        self.name = name
        self.schema = schema

    def table_prefix(self, job_prefix: str) -> str:
        """Object-store prefix of the published table."""
        return paths.sink_prefix(job_prefix, self.name) + "/"

    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        key = f"{staging_prefix}/{self.name}.parquet"
        store.put(key, buf.getvalue())
        return key

    def published_key(self, job_prefix: str, epoch: int, staged_key: str) -> str:
        """Final name of a staged file: deterministic in (epoch, range), so a
        re-publish overwrites rather than duplicates."""
        return f"{self.table_prefix(job_prefix)}epoch={epoch:08d}/part-{range_label_of(staged_key)}.parquet"

    def publish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> list[str]:
        """Copies each staged file to its final name inside the store (``ObjectStore.copy``:
        S3 ``CopyObject``, no bytes through the driver), ``REQUEST_THREADS`` at a time.

        Idempotent: a final name is deterministic in (epoch, range), and a copy replaces
        it atomically with the same bytes, so a re-publish after a crash rewrites what
        was published and duplicates nothing. One COPY per file; a staged file already
        gone (deleted by retention after its epoch expired) costs a HEAD of the final
        name more.

        Returns:
            the final keys, in the order of ``staged``.

        Raises:
            ObjectNotFoundError: a staged file is gone and was never published.
        """
        return map_requests(lambda key: self._publish_one(store, job_prefix, epoch, key), staged,
                            REQUEST_THREADS)

    def _publish_one(self, store: ObjectStore, job_prefix: str, epoch: int, key: str) -> str:
        final = self.published_key(job_prefix, epoch, key)
        try:
            store.copy(key, final)
        except ObjectNotFoundError:
            if not store.exists(final):
                raise
        return final

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        return [store.uri(k) for k in store.list(self.table_prefix(job_prefix))
                if (m := _EPOCH_DIR.search(k)) and int(m.group(1)) > epoch]

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        tables = [
            pq.read_table(arrow_input(store.get(k)))
            for k in store.list(self.table_prefix(job_prefix))
            if k.endswith(".parquet")
        ]
        if not tables:
            if self.schema is None:
                return pa.table({})
            return self.schema.empty_table()
        return pa.concat_tables(tables, promote_options="default")
