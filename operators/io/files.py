"""A file source: Parquet, CSV and JSON-lines files landing in a directory or an
object-store prefix, read in order of arrival (Spark Structured Streaming's file source,
Databricks Auto Loader).

Offsets and the file log
------------------------
The source has one partition, ``files``. Each discovery (``end_offsets``) lists the
watched prefix and appends the files it has not seen to a durable, append-only *file
log* in the job's store, under ``dkvstream.operators.paths.source_prefix(job, name)``: per file
its ordinal, name, size, CRC-32 of its bytes, modification time and row count. Offsets
are cumulative row numbers over the logged files, in log order (dense: a file of n rows
takes n offsets, an empty file none), so the offset a checkpoint commits names exactly
which files and rows were processed. A log entry never changes, so a restart re-reads
exactly the same rows; a logged file that later changed or vanished cannot be re-read
as logged, and reading it raises ``SourceFileChangedError`` (or, with
``on_changed_file="dead_letter"``, sends one dead-letter row per offset naming it).

Log layout (as Spark's ``HDFSMetadataLog`` with its compacted ``CompactibleFileStreamLog``)::

    sources/<name>/log/batch-<n:010d>.json     the files discovery n found
    sources/<name>/log/compact-<n:010d>.json   every file of batches 1..n

Batch n is written with put-if-absent, so two processes discovering at once (a driver
and a sensor) never log different files under one number: the loser reloads the log
and discovers again. A writer whose view is older than a compaction that deleted batch
n could still put a batch n; it checks for a compact object numbered n or more after
its put, and readers check that no compaction ran while they read the log. Every
``compact_every`` batches the whole log is written as one compact object and the
batches and compact objects it covers are deleted: the log holds at most
``compact_every + 1`` objects however long the job runs (its bytes grow with the number
of files, about 130 bytes per file plus its name, as Spark's seen-files list does without
``maxFileAge``).

Checkpoints and a damaged file log
----------------------------------
The log is the only record of which file an offset is in: a restart whose log lost its
newest objects would log the files landing next under the lost ordinals, at offsets the
checkpoint says were read, and skip them. So each checkpoint records (``snapshot_state``)
how many logged files its offset covers, ``files``, the CRC-32 of their entries (each as
compact sorted JSON, chained), ``crc32``, and the newest batch number, ``batch``; a
restart (``restore_state``) checks the log before discovering anything. A log shorter
than ``files`` is first completed from the listing, as a discovery would, if the files
it lost are still there unchanged (the CRC-32 then matches); otherwise, or if the first
``files`` entries differ, the restart refuses with ``RecoveryRefusedError`` naming the
first missing object and what to do, having logged nothing (as Spark's file source
fails on a missing metadata-log batch). An object that does not parse, or that follows a
missing one, is a ``CorruptionError`` naming it and the way out. A checkpoint written
before this record (``source_state`` None) is not checked. The CRC-32s of the log's
prefixes are kept with the loaded log, so a commit costs no request and O(new files).

Order of arrival, and files still being written
-----------------------------------------------
Each discovery logs its new files in order of modification time, then name. A file
found by a later discovery comes after every file logged before, whatever its
modification time. A file or directory whose name starts with ``_`` or ``.`` is ignored
(Hadoop's hidden-file rule, which Spark follows): a writer writes ``_name`` or
``.name`` and renames it when complete. An S3 PUT is atomic, so objects need no rename.
A name is logged once: a file rewritten under a logged name is not read again.

Formats
-------
``parquet`` (``pyarrow.parquet``), ``csv`` (``pyarrow.csv``: a header line naming the
columns, then one record per line) and ``jsonl`` (``pyarrow.json``: one JSON object per
line). Columns are read with the declared types: ``value_schema`` for the value columns,
the key column as its ``value_schema`` type or else as a string, the timestamp column
as its ``value_schema`` type, or int64 with ``timestamp_unit``, or else an ISO-8601
timestamp with a zone offset (a CSV timestamp without one: declare the column in
``value_schema`` as a naive ``pa.timestamp``). The key becomes binary (strings as UTF-8, other types as
their string form), the timestamp int64 ms since the Unix epoch (UTC; a naive timestamp
is taken as UTC; finer units are floored to ms).

A malformed row never stops the job: a CSV or JSON-lines line that does not parse or whose
values do not fit the declared types becomes a dead-letter row whose error names the file
and line and whose value is the raw line (the runtime's dead-letter table, with
partition and offset). Offsets of CSV/JSON-lines files are their non-blank data lines,
so a quoted CSV field must not hold a line break (such a record is dead-lettered, as
two bad lines). A Parquet file that cannot be opened takes one offset, a dead-letter row
naming the file; one whose columns are missing or do not cast to the declared types
dead-letters all of its rows.

Requests per discovery: one LIST (per 1,000 files) of the watched prefix, one GET per
new file (the driver reads it to count rows and checksum it), one PUT of the batch and
one LIST of the log when files were found, and every ``compact_every`` batches one PUT and ``compact_every``
DELETEs. Reads: one GET per file (the newest decoded file is kept for the next slice).
"""
from __future__ import annotations

