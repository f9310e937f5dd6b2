"""Sinks: where an operator's outputs land, exactly once.

Tasks write output files under *staging* names unique to (epoch, range, attempt); the
driver names them in the epoch's checkpoint and only then *publishes* them to their
final, deterministic names. Publishing is idempotent and re-run on restart for the
newest checkpoint, so a crash between any two steps neither loses nor duplicates rows,
and readers of the sink directory never see a file of an uncommitted epoch.

A sink whose publish copies the staged object byte for byte (``ParquetSink``) records
its checksum when staging (``Sink.stage``), and the checkpoint keeps it, so a restart
leaves a published file that is already correct alone and never publishes a staged file
damaged since (``Sink.check_staged``, ``Sink.republish``).

Erasure (``Sink.erase_rows``, a GDPR request) removes a key's rows from a sink's
published output and from the job's staged files of it. A ``ParquetSink`` rewrites
each file holding a matching row in place (one atomic PUT over the same name, so a
reader of the directory sees every other row exactly once at every moment) and
records in the rewritten file's footer (``ERASED_FROM``) the checksum of the bytes it
replaced: that is the checksum the checkpoint recorded when the file was staged, so a
restart takes the rewritten file for the published copy it expects and neither copies
the staged file again nor refuses it (``ParquetSink.check_staged``).
"""
from __future__ import annotations

import io
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dkvstream.operators import paths
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.paths import range_label_of
from dkvstream.storage.errors import ObjectNotFoundError
from dkvstream.storage.objectstore import REQUEST_THREADS, ObjectStore, map_requests
from dkvstream.storage.objectstore.checksum import ObjectChecksum

# A ParquetSink's files sit in ``epoch=<e>`` directories, which every reader of the table
# by its directory (pyarrow, DuckDB, Spark: hive partitioning) turns into this column.
EPOCH_COLUMN = "epoch"
_EPOCH_DIR = re.compile(r"/epoch=(\d+)/")
# Footer key of a Parquet file rewritten by an erasure: the ``[size, crc32c]`` of the
# file's bytes before its first erasure (``ParquetSink.erase_rows``).
ERASED_FROM = b"dkvstream.erased_from"


class Sink(ABC):
    """Receives the records of one operator output."""

    name: str = "sink"

    @abstractmethod
    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        """Write ``table`` under ``staging_prefix`` (unique to the task attempt) in the
        task; return the staged object key."""

    def stage(self, store: ObjectStore, staging_prefix: str, table: pa.Table
              ) -> tuple[str, ObjectChecksum | None]:
        """``write_staged``, with the staged object's checksum where the sink computes one
        (the checkpoint records it; ``check_staged``). The runtime's tasks call this one.

        Returns:
            ``(staged object key, its checksum or None)``. Default: no checksum.
        """
        return self.write_staged(store, staging_prefix, table), None

    def prepare(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str]) -> None:
        """Called by the driver before it commits ``epoch``, with the epoch's staged
        files; raising fails the epoch with nothing committed (e.g. an insert of an
        existing key into a table sink). Default: nothing to check."""

    def prepare_in_tasks(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                         map_in_tasks: Callable[[Callable, list], list]) -> None:
        """``prepare``, for a sink whose check reads the staged rows (a table sink's
        inserts): ``map_in_tasks`` as in ``publish_in_tasks``, so the rows never pass
        through the driver. The runtime calls this one. Default: ``prepare``."""
        self.prepare(store, job_prefix, epoch, staged)

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

    def check_staged(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                     checksums: dict[str, ObjectChecksum], full: bool) -> list[str]:
        """Whether a restart can publish committed epoch ``epoch`` again (its checkpoint
        is checked before the job continues from it, ``dkvstream.operators.runtime.recovery``).

        Args:
            staged: the epoch's staged object keys of this sink's output.
            checksums: staged key -> checksum taken when staging (absent: not checked;
                checkpoints written before checksums existed have none).
            full: ``verify_restart="full"``: read objects rather than compare sizes.

        Returns:
            One message per object that cannot be published, naming its URI. Default:
            each staged object exists.
        """
        return [f"{store.uri(k)}: staged output named by epoch {epoch} is missing"
                for k in staged if not store.exists(k)]

    def republish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                  checksums: dict[str, ObjectChecksum], full: bool,
                  map_in_tasks: Callable[[Callable, list], list]) -> list[str]:
        """Publishes the newest committed epoch again on restart, finishing a publish a
        crash interrupted; arguments as ``check_staged`` and ``publish_in_tasks``.
        Default: ``publish_in_tasks`` (a sink that is idempotent by its own means)."""
        return self.publish_in_tasks(store, job_prefix, epoch, staged, map_in_tasks)

    @abstractmethod
    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        """Everything published so far, as one table."""

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str] | None:
        """What this sink has made visible for epochs after ``epoch`` (URIs or a
        description; empty if nothing), or None if it cannot tell. A restart falls back
        to checkpoint ``epoch`` only when nothing is (``dkvstream.operators.runtime.recovery``)."""
        return None

    def erasure_column(self, column: str) -> str:
        """The column this sink erases by when the job's subject key is in ``column``
        of its outputs: ``column`` itself, but the record key's column for a sink whose
        rows are keyed records (a topic, the dead-letter table)."""
        return column

    def erase_rows(self, store: ObjectStore, job_prefix: str, column: str, values: list) -> list[str]:
        """Erasure (a GDPR request): removes every row whose ``column`` equals one of
        ``values`` from this sink's published output and from the job's staged files of
        it, so that no object the sink wrote holds them and a restart does not publish
        them again. Idempotent: a second call finds nothing and returns ``[]``.

        Args:
            store: the job's object store.
            job_prefix: the job's prefix (``dkvstream.operators.paths.job_prefix``).
            column: the column to match (the sink's key column, e.g. ``key``).
            values: the values to erase (Python values of the column's type; ``str``
                and ``bytes`` are taken for each other).

        Returns:
            The keys of the objects that held a matching row (before the rewrite),
            sorted.

        Raises:
            NotImplementedError: the sink cannot erase rows (names the sink).
            ValueError: no object of the sink has ``column``.
        """
        raise NotImplementedError(f"sink {self.name} ({type(self).__name__}) cannot erase rows; "
                                  f"remove them from its output by hand")


