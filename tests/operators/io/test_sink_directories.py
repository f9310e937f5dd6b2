"""Every sink that is a directory of files reads by its directory with pyarrow, DuckDB and
Spark, as docs/sources-and-sinks.md shows: a ``ParquetSink`` table, the dead-letter table
(``dkvstream.operators.io.dead_letter.DeadLetterSink``) and a Delta ``TableSink``.

Oracles: the pandas window counts of the good input rows, the injected bad rows with
the epoch whose committed offsets first cover them, and the Delta table's dict model.
"""
from __future__ import annotations

import io

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from dkvstream.operators.io.dead_letter import DEAD_LETTER_SCHEMA, DeadLetterSink, stage
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore import open_object_store
from tests.operators.io.test_dead_letter import BAD, BadInputSource, _job, _oracle
from tests.operators.io.test_table_sink import as_model, model_after, random_changes, run_drained


def by_pyarrow(directory: str) -> pd.DataFrame:
    return pq.read_table(directory).to_pandas()


def by_duckdb(directory: str) -> pd.DataFrame:
    return duckdb.sql(f"SELECT * FROM read_parquet('{directory}/*/*.parquet', hive_partitioning = true, "
                      f"hive_types = {{'epoch': BIGINT}})").df()


def by_spark(spark, directory: str) -> pd.DataFrame:
    return spark.read.parquet(directory).toPandas()


