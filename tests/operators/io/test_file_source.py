"""The file source (``dkvstream.operators.io.files.FileSource``): files landing in waves in a
directory (or an S3 prefix on SeaweedFS) while an in-process job processes them; the
output equals a pandas oracle over every row of every file, a restart re-reads nothing,
malformed rows and files go to the dead-letter table naming the file, hidden files wait
for their rename, and the file log stays a bounded number of objects."""
from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import tempfile

import crc32c
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.examples.keyed_count import WINDOW_MS, KeyedWindowCount
from dkvstream.operators.api.job import Job
from dkvstream.operators.errors import RecoveryRefusedError, SourceFileChangedError
from dkvstream.operators.io.files import FileSource
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.paths import checkpoint_key, job_prefix, source_prefix
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore import open_object_store
from tests.crashes import Crash, crash_at

SCHEMA = pa.schema([("amount", pa.int64())])
BASE_MS = 1_700_000_000_000  # 2023-11-14, in the past of the wall clock
STEP_MS = 60_000  # one event a minute: 60 per hourly window
ROWS_PER_FILE = 90


def _rows(first: int, n: int) -> pd.DataFrame:
    """Rows ``first .. first + n - 1`` of the global stream (timestamps increasing)."""
    i = np.arange(first, first + n)
    return pd.DataFrame({"user": [f"u{j % 7}" for j in i], "ts": BASE_MS + i * STEP_MS,
                         "amount": (i % 13 + 1).astype(np.int64)})


def _encode(df: pd.DataFrame, fmt: str) -> bytes:
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf)
        return buf.getvalue()
    if fmt == "csv":
        return df.to_csv(index=False).encode()
    return "".join(json.dumps(r) + "\n" for r in df.to_dict("records")).encode()


def _write(directory, name: str, data: bytes, mtime_s: float) -> None:
    """Writes a file as a careful writer does: hidden name, then rename; its mtime set
    so that arrival order is explicit."""
    tmp = os.path.join(directory, "_" + name)
    with open(tmp, "wb") as f:
        f.write(data)
    os.utime(tmp, (mtime_s, mtime_s))
    os.rename(tmp, os.path.join(directory, name))


def _source(location, fmt: str, **kw) -> FileSource:
    return FileSource(location, fmt, SCHEMA, key_column="user", timestamp_column="ts",
                      timestamp_unit="ms", **kw)


def _job(source: FileSource, name: str = "files", events_per_epoch: int = 200) -> Job:
    op = KeyedWindowCount()
    return Job(name=name, source=source, operators=[op],
               sinks={n: ParquetSink(n, s) for n, s in op.outputs.items()},
               key_groups=8, parallelism=1, events_per_epoch=events_per_epoch,
               max_out_of_orderness_ms=0)


def _oracle(df: pd.DataFrame, watermark: int) -> pd.DataFrame:
    """Per user and hourly window closed by ``watermark``: count and sum of amount."""
    df = df.assign(window_start=df.ts - df.ts % WINDOW_MS, key=df.user)
    out = df.groupby(["key", "window_start"], as_index=False).agg(
        count=("amount", "size"), amount=("amount", "sum"))
    out = out[out.window_start + WINDOW_MS <= watermark]
    return _sorted(out)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return (df[["key", "window_start", "count", "amount"]].sort_values(["key", "window_start"])
            .reset_index(drop=True).astype({"count": "int64", "amount": "int64"}))


def _output(runner: JobRunner, sink: str = "main") -> pd.DataFrame:
    return runner.job.sinks[sink].read(runner.store, runner.job.prefix).to_pandas()


