"""Manifest encoding, publishing with put_if_absent, and each invariant on its own."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dkvstream.storage.dkv import invariants as inv
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.manifest import (
    Manifest,
    WalRef,
    decode_manifest,
    encode_manifest,
    frame,
    load_manifest,
    publish_manifest,
)
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.errors import CorruptionError, ManifestConflictError
from dkvstream.storage.objectstore.local import LocalObjectStore


def t(key: str, lo: bytes, hi: bytes, s0: int, s1: int) -> TableInfo:
    return TableInfo(key=key, size=100, entries=3, min_key=lo, max_key=hi, min_seq=s0, max_seq=s1)


def good() -> Manifest:
    levels = LevelList(
        (
            (t("l0-new", b"a", b"z", 21, 30), t("l0-old", b"c", b"q", 11, 20)),
            (t("l1-a", b"a", b"f", 1, 10), t("l1-b", b"g", b"\xff\xff", 2, 9)),
        )
    )
    wal = (WalRef("w1", 31, 40, 500, 10), WalRef("w2", 41, 42, 60, 2))
    return Manifest(name="e1-a", prefix="p/r", last_seq=42, flushed_seq=30, levels=levels, wal=wal)


def test_roundtrip() -> None:
    m = good()
    assert decode_manifest(encode_manifest(m), "mem://m") == m
    empty = Manifest(name="e0", prefix="p", last_seq=0, flushed_seq=0)
    assert decode_manifest(encode_manifest(empty), "mem://m") == empty


def test_format_is_two_lines_with_crc() -> None:
    lines = encode_manifest(good()).split(b"\n")
    assert len(lines) == 3 and lines[2] == b""
    assert lines[0].startswith(b'{"flushed_seq":30,"format_version":2')
    assert lines[1].startswith(b'{"crc32c":"')


def test_publish_conflict_and_load(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    publish_manifest(store, "p/r/manifests/e1-a.json", good())
    with pytest.raises(ManifestConflictError, match="e1-a.json"):
        publish_manifest(store, "p/r/manifests/e1-a.json", good())
    assert load_manifest(store, "p/r/manifests/e1-a.json") == good()


def test_unknown_version_rejected() -> None:
    body = json.loads(encode_manifest(good()).split(b"\n")[0])
    body["format_version"] = 3
    with pytest.raises(CorruptionError, match="format_version"):
        decode_manifest(frame(body), "mem://m")


def test_version_1_manifest_still_reads() -> None:
    body = json.loads(encode_manifest(good()).split(b"\n")[0])
    body["format_version"] = 1
    del body["key_range"], body["handled_compactions"]
    m = decode_manifest(frame(body), "mem://m")
    assert replace(m, format_version=2) == good()


def test_v2_fields_roundtrip() -> None:
    m = good()
    lv = m.levels.levels
    clipped = replace(lv[1][0], clip=(b"a", None))
    m2 = replace(
        m, key_range=(b"\x00\x01", b"\x00\x09"), handled_compactions=("c1", "c2"),
        levels=type(m.levels)((lv[0], (clipped, *lv[1][1:]), *lv[2:])),
    )
    assert decode_manifest(encode_manifest(m2), "mem://m") == m2


def test_all_invariants_hold_for_good_manifest() -> None:
    for pred in inv.ALL_INVARIANTS:
        assert pred(good()), pred.__name__
    inv.check_manifest(good(), "mem://m")


def test_sorted_runs_are_disjoint() -> None:
    m = good()
    l0, l1 = m.levels.levels
    overlapping = (l1[0], replace(l1[1], min_key=b"f"))
    assert not inv.sorted_runs_are_disjoint(replace(m, levels=LevelList((l0, overlapping))))
    assert not inv.sorted_runs_are_disjoint(replace(m, levels=LevelList((l0, l1[::-1]))))
    # L0 may overlap freely
    assert inv.sorted_runs_are_disjoint(m)


def test_tables_have_valid_ranges() -> None:
    m = good()
    l0, l1 = m.levels.levels
    bad = (replace(l0[0], max_seq=31, min_seq=21), l0[1])  # above flushed_seq
    assert not inv.tables_have_valid_ranges(replace(m, levels=LevelList((bad, l1))))
    bad = (replace(l0[0], min_key=b"zz"), l0[1])
    assert not inv.tables_have_valid_ranges(replace(m, levels=LevelList((bad, l1))))


def test_seqs_are_consistent() -> None:
    assert not inv.seqs_are_consistent(replace(good(), flushed_seq=50))


def test_wal_is_above_tables() -> None:
    m = good()
    assert not inv.wal_is_above_tables(replace(m, wal=(WalRef("w", 30, 40, 1, 1),)))
    assert not inv.wal_is_above_tables(replace(m, wal=m.wal[::-1]))
    assert not inv.wal_is_above_tables(replace(m, wal=(WalRef("w", 31, 43, 1, 1),)))


def test_l0_is_newest_first() -> None:
    m = good()
    l0, l1 = m.levels.levels
    assert not inv.l0_is_newest_first(replace(m, levels=LevelList((l0[::-1], l1))))


def test_tables_are_unique() -> None:
    m = good()
    l0, l1 = m.levels.levels
    dup = (l1[0], replace(l1[1], key=l1[0].key))
    assert not inv.tables_are_unique(replace(m, levels=LevelList((l0, dup))))


def test_check_manifest_names_invariant() -> None:
    with pytest.raises(CorruptionError, match="seqs_are_consistent"):
        inv.check_manifest(replace(good(), flushed_seq=50, wal=()), "mem://m")
