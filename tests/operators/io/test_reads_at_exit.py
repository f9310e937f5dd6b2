"""A script that reads a job's output and exits at once must exit 0.

pyarrow's Parquet and dataset readers finish some work on Arrow's worker threads after
the read has returned; if that work drops the last reference to a buffer Python owns
(bytes handed to pyarrow as ``io.BytesIO``), the worker takes the GIL while the
interpreter exits and the process aborts: ``terminate called without an active
exception``, exit status 134, after the script printed its results
(``dkvstream.operators.io.arrow_input``). The readers here give pyarrow copies in Arrow's memory.

The same holds for deltalake's Python filesystem, which table-sink reads of a local
table replace with Arrow's own (``dkvstream.operators.io.table_reader.delta_dataset``). The fast
tests check these properties on each read path; the slow one runs a read-only script
200 times (2-12% of the runs aborted before).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pa_fs
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from dkvstream.examples.keyed_count import WINDOW_MS, KeyedWindowCount
from dkvstream.operators.api.job import Job
from dkvstream.operators.io.arrow_input import arrow_input
from dkvstream.operators.io.files import FileSource
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from tests.ci_env import scaled
from tests.operators.io.test_table_sink import as_model, model_after, random_changes, run_drained

ROOT = Path(__file__).resolve().parents[3]
# 40 rows five minutes apart: the first hourly windows close, the last stays open.
ROWS = pd.DataFrame({"user": [f"u{i % 5}" for i in range(40)],
                     "ts": [1_700_000_000_000 + i * 300_000 for i in range(40)],
                     "amount": [i % 7 for i in range(40)]})


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf)
    return buf.getvalue()


def test_arrow_input_reads_a_copy_in_arrow_memory() -> None:
    """The reader's bytes are not the caller's: Arrow's pool holds a copy (so releasing
    it needs no interpreter), and changing the caller's buffer afterwards changes
    nothing read."""
    data = bytearray(_parquet(ROWS))
    before = pa.total_allocated_bytes()
    source = arrow_input(data)
    assert pa.total_allocated_bytes() - before >= len(data)
    data[:] = b"\0" * len(data)
    pd.testing.assert_frame_equal(pq.read_table(source).to_pandas(), ROWS)


@pytest.fixture
def arrow_sources(monkeypatch) -> list:
    """Every source the pyarrow readers the project calls are given, recorded."""
    seen: list = []

    def spy(real):
        def call(source, *args, **kwargs):
            seen.append(source)
            return real(source, *args, **kwargs)
        return call

    for module, name in [(pq, "read_table"), (pq, "ParquetFile"), (pa_csv, "read_csv"),
                         (pa_json, "read_json")]:
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    return seen


def _run_file_job(tmp_path: Path, fmt: str) -> tuple[JobRunner, pd.DataFrame]:
    """Runs a file-source job over ``ROWS`` in ``fmt`` plus one bad record (a dead
    letter); returns the closed runner and the oracle of its ``main`` output."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    if fmt == "parquet":
        (inbox / "a.parquet").write_bytes(_parquet(ROWS))
        (inbox / "b.parquet").write_bytes(b"not parquet")  # one offset, one dead letter
    elif fmt == "csv":
        (inbox / "a.csv").write_text(ROWS.to_csv(index=False) + "u1,bad,3\n")
    else:
        (inbox / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS.to_dict("records"))
                                       + '{"user": "u1", "ts": "bad", "amount": 3}\n')
    source = FileSource(str(inbox), fmt, pa.schema([("amount", pa.int64())]), key_column="user",
                        timestamp_column="ts", timestamp_unit="ms")
    op = KeyedWindowCount()
    job = Job(name="exit", source=source, operators=[op],
              sinks={n: ParquetSink(n, s) for n, s in op.outputs.items()}, key_groups=4,
              events_per_epoch=25, max_out_of_orderness_ms=0)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    runner.close()
    df = ROWS.assign(window_start=ROWS.ts - ROWS.ts % WINDOW_MS)
    closed = df[df.window_start + WINDOW_MS <= ROWS.ts.max()]
    oracle = closed.groupby(["user", "window_start"], as_index=False).agg(
        count=("amount", "size"), amount=("amount", "sum")).rename(columns={"user": "key"})
    return runner, oracle


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df[["key", "window_start", "count", "amount"]].sort_values(["key", "window_start"]).reset_index(
        drop=True).astype({"count": "int64", "amount": "int64"})


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_job_reads_give_pyarrow_no_python_owned_bytes(tmp_path, arrow_sources, fmt) -> None:
    """A file-source job (landed files decoded, a bad record) and the reads of its sink
    and dead-letter table hand pyarrow only ``arrow_input`` readers, and the reads
    return what the job wrote: the closed windows of a pandas oracle, one dead letter."""
    runner, oracle = _run_file_job(tmp_path, fmt)
    job = runner.job
    out = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    dead = job.dead_letter.sink.read(runner.store, job.prefix)
    pd.testing.assert_frame_equal(_sorted(out), _sorted(oracle))
    assert dead.num_rows == 1
    assert arrow_sources, "no pyarrow reader was called"
    assert all(isinstance(s, pa.BufferReader) for s in arrow_sources), \
        [type(s).__name__ for s in arrow_sources]