import bisect
import functools
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from dkvstream.operators.api.columns import (
    ERROR_COLUMN,
    INGEST_TIME_COLUMN,
    KEY_COLUMN,
    RAW_VALUE_COLUMN,
    TIMESTAMP_COLUMN,
)
from dkvstream.operators.errors import RecoveryRefusedError, SourceFileChangedError
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.sources import Source
from dkvstream.operators.paths import source_prefix
from dkvstream.storage.errors import CorruptionError, ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore, open_object_store

PARTITION = "files"
FORMATS = ("parquet", "csv", "jsonl")
TIMESTAMP_UNITS = ("s", "ms", "us", "ns")
_BATCH = "batch-"
_COMPACT = "compact-"
# What pyarrow's readers and casts raise on bad bytes or values (ArrowInvalid is a
# ValueError, ArrowTypeError a TypeError, a truncated file an OSError).
_DECODE_ERRORS = (pa.ArrowException, ValueError, TypeError, OSError)
_TEXT_TIMESTAMP = pa.timestamp("us", "UTC")  # a string timestamp without a declared type


@dataclass(frozen=True)
class LoggedFile:
    """One file of the file log.

    Attributes:
        ordinal: position in the log (0-based).
        name: key of the file relative to the watched store.
        size: bytes when logged.
        crc32: CRC-32 of the bytes when logged (``zlib.crc32``).
        mtime_ms: modification time, ms since the Unix epoch (the discovery's wall clock
            for a store that does not report one).
        start: first offset of the file's rows.
        rows: offsets the file takes.
        error: why the whole file is unreadable (a corrupt Parquet file), else None.
    """

    ordinal: int
    name: str
    size: int
    crc32: int
    mtime_ms: int
    start: int
    rows: int
    error: str | None = None

    @property
    def end(self) -> int:
        """One past the file's last offset."""
        return self.start + self.rows


