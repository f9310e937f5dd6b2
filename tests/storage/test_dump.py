"""The dump CLI against a table and a manifest built here."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from storage.dkv import DKV, DKVOptions
from storage.dkv.dump import main
from storage.dkv.sstable import SSTableBuilder
from storage.objectstore.local import LocalObjectStore


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
