"""Contract tests for every ObjectStore implementation (see conftest.STORE_FACTORIES)."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from storage.errors import ObjectExistsError, ObjectNotFoundError
from storage.objectstore import ObjectStore, open_object_store
from storage.objectstore.local import LocalObjectStore


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


def test_delete_and_delete_missing(store: ObjectStore) -> None:
    store.put("k", b"v")
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")  # no error
    store.delete("never/was")


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
    assert set(before) == {"GET", "PUT", "LIST", "DELETE", "HEAD", "bytes_read", "bytes_written"}
    store.put("a", b"12345")
    store.put_if_absent("b", b"67")
    store.get("a")
    store.get_range("a", 1, 2)
    store.list("")
    store.exists("a")
    store.size("a")
    store.delete("a")
    s = store.stats.snapshot()
    assert s["PUT"] - before["PUT"] == 2
    assert s["GET"] - before["GET"] == 2
    assert s["LIST"] - before["LIST"] == 1
    assert s["HEAD"] - before["HEAD"] == 2
    assert s["DELETE"] - before["DELETE"] == 1
    assert s["bytes_written"] - before["bytes_written"] == 7
    assert s["bytes_read"] - before["bytes_read"] == 7


def test_uri_names_key_and_root_reopens(store: ObjectStore) -> None:
    store.put("x/y", b"data")
    assert store.uri("x/y").endswith("x/y")
    assert store.uri("x/y").startswith(store.root_uri)
    again = open_object_store(store.root_uri)
    assert again.get("x/y") == b"data"


def test_pickle_roundtrip(store: ObjectStore) -> None:
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("k") == b"v"
    assert clone.root_uri == store.root_uri


def test_open_object_store_schemes(tmp_path: Path) -> None:
    assert isinstance(open_object_store(str(tmp_path)), LocalObjectStore)
    assert isinstance(open_object_store(tmp_path.as_uri()), LocalObjectStore)
    with pytest.raises(NotImplementedError, match="issue 5"):
        open_object_store("s3://bucket/prefix")
    with pytest.raises(ValueError):
        open_object_store("gopher://x/y")


def test_rejects_escaping_keys(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "root")
    with pytest.raises(ValueError):
        store.put("../escape", b"x")