def _dead(runner: JobRunner) -> pd.DataFrame:
    return runner.job.dead_letter.sink.read(runner.store, runner.job.prefix).to_pandas()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_waves_of_files_match_the_oracle_and_a_restart_rereads_nothing(tmp_path, fmt) -> None:
    """Three waves of two files; a run between waves (the third by a new runner that
    restarts from the checkpoint). Every row is read exactly once (events over all
    committed epochs = rows written) and the output equals pandas over all rows."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    written, events, results = [], 0, []
    runner = JobRunner(_job(_source(str(inbox), fmt)), None, root)
    for wave in range(3):
        for _ in range(2):
            n = len(written) * ROWS_PER_FILE
            df = _rows(n, ROWS_PER_FILE)
            # Names against arrival order: the mtime, not the name, orders files.
            _write(inbox, f"{9 - len(written)}.{fmt}", _encode(df, fmt), 1e9 + len(written))
            written.append(df)
        if wave == 2:
            runner.close()
            runner = JobRunner(_job(_source(str(inbox), fmt)), None, root)
        results += runner.run()
        assert runner.run() == []  # nothing new: the run ends at once
    events = sum(r.events for r in results)
    everything = pd.concat(written, ignore_index=True)
    assert events == len(everything)
    watermark = results[-1].watermark
    assert watermark == everything.ts.max() - 1  # the bound is 0
    got = _sorted(_output(runner))
    assert not got.duplicated(["key", "window_start"]).any()
    pd.testing.assert_frame_equal(got, _oracle(everything, watermark))
    assert len(_output(runner, "late")) == 0
    # The log is in arrival (mtime) order, offsets dense over the files' rows.
    files = runner.job.source.logged_files()
    assert [f.name for f in files] == [f"{9 - i}.{fmt}" for i in range(6)]
    assert [f.start for f in files] == [i * ROWS_PER_FILE for i in range(6)]
    assert results[-1].source_offsets == {"files": 6 * ROWS_PER_FILE}
    runner.close()


def test_a_crashed_epoch_is_replayed_from_the_log(tmp_path) -> None:
    """An epoch crashes after its tasks ran (nothing committed); a new runner re-reads
    exactly the uncommitted offsets from the same logged files: output exact."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    df = _rows(0, 3 * ROWS_PER_FILE)
    for i in range(3):
        _write(inbox, f"f{i}.csv", _encode(df.iloc[i * ROWS_PER_FILE:(i + 1) * ROWS_PER_FILE], "csv"), 1e9 + i)

    with crash_at("after_tasks", 2), pytest.raises(Crash):
        JobRunner(_job(_source(str(inbox), "csv"), events_per_epoch=100), None, root).run()
    runner = JobRunner(_job(_source(str(inbox), "csv"), events_per_epoch=100), None, root)
    results = runner.run()
    assert [r.epoch for r in results] == [2, 3]  # 270 rows, 100 per epoch
    assert sum(r.events for r in results) == len(df) - 100
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(df, results[-1].watermark))
    runner.close()


BAD_CSV = (b"user,ts,amount\n"
           b"u1,1700000000000,5\n"
           b"u2,1700000060000,not-a-number\n"     # line 3: wrong type
           b"u3,1700000120000\n"                  # line 4: a column short
           b"\n"                                  # blank: no offset
           b"u4,1700000180000,7\n")
BAD_JSONL = (b'{"user": "u1", "ts": 1700000000000, "amount": 5}\n'
             b'{"user": "u2", "ts": 1700000060000, "amount": "x"}\n'   # line 2: wrong type
             b'{"user": "u3", "ts": 1700000120000, "amount": \n'       # line 3: not JSON
             b'\n'
             b'{"user": "u4", "ts": 1700000180000, "amount": 7}\n')


@pytest.mark.parametrize("fmt, data, bad_lines", [("csv", BAD_CSV, [3, 4]), ("jsonl", BAD_JSONL, [2, 3])])
def test_malformed_rows_go_to_the_dead_letter_table(tmp_path, fmt, data, bad_lines) -> None:
    """Bad lines become dead-letter rows naming the file and line, with the raw line as
    value and their offsets; the good rows of the same file are processed."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    _write(inbox, f"bad.{fmt}", data, 1e9)
    good = _rows(0, ROWS_PER_FILE)
    _write(inbox, f"good.{fmt}", _encode(good, fmt), 1e9 + 1)
    runner = JobRunner(_job(_source(str(inbox), fmt)), None, root)
    results = runner.run()
    raw = [line for line in data.split(b"\n") if line.strip()]
    raw = raw[1:] if fmt == "csv" else raw
    dead = _dead(runner).sort_values("offset")
    assert dead.offset.tolist() == [1, 2]
    assert dead.reason.tolist() == ["unparseable_value"] * 2
    assert dead.partition.tolist() == ["files"] * 2
    assert dead.value.tolist() == [raw[1], raw[2]]
    for line, error in zip(bad_lines, dead.error):
        assert f"bad.{fmt} line {line}:" in error
    assert sum(r.events for r in results) == 2 + ROWS_PER_FILE  # good events: 2 of bad's 4
    assert results[-1].source_offsets == {"files": 4 + ROWS_PER_FILE}
    parsed = pd.DataFrame({"user": ["u1", "u4"], "ts": [BASE_MS, BASE_MS + 180_000], "amount": [5, 7]})
    pd.testing.assert_frame_equal(_sorted(_output(runner)),
                                  _oracle(pd.concat([parsed, good]), results[-1].watermark))
    runner.close()


def test_corrupt_parquet_file_is_one_dead_letter_row(tmp_path) -> None:
    """A file that is not Parquet takes one offset, a dead-letter row naming it; the
    files around it are processed."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    a, b = _rows(0, ROWS_PER_FILE), _rows(ROWS_PER_FILE, ROWS_PER_FILE)
    _write(inbox, "a.parquet", _encode(a, "parquet"), 1e9)
    _write(inbox, "b.parquet", b"PAR1 this is not parquet", 1e9 + 1)
    _write(inbox, "c.parquet", _encode(b, "parquet"), 1e9 + 2)
    runner = JobRunner(_job(_source(str(inbox), "parquet")), None, root)
    results = runner.run()
    dead = _dead(runner)
    assert dead.offset.tolist() == [ROWS_PER_FILE]
    assert "b.parquet" in dead.error[0] and "not a readable Parquet file" in dead.error[0]
    assert sum(r.events for r in results) == 2 * ROWS_PER_FILE
    assert results[-1].source_offsets == {"files": 2 * ROWS_PER_FILE + 1}
    pd.testing.assert_frame_equal(_sorted(_output(runner)),
                                  _oracle(pd.concat([a, b]), results[-1].watermark))
    runner.close()