class ParquetSink(Sink):
    """A Parquet table: one zstd-compressed file per (epoch, range) under
    ``<job>/sinks/<name>/epoch=<epoch>/``.

    Args:
        name: table name (the Dagster asset name of the sink).
        schema: Arrow schema of the records; read back with it even when empty.

    Raises:
        ValueError: ``schema`` has an ``epoch`` column (``check_columns``).
    """

    def __init__(self, name: str, schema: pa.Schema | None = None) -> None:
        self.name = name
        self.schema = schema
        if schema is not None:
            self.check_columns(schema.names)

    def check_columns(self, names: list[str]) -> None:
        """Refuses an ``epoch`` column: readers by directory add one from the ``epoch=``
        directories, and pyarrow cannot merge the two (``Unable to merge: Field epoch has
        incompatible types``).

        Raises:
            ValueError: naming the table and what to do.
        """
        if EPOCH_COLUMN in names:
            raise ValueError(f"ParquetSink {self.name!r}: the output has a column {EPOCH_COLUMN!r}, "
                             f"which readers of the table's directory (pyarrow, DuckDB, Spark) also "
                             f"take from its epoch=<e> directories and cannot merge with it; rename "
                             f"the column")

    def table_prefix(self, job_prefix: str) -> str:
        """Object-store prefix of the published table."""
        return paths.sink_prefix(job_prefix, self.name) + "/"

    def write_staged(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> str:
        return self.stage(store, staging_prefix, table)[0]

    def stage(self, store: ObjectStore, staging_prefix: str, table: pa.Table) -> tuple[str, ObjectChecksum]:
        self.check_columns(table.column_names)
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        key = f"{staging_prefix}/{self.name}.parquet"
        data = buf.getvalue()
        store.put(key, data)
        return key, ObjectChecksum.of(data)

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

    def check_staged(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                     checksums: dict[str, ObjectChecksum], full: bool) -> list[str]:
        """Each staged file with a checksum is publishable if its published copy already
        matches it (size; CRC32C too when ``full``: one HEAD or GET) or, failing that,
        the staged file itself matches (one GET: it is about to be copied). One without
        a checksum: it, or its published copy, exists."""
        actions = map_requests(lambda key: self._restart_action(store, job_prefix, epoch, key,
                                                                checksums.get(key), full),
                               staged, REQUEST_THREADS)
        return [problem for _, problem in actions if problem]

    def _restart_action(self, store: ObjectStore, job_prefix: str, epoch: int, key: str,
                        expected: ObjectChecksum | None, full: bool) -> tuple[str, str | None]:
        """What a restart does with staged file ``key``: ``("keep", None)`` (its published
        copy matches), ``("copy", None)`` (the staged file matches, or has no checksum) or
        ``("refuse", why)``."""
        final = self.published_key(job_prefix, epoch, key)
        if expected is None:
            if store.exists(key) or store.exists(final):
                return "copy", None
            return "refuse", f"{store.uri(key)}: staged output named by epoch {epoch} is missing"
        published = expected.mismatch(store, final, full)
        if published is None or erased_from(store, final) == expected:
            return "keep", None  # as published, or as an erasure rewrote it
        damage = expected.mismatch(store, key, full=True)
        if damage is None or erased_from(store, key) == expected:
            return "copy", None
        return "refuse", (f"{store.uri(key)}: staged output of epoch {epoch} {damage} (the checkpoint "
                          f"recorded it as written), and its published copy {store.uri(final)} "
                          f"{published}: it cannot be published")

    def republish(self, store: ObjectStore, job_prefix: str, epoch: int, staged: list[str],
                  checksums: dict[str, ObjectChecksum], full: bool,
                  map_in_tasks: Callable[[Callable, list], list]) -> list[str]:
        """``publish`` of files whose published copy does not match their checksum yet
        (a file already published correctly is left alone: one HEAD, or a GET when
        ``full``); a staged file is read and checked before it is copied (one GET).
        Files without a checksum are copied as by ``publish``.

        Raises:
            RecoveryRefusedError: a staged file to copy no longer matches its checksum
                (nothing was copied over its published name); the message names both
                objects and what to do.
            ObjectNotFoundError: a staged file without a checksum is gone and was never
                published.
        """
        return map_requests(lambda key: self._republish_one(store, job_prefix, epoch, key,
                                                            checksums.get(key), full),
                            staged, REQUEST_THREADS)

    def _republish_one(self, store: ObjectStore, job_prefix: str, epoch: int, key: str,
                       expected: ObjectChecksum | None, full: bool) -> str:
        if expected is None:
            return self._publish_one(store, job_prefix, epoch, key)
        action, problem = self._restart_action(store, job_prefix, epoch, key, expected, full)
        if action == "refuse":
            raise RecoveryRefusedError(
                f"sink {self.name}: {problem}. Nothing was copied. Restore the staged object, or "
                f"delete the published output of epoch {epoch} "
                f"({store.uri(self.table_prefix(job_prefix))}epoch={epoch:08d}/) so that the restart "
                "falls back to the previous checkpoint and computes the epoch again.")
        final = self.published_key(job_prefix, epoch, key)
        if action == "copy":
            store.copy(key, final)
        return final

    def published_after(self, store: ObjectStore, job_prefix: str, epoch: int) -> list[str]:
        return [store.uri(k) for k in store.list(self.table_prefix(job_prefix))
                if (m := _EPOCH_DIR.search(k)) and int(m.group(1)) > epoch]

    def staged_file_name(self) -> str:
        """The name of this sink's staged files (the last part of their keys)."""
        return f"{self.name}.parquet"

    def erase_rows(self, store: ObjectStore, job_prefix: str, column: str, values: list) -> list[str]:
        """Erasure: rewrites every published file of the table and every staged file of
        the sink (under the job's staging prefixes, named by a retained checkpoint or
        not) that holds a row whose ``column`` is in ``values``, without those rows.

        Each rewrite is one PUT over the same name (atomic, no temporary object in the
        table's directory): a reader of the directory sees the file before or after,
        so every other row exactly once. A file left without rows stays as an empty
        file of the same schema, so the epoch's published names do not change. Staged
        files are rewritten before published ones: a publish racing with the erasure
        copies an erased staged file. The rewritten file's footer keeps the checksum
        the checkpoint recorded (``ERASED_FROM``), so a restart keeps it
        (``check_staged``).

        Cost: one LIST of the table, one LIST of the job's staging prefixes, one GET
        per file (published and staged), one PUT per file rewritten.

        Args and returns: as ``Sink.erase_rows``.

        Raises:
            ValueError: no file of the sink has ``column``, or a value cannot be
                converted to the column's type.
        """
        published = [k for k in store.list(self.table_prefix(job_prefix))
                     if k.endswith(".parquet") and _EPOCH_DIR.search(k)]
        name = "/" + self.staged_file_name()
        staged = [k for k in staged_keys(store, job_prefix) if k.endswith(name)]
        found: list[tuple[bool, bool]] = []
        for keys in (staged, published):  # staged first (docstring)
            found += map_requests(lambda k: erase_from_parquet(store, k, column, values, f"sink {self.name}"),
                                  keys, REQUEST_THREADS)
        if published + staged and not any(has for has, _ in found):
            raise ValueError(f"sink {self.name}: no file of {store.uri(self.table_prefix(job_prefix))} has a "
                             f"column {column!r}; erase by one of the sink's columns")
        return sorted(k for k, (_, held) in zip(staged + published, found) if held)


    def read_published(self, store: ObjectStore, key: str, epoch: int) -> pa.Table:
        """The rows of one published file ``key`` of epoch ``epoch`` (for ``read``)."""
        return pq.read_table(arrow_input(store.get(key)))

    def read(self, store: ObjectStore, job_prefix: str) -> pa.Table:
        tables = [
            self.read_published(store, k, int(m.group(1)))
            for k in store.list(self.table_prefix(job_prefix))
            if k.endswith(".parquet") and (m := _EPOCH_DIR.search(k))
        ]
        if not tables:
            if self.schema is None:
                return pa.table({})
            return self.schema.empty_table()
        return pa.concat_tables(tables, promote_options="default")


def staged_keys(store: ObjectStore, job_prefix: str) -> list[str]:
    """Every staged file of a job, in either key layout (``dkvstream.operators.paths``):
    one LIST of ``staging/`` and one of ``r/``."""
    return list_task_files(store, job_prefix, with_state=False)[1]


def list_task_files(store: ObjectStore, job_prefix: str, *, with_state: bool = True) -> tuple[list[str], list[str]]:
    """What a job's tasks wrote, in either key layout (``dkvstream.operators.paths``):
    ``(DKV files, staged files)``, from one LIST each of ``staging/``, ``r/`` (where
    ``LAYOUT_HASHED`` puts both) and, ``with_state``, ``state/`` (else the DKV list is
    empty). The LISTs run in parallel."""
    roots = [paths.staging_root(job_prefix), paths.hashed_root(job_prefix)]
    flat_staged, hashed, *flat_state = map_requests(
        store.list, roots + ([paths.state_root(job_prefix)] if with_state else []))
    staged = flat_staged + [k for k in hashed if paths.is_staged_key(job_prefix, k)]
    if not with_state:
        return [], staged
    return flat_state[0] + [k for k in hashed if paths.parse_state_key(job_prefix, k) is not None], staged


def erase_from_parquet(store: ObjectStore, key: str, column: str, values: list, where: str) -> tuple[bool, bool]:
    """Rewrites Parquet file ``key`` without the rows whose ``column`` is one of
    ``values`` (one GET; one PUT over the same name if it held one), recording in its
    footer the checksum of its bytes before the first such rewrite (``ERASED_FROM``).

    Args:
        where: who asks, for errors (``"sink <name>"``).

    Returns:
        ``(the file has the column, it held a matching row)``; ``(False, False)`` for a
        missing file.

    Raises:
        ValueError: a value does not convert to the column's type (``erase_value_set``).
    """
    try:
        data = store.get(key)
    except ObjectNotFoundError:  # a staged file collected meanwhile
        return False, False
    table = pq.read_table(arrow_input(data))
    if column not in table.column_names:
        return False, False
    col = table.column(column)
    hit = pc.fill_null(pc.is_in(col, value_set=erase_value_set(values, col.type, where, column)), False)
    if not pc.any(hit).as_py():
        return True, False
    meta = dict(table.schema.metadata or {})
    # The first erasure's checksum is the staged file's: a later one keeps it.
    meta.setdefault(ERASED_FROM, json.dumps(ObjectChecksum.of(data).to_json()).encode())
    buf = io.BytesIO()
    pq.write_table(table.filter(pc.invert(hit)).replace_schema_metadata(meta), buf, compression="zstd")
    store.put(key, buf.getvalue())
    return True, True


def erased_from(store: ObjectStore, key: str) -> ObjectChecksum | None:
    """The checksum of Parquet file ``key``'s bytes before an erasure rewrote it
    (``ParquetSink.erase_rows``), or None if it was not rewritten, is missing or is not
    Parquet. One GET."""
    try:
        meta = pq.read_metadata(arrow_input(store.get(key))).metadata or {}
    except (ObjectNotFoundError, pa.ArrowException, OSError):  # damaged: not an erasure
        return None
    raw = meta.get(ERASED_FROM)
    return None if raw is None else ObjectChecksum.from_json(json.loads(raw))


def erase_value_set(values: list, arrow_type: pa.DataType, where: str, column: str) -> pa.Array:
    """``values`` as an array of the column's type, for matching rows to erase: a
    ``str`` is taken as its UTF-8 bytes for a binary column, ``bytes`` as UTF-8 text
    for a string column.

    Raises:
        ValueError: a value does not convert; names ``where`` and ``column``.
    """
    binary = pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)
    text = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    converted = [v.encode() if binary and isinstance(v, str)
                 else v.decode() if text and isinstance(v, (bytes, bytearray)) else v for v in values]
    try:
        return pa.array(converted).cast(arrow_type) if converted else pa.array([], arrow_type)
    except (pa.ArrowException, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot match values {values!r} against column {column!r} of type "
                         f"{arrow_type}: {e}; give values of the column's type") from e
