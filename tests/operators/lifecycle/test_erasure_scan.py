"""The whole-store scan finds a key in every kind of object a job's store holds, where its
bytes are compressed or encoded too (so a clean scan after an erasure is not vacuous), and
finds nothing once those objects no longer hold it."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from dkvstream.operators.runtime.erasure_scan import scan_store
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.log import Log
from dkvstream.storage.objectstore.memory import MemoryObjectStore

KEY = "subjé-4242".encode()  # non-ASCII: JSON writers escape it, so the raw bytes differ


def _store_with_the_key_everywhere() -> tuple[MemoryObjectStore, dict[str, str]]:
    """A store holding KEY in each kind of object; returns ``{kind: object key}``."""
    store = MemoryObjectStore()
    kinds = {}
    # DKV: a table (zstd blocks, many keys so the literals are entropy-coded), its manifest
    # (the table's first key, hex) and, after more writes, a WAL object.
    db = DKV.open(store, "jobs/j/state/op/kg-0000-0127", options=DKVOptions(zstd_level=19))
    db.put(KEY, b"v" * 50)
    for i in range(2000):  # neighbours: the key is no block's first key (those are in the index)
        db.put(KEY[:-2] + b"%02d" % (i % 100) + b"/%04d" % i, b"x%07d" % (i * 7919 % 10007))
    db.flush()
    db.put(b"another", KEY + b"-as-a-value")
    db.checkpoint("c1")
    db.close()
    kinds["sstable"] = next(k for k in store.list("jobs/j/state/") if k.endswith(".sst"))
    kinds["wal"] = next(k for k in store.list("jobs/j/state/") if k.endswith(".wal"))
    # A manifest records its tables' first and last keys (hex): KEY first in another range.
    other = DKV.open(store, "jobs/j/state/op/kg-0128-0255")
    other.put(KEY, b"1")
    other.put(b"zz", b"2")
    other.flush()
    kinds["manifest"] = other.checkpoint("c1")
    other.close()
    # Parquet: zstd pages, dictionary-encoded.
    table = pa.table({"key": [KEY.decode()] + [f"other-{i}" for i in range(3000)],
                      "n": list(range(3001))})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", use_dictionary=True, write_statistics=False)
    store.put("jobs/j/sinks/out/part-0.parquet", buf.getvalue())
    kinds["parquet"] = "jobs/j/sinks/out/part-0.parquet"
    # A Delta log entry: the key only in the column statistics, JSON-escaped, in a JSON string.
    stats = json.dumps({"numRecords": 1, "minValues": {"key": KEY.decode()}, "maxValues": {"key": KEY.decode()}})
    store.put("jobs/j/sinks/delta/_delta_log/00000000000000000000.json",
              json.dumps({"add": {"path": "part-0.parquet", "stats": stats}}).encode() + b"\n")
    kinds["delta log"] = "jobs/j/sinks/delta/_delta_log/00000000000000000000.json"
    # A log segment (a compacted topic's file; its batches zstd-compressed).
    log = Log(store, prefix="topics")
    log.create_topic("users")
    producer = log.producer()
    producer.send("users", KEY, b"profile " * 200, partition=0)
    for i in range(300):
        producer.send("users", b"u%d" % i, b"profile %d " % i * 20, partition=0)
    producer.flush()
    kinds["log segment"] = next(k for k in store.list("topics/") if "seg" in k or k.endswith(".log") or
                                _is_segment(store.get(k)))
    # A zstd blob (e.g. an exported file).
    store.put("exports/blob.zst", zstandard.ZstdCompressor().compress(b"header " + KEY + b" trailer" * 100))
    kinds["zstd"] = "exports/blob.zst"
    return store, kinds


def _is_segment(data: bytes) -> bool:
    return data.endswith(b"DKVLOG01")


def test_scan_finds_the_key_in_every_kind_of_object_and_nothing_once_gone():
    store, kinds = _store_with_the_key_everywhere()
    found = {h.key: h.how for h in scan_store(store, KEY).holding}
    for kind, key in kinds.items():
        assert key in found, f"{kind} object {key} not found holding the key"
    # These hold it only encoded: the raw search alone would have missed them.
    for kind in ("sstable", "manifest", "parquet", "delta log", "log segment"):
        assert KEY not in store.get(kinds[kind]), kind
        assert found[kinds[kind]] != "raw bytes", kind
    assert scan_store(store, b"no-such-subject-at-all").holding == []
    for key in found:
        store.delete(key)
    result = scan_store(store, KEY)
    assert result.holding == [] and result.objects_scanned == len(store.list(""))


def test_an_object_that_does_not_decode_is_not_proven_clean():
    store = MemoryObjectStore()
    store.put("x/broken.parquet", b"PAR1 not really PAR1")
    [h] = scan_store(store, KEY).holding
    assert h.key == "x/broken.parquet" and h.how.startswith("undecodable parquet")