def test_hidden_file_waits_for_its_rename(tmp_path) -> None:
    """A file named ``_...`` (or in a ``.`` directory) is not read; renamed, it is."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    (inbox / ".staging").mkdir(parents=True)
    df = _rows(0, ROWS_PER_FILE)
    (inbox / "_part.jsonl").write_bytes(_encode(df, "jsonl"))
    (inbox / ".staging" / "part.jsonl").write_bytes(_encode(df, "jsonl"))
    runner = JobRunner(_job(_source(str(inbox), "jsonl")), None, root)
    assert runner.run() == []
    assert runner.job.source.logged_files() == []
    os.rename(inbox / "_part.jsonl", inbox / "part.jsonl")
    results = runner.run()
    assert sum(r.events for r in results) == ROWS_PER_FILE
    assert [f.name for f in runner.job.source.logged_files()] == ["part.jsonl"]
    runner.close()


def test_file_log_stays_bounded_and_reloads(tmp_path) -> None:
    """25 discoveries with compaction every 4 batches: the log never holds more than 5
    objects, and a new source instance (a restart) loads the same files and offsets."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    store = open_object_store(str(tmp_path / "store"))
    prefix = source_prefix(job_prefix("bounded"), "files")
    source = _source(str(inbox), "csv", compact_every=4)
    source.attach(store, job_prefix("bounded"))
    sizes = []
    for i in range(25):
        _write(inbox, f"f{i:03d}.csv", _encode(_rows(i * 3, 3), "csv"), 1e9 + i)
        assert source.end_offsets() == {"files": 3 * (i + 1)}
        sizes.append(len(store.list(prefix)))
    assert max(sizes) <= 5, sizes
    assert sizes[-1] == 2  # compact-24 and batch 25
    again = _source(str(inbox), "csv", compact_every=4)
    again.attach(store, job_prefix("bounded"))
    assert again.logged_files() == source.logged_files()
    assert again.read("files", 0, 75).column("key").to_pylist() == [
        u.encode() for u in _rows(0, 75).user]
    # The pickled source (as Spark ships a job) carries no loaded state and reads the same.
    clone = pickle.loads(pickle.dumps(source))
    assert clone.read("files", 10, 20).equals(source.read("files", 10, 20))


def test_changed_file_fails_or_is_dead_lettered(tmp_path) -> None:
    """A file rewritten after it was logged and before it was read: the read raises
    naming the file; with on_changed_file="dead_letter" its offsets are dead letters."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    store = open_object_store(str(tmp_path / "store"))
    _write(inbox, "a.csv", _encode(_rows(0, 10), "csv"), 1e9)
    source = _source(str(inbox), "csv")
    source.attach(store, job_prefix("changed"))
    assert source.end_offsets() == {"files": 10}
    (inbox / "a.csv").write_bytes(_encode(_rows(0, 11), "csv"))
    with pytest.raises(SourceFileChangedError, match=r"a\.csv changed after it was logged"):
        source.read("files", 0, 10)
    os.remove(inbox / "a.csv")
    lenient = _source(str(inbox), "csv", on_changed_file="dead_letter")
    lenient.attach(store, job_prefix("changed"))
    t = lenient.read("files", 0, 10)
    assert t.num_rows == 10 and t.column("_error").null_count == 0
    assert "a.csv changed after it was logged" in t.column("_error")[0].as_py()
    assert "now: gone" in t.column("_error")[0].as_py()


def test_key_and_timestamp_conversions(tmp_path) -> None:
    """Integer keys become their decimal UTF-8 bytes; timestamps in s, us and
    zone-aware ISO-8601 strings become ms, floored; the file's mtime is _ingest_time."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    store = open_object_store(str(tmp_path / "store"))
    t = pa.table({"id": pa.array([7, 8], pa.int32()), "us": pa.array([1_500_999, -1], pa.int64()),
                  "amount": [1, 2]})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    _write(inbox, "a.parquet", buf.getvalue(), 1_000_000.25)
    src = FileSource(str(inbox), "parquet", SCHEMA, key_column="id", timestamp_column="us",
                     timestamp_unit="us")
    src.attach(store, job_prefix("conv"))
    src.end_offsets()
    got = src.read("files", 0, 2)
    assert got.column("key").to_pylist() == [b"7", b"8"]
    assert got.column("timestamp").to_pylist() == [1_500, -1]
    assert got.column("_ingest_time").to_pylist() == [1_000_000_250] * 2
    _write(inbox, "b.jsonl", b'{"k": "x", "t": "2024-01-01T00:00:00.0015+01:00", "amount": 3}\n',
           1_000_001)
    text = FileSource(str(inbox), "jsonl", SCHEMA, key_column="k", timestamp_column="t",
                      suffix=".jsonl")
    text.attach(store, job_prefix("conv2"))
    assert text.end_offsets() == {"files": 1}
    assert text.read("files", 0, 1).column("timestamp").to_pylist() == [1_704_063_600_001]


