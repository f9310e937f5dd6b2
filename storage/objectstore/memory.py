"""An object store in a dict: for tests and the operator test harness
(``dkvstream.operators.testing``), where a local directory's files and fsyncs would cost
time without changing what is stored.

Atomicity: every request holds one lock, so ``put`` replaces an object in one step and
``put_if_absent`` checks and writes under the same lock. Requests are counted in
``stats`` as ``LocalObjectStore`` counts them, so request counts measured here match a
directory's. Nothing survives the process; the store does not pickle (a Spark task would
get an empty copy), and ``open_object_store`` cannot reopen it.
"""
from __future__ import annotations

import threading

from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import DELETE_BATCH, ObjectStore


class MemoryObjectStore(ObjectStore):
    """A flat ``{key: bytes}`` object store in this process's memory.

    Attributes:
        objects: the stored objects by key (read it in tests; write through the methods).
    """

    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        raise TypeError("a MemoryObjectStore lives in one process and does not pickle; "
                        "use a directory or an s3:// store for a job on Spark")

    @property
    def root_uri(self) -> str:
        return "memory://"

    def uri(self, key: str) -> str:
        return f"memory://{key}"

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = bytes(data)
        self.stats.record("PUT", bytes_written=len(data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        with self._lock:
            exists = key in self.objects
            if not exists:
                self.objects[key] = bytes(data)
        if exists:
            self.stats.record("PUT")
            raise ObjectExistsError(f"object already exists: {self.uri(key)}")
        self.stats.record("PUT", bytes_written=len(data))

    def get(self, key: str) -> bytes:
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            self.stats.record("GET")
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}")
        self.stats.record("GET", bytes_read=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            self.stats.record("GET")
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}")
        part = data[start:start + length]
        self.stats.record("GET", bytes_read=len(part))
        return part

    def size(self, key: str) -> int:
        self.stats.record("HEAD")
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}")
        return len(data)

    def exists(self, key: str) -> bool:
        self.stats.record("HEAD")
        with self._lock:
            return key in self.objects

    def list(self, prefix: str) -> list[str]:
        self.stats.record("LIST")
        with self._lock:
            return sorted(k for k in self.objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self.stats.record("DELETE")
        with self._lock:
            self.objects.pop(key, None)

    def delete_many(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            self.stats.record("DELETE")  # one request per batch, as S3's DeleteObjects
            with self._lock:
                for key in keys[start:start + DELETE_BATCH]:
                    self.objects.pop(key, None)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.stats.record("COPY")  # no bytes move: bytes objects are immutable, shared
        with self._lock:
            data = self.objects.get(src_key)
            if data is not None:
                self.objects[dst_key] = data
        if data is None:
            raise ObjectNotFoundError(f"object not found: {self.uri(src_key)}")
