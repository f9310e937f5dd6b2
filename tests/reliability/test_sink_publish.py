"""What readers of a Parquet sink directory see after faults around publishing: restarts,
a disk full mid-publish, a staged file damaged after its epoch committed.

Oracle: the README's first job (a running maximum per key over six events, whose rows are
known by hand), read by DuckDB's glob as the README shows and by pyarrow; and the
published files' bytes before and after a restart.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path
from urllib.parse import unquote

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dkvstream.operators import IntCodec, Job, JobRunner, Operator, ParquetSink, Source, ValueSpec
from dkvstream.operators.errors import RecoveryRefusedError
from dkvstream.operators.io.dead_letter import DEAD_LETTER_OUTPUT
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.storage.objectstore import local as local_store
from tests.crashes import Crash, crash_at

EVENTS = pa.table({"key": [b"a", b"b", b"a", b"c", b"a", b"b"], "amount": [5, 7, 2, 9, 8, 1],
                   "timestamp": [1_000, 2_000, 3_000, 4_000, 5_000, 6_000]})
# (key, max, epoch) rows the job publishes: every new maximum per key.
EXPECTED = sorted([("a", 5, 1), ("b", 7, 1), ("c", 9, 2), ("a", 8, 3)])
# Keys "a" and "d" fall in different key-group ranges (key groups 31 and 202 of 256), so
# epochs 1 and 2 publish two files each.
TWO_FILES = pa.table({"key": [b"a", b"d", b"a", b"d", b"a", b"d"], "amount": [5, 7, 6, 9, 8, 1],
                      "timestamp": [1_000, 2_000, 3_000, 4_000, 5_000, 6_000]})
EXPECTED_TWO_FILES = sorted([("a", 5, 1), ("d", 7, 1), ("a", 6, 2), ("d", 9, 2), ("a", 8, 3)])


class TableSource(Source):
    value_schema = pa.schema([("amount", pa.int64())])

    def __init__(self, events: pa.Table = EVENTS) -> None:
        self.events = events

    def partitions(self):
        return ["p0"]

    def end_offsets(self):
        return {"p0": self.events.num_rows}

    def read(self, partition, start, end):
        return self.events.slice(start, end - start)


class RunningMax(Operator):
    name = "running_max"
    outputs = {"main": pa.schema([("key", pa.string()), ("max", pa.int64())])}
    best = ValueSpec(IntCodec())

    def on_event(self, subject, event):
        best, amount = self.best.state_for(subject), event.value["amount"]
        if amount > best.get(default=-1):
            best.set(amount)
            subject.emit({"key": subject.key.decode(), "max": amount})


def _job(events: pa.Table = EVENTS) -> Job:
    """The README's first job (over ``events``)."""
    return Job(name="first", source=TableSource(events), operators=[RunningMax()],
               sinks={"main": ParquetSink("maxima")}, events_per_epoch=2)


def _sink_dir(root: Path) -> Path:
    return root / "jobs" / "first" / "sinks" / "maxima"


def _duckdb_rows(root: Path) -> list[tuple]:
    """The README's DuckDB read: a glob over every file of every epoch directory."""
    return sorted(duckdb.sql(f"SELECT key, max, CAST(epoch AS BIGINT) FROM read_parquet("
                             f"'{_sink_dir(root)}/*/*.parquet', hive_partitioning = true)").fetchall())


def _pyarrow_rows(root: Path) -> list[tuple]:
    t = pq.read_table(_sink_dir(root)).to_pydict()
    return sorted(zip(t["key"], t["max"], [int(e) for e in t["epoch"]], strict=True))


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_readme_job_run_three_times_publishes_each_row_once(tmp_path: Path) -> None:
    """Each restart publishes the newest checkpoint again: afterwards the sink directory
    holds the published files only (no temp file), and DuckDB's glob, pyarrow and the
    sink's own reader see each row once."""
    root = tmp_path / "store"
    runs = [[(r.epoch, r.events) for r in JobRunner(_job(), None, str(root)).run()] for _ in range(3)]
    assert runs == [[(1, 2), (2, 2), (3, 2)], [], []]
    assert [f for f in _files(_sink_dir(root)) if ".tmp" in f] == []
    assert all(f.startswith("epoch=") and f.endswith(".parquet") for f in _files(_sink_dir(root)))
    assert _duckdb_rows(root) == EXPECTED
    assert _pyarrow_rows(root) == EXPECTED