def test_s3_prefix_on_seaweedfs(s3_server, s3_store) -> None:
    """Two waves of Parquet files PUT under an S3 prefix (the job's store is the same
    bucket): the output equals the oracle and the log is in the job's prefix."""
    source = _source(s3_store, "parquet", prefix="landing/")
    runner = JobRunner(_job(source, name="s3files"), None, s3_store)
    written, results = [], []
    for wave in range(2):
        for j in range(2):
            df = _rows(len(written) * ROWS_PER_FILE, ROWS_PER_FILE)
            s3_store.put(f"landing/w{wave}-{j}.parquet", _encode(df, "parquet"))
            written.append(df)
        s3_store.put("landing/_incomplete.parquet", b"half a file")
        results += runner.run()
    everything = pd.concat(written, ignore_index=True)
    assert sum(r.events for r in results) == len(everything)
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(everything, results[-1].watermark))
    assert [f.name for f in source.logged_files()] == [f"landing/w{w}-{j}.parquet" for w in range(2) for j in range(2)]
    assert s3_store.list(source_prefix(job_prefix("s3files"), source.name))
    runner.close()


@settings(max_examples=20, deadline=None)
@given(waves=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=3), min_size=1, max_size=4),
       events_per_epoch=st.integers(10, 120), fmt=st.sampled_from(["parquet", "csv", "jsonl"]),
       slice_rows=st.integers(1, 50))
def test_any_waves_and_epoch_sizes_give_the_oracle(waves, events_per_epoch, fmt, slice_rows) -> None:
    """Property: files of any row counts (empty ones too) landing in any waves, read in
    epochs of any size, a new runner (restart) for every other wave: every row is read
    once, the output equals the oracle, and slices of the log read as its rows."""
    with tempfile.TemporaryDirectory() as tmp:
        inbox, root = os.path.join(tmp, "in"), os.path.join(tmp, "store")
        os.mkdir(inbox)
        written, results, runner = [], [], None
        for w, sizes in enumerate(waves):
            for n in sizes:
                df = _rows(sum(len(d) for d in written), n)
                _write(inbox, f"f{len(written):03d}.{fmt}", _encode(df, fmt), 1e9 + len(written))
                written.append(df)
            if runner is None or w % 2:
                if runner is not None:
                    runner.close()
                runner = JobRunner(_job(_source(inbox, fmt), events_per_epoch=events_per_epoch), None, root)
            results += runner.run()
        everything = pd.concat(written, ignore_index=True)
        assert sum(r.events for r in results) == len(everything)
        if results:
            pd.testing.assert_frame_equal(_sorted(_output(runner)),
                                          _oracle(everything, results[-1].watermark))
        source = runner.job.source
        cuts = sorted({0, len(everything), *range(0, len(everything), slice_rows)})
        keys = [k for a, b in itertools.pairwise(cuts) for k in source.read("files", a, b).column("key").to_pylist()]
        assert keys == [u.encode() for u in everything.user]
        runner.close()


def test_max_files_per_discovery_logs_the_oldest_first(tmp_path) -> None:
    """A backlog of 5 files with at most 2 per discovery: logged 2, 2, 1, oldest first."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    for i in range(5):
        _write(inbox, f"{i}.csv", _encode(_rows(i, 1), "csv"), 1e9 + 5 - i)
    source = _source(str(inbox), "csv", max_files_per_discovery=2)
    source.attach(open_object_store(str(tmp_path / "store")), job_prefix("backlog"))
    assert [[f.name for f in source.discover()] for _ in range(4)] == [
        ["4.csv", "3.csv"], ["2.csv", "1.csv"], ["0.csv"], []]


def test_csv_field_with_a_line_break_is_two_bad_lines_not_a_cut_value(tmp_path) -> None:
    """A quoted CSV field holding a line break: both of its lines are dead letters (the
    parser alone would keep the first half as a good row, silently cut); a naive
    timestamp column declared in value_schema is read as UTC and kept as a value."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.csv").write_bytes(b'user,ts,amount,note\nu1,2024-01-01T00:00:00,5,"two\nlines"\n'
                                  b'u2,2024-01-01T00:00:01,6,"one, quoted ""line"""\n')
    schema = pa.schema([("amount", pa.int64()), ("ts", pa.timestamp("ms")), ("note", pa.string())])
    source = FileSource(str(inbox), "csv", schema, key_column="user", timestamp_column="ts")
    source.attach(open_object_store(str(tmp_path / "store")), job_prefix("quotes"))
    assert source.end_offsets() == {"files": 3}
    t = source.read("files", 0, 3).to_pylist()
    assert [r["_raw_value"] for r in t[:2]] == [b'u1,2024-01-01T00:00:00,5,"two', b'lines"']
    assert all("a.csv line" in r["_error"] and "unbalanced quotes" in r["_error"] for r in t[:2])
    assert (t[2]["key"], t[2]["timestamp"], t[2]["note"], t[2]["_error"]) == (
        b"u2", 1_704_067_201_000, 'one, quoted "line"', None)


