"""The object-store interface: the only gateway to bytes at rest.

Everything the storage layer persists (SSTables, WAL objects, manifests) goes through an
``ObjectStore``. The interface is deliberately small so that a local directory and an S3
bucket can both implement it:

* ``put`` overwrites atomically (readers see the old or the new object, never a partial one);
* ``put_if_absent`` is the only conditional write, used to commit manifests;
* ``get`` / ``get_range`` / ``size`` / ``exists`` read; ``list`` lists keys under a prefix;
* ``delete`` is idempotent; ``delete_many`` deletes a batch of keys in one request per
  ``DELETE_BATCH`` keys (S3 ``DeleteObjects``);
* ``copy`` copies an object inside the store without its bytes passing through the
  caller (S3 ``CopyObject``), atomically like ``put``.

Requests that do not depend on each other can be issued concurrently with
``map_requests`` (a bounded thread pool); every store is safe to call from several threads.

Keys are ``/``-separated relative paths (no leading ``/``, no ``..``). Every request is
counted in ``ObjectStore.stats`` so tests and benchmarks can report GETs and PUTs.

Implementations are picked by URI scheme with ``open_object_store`` (like pyiceberg's
``load_file_io``). A store pickles as its configuration (a local root; an S3 bucket,
prefix, endpoint, region and credentials), so Spark tasks get the driver's store and
rebuild its clients; its request counts start afresh in each process.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar
from urllib.parse import urlparse

from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "ObjectExistsError",
    "ObjectNotFoundError",
    "ObjectStore",
    "RequestStats",
    "map_requests",
    "open_existing_store",
    "open_object_store",
    "subtract_requests",
    "sum_requests",
]

REQUEST_KINDS = ("GET", "PUT", "LIST", "DELETE", "HEAD", "COPY")
# Keys per ``delete_many`` request: the S3 ``DeleteObjects`` maximum.
DELETE_BATCH = 1000
# Threads ``map_requests`` uses by default: enough to hide a 10-ms request latency at
# thousands of requests per second, and within a boto3 client's connection pool.
REQUEST_THREADS = 32


class RequestStats:
    """Thread-safe counters of object-store requests and bytes moved.

    Counts are per request kind (``GET`` includes ranged gets, ``PUT`` includes
    ``put_if_absent``, ``HEAD`` is ``size``/``exists``, ``DELETE`` counts one
    ``delete`` or one ``delete_many`` batch of up to ``DELETE_BATCH`` keys, ``COPY`` is
    ``copy``), plus ``bytes_read`` and
    ``bytes_written`` (payload bytes only).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REQUEST_KINDS, 0)
        self._bytes_read = 0
        self._bytes_written = 0

    def record(self, kind: str, bytes_read: int = 0, bytes_written: int = 0) -> None:
        """Counts one request.

        Args:
            kind: One of ``REQUEST_KINDS``.
            bytes_read: Payload bytes returned by the request.
            bytes_written: Payload bytes sent by the request.
        """
        with self._lock:
            self._counts[kind] += 1
            self._bytes_read += bytes_read
            self._bytes_written += bytes_written

    def snapshot(self) -> dict[str, int]:
        """Returns a consistent copy of the counters as a plain dict.

        Returns:
            ``{"GET": n, "PUT": n, "LIST": n, "DELETE": n, "HEAD": n, "COPY": n,
            "bytes_read": n, "bytes_written": n}``.
        """
        with self._lock:
            out = dict(self._counts)
            out["bytes_read"] = self._bytes_read
            out["bytes_written"] = self._bytes_written
            return out

    def reset(self) -> None:
        """Sets every counter back to zero."""
        with self._lock:
            self._counts = dict.fromkeys(REQUEST_KINDS, 0)
            self._bytes_read = 0
            self._bytes_written = 0


STAT_FIELDS = (*REQUEST_KINDS, "bytes_read", "bytes_written")