@pytest.mark.parametrize("fails", ["publish", "staging"])
def test_disk_full_leaves_no_temp_in_the_sink(fails: str, tmp_path: Path, monkeypatch) -> None:
    """The disk fills up (ENOSPC) while epoch 1's second file is published (its hard
    link, then the byte copy that stands in for it, which writes half the bytes), or
    while a task writes epoch 2's staged file: no temp file nor partial file is left,
    in the sink directory or anywhere; readers see whole published files only, and
    after the restart every row exactly once."""
    root = tmp_path / "store"
    job = _job(TWO_FILES)
    real_link, real_open = local_store.os.link, open
    published = []

    def enospc() -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def link(src, dst, *args, **kwargs):
        if "sinks" in unquote(str(dst)):  # a publish (to its temp name)
            if published:
                enospc()
            published.append(dst)
        return real_link(src, dst, *args, **kwargs)

    def copyfile(src, dst, *args, **kwargs):
        with real_open(dst, "wb") as f:
            f.write(Path(src).read_bytes()[:100])
        enospc()

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

    def open_(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        staging = "epoch=0000000002" in unquote(str(path)) and str(path).endswith("maxima.parquet")
        return FullFile(f) if staging else f

    if fails == "publish":
        monkeypatch.setattr(local_store.os, "link", link)
        monkeypatch.setattr(local_store.shutil, "copyfile", copyfile)
    else:
        monkeypatch.setattr(local_store, "open", open_, raising=False)
    with pytest.raises(Exception) as raised:
        JobRunner(job, None, str(root)).run()
    assert "No space left on device (injected)" in str(raised.value)
    monkeypatch.undo()
    assert [f for f in _files(root) if ".tmp" in f] == []
    if fails == "publish":
        assert published and len(_duckdb_rows(root)) == 1  # one of epoch 1's two files
    else:
        assert _duckdb_rows(root) == [("a", 5, 1), ("d", 7, 1)]  # epoch 1

    assert [r.epoch for r in JobRunner(job, None, str(root)).run()] == [2, 3]
    assert [f for f in _files(root) if ".tmp" in f] == []
    assert _duckdb_rows(root) == EXPECTED_TWO_FILES == _pyarrow_rows(root)


def _staged_key(runner: JobRunner, epoch: int) -> str:
    (key,) = read_checkpoint(runner.store, runner.job.prefix, epoch).outputs["main"]
    return key


def _damaged(data: bytes, how: str) -> bytes:
    if how == "bit flip":  # same size: only a read of the bytes can tell
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]
    return data[: len(data) // 2]


@pytest.mark.parametrize("mode", ["names", "full"])
@pytest.mark.parametrize("how", ["bit flip", "truncated"])
def test_damaged_staged_file_never_replaces_a_published_one(mode: str, how: str, tmp_path: Path) -> None:
    """The newest epoch is published; then its staged file is replaced by damaged bytes.
    The restart leaves the published file, which matches the checksum the checkpoint
    recorded, alone: its bytes stay and readers still read it."""
    root = tmp_path / "store"
    runner = JobRunner(_job(), None, str(root))
    runner.run()
    staged = _staged_key(runner, 3)
    final = runner.job.sinks["main"].published_key(runner.job.prefix, 3, staged)
    good = runner.store.get(final)
    runner.store.put(staged, _damaged(runner.store.get(staged), how))

    assert JobRunner(_job(), None, str(root), verify_restart=mode).run() == []
    assert runner.store.get(final) == good
    assert _duckdb_rows(root) == EXPECTED == _pyarrow_rows(root)


@pytest.mark.parametrize("mode", ["names", "full"])
def test_damaged_staged_file_of_an_unpublished_epoch_is_recomputed(mode: str, tmp_path: Path) -> None:
    """Epoch 3 is committed but not published (crash), and its staged file is then
    damaged: nothing of epoch 3 is visible, so the restart falls back to epoch 2, names
    the file, and computes epoch 3 again; readers see each row once."""
    root = tmp_path / "store"
    job = _job()
    with crash_at("after_commit", 3), pytest.raises(Crash):
        JobRunner(job, None, str(root)).run()
    runner = JobRunner(job, None, str(root), verify_restart=mode)
    staged = _staged_key(runner, 3)
    runner.store.put(staged, _damaged(runner.store.get(staged), "bit flip"))

    assert [r.epoch for r in runner.run()] == [3]
    recovery = read_checkpoint(runner.store, job.prefix, 3).metrics["recovery"]
    assert recovery["fell_back_to_epoch"] == 2
    assert any(runner.store.uri(staged) in bad and "crc32c" in bad for bad in recovery["bad_objects"])
    assert _duckdb_rows(root) == EXPECTED == _pyarrow_rows(root)


def test_damaged_staged_file_of_a_partly_published_epoch_is_refused(tmp_path: Path) -> None:
    """Epoch 2's publish was cut after its first file; the second file's staged copy is
    then damaged. Nothing is copied over anything: the restart refuses, naming the
    staged object and the way out; after the epoch's published output is deleted as it
    says, the restart recomputes it and readers see each row once."""
    root = tmp_path / "store"
    job = _job(TWO_FILES)
    with crash_at("after_commit", 2), pytest.raises(Crash):
        JobRunner(job, None, str(root)).run()
    runner = JobRunner(job, None, str(root))
    sink = job.sinks["main"]
    first, second = read_checkpoint(runner.store, job.prefix, 2).outputs["main"]
    runner.store.copy(first, sink.published_key(job.prefix, 2, first))  # the part published
    runner.store.put(second, _damaged(runner.store.get(second), "bit flip"))
    before = _files(_sink_dir(root))

    with pytest.raises(RecoveryRefusedError) as refused:
        runner.run()
    message = str(refused.value)
    assert runner.store.uri(second) in message and "crc32c" in message
    assert "delete that output" in message
    assert _files(_sink_dir(root)) == before

    shutil.rmtree(_sink_dir(root) / "epoch=00000002")
    assert [r.epoch for r in JobRunner(job, None, str(root)).run()] == [2, 3]
    assert _duckdb_rows(root) == EXPECTED_TWO_FILES == _pyarrow_rows(root)


def test_republish_refuses_a_damaged_staged_file_it_would_copy(tmp_path: Path) -> None:
    """``ParquetSink.republish`` itself (not only the restart's check before it) never
    copies a staged file that no longer matches its checksum."""
    root = tmp_path / "store"
    job = _job()
    with crash_at("after_commit", 1), pytest.raises(Crash):
        JobRunner(job, None, str(root)).run()
    runner = JobRunner(job, None, str(root))
    ckpt = read_checkpoint(runner.store, job.prefix, 1)
    staged = ckpt.outputs["main"][0]
    runner.store.put(staged, _damaged(runner.store.get(staged), "truncated"))
    sink = job.sinks["main"]
    with pytest.raises(RecoveryRefusedError, match="staged output of epoch 1 has .* bytes"):
        sink.republish(runner.store, job.prefix, 1, [staged], ckpt.staged_checksums(), False,
                       lambda fn, items: [fn(i) for i in items])
    assert not runner.store.exists(sink.published_key(job.prefix, 1, staged))


def test_damaged_staged_dead_letter_file_never_replaces_a_published_one(tmp_path: Path) -> None:
    """The dead-letter table is a sink too: its staged files' checksums are in the
    checkpoint, and a restart leaves a published dead-letter file that matches alone
    when its staged copy was damaged since. Oracle: the row with a negative timestamp is
    the one dead letter, in epoch 3."""
    events = EVENTS.set_column(2, "timestamp", pa.array([1_000, 2_000, 3_000, 4_000, -5, 6_000]))
    root = tmp_path / "store"
    runner = JobRunner(_job(events), None, str(root))
    runner.run()
    ckpt = read_checkpoint(runner.store, runner.job.prefix, 3)
    (staged,) = ckpt.outputs[DEAD_LETTER_OUTPUT]
    assert staged in ckpt.output_checksums
    sink = runner.job.dead_letter.sink
    final = sink.published_key(runner.job.prefix, 3, staged)
    good = runner.store.get(final)
    runner.store.put(staged, _damaged(runner.store.get(staged), "bit flip"))

    assert JobRunner(_job(events), None, str(root), verify_restart="full").run() == []
    assert runner.store.get(final) == good
    dead = pq.read_table(_sink_dir(root).parent / "dead_letter")
    assert dead.column("offset").to_pylist() == [4] and dead.column("epoch").to_pylist() == [3]