def test_two_discoverers_never_log_a_file_twice(tmp_path) -> None:
    """Two instances of the source (a driver and a sensor) discover on one log with
    compaction every 2 batches; one falls behind while the other logs and compacts
    over the batch it would write next. Every file is logged once, offsets dense, and
    every instance and a fresh one see the same log."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    store = open_object_store(str(tmp_path / "store"))
    a, b = (_source(str(inbox), "csv", compact_every=2) for _ in range(2))
    for s in (a, b):
        s.attach(store, job_prefix("race"))
    for i in range(9):
        # Each file older than the one before: a stale writer would log them in another
        # order than the log has them (the log's order is discovery, then mtime).
        _write(inbox, f"f{i}.csv", _encode(_rows(i, i + 1), "csv"), 1e9 - i)
        (a if i % 3 == 0 else b).discover()  # a falls behind b, which compacts
    a.discover()
    fresh = _source(str(inbox), "csv", compact_every=2)
    fresh.attach(store, job_prefix("race"))
    want = [f"f{i}.csv" for i in range(9)]
    for s in (a, b, fresh):
        s.end_offsets()
        files = s.logged_files()
        assert [f.name for f in files] == want
        assert [f.start for f in files] == [i * (i + 1) // 2 for i in range(9)]


def test_user_mistakes_are_refused_with_what_to_do(tmp_path) -> None:
    """A declared timestamp column that is neither a timestamp nor an integer with a
    unit, a reserved column name, an unknown format: a ValueError naming the fix."""
    inbox = str(tmp_path)
    with pytest.raises(ValueError, match="declare a pa.timestamp type, or an integer type and give timestamp_unit"):
        FileSource(inbox, "csv", pa.schema([("ts", pa.int64())]), key_column="k", timestamp_column="ts")
    with pytest.raises(ValueError, match="may not hold a column named 'key'"):
        FileSource(inbox, "csv", pa.schema([("key", pa.string())]), key_column="key", timestamp_column="ts")
    with pytest.raises(ValueError, match="format must be one of"):
        FileSource(inbox, "xml", SCHEMA, key_column="k", timestamp_column="ts")
    inside = FileSource(inbox, "csv", SCHEMA, key_column="k", timestamp_column="ts")
    with pytest.raises(ValueError, match="the job's files .* are under the watched location"):
        inside.attach(open_object_store(str(tmp_path / "store")), job_prefix("mine"))
    inside.attach(open_object_store(str(tmp_path / ".store")), job_prefix("mine"))  # hidden: fine
    with pytest.raises(RuntimeError, match=r"attach\(store, job_prefix\) was not called"):
        FileSource(inbox, "csv", SCHEMA, key_column="k", timestamp_column="ts").end_offsets()


def test_a_load_racing_a_compaction_and_a_stale_writer_reloads(tmp_path) -> None:
    """While a reader loads the log, a writer compacts over the batches it listed and a
    stale writer puts its own batch 2 (other files, other order) where the deleted one
    was. The reader must not take that batch: it sees the compaction and reloads."""
    from dkvstream.storage.objectstore.local import LocalObjectStore

    class HookedStore(LocalObjectStore):
        hook = None

        def get(self, key: str) -> bytes:
            data = super().get(key)
            if self.hook is not None and key.endswith("batch-0000000001.json"):
                hook, self.hook = self.hook, None
                hook()
            return data

    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    writer, stale, reader = (_source(str(inbox), "csv", compact_every=3) for _ in range(3))
    hooked = HookedStore(root)
    for s, store in ((writer, open_object_store(root)), (stale, open_object_store(root)),
                     (reader, hooked)):
        s.attach(store, job_prefix("race"))
    _write(inbox, "f0.csv", _encode(_rows(0, 1), "csv"), 1e9)
    writer.discover()
    stale.logged_files()  # its view: batch 1
    _write(inbox, "f1.csv", _encode(_rows(1, 2), "csv"), 1e9 + 10)
    writer.discover()  # batch 2

    def race():
        _write(inbox, "f2.csv", _encode(_rows(3, 3), "csv"), 1e9 + 5)  # older than f1
        writer.discover()  # batch 3, compacts: batches 1-3 deleted
        stale.discover()  # puts batch 2 = [f2, f1], sees compact 3, reloads

    hooked.hook = race
    assert [f.name for f in reader.logged_files()] == ["f0.csv", "f1.csv", "f2.csv"]
    assert [f.name for f in stale.logged_files()] == ["f0.csv", "f1.csv", "f2.csv"]


def _log_key(job: str, name: str) -> str:
    return f"{source_prefix(job_prefix(job), 'files')}log/{name}"


def _two_waves(inbox, root: str) -> list[pd.DataFrame]:
    """Two runs of a job ``files`` over two waves of two CSV files: batches 1 and 2 of
    the file log, the checkpoint past all four files."""
    written = []
    runner = JobRunner(_job(_source(str(inbox), "csv")), None, root)
    for _ in range(2):
        for _ in range(2):
            df = _rows(len(written) * ROWS_PER_FILE, ROWS_PER_FILE)
            _write(inbox, f"f{len(written)}.csv", _encode(df, "csv"), 1e9 + len(written))
            written.append(df)
        runner.run()
    assert runner.latest().source_offsets == {"files": 4 * ROWS_PER_FILE}
    runner.close()
    return written


@pytest.mark.parametrize("discovered_first", [False, True])
def test_lost_newest_log_object_after_files_moved_away_is_refused(tmp_path, discovered_first) -> None:
    """The newest file-log object is lost after the files it logged were moved away
    (processed), and new files land. Logged again under the lost ordinals, the new
    files' offsets would be below the checkpoint's and be skipped: the restart refuses,
    naming the lost object and what to do, before logging anything (or, if another
    discoverer (a sensor) logged them first, because the log no longer matches the
    checkpoint's record of it). Restoring the object as advised, the job goes on and
    the output equals the oracle over every file."""
    inbox, archive, root = tmp_path / "in", tmp_path / "archive", str(tmp_path / "store")
    inbox.mkdir()
    archive.mkdir()
    written = _two_waves(inbox, root)
    for i in range(4):  # processed: moved away, as the docs allow
        os.rename(inbox / f"f{i}.csv", archive / f"f{i}.csv")
    store = open_object_store(root)
    lost = _log_key("files", "batch-0000000002.json")
    saved = store.get(lost)
    store.delete(lost)
    for i in (4, 5):
        df = _rows(i * ROWS_PER_FILE, ROWS_PER_FILE)
        _write(inbox, f"f{i}.csv", _encode(df, "csv"), 1e9 + i)
        written.append(df)
    if discovered_first:
        sensor = _source(str(inbox), "csv")
        sensor.attach(store, job_prefix("files"))
        sensor.end_offsets()  # logs f4, f5 as files 2 and 3
    runner = JobRunner(_job(_source(str(inbox), "csv")), None, root)
    with pytest.raises(RecoveryRefusedError) as refused:
        runner.run()
    message = str(refused.value)
    assert "checkpoint of epoch 2" in message and "4 files" in message
    assert "Restore" in message and "from the start" in message
    if discovered_first:
        assert "does not hold the files" in message
        return
    assert store.uri(lost) in message
    assert not store.exists(lost)  # nothing logged over the lost ordinals
    store.put(lost, saved)  # the way out: restore the object
    results = runner.run()
    assert sum(r.events for r in results) == 2 * ROWS_PER_FILE
    everything = pd.concat(written, ignore_index=True)
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(everything, results[-1].watermark))
    runner.close()


def test_lost_newest_log_object_with_files_in_place_is_logged_again_and_checked(tmp_path) -> None:
    """The newest file-log object is lost, the files it logged still in place: the
    restart logs them again, finds them identical to what the checkpoint recorded, and
    goes on; nothing is read twice or skipped."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    written = _two_waves(inbox, root)
    store = open_object_store(root)
    store.delete(_log_key("files", "batch-0000000002.json"))
    df = _rows(4 * ROWS_PER_FILE, ROWS_PER_FILE)
    _write(inbox, "f4.csv", _encode(df, "csv"), 1e9 + 4)
    written.append(df)
    runner = JobRunner(_job(_source(str(inbox), "csv")), None, root)
    results = runner.run()
    assert sum(r.events for r in results) == ROWS_PER_FILE
    assert [f.name for f in runner.job.source.logged_files()] == [f"f{i}.csv" for i in range(5)]
    everything = pd.concat(written, ignore_index=True)
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(everything, results[-1].watermark))
    runner.close()


