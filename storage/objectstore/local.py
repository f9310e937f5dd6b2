"""A local-directory object store.

Key ``a/b/c`` is the file ``<root>/a/b/c``; parent directories are created on demand.

Atomicity:

* ``put`` writes a temp file in the store's temp directory ``<root>/.tmp/``, fsyncs it,
  then ``os.replace``s it over the key. ``rename`` within one filesystem is atomic on
  POSIX, so a reader sees the old file or the new one, never a partial write.
* ``put_if_absent`` writes the same kind of temp file, then ``os.link``s it to the key.
  ``link`` fails with ``EEXIST`` if the key exists, so exactly one of several racing writers
  wins, and the winner's file is complete the instant it becomes visible.
* ``copy`` hard-links the source to a temp name and renames it over the key (a byte copy
  where the filesystem has no hard links): no bytes move, and the result is atomic as
  ``put``'s. Sharing the inode is safe because no write ever changes a file in place
  (``put`` renames a new file over the name).

A temp file never sits next to the objects: a reader that globs a directory of the
store (DuckDB's ``read_parquet('dir/*/*.parquet')``, Spark, pyarrow) sees finished
objects only, whatever fault came between a write and its rename. Every write unlinks
its temp name once done, in every case: ``rename`` does nothing when both names are
already links to one file (a copy repeated onto its own result), which would otherwise
leave the temp name behind. The temp directory is ``.tmp/`` under the root (the same
filesystem, which keeps ``rename`` and ``link`` atomic; the whole root must be one
filesystem); a temp file is named ``<uuid hex>-<key, percent-encoded>`` (cut to the
filesystem's 255-byte name limit), so cleanup can tell which key prefix it was for.
* ``delete_many`` unlinks the keys one by one and counts one ``DELETE`` per batch of
  ``DELETE_BATCH`` keys, the requests S3's ``DeleteObjects`` would make, so request
  counts measured on a directory match a bucket's.

``list`` never returns the temp directory's files; a writer killed between the write and
the rename leaves one, which ``remove_abandoned_writes`` (called by the job's cleanup)
deletes once it is old. It also deletes the ``.tmp-<uuid>-<name>`` files that versions of
this store which wrote temp files next to their key left behind (``list`` hides those too).

``get_range_immutable`` keeps up to ``MAX_OPEN_FILES`` files open per store (LRU) and
reads them with ``pread``; this store's own ``put`` and ``delete`` of a key close its file
first. A file deleted by another process stays readable through a kept descriptor, as
the interface allows for immutable objects.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote, unquote

from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import DELETE_BATCH, ObjectStore

TMP_DIR = ".tmp"  # under the root: where every write's temp file lives until renamed
LEGACY_TMP_PREFIX = ".tmp-"  # temp files next to their key, as older versions wrote them
NAME_MAX = 255  # bytes in a file name (ext4, xfs, apfs)
_UUID_HEX = 32
MAX_OPEN_FILES = 256  # per store instance, for get_range_immutable


class LocalObjectStore(ObjectStore):
    """An ``ObjectStore`` over a directory tree.

    Args:
        root: Directory that holds the objects; created if missing.
    """

    def __init__(self, root: str | Path) -> None:
        super().__init__()
        self._root = Path(root).resolve()
        self._root.mkdir(parents=True, exist_ok=True)
        self._root_prefix = str(self._root) + os.sep
        self._fds: OrderedDict[str, int] = OrderedDict()  # get_range_immutable's open files
        self._fds_lock = threading.Lock()

    def __reduce__(self):  # pickles as its root only; stats start fresh in the other process
        return (LocalObjectStore, (str(self._root),))

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self._root)!r})"

    @property
    def root_uri(self) -> str:
        return self._root.as_uri()

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def _path(self, key: str) -> Path:
        # Reject keys that would escape the root; keys come from our own naming code, so
        # this is a guard against bugs rather than an access-control check.
        parts = key.split("/")
        if key.startswith("/") or ".." in parts or parts[0] == TMP_DIR:
            raise ValueError(f"invalid object key {key!r}")
        return self._root / key

    def _temp_path(self, key: str) -> Path:
        """A fresh temp name for a write of ``key``, in the store's temp directory."""
        tmp_dir = self._root / TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        name = f"{uuid.uuid4().hex}-{quote(key, safe='')}"
        # A cut name still starts with the key's beginning, all a prefix match needs.
        return tmp_dir / name[:NAME_MAX]

    def _write_temp(self, key: str, data: bytes) -> Path:
        tmp = self._temp_path(key)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            # A write failing midway (disk full, I/O error) leaves no litter; a process
            # killed here leaves a temp file that ``list`` never returns.
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _install(self, tmp: Path, path: Path, install) -> None:
        """``install(tmp, path)`` (``os.replace`` or ``os.link``) with the key's directory
        made first (only now, so a write that failed earlier leaves no new directory),
        then the temp name unlinked whatever happened: after a ``link``, after a failure,
        and after a ``rename`` between two links to one file, which POSIX makes a no-op
        that keeps both names."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            install(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._forget_fd(key)
        self._install(self._write_temp(key, data), path, os.replace)
        self.stats.record("PUT", bytes_written=len(data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            self._install(self._write_temp(key, data), path, os.link)
        except FileExistsError:
            self.stats.record("PUT")
            raise ObjectExistsError(f"object already exists: {self.uri(key)}") from None
        self.stats.record("PUT", bytes_written=len(data))

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.stats.record("GET")
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}") from None
        self.stats.record("GET", bytes_read=len(data))
        return data

    def _open_for_range(self, key: str, start: int, length: int) -> int:
        """Checks a ranged read's arguments and opens the object (string path, no pathlib:
        block reads are on the hot path of cold DKV reads); returns the descriptor."""
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length} for {self.uri(key)}")
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        try:
            return os.open(self._root_prefix + key, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.stats.record("GET")
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}") from None

    def _pread(self, key: str, fd: int, start: int, length: int) -> bytes:
        try:
            data = os.pread(fd, length, start)
        except IsADirectoryError:
            self.stats.record("GET")
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}") from None
        self.stats.record("GET", bytes_read=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        fd = self._open_for_range(key, start, length)
        try:
            return self._pread(key, fd, start, length)
        finally:
            os.close(fd)

    def get_range_immutable(self, key: str, start: int, length: int) -> bytes:
        # Keeps up to MAX_OPEN_FILES objects open (LRU): a cold SSTable block read then
        # costs one pread instead of open + read + close.
        with self._fds_lock:
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
        if fd is None:
            fd = self._open_for_range(key, start, length)
            with self._fds_lock:
                if key in self._fds:  # another thread opened it meanwhile
                    os.close(fd)
                    fd = self._fds[key]
                else:
                    self._fds[key] = fd
                    while len(self._fds) > MAX_OPEN_FILES:
                        os.close(self._fds.popitem(last=False)[1])
        elif start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length} for {self.uri(key)}")
        try:
            return self._pread(key, fd, start, length)
        except ObjectNotFoundError:
            self._forget_fd(key)
            raise

    def _forget_fd(self, key: str) -> None:
        with self._fds_lock:
            fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Closes the files ``get_range_immutable`` keeps open (the store stays usable)."""
        with self._fds_lock:
            fds, self._fds = list(self._fds.values()), OrderedDict()
        for fd in fds:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may be gone
            pass

    def size(self, key: str) -> int:
        path = self._path(key)
        self.stats.record("HEAD")
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}") from None
        if not path.is_file():
            raise ObjectNotFoundError(f"object not found: {self.uri(key)}")
        return st.st_size

    def exists(self, key: str) -> bool:
        self.stats.record("HEAD")
        return self._path(key).is_file()

    def _walk(self, prefix: str):
        """Yields ``(directory path, its key prefix ending in "/" or "", file names)``
        below the deepest directory ``prefix`` names completely."""
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self._path(base_rel) if base_rel else self._root
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            if dirpath == str(self._root) and TMP_DIR in dirnames:
                dirnames.remove(TMP_DIR)  # temp files are no objects
            rel_dir = os.path.relpath(dirpath, self._root)
            yield dirpath, "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/", filenames

    def list(self, prefix: str) -> list[str]:
        self.stats.record("LIST")
        out: list[str] = []
        for _dirpath, rel_dir, filenames in self._walk(prefix):
            for name in filenames:
                if name.startswith(LEGACY_TMP_PREFIX):
                    continue
                key = rel_dir + name
                if key.startswith(prefix):
                    out.append(key)
        out.sort()
        return out

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        """Deletes temp files of writes to keys under ``prefix`` last written more than
        ``older_than_s`` seconds ago: a write killed before its rename or link leaves
        one. A temp name cut to ``NAME_MAX`` whose key part is shorter than ``prefix`` is
        left for a cleanup with a shorter prefix (``""`` takes every one). Returns how
        many were deleted."""
        candidates = []
        tmp_dir = self._root / TMP_DIR
        if tmp_dir.is_dir():
            for name in os.listdir(tmp_dir):
                # "<32 hex digits>-<percent-encoded key>", perhaps cut.
                if unquote(name[_UUID_HEX + 1:]).startswith(prefix):
                    candidates.append(os.path.join(tmp_dir, name))
        for dirpath, rel_dir, filenames in self._walk(prefix):
            for name in filenames:
                # Older versions' ".tmp-<32 hex digits>-<name>" is a write of rel_dir + name.
                start = len(LEGACY_TMP_PREFIX) + _UUID_HEX + 1
                if name.startswith(LEGACY_TMP_PREFIX) and (rel_dir + name[start:]).startswith(prefix):
                    candidates.append(os.path.join(dirpath, name))
        cutoff = time.time() - older_than_s
        removed = 0
        for path in candidates:
            try:
                if os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                pass  # its writer finished or cleaned up meanwhile
        return removed

    def delete(self, key: str) -> None:
        self.stats.record("DELETE")
        self._unlink(key)

    def _unlink(self, key: str) -> None:
        self._forget_fd(key)
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def delete_many(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            self.stats.record("DELETE")  # one request per batch, as S3's DeleteObjects
            for key in keys[start:start + DELETE_BATCH]:
                self._unlink(key)

    def copy(self, src_key: str, dst_key: str) -> None:
        src, dst = self._path(src_key), self._path(dst_key)
        self.stats.record("COPY")
        if not src.is_file():
            raise ObjectNotFoundError(f"object not found: {self.uri(src_key)}")
        self._forget_fd(dst_key)
        tmp = self._temp_path(dst_key)
        try:
            try:
                os.link(src, tmp)
                # The link has the source's age; a cleanup takes old temp files for
                # abandoned writes (remove_abandoned_writes), so it is made young.
                os.utime(tmp)
            except FileNotFoundError:
                raise ObjectNotFoundError(f"object not found: {self.uri(src_key)}") from None
            except OSError:  # no hard links on this filesystem: copy the bytes
                shutil.copyfile(src, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._install(tmp, dst, os.replace)
