"""The dump CLI against a table and a manifest built here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.dump import main
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.sstable import SSTableBuilder
from dkvstream.storage.objectstore.local import LocalObjectStore


def run(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out) == 0
    return out.getvalue()


def test_dump_sstable(tmp_path: Path) -> None:
    b = SSTableBuilder(block_bytes=256, bloom_bits_per_key=10, zstd_level=3)
    for i in range(100):
        if i == 1:
            b.add(b"key-%03d" % i, 1000 + i, None)
        else:
            b.add(b"key-%03d" % i, 1000 + i, b"x" * 20)
    b.add(b"\xff\x00", 5, b"v")
    data, meta = b.finish()
    (tmp_path / "t.sst").write_bytes(data)
    text = run("sstable", str(tmp_path / "t.sst"), "--entries", "3")
    assert "entries: 101\n" in text
    assert "key range: 'key-000' .. 0xff00\n" in text
    assert "seq range: 5 .. 1099\n" in text
    nblocks = len(meta["blocks"])
    assert f"blocks: {nblocks}, raw {sum(x[3] for x in meta['blocks'])} bytes" in text
    bits = len(meta["bloom"]["bits"]) * 8
    assert f"bloom: {bits} bits" in text and f"{bits / 101:.2f} bits/key" in text
    assert "  key='key-000' seq=1000 value_len=20\n" in text
    assert "  key='key-001' seq=1001 tombstone\n" in text
    assert "key-003" not in text
    uri_text = run("sstable", (tmp_path / "t.sst").as_uri(), "--entries", "0")
    assert "entries: 101\n" in uri_text and "first" not in uri_text


def test_dump_manifest(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    db = DKV.open(store, "op/r", options=DKVOptions(memtable_bytes=2000))
    for i in range(200):
        db.put(b"k%03d" % i, b"v" * 10)
    db.compact_all()
    db.put(b"late", b"1")
    mkey = db.checkpoint("e1")
    text = run("manifest", str(tmp_path / mkey))
    tables = db.stats()["tables_per_level"]
    assert "name: e1  prefix: op/r  format version 2\n" in text
    last = db.stats()["bytes_per_level"][-1]
    assert f"L{len(tables) - 1}: {tables[-1]} tables, {last} bytes" in text
    assert "wal objects: 1," in text and "records=1" in text


def test_dump_reports_corruption(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.sst").write_bytes(b"\x00" * 100)
    assert main(["sstable", str(tmp_path / "bad.sst")], io.StringIO()) == 1
    assert "bad magic" in capsys.readouterr().err


def _checkpointed(tmp_path: Path) -> tuple[LocalObjectStore, str, dict[bytes, bytes]]:
    """A DKV under a job-like prefix with tables on two levels, a tombstone and a WAL
    object, checkpointed; returns (store, manifest key, the live state as a dict)."""
    store = LocalObjectStore(tmp_path)
    db = DKV.open(store, "jobs/j/state/op/kg-0000-0127", options=DKVOptions(memtable_bytes=2000))
    oracle = {}
    for i in range(300):
        k, v = b"k%03d" % (i % 250), b"v%d" % i
        db.put(k, v)
        oracle[k] = v
    db.compact_all()
    for k in (b"k005", b"k100"):
        db.delete(k)
        del oracle[k]
    db.put(b"\xff\x00", b"\x80")
    oracle[b"\xff\x00"] = b"\x80"
    return store, db.checkpoint("e1"), oracle


def test_scan_manifest_equals_the_state_in_a_key_range(tmp_path: Path) -> None:
    _, mkey, oracle = _checkpointed(tmp_path)
    text = run("scan", str(tmp_path / mkey), "--from", "k004", "--to", "k101")
    got = [json.loads(line) for line in text.splitlines()]
    want = [{"key": k.decode(), "value": v.decode()} for k, v in sorted(oracle.items())
            if b"k004" <= k < b"k101"]
    assert got == want
    text = run("scan", (tmp_path / mkey).as_uri(), "--hex", "--from", "ff")
    assert [json.loads(line) for line in text.splitlines()] == [{"key": "ff00", "value": "80"}]
    assert len(run("scan", str(tmp_path / mkey), "--limit", "7").splitlines()) == 7


def test_scan_sstable_prints_tombstones_and_sequence_numbers(tmp_path: Path) -> None:
    b = SSTableBuilder(block_bytes=256, bloom_bits_per_key=10, zstd_level=3)
    for i in range(50):
        b.add(b"key-%03d" % i, 100 + i, None if i % 7 == 0 else b"value %d" % i)
    (tmp_path / "t.sst").write_bytes(b.finish()[0])
    got = [json.loads(line) for line in run("scan", str(tmp_path / "t.sst"), "--from", "key-010",
                                              "--to", "key-015").splitlines()]
    assert got == [{"key": f"key-{i:03d}", "seq": 100 + i,
                    "value": None if i % 7 == 0 else f"value {i}"} for i in range(10, 15)]


def test_verify_passes_an_intact_checkpoint(tmp_path: Path) -> None:
    store, mkey, _ = _checkpointed(tmp_path)
    tables = store.list("jobs/j/state/op/kg-0000-0127/sst/")
    text = run("verify", str(tmp_path / mkey), *(str(tmp_path / t) for t in tables))
    assert text.count(": ok,") == 1 + len(tables) and "1 WAL objects (3 records)" in text


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["table block", "table missing", "manifest byte", "wal byte"])
def test_verify_exits_1_on_damage_and_names_the_file(tmp_path: Path, damage: str) -> None:
    store, mkey, _ = _checkpointed(tmp_path)
    m = load_manifest(store, mkey)
    table = next(m.levels.all_tables()).key
    victim = {"table block": table, "table missing": table, "manifest byte": mkey,
              "wal byte": m.wal[0].key}[damage]
    if damage == "table missing":
        (tmp_path / victim).unlink()
    else:
        _flip(tmp_path / victim, 20)
    out = io.StringIO()
    assert main(["verify", str(tmp_path / mkey)], out) == 1
    assert "FAILED" in out.getvalue() and victim.rsplit("/", 1)[1] in out.getvalue()
    if damage == "table block":  # the table alone fails as well
        out = io.StringIO()
        assert main(["verify", str(tmp_path / table)], out) == 1
        assert "FAILED" in out.getvalue()


def test_usage_mistakes_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, mkey, _ = _checkpointed(tmp_path)
    assert main(["scan", str(tmp_path / mkey), "--hex", "--from", "zz"], io.StringIO()) == 2
    assert capsys.readouterr().err == "error: 'zz' is not hex (--hex takes keys as hex digits)\n"
    moved = tmp_path / "e1.json"
    moved.write_bytes((tmp_path / mkey).read_bytes())
    assert main(["scan", str(moved)], io.StringIO()) == 2
    assert "must lie at <store root>/jobs/j/state/op/kg-0000-0127/manifests/e1.json" in capsys.readouterr().err