def test_table_sink_reads_scan_local_tables_with_arrows_filesystem(tmp_path, monkeypatch) -> None:
    """``read``, ``scan``, ``lookup`` and ``dataset`` of a table sink in a local store
    scan through Arrow's own filesystem (deltalake's default is a Python one), and
    return the dict model's rows."""
    filesystems: list = []
    real = DeltaTable.to_pyarrow_dataset

    def spy(self, *args, **kwargs):
        filesystems.append(kwargs.get("filesystem"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", spy)
    rows = random_changes(120, 20, seed=3)
    job, sink, runner = run_drained(rows, tmp_path)
    model = model_after(rows)
    assert as_model(sink.read(runner.store, job.prefix)) == model
    assert as_model(sink.scan(runner.store, job.prefix)) == model
    assert as_model(sink.dataset(runner.store, job.prefix).to_table()) == model
    keys = pa.table({"id": list(model), "day": [v[0] for v in model.values()]})
    assert as_model(sink.lookup(runner.store, job.prefix, keys)) == model
    runner.close()
    assert len(filesystems) >= 4
    assert all(isinstance(fs, pa_fs.SubTreeFileSystem) for fs in filesystems), filesystems


READ_AND_EXIT = """
import pyarrow.parquet as pq
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.io.dead_letter import DeadLetter
from dkvstream.storage.objectstore import open_object_store
from tests.operators.io.test_table_sink import make_job
store = open_object_store({root!r})
print(ParquetSink("main").read(store, "jobs/exit").num_rows,
      DeadLetter().sink.read(store, "jobs/exit").num_rows,
      pq.read_table({sink!r}).num_rows,
      make_job([])[1].read(store, "jobs/tbl").num_rows)
"""


@pytest.mark.slow("200 Python processes that read jobs' output: 100 s on 2 quiet cores, 10 min loaded")
def test_a_read_only_script_exits_cleanly_200_times(tmp_path) -> None:
    """Jobs' output read with ``ParquetSink.read``, the dead-letter table,
    ``pq.read_table`` and ``TableSink.read`` by a script that exits right after
    printing: 200 runs at full size (two at a time; ``tests.ci_env.long_run_scale``),
    every one exits 0 and prints the row counts (none aborts with status 134)."""
    runner, oracle = _run_file_job(tmp_path, "parquet")
    root = str(tmp_path / "store")
    rows = random_changes(120, 20, seed=3)
    run_drained(rows, root)[2].close()
    script = tmp_path / "read_and_exit.py"
    script.write_text(READ_AND_EXIT.format(root=root, sink=f"{root}/jobs/exit/sinks/main"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(_: int) -> tuple[int, str, str]:
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                           cwd=str(tmp_path), timeout=120)
        return p.returncode, p.stdout, p.stderr

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(run, range(scaled(200))))
    failed = [(rc, err[-300:]) for rc, _, err in runs if rc != 0]
    assert failed == [], f"{len(failed)} of {len(runs)} runs failed: {failed[:3]}"
    assert {out for _, out, _ in runs} == {f"{len(oracle)} 1 {len(oracle)} {len(model_after(rows))}\n"}
