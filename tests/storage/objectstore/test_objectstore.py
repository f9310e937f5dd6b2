"""Contract tests for every ObjectStore implementation: the local directory store and
the S3 store against a real SeaweedFS server (tests/conftest.py ``s3_server``), then
S3-only tests: multipart, pagination, retries, a stopped server."""

from __future__ import annotations

import http.client
import os
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import ForwardingObjectStore, ObjectStore, open_object_store
from dkvstream.storage.objectstore.local import LocalObjectStore
from dkvstream.storage.objectstore.memory import MemoryObjectStore
from dkvstream.storage.objectstore.s3 import S3CredentialsError, S3ObjectStore, S3RequestError

MiB = 1024 * 1024


@pytest.fixture(params=["local", "s3", "forwarding", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty store of each implementation (overrides tests/storage/conftest.py's
    local-only ``store`` for this module: the S3 one needs the session's server), and a
    ``ForwardingObjectStore`` over a local one."""
    if request.param == "local":
        return LocalObjectStore(tmp_path / "bucket")
    if request.param == "memory":
        return MemoryObjectStore()
    if request.param == "forwarding":
        return ForwardingObjectStore(LocalObjectStore(tmp_path / "bucket"))
    return request.getfixturevalue("s3_store")


def _s3_store_like(s3_server, prefix: str, **kwargs) -> S3ObjectStore:
    return S3ObjectStore(s3_server.bucket, prefix, endpoint_url=kwargs.pop("endpoint_url", s3_server.endpoint_url),
                         region=s3_server.region, access_key_id=s3_server.access_key,
                         secret_access_key=s3_server.secret_key, **kwargs)


def test_put_get_roundtrip(store: ObjectStore) -> None:
    store.put("a/b/c.bin", b"hello")
    assert store.get("a/b/c.bin") == b"hello"
    assert store.exists("a/b/c.bin")
    assert store.size("a/b/c.bin") == 5


def test_put_overwrites(store: ObjectStore) -> None:
    store.put("k", b"old")
    store.put("k", b"newer")
    assert store.get("k") == b"newer"


def test_put_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.size("empty") == 0


def test_put_if_absent_conflict_keeps_first(store: ObjectStore) -> None:
    store.put_if_absent("m/1.json", b"first")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("m/1.json", b"second")
    with pytest.raises(FileExistsError):  # also a built-in FileExistsError
        store.put_if_absent("m/1.json", b"third")
    assert store.get("m/1.json") == b"first"


def test_put_if_absent_race_has_one_winner(store: ObjectStore) -> None:
    winners: list[int] = []

    def attempt(i: int) -> None:
        try:
            store.put_if_absent("race", str(i).encode())
            winners.append(i)
        except ObjectExistsError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get("race") == str(winners[0]).encode()


def test_get_range(store: ObjectStore) -> None:
    data = bytes(range(256))
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 100, 50) == data[100:150]
    assert store.get_range("r", 250, 100) == data[250:]  # short read at the end
    assert store.get_range("r", 256, 10) == b""


def test_get_range_immutable_reads_like_get_range(store: ObjectStore) -> None:
    data = bytes(range(256))
    store.put("im/t", data)
    for start, length in ((0, 10), (100, 50), (250, 100), (256, 10), (5, 0)):
        assert store.get_range_immutable("im/t", start, length) == data[start : start + length]
    with pytest.raises(ObjectNotFoundError, match="im/missing"):
        store.get_range_immutable("im/missing", 0, 1)
    # The store's own rewrite and delete are seen even if it kept the object open.
    store.put("im/t", b"new bytes")
    assert store.get_range_immutable("im/t", 0, 3) == b"new"
    store.delete("im/t")
    with pytest.raises(ObjectNotFoundError, match="im/t"):
        store.get_range_immutable("im/t", 0, 1)


def test_local_store_bounds_open_files(tmp_path) -> None:
    from dkvstream.storage.objectstore import local

    s = local.LocalObjectStore(tmp_path)
    for i in range(local.MAX_OPEN_FILES + 20):
        s.put(f"f/{i}", b"%d" % i)
        assert s.get_range_immutable(f"f/{i}", 0, 8) == b"%d" % i
    assert len(s._fds) == local.MAX_OPEN_FILES
    assert s.get_range_immutable("f/0", 0, 8) == b"0"  # evicted, reopened
    s.close()
    assert not s._fds


def test_list_sorted_recursive_with_prefix(store: ObjectStore) -> None:
    keys = ["p/z", "p/a/2", "p/a/1", "p/b", "q/x", "px"]
    for k in keys:
        store.put(k, b"x")
    store.put_if_absent("p/c", b"y")
    assert store.list("p/") == ["p/a/1", "p/a/2", "p/b", "p/c", "p/z"]
    assert store.list("p") == ["p/a/1", "p/a/2", "p/b", "p/c", "p/z", "px"]
    assert store.list("p/a/") == ["p/a/1", "p/a/2"]
    assert store.list("") == sorted([*keys, "p/c"])
    assert store.list("nothing/") == []


def test_list_hides_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("d/k", b"x")
    (tmp_path / "d" / ".tmp-abandoned-k").write_bytes(b"partial")
    assert store.list("d/") == ["d/k"]


def test_local_abandoned_writes_removed_only_when_old(tmp_path: Path) -> None:
    """What a ``put`` killed between its write and its rename leaves (``_write_temp`` is
    that first step) is removed once older than the limit; a young one may be a write
    in progress and stays, and so do files outside the prefix and finished objects.
    Temp files an older version left next to their key are removed the same way."""
    import time

    store = LocalObjectStore(tmp_path)
    store.put("job/a/k", b"done")
    old = store._write_temp("job/a/t1", b"partial")
    other = store._write_temp("other/t2", b"partial")
    young = store._write_temp("job/a/t3", b"partial")
    legacy = tmp_path / "job" / "a" / f".tmp-{'0' * 32}-t4"
    legacy.write_bytes(b"partial")
    hours_ago = time.time() - 7200
    for path in (old, other, legacy):
        os.utime(path, (hours_ago, hours_ago))
    assert store.remove_abandoned_writes("job/", older_than_s=3600) == 2
    assert not old.exists() and not legacy.exists() and other.exists() and young.exists()
    assert store.get("job/a/k") == b"done"
    assert store.remove_abandoned_writes("", older_than_s=0) == 2  # the rest, once old enough
    assert store.list("") == ["job/a/k"]


def test_local_temp_files_never_in_an_object_directory(tmp_path: Path) -> None:
    """A write in progress keeps its temp file outside every object directory (a reader
    globbing ``d/*`` sees finished objects only), ``list`` never shows it, and a long
    key's temp name fits the filesystem's name limit and is still found by prefix."""
    import time

    store = LocalObjectStore(tmp_path)
    tmp = store._write_temp("d/k", b"partial")
    assert tmp.parent == tmp_path / ".tmp"
    assert list((tmp_path).glob("d/*")) == []
    long_key = "job/" + "/".join(["x" * 100] * 3) + "/k"
    long_tmp = store._write_temp(long_key, b"partial")
    assert len(long_tmp.name.encode()) <= 255
    store.put(long_key, b"done")
    assert store.list("") == [long_key]
    hours_ago = time.time() - 7200
    for path in (tmp, long_tmp):
        os.utime(path, (hours_ago, hours_ago))
    assert store.remove_abandoned_writes("job/", older_than_s=3600) == 1 and tmp.exists()
    with pytest.raises(ValueError):
        store.put(".tmp/x", b"no")


def test_local_copy_onto_its_own_result_leaves_no_temp(tmp_path: Path) -> None:
    """A copy repeated onto a target that already is a link to the source (a publish
    redone on restart): ``rename`` between two links to one file does nothing, and the
    temp name must still go."""
    store = LocalObjectStore(tmp_path)
    store.put("staged/a", b"rows")
    for _ in range(3):
        store.copy("staged/a", "sink/epoch=1/part-0.parquet")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "sink/epoch=1/part-0.parquet", "staged/a"]
    assert store.get("sink/epoch=1/part-0.parquet") == b"rows"


@pytest.mark.parametrize("fail_at", ["write", "link", "replace"])
def test_local_failing_write_leaves_no_temp_anywhere(tmp_path: Path, monkeypatch, fail_at: str) -> None:
    """A write that fails midway (disk full) leaves neither a temp file nor a partial
    object, for ``put``, ``put_if_absent`` and ``copy``; the previous object stays."""
    import errno

    store = LocalObjectStore(tmp_path)
    store.put("d/k", b"old")
    store.put("d/src", b"source")

    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fail_at == "write":
        real_open = open

        class FullFile:
            def __init__(self, f):
                self._f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._f.close()

            def write(self, data):
                self._f.write(data[: len(data) // 2])
                enospc()

        monkeypatch.setattr("builtins.open", lambda p, m="r", *a, **k: FullFile(real_open(p, m, *a, **k))
                            if "w" in m else real_open(p, m, *a, **k))
        monkeypatch.setattr("shutil.copyfile", enospc)
        monkeypatch.setattr(os, "link", enospc)  # copy falls back to copying bytes
    else:
        monkeypatch.setattr(os, fail_at, enospc)
    for write in (lambda: store.put("d/k", b"new"), lambda: store.put("e/k", b"new"),
                  lambda: store.put_if_absent("e/k", b"new"), lambda: store.copy("d/src", "d/k")):
        try:
            write()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    monkeypatch.undo()
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    # A filesystem without hard links makes ``copy`` copy the bytes, which succeeds here.
    assert store.get("d/k") == (b"source" if fail_at == "link" else b"old")
    assert [f for f in files if ".tmp" in f] == []


def test_s3_abandoned_multipart_uploads_aborted_only_when_old(s3_server, s3_store) -> None:
    """A multipart upload never completed (its writer killed) is aborted: its parts
    disappear from ListMultipartUploads; completed objects stay."""
    client, bucket = s3_store.client, s3_store.bucket
    s3_store.put("job/done", b"x")
    key = f"{s3_store.prefix}/job/partial"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"p" * 1024)

    def pending() -> list[str]:
        return [u["UploadId"] for u in client.list_multipart_uploads(
            Bucket=bucket, Prefix=f"{s3_store.prefix}/").get("Uploads", ())]

    assert pending() == [upload]
    assert s3_store.remove_abandoned_writes("job/", older_than_s=3600) == 0  # young: maybe in progress
    assert pending() == [upload]
    assert s3_store.remove_abandoned_writes("job/", older_than_s=0) == 1
    assert pending() == [] and s3_store.list("job/") == ["job/done"]


def test_delete_and_delete_missing(store: ObjectStore) -> None:
    store.put("k", b"v")
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")  # no error
    store.delete("never/was")


def test_copy_is_a_whole_independent_object(store: ObjectStore) -> None:
    store.put("staged/a.parquet", b"payload")
    store.put("final/a.parquet", b"older")
    before = store.stats.snapshot()
    store.copy("staged/a.parquet", "final/a.parquet")  # replaces, no bytes through us
    store.copy("staged/a.parquet", "final/a.parquet")  # again: idempotent
    after = store.stats.snapshot()
    assert after["COPY"] - before["COPY"] == 2
    assert after["bytes_read"] == before["bytes_read"] and after["bytes_written"] == before["bytes_written"]
    store.put("staged/a.parquet", b"rewritten")  # the copy is not a view of the source
    store.delete("staged/a.parquet")
    assert store.get("final/a.parquet") == b"payload"
    store.copy("final/a.parquet", "final/a.parquet")  # onto itself: nothing changes
    assert store.get("final/a.parquet") == b"payload"
    with pytest.raises(ObjectNotFoundError, match="staged/a.parquet"):
        store.copy("staged/a.parquet", "final/b.parquet")
    assert not store.exists("final/b.parquet")


def test_delete_many_batches(store: ObjectStore, monkeypatch) -> None:
    import dkvstream.storage.objectstore.local
    import dkvstream.storage.objectstore.memory
    import dkvstream.storage.objectstore.s3
    from dkvstream.storage import objectstore

    for module in (objectstore, dkvstream.storage.objectstore.local, dkvstream.storage.objectstore.s3,
                   dkvstream.storage.objectstore.memory):
        monkeypatch.setattr(module, "DELETE_BATCH", 3, raising=False)
    keys = [f"d/{i}" for i in range(7)]
    for k in keys:
        store.put(k, b"x")
    before = store.stats.snapshot()["DELETE"]
    store.delete_many([*keys[:5], "d/missing"])  # 6 keys: 2 requests
    assert store.stats.snapshot()["DELETE"] - before == 2
    assert store.list("d/") == keys[5:]
    store.delete_many([])
    assert store.stats.snapshot()["DELETE"] - before == 2


def test_map_requests_keeps_order_and_raises_after_all_ran() -> None:
    from dkvstream.storage.objectstore import map_requests

    ran: list[int] = []

    def call(i: int) -> int:
        ran.append(i)
        if i == 3:
            raise ValueError("three")
        return i * i

    assert map_requests(call, range(3), threads=4) == [0, 1, 4]
    ran.clear()
    with pytest.raises(ValueError, match="three"):
        map_requests(call, range(8), threads=4)
    assert sorted(ran) == list(range(8))


def test_missing_key_raises_naming_key(store: ObjectStore) -> None:
    for call in (
        lambda: store.get("no/such/key"),
        lambda: store.get_range("no/such/key", 0, 1),
        lambda: store.size("no/such/key"),
    ):
        with pytest.raises(ObjectNotFoundError, match="no/such/key"):
            call()
    with pytest.raises(FileNotFoundError):
        store.get("no/such/key")
    assert not store.exists("no/such/key")


def test_stats_count_requests_and_bytes(store: ObjectStore) -> None:
    before = store.stats.snapshot()
    assert set(before) == {"GET", "PUT", "LIST", "DELETE", "HEAD", "COPY", "bytes_read", "bytes_written"}
    store.put("a", b"12345")
    store.put_if_absent("b", b"67")
    store.get("a")
    store.get_range("a", 1, 2)
    store.list("")
    store.exists("a")
    store.size("a")
    store.copy("a", "c")
    store.delete("a")
    store.delete_many(["b", "c"])
    s = store.stats.snapshot()
    assert s["COPY"] - before["COPY"] == 1
    assert s["PUT"] - before["PUT"] == 2
    assert s["GET"] - before["GET"] == 2
    assert s["LIST"] - before["LIST"] == 1
    assert s["HEAD"] - before["HEAD"] == 2
    assert s["DELETE"] - before["DELETE"] == 2  # one delete, one batch
    assert s["bytes_written"] - before["bytes_written"] == 7
    assert s["bytes_read"] - before["bytes_read"] == 7


def test_uri_names_key_and_root_reopens(store: ObjectStore) -> None:
    if isinstance(store, MemoryObjectStore):
        pytest.skip("a MemoryObjectStore lives in its process: test_memory_store_stays_in_its_process")
    store.put("x/y", b"data")
    assert store.uri("x/y").endswith("x/y")
    assert store.uri("x/y").startswith(store.root_uri)
    again = open_object_store(store.root_uri)
    assert again.get("x/y") == b"data"


def test_pickle_roundtrip(store: ObjectStore) -> None:
    if isinstance(store, MemoryObjectStore):
        pytest.skip("a MemoryObjectStore lives in its process: test_memory_store_stays_in_its_process")
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("k") == b"v"
    assert clone.root_uri == store.root_uri


def test_memory_store_stays_in_its_process() -> None:
    """It refuses to pickle (a Spark task would get an empty copy) and has no URI to
    reopen it by."""
    store = MemoryObjectStore()
    store.put("x/y", b"data")
    assert store.uri("x/y") == "memory://x/y"
    with pytest.raises(TypeError, match="does not pickle"):
        pickle.dumps(store)
    with pytest.raises(ValueError, match="unknown object-store URI scheme 'memory'"):
        open_object_store(store.root_uri)


def test_open_object_store_schemes(tmp_path: Path) -> None:
    assert isinstance(open_object_store(str(tmp_path)), LocalObjectStore)
    assert isinstance(open_object_store(tmp_path.as_uri()), LocalObjectStore)
    s3 = open_object_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3ObjectStore)
    assert (s3.bucket, s3.prefix, s3.root_uri) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    assert s3.uri("a/b") == "s3://bucket/some/prefix/a/b"
    assert open_object_store("s3a://bucket").root_uri == "s3://bucket"
    with pytest.raises(ValueError):
        open_object_store("gopher://x/y")
    with pytest.raises(ValueError):
        open_object_store("s3:///no-bucket")


def test_rejects_escaping_keys(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "root")
    with pytest.raises(ValueError):
        store.put("../escape", b"x")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(
    st.sampled_from(["put", "put_if_absent", "delete", "copy", "delete_many"]),
    # No key is also a "directory" of another: the local store keeps keys as files.
    st.sampled_from(["a/x", "a/y", "a/z/w", "b/x", "ax"]),
    st.binary(max_size=64)), max_size=12))
def test_operations_match_a_dict(store: ObjectStore, ops) -> None:
    """Any sequence of writes (copies onto their own result included) leaves the store
    equal to a dict replaying them; a local store's directory holds those objects only."""
    for key in store.list(""):
        store.delete(key)
    model: dict[str, bytes] = {}
    for op, key, data in ops:
        if op == "put":
            store.put(key, data)
            model[key] = data
        elif op == "put_if_absent":
            if key in model:
                with pytest.raises(ObjectExistsError):
                    store.put_if_absent(key, data)
            else:
                store.put_if_absent(key, data)
                model[key] = data
        elif op == "copy":  # from the key named by the data's first byte, if any
            src = sorted(model)[data[0] % len(model)] if model and data else "a/x"
            if src in model:
                store.copy(src, key)
                model[key] = model[src]
            else:
                with pytest.raises(ObjectNotFoundError):
                    store.copy(src, key)
        elif op == "delete_many":
            store.delete_many([key, "b/x"])
            model.pop(key, None)
            model.pop("b/x", None)
        else:
            store.delete(key)
            model.pop(key, None)
    assert store.list("") == sorted(model)
    assert store.list("a/") == sorted(k for k in model if k.startswith("a/"))
    for key, data in model.items():
        assert store.get(key) == data
        assert store.get_range(key, 1, 3) == data[1:4]
    if isinstance(store, LocalObjectStore):  # on disk: the objects, and no temp file at all
        root = store._root
        assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == sorted(model)


# ------------------------------------------------------------------- S3 only
def test_s3_multipart_put_roundtrip(s3_server, s3_store) -> None:
    store = _s3_store_like(s3_server, s3_store.prefix, multipart_threshold=5 * MiB,
                           multipart_chunksize=5 * MiB)
    data = os.urandom(12 * MiB)  # 3 parts: 5 + 5 + 2 MiB
    before = store.stats.snapshot()
    store.put("big/object", data)
    after = store.stats.snapshot()
    assert after["PUT"] - before["PUT"] == 3 + 2  # create, 3 parts, complete
    assert after["bytes_written"] - before["bytes_written"] == len(data)
    head = store.client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/big/object")
    assert head["ETag"].strip('"').endswith("-3"), f"not a 3-part upload: {head['ETag']}"
    assert store.size("big/object") == len(data)
    assert store.get("big/object") == data
    boundary = 5 * MiB
    assert store.get_range("big/object", boundary - 10, 20) == data[boundary - 10:boundary + 10]
    # A small object stays a single PutObject.
    store.put("small", b"x" * 100)
    assert store.stats.snapshot()["PUT"] - after["PUT"] == 1


def test_s3_list_paginates(s3_server, s3_store) -> None:
    store = _s3_store_like(s3_server, s3_store.prefix, list_page_size=3)
    keys = [f"d/{i:03d}" for i in range(10)]
    for k in reversed(keys):
        store.put(k, b"v")
    store.put("e/outside", b"v")
    before = store.stats.snapshot()["LIST"]
    assert store.list("d/") == keys
    assert store.stats.snapshot()["LIST"] - before == 4  # pages of 3, 3, 3, 1
    assert store.list("") == [*keys, "e/outside"]


def test_s3_store_pickles_with_its_configuration(s3_server, s3_store) -> None:
    """A store built from explicit arguments (no environment) reopens elsewhere."""
    store = _s3_store_like(s3_server, s3_store.prefix, list_page_size=7)
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert (clone.endpoint_url, clone.list_page_size, clone.root_uri) == (
        s3_server.endpoint_url, 7, store.root_uri)
    assert clone.get("k") == b"v"


def test_s3_store_from_dagster_s3_resource(s3_server, s3_store) -> None:
    from dagster_aws.s3 import S3Resource

    resource = S3Resource(endpoint_url=s3_server.endpoint_url, region_name=s3_server.region,
                          aws_access_key_id=s3_server.access_key,
                          aws_secret_access_key=s3_server.secret_key)
    store = S3ObjectStore.from_s3_resource(resource, s3_server.bucket, s3_store.prefix)
    store.put("from/resource", b"1")
    assert s3_store.get("from/resource") == b"1"
    # Or around the resource's own client: same identity, reopened after pickling.
    wrapped = S3ObjectStore(s3_server.bucket, s3_store.prefix, client=resource.get_client())
    assert pickle.loads(pickle.dumps(wrapped)).get("from/resource") == b"1"


def test_s3_bad_credentials_fail_at_once_naming_the_uri(s3_server, s3_store) -> None:
    store = S3ObjectStore(s3_server.bucket, s3_store.prefix, endpoint_url=s3_server.endpoint_url,
                          access_key_id="nobody", secret_access_key="wrong")
    with pytest.raises(S3CredentialsError, match=rf"s3://{s3_server.bucket}/{s3_store.prefix}/k .*HTTP 403") as e:
        store.get("k")
    assert not e.value.retryable and "AWS_ACCESS_KEY_ID" in str(e.value)


def test_s3_missing_credentials_fail_before_any_request(monkeypatch, tmp_path) -> None:
    """No credentials anywhere botocore looks: one error saying what to set, no request
    sent (so none retried)."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # An endpoint no other test uses: the process's clients are shared per configuration.
    store = S3ObjectStore("bucket", "no-credentials", endpoint_url="http://127.0.0.1:9")
    with pytest.raises(S3CredentialsError, match=r"s3://bucket/no-credentials/k: no credentials to sign with "
                                                 r".*set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") as e:
        store.get("k")
    assert not e.value.retryable and isinstance(e.value, S3RequestError)
    assert store.stats.snapshot()["GET"] == 1  # the one logical request, never sent


class FaultProxy:
    """An HTTP proxy on loopback in front of the S3 server that answers the next
    requests from a script instead of forwarding them. Script entries:

    * ``(status, code)``: answer with that HTTP status and S3 error code, send nothing on;
    * ``("lost", status)``: forward the request, then answer ``status`` instead of the
      server's response (the write happened, its answer was lost).

    ``requests`` counts every request that reached the proxy.
    """

    def __init__(self, target_port: int) -> None:
        self.script: list[tuple] = []
        self.requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests += 1
                action = proxy.script.pop(0) if proxy.script else None
                if action is None or action[0] == "lost":
                    conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    payload = response.read()
                    if action is None:
                        self.send_response(response.status)
                        for k, v in response.getheaders():
                            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                                self.send_header(k, v)
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                    action = (action[1], "InternalError")
                status, code = action
                payload = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                           f"<Message>injected by the test</Message></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint_url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fault_proxy(s3_server):
    proxy = FaultProxy(s3_server.ports["s3"])
    yield proxy
    proxy.close()


def test_s3_transient_errors_are_retried(s3_server, s3_store, fault_proxy) -> None:
    s3_store.put("k", b"value")
    store = _s3_store_like(s3_server, s3_store.prefix, endpoint_url=fault_proxy.endpoint_url, max_attempts=4)
    fault_proxy.script = [(503, "SlowDown"), (500, "InternalError"), (503, "ServiceUnavailable")]
    assert store.get("k") == b"value"
    assert fault_proxy.requests == 4  # three refused attempts, then the one that worked
    assert store.stats.snapshot()["GET"] == 1  # one logical request
    # More transient failures than attempts: a clear error naming the object.
    fault_proxy.requests = 0
    fault_proxy.script = [(503, "SlowDown")] * 4
    with pytest.raises(S3RequestError, match=rf"{store.uri('k')} failed: HTTP 503 SlowDown") as e:
        store.get("k")
    assert fault_proxy.requests == 4
    assert e.value.retryable  # later, the server may answer


def test_s3_permanent_errors_are_not_retried(s3_server, s3_store, fault_proxy) -> None:
    store = _s3_store_like(s3_server, s3_store.prefix, endpoint_url=fault_proxy.endpoint_url, max_attempts=4)
    for sent, code in enumerate(["AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"], 1):
        fault_proxy.script = [(403, code)]
        with pytest.raises(S3CredentialsError, match=rf"HTTP 403 {code}: .*the credentials were refused") as e:
            store.put("k", b"v")
        assert fault_proxy.requests == sent and not e.value.retryable
    fault_proxy.script = [(400, "InvalidArgument")]
    with pytest.raises(S3RequestError, match=r"HTTP 400") as e:
        store.list("")
    assert fault_proxy.requests == 4
    assert not isinstance(e.value, S3CredentialsError) and not e.value.retryable


def test_s3_put_if_absent_whose_answer_was_lost(s3_server, s3_store, fault_proxy) -> None:
    """The first attempt commits, its answer is lost, the retry gets 412: still our write."""
    store = _s3_store_like(s3_server, s3_store.prefix, endpoint_url=fault_proxy.endpoint_url, max_attempts=3)
    fault_proxy.script = [("lost", 503)]
    store.put_if_absent("m/1", b"manifest")
    assert s3_store.get("m/1") == b"manifest"
    assert fault_proxy.requests == 3  # lost write, 412 retry, read-back
    # Someone else's object under the same name is a conflict, retried or not.
    fault_proxy.script = [(503, "SlowDown")]
    with pytest.raises(ObjectExistsError):
        store.put_if_absent("m/1", b"another manifest")
    assert s3_store.get("m/1") == b"manifest"


def test_s3_stopped_server_fails_clearly_then_recovers(s3_server, s3_store) -> None:
    store = _s3_store_like(s3_server, s3_store.prefix, max_attempts=2, connect_timeout_s=1)
    store.put("before", b"kept")
    s3_server.stop()
    try:
        with pytest.raises(S3RequestError, match=rf"GetObject {store.uri('before')} failed after 2 attempts: "
                                                 r"Could not connect"):
            store.get("before")
        with pytest.raises(S3RequestError, match=r"PutObject\(If-None-Match\) s3://.*/m/1 failed"):
            store.put_if_absent("m/1", b"x")
        with pytest.raises(S3RequestError, match=r"ListObjectsV2"):
            store.list("")
    finally:
        s3_server.start()
    assert store.get("before") == b"kept"
    store.put_if_absent("m/1", b"x")
    assert store.list("") == ["before", "m/1"]


# Every request of the interface, with arguments: a ForwardingObjectStore must pass each
# one to its inner store as it is (not fall back to a default built on other requests).
REQUESTS = {
    "uri": ("k",), "put": ("k", b"v"), "put_if_absent": ("k", b"v"), "get": ("k",),
    "get_range": ("k", 1, 2), "get_range_immutable": ("k", 1, 2), "size": ("k",), "exists": ("k",),
    "list": ("p/",), "delete": ("k",), "delete_many": (["a", "b"],), "copy": ("a", "b"),
    "remove_abandoned_writes": ("p/", 60.0),
}
RETURN_NOTHING = {"put", "put_if_absent", "delete", "delete_many", "copy"}


def test_requests_table_covers_the_interface() -> None:
    public = {n for n in vars(ObjectStore) if not n.startswith("_") and n != "root_uri"}
    assert public == set(REQUESTS)


@pytest.mark.parametrize("request_name", sorted(REQUESTS))
def test_forwarding_store_passes_each_request_to_its_inner_store(request_name: str) -> None:
    from unittest import mock

    inner = mock.create_autospec(ObjectStore, instance=True)
    inner.stats = object()
    type(inner).root_uri = mock.PropertyMock(return_value="mem://x")
    store = ForwardingObjectStore(inner)
    result = getattr(store, request_name)(*REQUESTS[request_name])
    getattr(inner, request_name).assert_called_once_with(*REQUESTS[request_name])
    assert result is (None if request_name in RETURN_NOTHING else getattr(inner, request_name).return_value)
    assert [c[0] for c in inner.method_calls] == [request_name]  # nothing else reached it
    assert store.root_uri == "mem://x" and store.stats is inner.stats