class FileSource(Source):
    """Files landing under a directory or object-store prefix, as one live partition
    (module docstring: offsets, file log, order, formats, bad input).

    Args:
        location: the watched directory or prefix: a path or URI (``s3://bucket/in``,
            ``open_object_store``) or an ``ObjectStore``.
        format: ``"parquet"``, ``"csv"`` or ``"jsonl"``.
        value_schema: the value columns handed to operators, with their types.
        key_column: the column that keys events (becomes the binary ``key``).
        timestamp_column: the event-time column (becomes int64 ms ``timestamp``).
        timestamp_unit: ``"s"``, ``"ms"``, ``"us"`` or ``"ns"`` if the timestamp column
            is an integer count of that unit since the Unix epoch; None: a timestamp.
        prefix: only keys under this prefix of ``location`` are watched.
        suffix: only keys ending with this (e.g. ``".csv"``); None: every key.
        name: the source's name (its metadata prefix, the dead-letter ``source``).
        on_changed_file: a logged file changed or vanished before it was read:
            ``"fail"`` raises ``SourceFileChangedError``; ``"dead_letter"`` sends each of
            its offsets to the dead-letter table and goes on.
        compact_every: compact the file log every this many batches (>= 1).
        max_files_per_discovery: log at most this many new files per discovery, the
            oldest first (Spark's ``maxFilesPerTrigger``): bounds the driver's work
            when a backlog lands; None: every new file.

    Raises:
        ValueError: a bad format, unit, name, policy, ``compact_every`` or
            ``max_files_per_discovery``, a ``value_schema`` column named ``key`` or
            ``timestamp`` (the runtime's own columns), or a timestamp column declared in
            ``value_schema`` as neither a timestamp nor an integer with ``timestamp_unit``.

    Picklable: holds store configurations and the log it loaded, no open client.
    """

    def __init__(self, location: str | ObjectStore, format: str, value_schema: pa.Schema,
                 key_column: str, timestamp_column: str, *, timestamp_unit: str | None = None,
                 prefix: str = "", suffix: str | None = None, name: str = "files",
                 on_changed_file: str = "fail", compact_every: int = 10,
                 max_files_per_discovery: int | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"file source {name}: format must be one of {FORMATS}, got {format!r}")
        if timestamp_unit is not None and timestamp_unit not in TIMESTAMP_UNITS:
            raise ValueError(f"file source {name}: timestamp_unit must be one of "
                             f"{TIMESTAMP_UNITS} or None, got {timestamp_unit!r}")
        if not name or "/" in name:
            raise ValueError(f"file source name {name!r}: non-empty, without '/'")
        if on_changed_file not in ("fail", "dead_letter"):
            raise ValueError(f"file source {name}: on_changed_file must be 'fail' or 'dead_letter', "
                             f"got {on_changed_file!r}")
        if compact_every < 1:
            raise ValueError(f"file source {name}: compact_every must be >= 1, got {compact_every}")
        if max_files_per_discovery is not None and max_files_per_discovery < 1:
            raise ValueError(f"file source {name}: max_files_per_discovery must be >= 1 or None, "
                             f"got {max_files_per_discovery}")
        for reserved in (KEY_COLUMN, TIMESTAMP_COLUMN):
            if reserved in value_schema.names:
                raise ValueError(f"file source {name}: value_schema may not hold a column named "
                                 f"{reserved!r} (the runtime's own column); rename it in the files")
        declared = value_schema.field(timestamp_column).type if timestamp_column in value_schema.names else None
        if declared is not None and not pa.types.is_timestamp(declared) and not (
                pa.types.is_integer(declared) and timestamp_unit is not None):
            raise ValueError(f"file source {name}: value_schema declares the timestamp column "
                             f"{timestamp_column!r} as {declared}: declare a pa.timestamp type, or "
                             f"an integer type and give timestamp_unit")
        self.store = location if isinstance(location, ObjectStore) else open_object_store(location)
        self.format, self.key_column, self.timestamp_column = format, key_column, timestamp_column
        self.timestamp_unit, self.prefix, self.suffix, self.name = timestamp_unit, prefix, suffix, name
        self.on_changed_file, self.compact_every = on_changed_file, compact_every
        self.max_files_per_discovery = max_files_per_discovery
        self._value_schema = value_schema
        self._meta: ObjectStore | None = None
        self._job_prefix = ""
        self._log_prefix = ""
        self._files: list[LoggedFile] | None = None  # the log, loaded on first use
        self._batches = 0  # batches logged (the last batch number)
        self._decoded: tuple[int, pa.Table] | None = None  # the newest decoded file
        self._starts: list[int] = []  # first offset of each logged file, for bisect
        self._crcs: list[int] = [0]  # _crcs[i]: CRC-32 of the first i log entries
        self._map_in_tasks: Callable[[Callable, list], list] | None = None  # use_tasks

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # Reloaded where used:
        state["_files"], state["_decoded"], state["_starts"], state["_crcs"] = None, None, [], [0]
        state["_map_in_tasks"] = None  # the driver's: a task reads in its own process
        return state

    # ------------------------------------------------------------- Source API
    def attach(self, store: ObjectStore, job_prefix: str) -> None:
        """Keeps the file log under ``source_prefix(job_prefix, name)`` of ``store``.

        Raises:
            ValueError: the job's own files are under the watched location (they would
                be read as input).
        """
        watched, own = self._location(), f"{store.root_uri.rstrip('/')}/{job_prefix}/"
        if own.startswith(watched) and not _hidden(own[len(watched):]):
            raise ValueError(f"file source {self.name}: the job's files ({own}) are under the "
                             f"watched location {watched}; watch a prefix of their own "
                             f"(prefix='landing/'), or keep the job's store elsewhere")
        self._meta = store
        self._job_prefix = job_prefix
        self._log_prefix = f"{source_prefix(job_prefix, self.name)}log/"
        self._files = None

    def use_tasks(self, map_in_tasks: Callable[[Callable, list], list]) -> None:
        """New files are surveyed (read for their row count and CRC-32) in tasks: the
        driver receives their log entries, never their bytes."""
        self._map_in_tasks = map_in_tasks

    def partitions(self) -> list[str]:
        return [PARTITION]

    @property
    def bounded(self) -> bool:
        return False

    @property
    def value_schema(self) -> pa.Schema:
        return self._value_schema

    def end_offsets(self) -> dict[str, int]:
        """Discovers new files (module docstring) and returns ``{"files": offsets}``.

        Raises:
            RuntimeError: ``attach`` was not called.
            CorruptionError: a file-log object is damaged (``logged_files``).
        """
        self.discover()
        return {PARTITION: self._end()}

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """Rows at offsets ``[start, end)``: ``key``, ``timestamp``, the value columns,
        ``_error``, ``_raw_value`` and ``_ingest_time`` (the file's modification time).

        Raises:
            KeyError: a partition other than ``files``.
            IndexError: the range is outside the logged offsets.
            SourceFileChangedError: a file of the range changed or vanished since it was
                logged (``on_changed_file="fail"``).
            CorruptionError: a file-log object is damaged (``logged_files``).
        """
        if partition != PARTITION:
            raise KeyError(f"file source {self.name}: unknown partition {partition!r} (it has "
                           f"one, {PARTITION!r})")
        files = self._log()
        if end > self._end():  # another driver may have logged more
            self._files = None
            files = self._log()
        if not 0 <= start <= end <= self._end():
            raise IndexError(f"file source {self.name}: offsets [{start}, {end}) outside [0, "
                             f"{self._end()}]")
        parts = [self._output_schema().empty_table()]
        i = max(0, bisect.bisect_right(self._index(), start) - 1)
        while i < len(files) and files[i].start < end:
            f = files[i]
            lo, hi = max(start, f.start), min(end, f.end)
            if hi > lo:
                parts.append(self._decode(f).slice(lo - f.start, hi - lo))
            i += 1
        return pa.concat_tables(parts)

    # -------------------------------------------------------------- discovery
    def discover(self) -> list[LoggedFile]:
        """Lists the watched prefix and logs the files not yet logged (one batch).

        Returns:
            The newly logged files, in log order.

        Raises:
            RuntimeError: ``attach`` was not called.
            CorruptionError: a file-log object is damaged (``logged_files``).
        """
        for _ in range(3):
            files = self._log()
            entries = self._survey_new(files, self.max_files_per_discovery)
            if not entries:
                return []
            if self._append(files, entries):
                return entries
        raise RuntimeError(f"file source {self.name}: another driver keeps logging files under "
                           f"{self._meta.uri(self._log_prefix)}; run one driver per job")

    def _survey_new(self, files: list[LoggedFile], limit: int | None) -> list[LoggedFile]:
        """Log entries for up to ``limit`` listed files not in ``files``, oldest first,
        numbered after ``files`` (nothing is written)."""
        seen = {f.name for f in files}
        new = sorted((mtime, key) for key, _size, mtime in self._listing() if key not in seen)[:limit]
        run = self._map_in_tasks or (lambda fn, items: [fn(item) for item in items])
        surveys = run(functools.partial(_survey_file, self), [key for _, key in new]) if new else []
        entries, start = [], files[-1].end if files else 0
        for (mtime, key), survey in zip(new, surveys):
            if survey is None:  # deleted between list and get: not arrived, for us
                continue
            size, crc, rows, error = survey
            entries.append(LoggedFile(len(files) + len(entries), key, size, crc, mtime, start, rows, error))
            start = entries[-1].end
        return entries

    def _append(self, files: list[LoggedFile], entries: list[LoggedFile]) -> bool:
        """Logs ``entries`` after ``files`` (the loaded log) as the next batch; False if
        another process logged that batch first (the log is then reloaded on next use)."""
        batch = self._batches + 1
        try:
            self._meta.put_if_absent(f"{self._log_prefix}{_BATCH}{batch:010d}.json",
                                     _encode(self, entries))
        except ObjectExistsError:
            self._files = None  # another driver logged batch n: reload, discover again
            return False
        if self._newest_compact() >= batch:
            # Our view was stale: another process logged batch n, compacted over it
            # and deleted it before our put. Ours is ignored by readers (it is not
            # after the newest compact object) and deleted by the next compaction.
            self._files = None
            return False
        files.extend(entries)
        self._batches = batch
        if batch % self.compact_every == 0:
            self._compact(batch)
        return True

    # ------------------------------------------------------ checkpointed state
    def snapshot_state(self, offsets: dict[str, int]) -> dict:
        """The file log's part in a checkpoint committing ``offsets`` (module docstring,
        "Checkpoints and a damaged file log").

        Returns:
            ``{"files": n, "crc32": c, "batch": b}``: the number of logged files holding
            offsets below ``offsets["files"]``, the CRC-32 of their log entries, and the
            newest batch number logged.
        """
        n = bisect.bisect_left(self._index(), offsets.get(PARTITION, 0))
        return {"files": n, "crc32": self._crc_through(n), "batch": self._batches}

    def restore_state(self, offsets: dict[str, int], state: dict | None) -> None:
        """Checks the file log against ``snapshot_state`` of the checkpoint restarted
        from: its first ``files`` entries must have the recorded CRC-32. A log holding
        fewer (its newest objects lost) is completed from the watched location if the
        files missing from it are still there unchanged, and checked. Nothing is checked
        for ``state`` None (a checkpoint written before it existed).

        Raises:
            RecoveryRefusedError: the log lost entries the checkpoint's offsets cover, or
                holds other ones; names the objects and what to do. Nothing is logged.
            CorruptionError: a file-log object is damaged (``logged_files``).
        """
        if state is None:
            return
        offset, n, crc = offsets.get(PARTITION, 0), state["files"], state["crc32"]
        self._files = None  # the log as stored now, not as this instance last saw it
        files = self._log()
        if len(files) < n and not self._relog(n, crc):
            raise RecoveryRefusedError(self._missing_message(offset, state))
        if self._crc_through(n) != crc:
            raise RecoveryRefusedError(
                f"file source {self.name}: the file log under {self._meta.uri(self._log_prefix)} "
                f"does not hold the files the checkpoint read: its first {n} files have CRC-32 "
                f"{self._crc_through(n)}, the checkpoint recorded {crc} for offsets below {offset} (a "
                f"file-log object was lost and other files logged under its numbers, or an object was "
                f"rewritten). {self._way_out()}")

    def _relog(self, n: int, crc: int) -> bool:
        """Logs the files a log shorter than ``n`` entries lost, if listing the watched
        location finds them again unchanged (the first ``n`` entries then have CRC-32
        ``crc``); False, logging nothing, if it does not."""
        for _ in range(3):
            files = self._log()
            if len(files) >= n:  # another process logged files meanwhile: the CRC decides
                return True
            entries = self._survey_new(files, n - len(files))
            if len(files) + len(entries) < n or \
                    _entries_crc(entries, self._crc_through(len(files))) != crc:
                return False
            if self._append(files, entries):
                return True
        return False

    def _missing_message(self, offset: int, state: dict) -> str:
        have, newest, last = len(self._log()), self._batches, state["batch"]
        first = self._meta.uri(f"{self._log_prefix}{_BATCH}{newest + 1:010d}.json")
        after = "" if last == newest + 1 else f" (or one numbered after it, up to {last})"
        return (f"file source {self.name}: the file log under {self._meta.uri(self._log_prefix)} holds "
                f"{have} files (objects up to number {newest}), but the checkpoint's offsets below "
                f"{offset} cover {state['files']} files, logged up to number {last}: {first}{after} is "
                f"missing, and the files it logged are not in the watched location as they were "
                f"logged. Nothing was logged. Restore the missing object from a copy of the store, or "
                f"put the files it logged back unchanged (same names, bytes and modification times): "
                f"a restart logs them again and checks them. {self._from_the_start()}")

    def _way_out(self) -> str:
        return (f"Restore the file-log objects under {self._meta.uri(self._log_prefix)} as they were "
                f"when the checkpoint was committed, from a copy of the store. {self._from_the_start()}")

    def _from_the_start(self) -> str:
        return (f"Otherwise run the job from the start: delete everything under "
                f"{self._meta.uri(self._job_prefix + '/')} (state and output); every file then in the "
                f"watched location is read.")

    def _index(self) -> list[int]:
        """First offset of each logged file (the log only grows: extended, not rebuilt)."""
        files = self._log()
        if len(self._starts) != len(files):
            self._starts += [f.start for f in files[len(self._starts):]]
        return self._starts

    def _crc_through(self, n: int) -> int:
        """CRC-32 of the first ``n`` log entries (``n`` <= the log's length)."""
        files = self._log()
        while len(self._crcs) <= n:
            self._crcs.append(_entries_crc([files[len(self._crcs) - 1]], self._crcs[-1]))
        return self._crcs[n]

    def logged_files(self) -> list[LoggedFile]:
        """Every logged file, in log (offset) order, without discovering.

        Raises:
            CorruptionError: a file-log object does not parse, or one before it is
                missing; names it and what to do (restore it, or delete it and the
                objects after it if their files are still in place).
        """
        return list(self._log())

    def _listing(self) -> list[tuple[str, int, int]]:
        """``(key, size, mtime ms)`` of the watched files: hidden names and other
        suffixes left out."""
        now = int(time.time() * 1000)
        out = []
        for key, size, mtime in _list_with_times(self.store, self.prefix):
            if _hidden(key[len(self.prefix):]):
                continue
            if self.suffix is not None and not key.endswith(self.suffix):
                continue
            out.append((key, size, now if mtime is None else mtime))
        return out

    def survey(self, key: str) -> tuple[int, int, int, str | None] | None:
        """What the log records of a new file, reading its bytes (in a task, ``use_tasks``).

        Returns:
            ``(size, CRC-32, rows, error)`` (``LoggedFile``'s fields), or None if the file
            is gone.
        """
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            return None
        error = None
        if self.format == "parquet":
            try:
                rows = pq.ParquetFile(arrow_input(data)).metadata.num_rows
            except _DECODE_ERRORS as e:  # any footer error: the file is unreadable as Parquet
                rows, error = 1, f"file {self.store.uri(key)}: not a readable Parquet file: {e}"
        else:
            lines = len(_lines(data))
            rows = lines - 1 if self.format == "csv" and lines else lines  # less the header
        return len(data), zlib.crc32(data), rows, error

    # -------------------------------------------------------------------- log
    def _log(self) -> list[LoggedFile]:
        if self._meta is None:
            raise RuntimeError(f"file source {self.name}: attach(store, job_prefix) was not called "
                               f"(JobRunner calls it; call it yourself to use the source alone)")
        if self._files is None:
            self._files, self._batches = self._load()
            self._starts, self._crcs, self._decoded = [], [0], None  # derived from the log: rebuilt
        return self._files

    def _load(self) -> tuple[list[LoggedFile], int]:
        """The log from the store: the newest compact object, then the batches after it.
        A compaction by another process may delete a listed object: list again."""
        for _ in range(5):
            try:
                files, batches, base = self._load_once()
            except ObjectNotFoundError:
                continue
            # A compaction during the load may have deleted a batch read and let a stale
            # writer put another under its number (see discover): the load counts only if
            # no compaction happened meanwhile.
            if self._newest_compact() == base:
                return files, batches
        raise RuntimeError(f"file source {self.name}: the file log under "
                           f"{self._meta.uri(self._log_prefix)} kept changing while it was read; "
                           f"run one driver per job")

    def _newest_compact(self) -> int:
        """Number of the newest compact object of the log, 0 if none."""
        return max((_number(k) for k in self._meta.list(self._log_prefix)
                    if k.rsplit("/", 1)[1].startswith(_COMPACT)), default=0)

    def _load_once(self) -> tuple[list[LoggedFile], int, int]:
        """``(files, last batch number, newest compact number)`` as stored now."""
        keys = self._meta.list(self._log_prefix)
        compacts = [k for k in keys if k.rsplit("/", 1)[1].startswith(_COMPACT)]
        base = _number(compacts[-1]) if compacts else 0
        files: list[LoggedFile] = []
        batches = base
        for key in ([compacts[-1]] if compacts else []) + [
                k for k in keys if k.rsplit("/", 1)[1].startswith(_BATCH) and _number(k) > base]:
            files.extend(self._decode_log_object(key, len(files)))
            batches = max(batches, _number(key))
        return files, batches, base

    def _decode_log_object(self, key: str, ordinal: int) -> list[LoggedFile]:
        """The entries of log object ``key``, expected to start at ``ordinal``.

        Raises:
            CorruptionError: the object is not a file-log object (truncated, damaged), or
                one before it is missing; names it and what to do.
            ValueError: it is the log of another location.
        """
        data = self._meta.get(key)
        try:
            doc = json.loads(data)
        except ValueError as e:  # a truncated object ends inside the JSON document
            where = f"offset {getattr(e, 'pos', 0)} of {len(data)} bytes"
            raise self._damaged(key, f"file-log object is not valid JSON at {where} "
                                     f"(truncated?): {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise self._damaged(key, f"not a file-log object of version 1 ({len(data)} bytes)")
        where = self._location()
        if doc.get("location") != where:
            raise ValueError(f"file source {self.name}: its file log {self._meta.uri(key)} is of "
                             f"{doc.get('location')!r}, the source watches {where!r}; a job's "
                             f"source location is fixed: use a new job (or source name)")
        try:
            files = [LoggedFile(**e) for e in doc["files"]]
        except (KeyError, TypeError) as e:  # a field missing, renamed or of another shape
            raise self._damaged(key, f"unreadable file-log entries ({len(data)} bytes): {e!r}") from e
        if files and files[0].ordinal != ordinal:
            raise self._damaged(key, f"file-log object starts at file {files[0].ordinal}, expected "
                                     f"{ordinal} (a file-log object before it is missing)",
                                restore="the missing object")
        return files

    def _damaged(self, key: str, what: str, restore: str = "it") -> CorruptionError:
        """The error for damaged file-log object ``key``, with the ways out."""
        return CorruptionError(
            f"{self._meta.uri(key)}: {what}. File source {self.name} cannot load its file log. Restore "
            f"{restore} from a copy of the store. If the files logged from there on are still in the "
            f"watched location unchanged, you may instead delete it and every file-log object "
            f"numbered after it: they are logged again, and a restart checks them against its "
            f"checkpoint. {self._from_the_start()}")

    def _compact(self, batch: int) -> None:
        """Writes the whole log as ``compact-<batch>`` and deletes what it covers."""
        self._meta.put(f"{self._log_prefix}{_COMPACT}{batch:010d}.json", _encode(self, self._files))
        for key in self._meta.list(self._log_prefix):
            name = key.rsplit("/", 1)[1]
            if (name.startswith(_BATCH) and _number(key) <= batch) or (
                    name.startswith(_COMPACT) and _number(key) < batch):
                self._meta.delete(key)

    def _location(self) -> str:
        """The watched location as recorded in the log."""
        return f"{self.store.root_uri.rstrip('/')}/{self.prefix}"

    def _end(self) -> int:
        files = self._log()
        return files[-1].end if files else 0

    # ---------------------------------------------------------------- reading
    def _output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(KEY_COLUMN, pa.binary()), pa.field(TIMESTAMP_COLUMN, pa.int64()),
                          *self._value_schema, pa.field(ERROR_COLUMN, pa.string()),
                          pa.field(RAW_VALUE_COLUMN, pa.binary()),
                          pa.field(INGEST_TIME_COLUMN, pa.int64())])

    def _decode(self, f: LoggedFile) -> pa.Table:
        """Every row of logged file ``f`` in the output schema (cached: the newest file)."""
        if self._decoded is not None and self._decoded[0] == f.ordinal:
            return self._decoded[1]
        uri = self.store.uri(f.name)
        try:
            data = self.store.get(f.name)
            now = f"{len(data)} bytes, CRC-32 {zlib.crc32(data)}"
        except ObjectNotFoundError:
            data, now = None, "gone"
        if data is None or len(data) != f.size or zlib.crc32(data) != f.crc32:
            message = (f"file {uri} changed after it was logged (logged: {f.size} bytes, CRC-32 "
                       f"{f.crc32}; now: {now}); its offsets [{f.start}, {f.end}) cannot be read "
                       f"as logged")
            if self.on_changed_file == "fail":
                raise SourceFileChangedError(
                    f"file source {self.name}: {message}. Restore the file, or set "
                    f"on_changed_file='dead_letter' to dead-letter its offsets and go on")
            table = self._error_rows(f.rows, [message] * f.rows, [None] * f.rows)
        elif f.error is not None:
            table = self._error_rows(f.rows, [f.error] * f.rows, [None] * f.rows)
        elif self.format == "parquet":
            table = self._decode_parquet(uri, data, f.rows)
        else:
            table = self._decode_lines(uri, data, f.rows)
        table = table.set_column(table.schema.get_field_index(INGEST_TIME_COLUMN), INGEST_TIME_COLUMN,
                                 pa.array(np.full(table.num_rows, f.mtime_ms, np.int64)))
        self._decoded = (f.ordinal, table)
        return table

    def _file_types(self) -> dict[str, pa.DataType]:
        """The type each needed column is parsed as (CSV and JSON lines)."""
        types = {self.key_column: pa.string(),
                 self.timestamp_column: pa.int64() if self.timestamp_unit else _TEXT_TIMESTAMP}
        types.update({f.name: f.type for f in self._value_schema})
        return types

    def _convert(self, t: pa.Table) -> pa.Table:
        """File columns -> the output schema (error columns null). Raises on any
        column it cannot convert (missing, or of a type it cannot take)."""
        names = [self.key_column, self.timestamp_column, *self._value_schema.names]
        missing = [c for c in dict.fromkeys(names) if c not in t.column_names]
        if missing:
            raise ValueError(f"column(s) {missing} missing (the file has {t.column_names})")
        key = t.column(self.key_column)
        if not (pa.types.is_binary(key.type) or pa.types.is_large_binary(key.type)):
            key = key if pa.types.is_string(key.type) or pa.types.is_large_string(key.type) \
                else key.cast(pa.string())
        key = key.cast(pa.binary())
        columns = [key, self._millis(t.column(self.timestamp_column))]
        columns += [t.column(f.name).cast(f.type) for f in self._value_schema]
        n = t.num_rows
        columns += [pa.nulls(n, pa.string()), pa.nulls(n, pa.binary()), pa.nulls(n, pa.int64())]
        return pa.Table.from_arrays(columns, schema=self._output_schema())

    def _millis(self, ts: pa.ChunkedArray) -> pa.ChunkedArray:
        """A timestamp column as int64 ms since the Unix epoch, floored."""
        if pa.types.is_timestamp(ts.type):
            unit = ts.type.unit
        elif pa.types.is_integer(ts.type) and self.timestamp_unit is not None:
            unit = self.timestamp_unit
        else:
            raise ValueError(f"timestamp column {self.timestamp_column!r} is {ts.type}: give "
                             f"timestamp_unit for an integer count since the Unix epoch, or store "
                             f"a timestamp")
        raw = ts.cast(pa.int64())
        if unit == "s":
            return pc.multiply_checked(raw, 1000)
        if unit == "ms":
            return raw
        d = 1000 if unit == "us" else 1_000_000
        q = pc.divide(raw, d)  # truncates toward zero: one less for a negative remainder
        return pc.if_else(pc.and_(pc.less(raw, 0), pc.not_equal(pc.multiply(q, d), raw)),
                          pc.subtract(q, 1), q)

    def _error_rows(self, n: int, errors: list[str], raw: list[bytes | None]) -> pa.Table:
        schema = self._output_schema()
        columns = [pa.nulls(n, f.type) for f in schema]
        columns[schema.get_field_index(ERROR_COLUMN)] = pa.array(errors, pa.string())
        columns[schema.get_field_index(RAW_VALUE_COLUMN)] = pa.array(raw, pa.binary())
        return pa.Table.from_arrays(columns, schema=schema)

    def _decode_parquet(self, uri: str, data: bytes, rows: int) -> pa.Table:
        try:
            names = list(dict.fromkeys([self.key_column, self.timestamp_column, *self._value_schema.names]))
            table = self._convert(pq.read_table(arrow_input(data), columns=names))
        except _DECODE_ERRORS as e:  # the whole file: a bad page, a missing column, a lossy cast
            return self._error_rows(rows, [f"file {uri}: {e}"] * rows, [None] * rows)
        return table

    def _decode_lines(self, uri: str, data: bytes, rows: int) -> pa.Table:
        lines = _lines(data)
        header = None
        if self.format == "csv" and lines:
            header, lines = lines[0][1], lines[1:]
        types = self._file_types()
        if header is not None:
            have = [c.strip().strip('"') for c in header.decode("utf-8", "replace").split(",")]
            missing = [c for c in types if c not in have]
            if missing:  # every record is bad the same way: say so once per line, no parsing
                error = f"file {uri}: header has no column(s) {missing} (it has {have})"
                return self._error_rows(rows, [error] * rows, [line for _, line in lines])

        def parse(chunk: list[tuple[int, bytes]]) -> pa.Table:
            body = b"\n".join(line for _, line in chunk) + b"\n"
            if self.format == "csv":
                # A record on one line has balanced quotes ("" escapes one); an odd count is
                # a field with a line break, which the parser would silently cut short.
                if any(line.count(b'"') % 2 for _, line in chunk):
                    raise ValueError("unbalanced quotes: a quoted field with a line break? "
                                     "(records must be one line each)")
                t = pa_csv.read_csv(arrow_input(header + b"\n" + body), convert_options=pa_csv.ConvertOptions(
                    column_types=types, include_columns=list(types)))
            else:
                t = pa_json.read_json(arrow_input(body), parse_options=pa_json.ParseOptions(
                    explicit_schema=pa.schema(list(types.items())), unexpected_field_behavior="ignore"))
            if t.num_rows != len(chunk):
                raise ValueError(f"{t.num_rows} records parsed from {len(chunk)} lines")
            return self._convert(t)

        return pa.concat_tables(self._parse_bisect(uri, lines, parse)) if lines \
            else self._output_schema().empty_table()

    def _parse_bisect(self, uri: str, lines: list[tuple[int, bytes]], parse) -> list[pa.Table]:
        """Parses ``lines`` in one go; if that fails, each half again, down to the bad
        lines, which become error rows: O(bad lines x log lines) parser calls."""
        try:
            return [parse(lines)]
        except _DECODE_ERRORS as e:  # any parse or conversion error marks bad lines
            if len(lines) == 1:
                number, raw = lines[0]
                return [self._error_rows(1, [f"file {uri} line {number}: {e}"], [raw])]
        mid = len(lines) // 2
        return self._parse_bisect(uri, lines[:mid], parse) + self._parse_bisect(uri, lines[mid:], parse)