@pytest.mark.parametrize("damaged", ["batch-0000000001.json", "batch-0000000002.json"])
def test_truncated_log_object_is_named_with_the_way_out(tmp_path, damaged) -> None:
    """A truncated file-log object: loading the log raises a CorruptionError naming the
    object, the offset and what to do, not a bare JSONDecodeError. Following the advice
    for the newest object with the files in place (delete it), the job goes on exactly."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    written = _two_waves(inbox, root)
    store = open_object_store(root)
    key = _log_key("files", damaged)
    data = store.get(key)
    store.put(key, data[:len(data) // 2])
    source = _source(str(inbox), "csv")
    source.attach(store, job_prefix("files"))
    with pytest.raises(CorruptionError) as corrupt:
        source.logged_files()
    message = str(corrupt.value)
    assert message.startswith(store.uri(key))
    assert "file-log object is not valid JSON at offset" in message
    assert f"of {len(data) // 2} bytes (truncated?)" in message
    assert "Restore it" in message and "delete it and every file-log object numbered after it" in message
    runner = JobRunner(_job(_source(str(inbox), "csv")), None, root)
    with pytest.raises(CorruptionError, match=store.uri(key)):
        runner.run()
    runner.close()
    if damaged != "batch-0000000002.json":
        return
    store.delete(key)  # the files it logged are in place: logged again, checked
    _add_a_file_and_check_exactly_once(inbox, root, written).close()


def _add_a_file_and_check_exactly_once(inbox, root: str, written: list[pd.DataFrame]) -> JobRunner:
    """Writes a fifth file, restarts the job and checks that the restart read exactly that
    file and that the output equals the oracle of every file; returns the open runner."""
    df = _rows(4 * ROWS_PER_FILE, ROWS_PER_FILE)
    _write(inbox, "f4.csv", _encode(df, "csv"), 1e9 + 4)
    runner = JobRunner(_job(_source(str(inbox), "csv")), None, root)
    results = runner.run()
    assert sum(r.events for r in results) == ROWS_PER_FILE
    everything = pd.concat([*written, df], ignore_index=True)
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(everything, results[-1].watermark))
    return runner


def test_log_object_missing_in_the_middle_is_named_with_the_way_out(tmp_path) -> None:
    """A file-log object lost before the newest (batch 1 of 2): the load names the
    object after the gap and says what to do."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    _two_waves(inbox, root)
    store = open_object_store(root)
    store.delete(_log_key("files", "batch-0000000001.json"))
    source = _source(str(inbox), "csv")
    source.attach(store, job_prefix("files"))
    with pytest.raises(CorruptionError, match=r"batch-0000000002\.json: file-log object starts at "
                                              r"file 2, expected 0 \(a file-log object before it "
                                              r"is missing\)\. File source files cannot load its "
                                              r"file log\. Restore the missing object"):
        source.logged_files()