def _normal(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``columns`` of ``df``, the epoch as int64 (pyarrow reads it as a dictionary of
    int32, Spark as int), rows sorted."""
    df = df[columns].copy()
    df["epoch"] = df["epoch"].astype("int64")
    return df.sort_values(columns).reset_index(drop=True)


@pytest.fixture(scope="module")
def dead_letter_run(tmp_path_factory):
    """The dead-letter job run to its end: ``(runner, results, store directory)``."""
    root = str(tmp_path_factory.mktemp("dl") / "store")
    runner = JobRunner(_job(events_per_epoch=120), None, root)
    results = runner.run()
    yield runner, results, root
    runner.close()


def _epoch_of(results, partition: str, offset: int) -> int:
    """The first committed epoch whose source offset of ``partition`` is past ``offset``."""
    return next(r.epoch for r in results if r.source_offsets[partition] > offset)


@pytest.mark.parametrize("reader", ["pyarrow", "duckdb", "spark"])
def test_parquet_and_dead_letter_tables_read_by_directory(dead_letter_run, reader, request) -> None:
    runner, results, root = dead_letter_run
    job = runner.job
    read = {"pyarrow": by_pyarrow, "duckdb": by_duckdb,
            "spark": lambda d: by_spark(request.getfixturevalue("spark"), d)}[reader]
    # The window counts: every row of the pandas oracle, each with the epoch of its file.
    counts = read(f"{root}/{job.prefix}/sinks/counts")
    columns = ["group", "window_start", "count", "amount"]
    got = counts[columns].astype({"window_start": "int64", "count": "int64", "amount": "int64"})
    assert got.sort_values(columns).reset_index(drop=True).equals(
        _oracle(BadInputSource())[columns].sort_values(columns).reset_index(drop=True))
    published = pd.concat([pq.read_table(f"{root}/{k}").to_pandas().assign(epoch=int(k.split("epoch=")[1][:8]))
                           for k in runner.store.list(f"{job.prefix}/sinks/counts/")])
    assert _normal(counts, [*columns, "epoch"]).equals(_normal(published, [*columns, "epoch"]))
    # The dead letters: each injected bad row once, with its reason and epoch.
    dead = read(f"{root}/{job.prefix}/sinks/dead_letter")
    assert sorted(dead.columns) == sorted(DEAD_LETTER_SCHEMA.names)
    oracle = pd.DataFrame([{"partition": p, "offset": o, "reason": reason, "epoch": _epoch_of(results, p, o)}
                           for (p, o), reason in BAD.items()])
    columns = ["partition", "offset", "reason", "epoch"]
    assert _normal(dead, columns).equals(_normal(oracle, columns))
    assert len({e for e in oracle["epoch"]}) >= 2  # rows of several epochs' directories


@pytest.mark.parametrize("reader", ["pyarrow", "duckdb", "spark"])
def test_delta_table_read_by_directory(tmp_path, reader, request) -> None:
    """A Delta table is read through its log (a plain Parquet read of the directory would
    also see the files its MERGEs replaced): ``deltalake.DeltaTable(directory)`` for
    pyarrow and DuckDB, ``TableSink.to_spark`` for Spark."""
    rows = random_changes(160, keys=25, seed=11)
    job, sink, runner = run_drained(rows, tmp_path)
    directory = f"{tmp_path}/{job.prefix}/sinks/items"
    if reader == "pyarrow":
        got = DeltaTable(directory).to_pyarrow_table()
    elif reader == "duckdb":
        con = duckdb.connect()
        con.register("items", DeltaTable(directory).to_pyarrow_dataset())
        got = con.sql("SELECT * FROM items").to_arrow_table()
    else:
        got = sink.to_spark(request.getfixturevalue("spark"), runner.store, job.prefix).toArrow()
    assert as_model(got) == model_after(rows)


def test_dead_letter_files_of_both_forms_read_back(tmp_path) -> None:
    """Files written with an ``epoch`` column (as dead-letter tables used to be) next to
    files without one: ``DeadLetterSink.read`` and pyarrow with an int64 hive ``epoch``
    (docs/sources-and-sinks.md) read both, every row with its directory's epoch."""
    root = str(tmp_path / "store")
    store = open_object_store(root)
    sink = DeadLetterSink("dead_letter")

    def rows(epoch: int, n: int) -> pa.Table:
        return pa.Table.from_pylist([
            {"source": "s", "partition": "p0", "offset": 10 * epoch + i, "key": b"k", "timestamp": 5,
             "value": b"{}", "reason": "missing_key", "error": None, "epoch": epoch} for i in range(n)],
            schema=DEAD_LETTER_SCHEMA)

    old = io.BytesIO()
    pq.write_table(rows(1, 2), old)
    store.put(f"jobs/j/sinks/dead_letter/epoch={1:08d}/part-source.parquet", old.getvalue())
    staged, _ = stage(store, "jobs/j", 2, rows(2, 3), "a1")
    assert pq.read_table(io.BytesIO(store.get(staged))).column_names == [
        n for n in DEAD_LETTER_SCHEMA.names if n != "epoch"]
    sink.publish(store, "jobs/j", 2, [staged])
    want = [(10, 1), (11, 1), (20, 2), (21, 2), (22, 2)]
    got = sink.read(store, "jobs/j")
    assert got.schema == DEAD_LETTER_SCHEMA
    assert sorted(zip(got["offset"].to_pylist(), got["epoch"].to_pylist())) == want
    both = pq.read_table(f"{root}/jobs/j/sinks/dead_letter",
                         partitioning=ds.partitioning(pa.schema([("epoch", pa.int64())]), flavor="hive"))
    assert sorted(zip(both["offset"].to_pylist(), both["epoch"].to_pylist())) == want
    with pytest.raises(ValueError, match="dead-letter rows of epochs \\[1\\] staged for epoch 2"):
        stage(store, "jobs/j", 2, rows(1, 1), "a2")
    assert sink.read(store, "jobs/none").schema == DEAD_LETTER_SCHEMA


def test_parquet_sink_refuses_an_epoch_column(tmp_path) -> None:
    """A column named like the ``epoch=`` directories would make the table unreadable
    by pyarrow by its directory: refused, naming the table."""
    with pytest.raises(ValueError, match="ParquetSink 'out': the output has a column 'epoch'.*rename"):
        ParquetSink("out", pa.schema([("key", pa.string()), ("epoch", pa.int64())]))
    store = open_object_store(str(tmp_path / "store"))
    with pytest.raises(ValueError, match="ParquetSink 'out': the output has a column 'epoch'"):
        ParquetSink("out").write_staged(store, "jobs/j/staging/x", pa.table({"epoch": [1]}))
