"""Torn and corrupt files: each is detected by checksum or validation with an error naming
the file and the offset (or block); a torn write is never visible; a restart falls back
to the previous checkpoint only where that is correct, says so, and the output still
equals the oracle exactly.

Extends tests/storage/dkv/test_corruption.py (every byte region of an SSTable, WAL and
manifest raises an error naming the file) with the offsets and blocks the errors name,
single-bit flips, truncation at every kind of cut, missing files, and the job level.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd
import pytest

from dkvstream.examples.synthetic import (
    WINDOW_COUNT_SCHEMA,
    KeyWindowCount,
    SyntheticSource,
    window_count_oracle,
)
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobFailedError, JobRunner
from dkvstream.operators.runtime.recovery import RecoveryRefusedError, check_checkpoint
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.sstable import FOOTER_SIZE
from dkvstream.storage.errors import CorruptionError, ObjectNotFoundError
from dkvstream.storage.objectstore import local as local_store
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.crashes import Crash, crash_at
from tests.storage.dkv.test_corruption import OPTS
from tests.storage.dkv.test_corruption import make_db as _db_with_wal
from tests.storage.dkv.test_corruption import read_everything as _read_all
from tests.storage.dkv.test_corruption import small_table as _table


def _path(store: LocalObjectStore, key: str) -> Path:
    return Path(store.uri(key).removeprefix("file://"))


def _flip_bit(store: LocalObjectStore, key: str, offset: int, bit: int) -> None:
    p = _path(store, key)
    data = bytearray(p.read_bytes())
    data[offset] ^= 1 << bit
    p.write_bytes(bytes(data))


def _truncate(store: LocalObjectStore, key: str, length: int) -> None:
    p = _path(store, key)
    p.write_bytes(p.read_bytes()[:length])


# ------------------------------------------------------------------ DKV files
def test_truncated_wal_tail_detected_with_offset(tmp_path: Path) -> None:
    store, mkey = _db_with_wal(tmp_path)
    (wal,) = store.list("p/r/wal/")
    data = store.get(wal)
    name = re.escape(wal.rsplit("/", 1)[1])
    # Mid-record, inside a record header, just after the magic, and a cut at a record
    # boundary (every record intact: only the manifest's size and last seq show it).
    boundary = len(data) - (8 + 8 + 1 + 4 + 5 + 4 + 4)  # the last record: k0299 -> b"late"
    for cut in (len(data) - 1, len(data) - 7, 8 + 3, boundary):
        store.put(wal, data[:cut])
        with pytest.raises(CorruptionError, match=rf"{name}.*offset \d+") as err:
            DKV.open(store, "p/r", mkey, OPTS)
        assert f"offset {cut}" in str(err.value) or "torn" in str(err.value)
    store.put(wal, data)
    assert DKV.open(store, "p/r", mkey, OPTS).get(b"k0299") == b"late"


def test_sstable_bit_flip_names_the_block_and_offset(tmp_path: Path) -> None:
    """A single flipped bit in data block i names block i and its offset; in the meta
    block (index, Bloom filter) the meta block's offset; in the footer the footer's."""
    store, data, reader = _table(tmp_path)
    bounds = reader.block_bounds()
    meta_off = bounds[-1][0] + bounds[-1][1]
    foot_off = len(data) - FOOTER_SIZE
    cases = []
    for i in (0, len(bounds) // 2, len(bounds) - 1):
        off, ln = bounds[i]
        for pos in (off, off + ln // 2, off + ln - 1):  # frame start, middle, crc
            cases.append((pos, rf"data block {i} .*at offset {off}\b"))
    for pos in (meta_off, (meta_off + foot_off) // 2, foot_off - 1):
        cases.append((pos, rf"meta block .*at offset {meta_off}\b"))
    for pos in range(foot_off, len(data), 3):
        cases.append((pos, rf"footer .*(at offset )?{foot_off}\b"))
    for pos, expect in cases:
        for bit in (0, 7):
            store.put("x/table-1.sst", data)
            _flip_bit(store, "x/table-1.sst", pos, bit)
            with pytest.raises(CorruptionError, match=r"table-1\.sst") as err:
                _read_all(store, len(data))
            assert re.search(expect, str(err.value)), (pos, bit, str(err.value))


def test_truncated_range_manifest_detected_with_offset(tmp_path: Path) -> None:
    store, mkey = _db_with_wal(tmp_path)
    data = store.get(mkey)
    for cut in (0, 1, len(data) // 2, data.index(b"\n") + 1, len(data) - 2, len(data) - 1):
        store.put(mkey, data[:cut])
        with pytest.raises(CorruptionError, match=r"e00000001-a1\.json: .*offset \d+|bytes \[0, \d+\)"):
            DKV.open(store, "p/r", mkey, OPTS)


def test_manifest_naming_a_missing_file_is_named(tmp_path: Path) -> None:
    store, mkey = _db_with_wal(tmp_path)
    (sst,) = store.list("p/r/sst/")
    (wal,) = store.list("p/r/wal/")
    data = store.get(sst)
    store.delete(sst)
    db = DKV.open(store, "p/r", mkey, OPTS)  # tables open lazily
    with pytest.raises(ObjectNotFoundError, match=rf"{re.escape(store.uri(sst))}: SSTable named by the manifest "
                                                  rf"is missing \(manifest says {len(data)} bytes\)"):
        db.get(b"k0003")
    store.put(sst, data)
    store.delete(wal)
    with pytest.raises(ObjectNotFoundError, match=rf"{re.escape(store.uri(wal))}: WAL object named by the manifest"):
        DKV.open(store, "p/r", mkey, OPTS)


# ------------------------------------------------------------------ torn writes
class _FailingFile:
    """Writes the first half of what it is given, then raises (a disk failing midway)."""

    def __init__(self, f) -> None:
        self._f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def write(self, data: bytes) -> int:
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(28, "No space left on device (injected)")

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.mark.parametrize("method", ["put", "put_if_absent"])
def test_torn_write_is_never_visible(method: str, tmp_path: Path, monkeypatch) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("a/old", b"previous version")
    real_open = open
    monkeypatch.setattr(local_store, "open", lambda p, mode="r": _FailingFile(real_open(p, mode)), raising=False)
    for key in ("a/new", "a/old"):
        if method == "put_if_absent" and key == "a/old":
            continue
        with pytest.raises(OSError, match="injected"):
            getattr(store, method)(key, b"x" * 10_000)
    monkeypatch.undo()
    assert store.list("a/") == ["a/old"]
    assert store.get("a/old") == b"previous version"
    assert not store.exists("a/new")
    with pytest.raises(ObjectNotFoundError):
        store.get("a/new")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["old"]  # no temp file left
    # Also a failure at the rename itself: old contents stay, nothing partial appears.
    monkeypatch.setattr(local_store.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(OSError, match="rename failed"):
        store.put("a/old", b"new version")
    monkeypatch.undo()
    assert store.get("a/old") == b"previous version" and store.list("a/") == ["a/old"]


def test_s3_upload_cut_midway_is_never_visible(s3_store) -> None:
    """A real SeaweedFS server: a PUT whose client dies after sending part of the body
    (Content-Length promises more) leaves neither a new object nor a partial one, and an
    existing object keeps its previous version."""
    import http.client
    from urllib.parse import urlsplit

    def raw_put(key: str, sent: bytes, length: int) -> http.client.HTTPConnection:
        url = urlsplit(s3_store._client.generate_presigned_url(
            "put_object", Params={"Bucket": s3_store.bucket, "Key": s3_store._object_key(key)}, ExpiresIn=60))
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.putrequest("PUT", f"{url.path}?{url.query}", skip_accept_encoding=True)
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        conn.send(sent)
        return conn

    s3_store.put("a/old", b"previous version")
    for key in ("a/new", "a/old"):
        raw_put(key, b"x" * 40_000, 100_000).sock.close()  # the writer crashes mid-body
    assert s3_store.list("a/") == ["a/old"]
    assert s3_store.get("a/old") == b"previous version"
    assert not s3_store.exists("a/new")
    # The same request sent whole does land (so the cut, not the request, kept it out).
    assert raw_put("a/new", b"y" * 1000, 1000).getresponse().status == 200
    assert s3_store.get("a/new") == b"y" * 1000


# ------------------------------------------------------------------ job restart and fallback
EVENTS = 300


def _job() -> Job:
    return Job(name="torn", source=SyntheticSource(EVENTS, keys=15, partitions=2, step_ms=900),
               operators=[KeyWindowCount()], sinks={"main": ParquetSink("counts", WINDOW_COUNT_SCHEMA)},
               key_groups=16, parallelism=2, events_per_epoch=120)


SMALL = DKVOptions(memtable_bytes=2_000, block_bytes=256)  # every epoch writes new SSTables


def _oracle(source: SyntheticSource) -> pd.DataFrame:
    return window_count_oracle(pd.concat([source.full_partition(p).to_pandas() for p in source.partitions()]))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True).astype("int64", errors="ignore")


def _output(runner: JobRunner) -> pd.DataFrame:
    return _sorted(runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas())


def _damage(store: LocalObjectStore, job: Job, epoch: int, what: str) -> str:
    """Damages one object only checkpoint ``epoch`` names; returns its file name."""
    ckpt = read_checkpoint(store, job.prefix, epoch)
    prev = read_checkpoint(store, job.prefix, epoch - 1)
    manifests = {k: load_manifest(store, k) for k in sorted(ckpt.operators["key_window_count"].values())}
    mkey, m = next(iter(manifests.items()))
    old = {t.key for mk in prev.operators["key_window_count"].values()
           for t in load_manifest(store, mk).levels.all_tables()}
    if what == "job checkpoint truncated":
        key = checkpoint_key(job.prefix, epoch)
        _truncate(store, key, store.size(key) // 2)
    elif what == "range manifest truncated":
        key = mkey
        _truncate(store, key, store.size(key) - 30)
    elif what == "WAL object missing":
        key = next(mf.wal[-1].key for mf in manifests.values() if mf.wal)
        store.delete(key)
    elif what == "SSTable missing":
        key = next(t.key for t in m.levels.all_tables() if t.key not in old)
        store.delete(key)
    elif what == "SSTable data block bit flip":
        key = next(t.key for t in m.levels.all_tables() if t.key not in old)
        _flip_bit(store, key, 10, 3)
    else:
        raise AssertionError(what)
    return key.rsplit("/", 1)[1]


FALLBACK_CASES = ["job checkpoint truncated", "range manifest truncated", "WAL object missing", "SSTable missing",
                  "SSTable data block bit flip"]


@pytest.mark.parametrize("what", FALLBACK_CASES)
def test_restart_falls_back_when_bad_epoch_output_is_not_visible(what: str, tmp_path: Path, caplog) -> None:
    """Epoch 2 is committed but not published (crash), then an object only it names is
    damaged: the restart falls back to epoch 1, says so, recomputes epoch 2, and the
    output equals the oracle exactly."""
    root = str(tmp_path / "store")
    job = _job()
    with crash_at("after_commit", 2), pytest.raises(Crash):
        JobRunner(job, None, root, dkv_options=SMALL).run()
    runner = JobRunner(job, None, root, dkv_options=SMALL, verify_restart="full")
    name = _damage(runner.store, job, 2, what)

    with caplog.at_level(logging.WARNING, logger="dkvstream.operators.runtime.recovery"):
        results = runner.run()
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "checkpoint epoch 2 is unusable" in warning and name in warning and "fell back to epoch 1" in warning
    assert results[0].epoch == 2 and results[-1].finished
    assert _output(runner).equals(_oracle(job.source))
    recovery = read_checkpoint(runner.store, job.prefix, 2).metrics["recovery"]
    assert recovery["fell_back_from_epoch"] == 2 and recovery["fell_back_to_epoch"] == 1
    assert any(name in b for b in recovery["bad_objects"])
    assert recovery["quarantined"] and all(runner.store.exists(k) for k in recovery["quarantined"])
    assert "recovery" not in read_checkpoint(runner.store, job.prefix, 3).metrics  # recorded once
    from dkvstream.assets.checkpoints import checkpoint_metadata, level_stats  # and shown in Dagster

    md = checkpoint_metadata(results[0], level_stats(runner.store, read_checkpoint(runner.store, job.prefix, 2)))
    assert md["fell_back_from_epoch"].value == 2 and md["recovery"].value == recovery
    assert "fell_back_from_epoch" not in checkpoint_metadata(results[1], level_stats(runner.store, runner.latest()))


def test_data_block_flip_without_full_verification_fails_the_epoch_naming_it(tmp_path: Path) -> None:
    """The default restart check reads no blocks: a flipped bit inside a block shows when
    the task reads it, as an epoch failure naming the table and offset (run with
    verify_restart="full", or the ``verified`` asset check, to fall back instead)."""
    root = str(tmp_path / "store")
    job = _job()
    with crash_at("after_commit", 2), pytest.raises(Crash):
        JobRunner(job, None, root, dkv_options=SMALL).run()
    runner = JobRunner(job, None, root, dkv_options=SMALL)
    name = _damage(runner.store, job, 2, "SSTable data block bit flip")
    with pytest.raises(JobFailedError, match=rf"{re.escape(name)}: .*offset \d+"):
        runner.run()


def test_fallback_refused_when_bad_epoch_output_is_visible(tmp_path: Path) -> None:
    """The last epoch is published; its checkpoint is then truncated. Falling back
    would replay an epoch whose output readers already see, so the restart refuses,
    names the bad object and the visible output, and changes nothing. After the
    operator deletes that output (as the error says), the restart falls back and the
    output equals the oracle."""
    root = str(tmp_path / "store")
    job = _job()
    runner = JobRunner(job, None, root, dkv_options=SMALL)
    last = runner.run()[-1].epoch
    key = checkpoint_key(job.prefix, last)
    _truncate(runner.store, key, 100)
    with pytest.raises(RecoveryRefusedError, match=rf"epoch-{last:010d}\.json: .*offset \d+.*already visible"
                                                   rf".*sinks/counts/epoch(=|%3D){last:08d}"):
        JobRunner(job, None, root, dkv_options=SMALL).run()
    assert list_epochs(runner.store, job.prefix) == list(range(1, last + 1)) and runner.store.size(key) == 100

    for k in runner.store.list(f"{job.prefix}/sinks/"):
        if f"/epoch={last:08d}/" in k:
            runner.store.delete(k)
    again = JobRunner(job, None, root, dkv_options=SMALL)
    assert [r.epoch for r in again.run()] == [last]
    assert _output(again).equals(_oracle(job.source))


def test_no_verifying_checkpoint_is_refused_naming_every_bad_object(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    job = _job()
    runner = JobRunner(job, None, root, dkv_options=SMALL, retain_checkpoints=1)
    runner.run(max_epochs=2)
    assert list_epochs(runner.store, job.prefix) == [2]
    _truncate(runner.store, checkpoint_key(job.prefix, 2), 10)
    with pytest.raises(RecoveryRefusedError, match=r"no retained checkpoint .*epoch-0000000002\.json: .*offset 10"):
        JobRunner(job, None, root).run()


def test_check_checkpoint_reports_torn_table_size(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    job = _job()
    runner = JobRunner(job, None, root, dkv_options=SMALL)
    runner.run(max_epochs=2)
    ckpt = read_checkpoint(runner.store, job.prefix, 2)
    mkey = sorted(ckpt.operators["key_window_count"].values())[0]
    table = next(iter(load_manifest(runner.store, mkey).levels.all_tables()))
    _truncate(runner.store, table.key, table.size - 5)
    _, errors = check_checkpoint(runner.store, job.prefix, 2)
    assert any(f"{runner.store.uri(table.key)}: SSTable has {table.size - 5} bytes" in e and
               f"torn or extended at offset {table.size - 5}" in e for e in errors)