def test_checkpoint_without_source_state_still_opens(tmp_path) -> None:
    """A checkpoint written before checkpoints recorded the source's state (no
    ``source_state``): the restart opens it, checks nothing and goes on exactly."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    written = _two_waves(inbox, root)
    store = open_object_store(root)
    key = checkpoint_key(job_prefix("files"), 2)
    body = json.loads(store.get(key))["body"]
    assert body.pop("source_state") is not None
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    store.put(key, json.dumps({"crc32c": crc32c.crc32c(canon), "body": body}).encode())
    runner = _add_a_file_and_check_exactly_once(inbox, root, written)
    assert runner.latest().source_state["files"] == 5  # recorded again from then on
    runner.close()


def test_union_records_and_checks_each_file_source(tmp_path) -> None:
    """A ``UnionSource`` of two file sources records each child's log in its checkpoint
    state under the child's name and checks each on restore: the child whose newest log
    object was lost (its files moved away) refuses, naming its log; state None (an old
    checkpoint) checks nothing."""
    from dkvstream.operators.io.union import UnionSource

    store = open_object_store(str(tmp_path / "store"))
    inboxes = {n: tmp_path / n for n in ("a", "b")}
    for inbox in inboxes.values():
        inbox.mkdir()

    def union() -> UnionSource:
        u = UnionSource([_source(str(inboxes[n]), "csv", name=n) for n in inboxes])
        u.attach(store, job_prefix("u"))
        return u

    first = union()
    for i in range(2):
        for n, inbox in inboxes.items():
            _write(inbox, f"{n}{i}.csv", _encode(_rows(i * 10, 10), "csv"), 1e9 + i)
        offsets = first.end_offsets()
    assert offsets == {"a/files": 20, "b/files": 20}
    state = first.snapshot_state(offsets)
    assert {n: s["files"] for n, s in state.items()} == {"a": 2, "b": 2}
    union().restore_state(offsets, state)  # the logs as recorded: fine
    for i in range(2):
        os.remove(inboxes["b"] / f"b{i}.csv")
    b_log = f"{source_prefix(job_prefix('u'), 'b')}log/"
    store.delete(f"{b_log}batch-0000000002.json")
    with pytest.raises(RecoveryRefusedError,
                       match=f"file source b: the file log under {store.uri(b_log)}"):
        union().restore_state(offsets, state)
    union().restore_state(offsets, None)


@settings(max_examples=25, deadline=None)
@given(waves=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=6),
       compact_every=st.integers(1, 4), committed=st.floats(0, 1), lost=st.integers(0, 8),
       moved=st.sets(st.integers(0, 20)), landed=st.integers(0, 2))
def test_restore_never_maps_committed_offsets_to_other_files(waves, compact_every, committed, lost,
                                                            moved, landed) -> None:
    """Property: files land in waves (one discovery each, files of a wave newer than
    the one before), a checkpoint commits some offset, then the newest ``lost`` file-log
    objects are lost, some files are moved away and new ones land. The restore either
    refuses, or the log's first ``files`` entries, all that the committed offsets
    cover, are exactly those the checkpoint saw; with no file moved away it never
    refuses."""
    with tempfile.TemporaryDirectory() as tmp:
        inbox = os.path.join(tmp, "in")
        os.mkdir(inbox)
        store = open_object_store(os.path.join(tmp, "store"))
        first = _source(inbox, "csv", compact_every=compact_every)
        first.attach(store, job_prefix("p"))
        names = []
        for w, sizes in enumerate(waves):
            for j, rows in enumerate(sizes):
                names.append(f"w{w}-{j}.csv")
                _write(inbox, names[-1], _encode(_rows(0, rows), "csv"), 1e9 + 10 * w + j)
            end = first.end_offsets()["files"]
        offsets = {"files": int(committed * end)}
        state = first.snapshot_state(offsets)
        seen = first.logged_files()
        log = f"{source_prefix(job_prefix('p'), 'files')}log/"
        for key in sorted(store.list(log), key=lambda k: k.rsplit("-", 1)[1])[::-1][:lost]:
            store.delete(key)
        gone = [n for i, n in enumerate(names) if i in moved]
        for n in gone:
            os.remove(os.path.join(inbox, n))
        for i in range(landed):
            _write(inbox, f"new{i}.csv", _encode(_rows(0, 3), "csv"), 2e9 + i)
        again = _source(inbox, "csv", compact_every=compact_every)
        again.attach(store, job_prefix("p"))
        try:
            again.restore_state(offsets, state)
        except RecoveryRefusedError:
            assert gone, "refused though every file is in place"
            return
        assert again.logged_files()[:state["files"]] == seen[:state["files"]]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_discovery_reads_no_file_in_the_driver(tmp_path, fmt, monkeypatch) -> None:
    """``end_offsets`` (the driver's discovery) lists the location and reads the file
    log; each new file's bytes (its row count and CRC-32) are read in a task
    (``use_tasks``), never in the driver."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    for i in range(3):
        _write(inbox, f"{i}.{fmt}", _encode(_rows(i * ROWS_PER_FILE, ROWS_PER_FILE), fmt), 1e9 + i)
    source = _source(str(inbox), fmt)
    source.attach(open_object_store(str(tmp_path / "store")), "jobs/files")
    in_task, driver_reads = [False], []

    def map_in_tasks(fn, items):
        in_task[0] = True
        try:
            return [fn(item) for item in items]
        finally:
            in_task[0] = False

    for name in ("get", "get_range"):
        real = getattr(source.store, name)

        def watched(key, *args, _real=real, _name=name):
            if not in_task[0]:
                driver_reads.append((_name, key))
            return _real(key, *args)
        monkeypatch.setattr(source.store, name, watched)
    source.use_tasks(map_in_tasks)
    assert source.end_offsets() == {"files": 3 * ROWS_PER_FILE}
    assert driver_reads == []
    assert [f.rows for f in source.logged_files()] == [ROWS_PER_FILE] * 3
    assert source.read("files", 0, 3 * ROWS_PER_FILE)["amount"].to_pylist() == \
        _rows(0, 3 * ROWS_PER_FILE)["amount"].tolist()


def test_discovery_in_spark_tasks_matches_the_oracle(spark, tmp_path) -> None:
    """The job on Spark: new files are surveyed in Spark tasks (the source pickles
    without the driver's task runner)."""
    inbox, root = tmp_path / "in", str(tmp_path / "store")
    inbox.mkdir()
    written = []
    for i in range(3):
        written.append(_rows(i * ROWS_PER_FILE, ROWS_PER_FILE))
        _write(inbox, f"{i}.csv", _encode(written[-1], "csv"), 1e9 + i)
    runner = JobRunner(_job(_source(str(inbox), "csv")), spark, root)
    results = runner.run()
    everything = pd.concat(written, ignore_index=True)
    assert sum(r.events for r in results) == len(everything)
    pd.testing.assert_frame_equal(_sorted(_output(runner)), _oracle(everything, results[-1].watermark))
    runner.close()