def subtract_requests(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Requests and bytes between two ``RequestStats.snapshot()``s (``after - before``)."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in STAT_FIELDS}


def sum_requests(snapshots) -> dict[str, int]:
    """Field-wise sum of ``RequestStats.snapshot()``-shaped dicts (missing fields are 0)."""
    total = dict.fromkeys(STAT_FIELDS, 0)
    for snap in snapshots:
        for k in STAT_FIELDS:
            total[k] += snap.get(k, 0)
    return total


class ObjectStore(ABC):
    """A flat key -> bytes store with atomic writes and request counting.

    Implementations must be safe to call from several threads; DKV itself is
    single-threaded, but several DKV instances may share one store.
    """

    def __init__(self) -> None:
        self.stats = RequestStats()

    @property
    @abstractmethod
    def root_uri(self) -> str:
        """The URI that ``open_object_store`` turns back into an equivalent store."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """Returns the full URI of ``key`` (used in error messages and manifests).

        Args:
            key: Object key relative to the store root.

        Returns:
            The absolute URI, e.g. ``file:///data/jobs/x/sst/a.sst``.
        """

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Writes ``data`` under ``key``, replacing any previous object atomically.

        Args:
            key: Object key.
            data: The full object payload.
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Writes ``data`` under ``key`` only if no object exists there, atomically.

        Args:
            key: Object key.
            data: The full object payload.

        Raises:
            ObjectExistsError: The key already exists; nothing was written.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Reads a whole object.

        Args:
            key: Object key.

        Returns:
            The object's bytes.

        Raises:
            ObjectNotFoundError: No such key (the message names its URI).
        """

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Reads ``length`` bytes starting at byte offset ``start``.

        Args:
            key: Object key.
            start: First byte offset (>= 0).
            length: Number of bytes (>= 0); fewer are returned at the end of the object.

        Returns:
            The requested bytes.

        Raises:
            ObjectNotFoundError: No such key.
        """

    def get_range_immutable(self, key: str, start: int, length: int) -> bytes:
        """``get_range`` of an object its writer never rewrites (an SSTable): a store may
        keep the object open between calls, so a read after the object was deleted may
        still return its bytes instead of raising ``ObjectNotFoundError``.

        Args, returns and raises: as ``get_range``.
        """
        return self.get_range(key, start, length)

    @abstractmethod
    def size(self, key: str) -> int:
        """Returns the object's size in bytes.

        Raises:
            ObjectNotFoundError: No such key.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Returns whether ``key`` exists."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Lists keys starting with ``prefix``, recursively, sorted ascending.

        Args:
            prefix: Key prefix; ``""`` lists everything. A prefix ending in ``/``
                lists one "directory".

        Returns:
            Sorted keys. In-flight temporary files are never listed.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Deletes ``key``; deleting a missing key is not an error."""

    def delete_many(self, keys: list[str]) -> None:
        """Deletes ``keys`` (missing ones are not an error), in one request per
        ``DELETE_BATCH`` keys where the store has a batch delete (S3 ``DeleteObjects``).
        Batches are sent one after another; send several with ``map_requests``.

        This default deletes one key per request.

        Raises:
            StorageError (store-specific): a key could not be deleted; keys of the
                request may or may not have been deleted (deleting again is safe).
        """
        for key in keys:
            self.delete(key)

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copies object ``src_key`` to ``dst_key``, replacing any object there
        atomically (as ``put``), without the bytes passing through this process where
        the store can copy in place (S3 ``CopyObject``, a local hard link).

        This default reads and writes the object (a GET and a PUT).

        Raises:
            ObjectNotFoundError: No object ``src_key``; nothing was written.
        """
        self.put(dst_key, self.get(src_key))

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        """Removes what writers killed mid-write left under ``prefix``: pieces no reader
        ever sees (``list`` hides them) but that take space, started more than
        ``older_than_s`` seconds ago (younger ones may be writes in progress).

        Returns:
            the number of abandoned writes removed. This default has none to remove.
        """
        return 0


class ForwardingObjectStore(ObjectStore):
    """An object store that passes every request to another, ``inner``: the base of
    stores that change one thing about a store (a view of it, a delay, a fault) and
    override only the requests they change. New requests of ``ObjectStore`` are
    forwarded here once, for all of them.

    ``stats`` is the inner store's: it counts the requests that reach it.

    Args:
        inner: the store that serves the requests.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__()
        self.inner = inner
        self.stats = inner.stats

    def __getstate__(self) -> dict:
        # Pickled with its inner store, which brings its own stats (they hold a lock).
        state = self.__dict__.copy()
        del state["stats"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.stats = self.inner.stats

    @property
    def root_uri(self) -> str:
        return self.inner.root_uri

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(key, start, length)

    def get_range_immutable(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range_immutable(key, start, length)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: list[str]) -> None:
        self.inner.delete_many(keys)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.inner.copy(src_key, dst_key)

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        return self.inner.remove_abandoned_writes(prefix, older_than_s)


def map_requests(fn: Callable[[T], R], items: Iterable[T], threads: int = REQUEST_THREADS) -> list[R]:
    """``[fn(item) for item in items]`` with up to ``threads`` calls in flight at once:
    independent object-store requests (copies, batch deletes) overlap their latencies
    instead of adding them up. Results are in the order of ``items``.

    Args:
        fn: one request (or a few), safe to run on several threads.
        items: its arguments.
        threads: most calls in flight (>= 1); one item runs in the calling thread.

    Raises:
        The first exception (in ``items`` order) of a call that raised, after every
        call has finished (none is left running).
    """
    items = list(items)
    if len(items) <= 1 or threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="objectstore") as pool:
        futures = [pool.submit(fn, item) for item in items]
        wait(futures)
    return [f.result() for f in futures]


def open_object_store(uri: str) -> ObjectStore:
    """Opens the object store for ``uri``, choosing the implementation by scheme.

    Args:
        uri: ``file:///abs/path``, a plain filesystem path, or ``s3://bucket/prefix``
            (``s3a://`` too; endpoint, region and credentials from the AWS environment
            variables, see ``dkvstream.storage.objectstore.s3``).

    Returns:
        An ``ObjectStore`` rooted at ``uri``.

    Raises:
        ValueError: The scheme is unknown.
    """
    from dkvstream.storage.objectstore.local import LocalObjectStore

    parsed = urlparse(uri)
    scheme = parsed.scheme
    # A Windows-style drive letter parses as a one-letter scheme; treat it as a path.
    if scheme == "" or len(scheme) == 1:
        return LocalObjectStore(uri)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URI with a host is not supported: {uri!r}")
        return LocalObjectStore(parsed.path)
    if scheme in ("s3", "s3a"):
        from dkvstream.storage.objectstore.s3 import S3ObjectStore

        # Endpoint, region and credentials come from the standard AWS environment
        # variables (see storage/objectstore/s3.py), so the URI alone reopens the store.
        return S3ObjectStore.from_uri(uri)
    raise ValueError(f"unknown object-store URI scheme {scheme!r} in {uri!r}")


def as_store(store: ObjectStore | str) -> ObjectStore:
    """``store`` itself, or the store at that root URI (``open_object_store``): for
    functions that take either."""
    return store if isinstance(store, ObjectStore) else open_object_store(store)


def open_existing_store(uri: str) -> ObjectStore:
    """``open_object_store`` for a tool that only reads: a local directory that does not
    exist is an error rather than created, so a misspelled path leaves nothing behind.

    Raises:
        FileNotFoundError: ``uri`` is a local path (or ``file://`` URI) with no directory.
        ValueError: The scheme is unknown.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:
        path = parsed.path if parsed.scheme == "file" else uri
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{uri}: no such directory")
    return open_object_store(uri)