def _hidden(path: str) -> bool:
    """True if a component of ``path`` starts with ``_`` or ``.`` (Hadoop's rule)."""
    return any(part.startswith(("_", ".")) for part in path.split("/"))


def _lines(data: bytes) -> list[tuple[int, bytes]]:
    """``(1-based line number, line)`` of each non-blank line, line ends removed."""
    return [(i + 1, line.rstrip(b"\r")) for i, line in enumerate(data.split(b"\n")) if line.strip()]


def _number(key: str) -> int:
    return int(key.rsplit("-", 1)[1].split(".", 1)[0])


def _survey_file(source: FileSource, key: str) -> tuple[int, int, int, str | None] | None:
    """A survey task (``FileSource.survey``); pickled to Spark tasks."""
    return source.survey(key)


def _entries_crc(entries: list[LoggedFile], crc: int = 0) -> int:
    """CRC-32 of ``entries`` (each as compact sorted JSON), continuing from ``crc``."""
    for f in entries:
        crc = zlib.crc32(json.dumps(asdict(f), sort_keys=True, separators=(",", ":")).encode(), crc)
    return crc


def _encode(source: FileSource, files: list[LoggedFile]) -> bytes:
    return json.dumps({"version": 1, "location": source._location(), "files": [asdict(f) for f in files]},
                      separators=(",", ":")).encode()


def _list_with_times(store: ObjectStore, prefix: str) -> list[tuple[str, int, int | None]]:
    """``(key, size, mtime ms or None)`` of every object under ``prefix``: the local
    store's file times, S3's ``LastModified``; other stores report no time."""
    from dkvstream.storage.objectstore.local import LocalObjectStore
    from dkvstream.storage.objectstore.s3 import S3ObjectStore

    if isinstance(store, S3ObjectStore):
        root = f"{store.prefix}/" if store.prefix else ""
        out, token = [], None
        while True:
            kwargs = {"Bucket": store.bucket, "Prefix": root + prefix, "MaxKeys": store.list_page_size}
            if token:
                kwargs["ContinuationToken"] = token
            store.stats.record("LIST")
            page = store.client.list_objects_v2(**kwargs)
            out += [(o["Key"][len(root):], o["Size"], int(o["LastModified"].timestamp() * 1000))
                    for o in page.get("Contents", ())]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out
    keys = store.list(prefix)
    if isinstance(store, LocalObjectStore):
        out = []
        for key in keys:
            try:
                st = _local_path(store, key).stat()
            except FileNotFoundError:  # deleted since the listing
                continue
            out.append((key, st.st_size, st.st_mtime_ns // 1_000_000))
        return out
    return [(key, store.size(key), None) for key in keys]


def _local_path(store: ObjectStore, key: str):
    from pathlib import Path

    return Path(url2pathname(urlparse(store.uri(key)).path))
