"""Delta Lake (delta-rs) against Apache Iceberg (pyiceberg) on the upsert-table workload.

Issue 10's workload: a keyed table receiving, per epoch, one atomic commit of upserts
(MERGE by primary key) and deletes, read by point lookups, projected and filtered scans
and time travel to an earlier version. Both libraries run in this process on a local
directory (Iceberg: pyiceberg's SQL catalog on SQLite, a ``file://`` warehouse).

    .venv/bin/python bench/table_formats.py                      # 50 epochs x 1,000 rows, 10k keys
    .venv/bin/python bench/table_formats.py --epochs 10 --keys 2000 --rows 200   # quick

Each format is checked against a dict model (final table and the table as of the middle
epoch) before its times count. Prints one Markdown table; ratios = each Iceberg variant / Delta.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from bench.plot import load_average

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("bucket", pa.int32()),
                    pa.field("value", pa.float64()), pa.field("epoch", pa.int64()),
                    pa.field("note", pa.string())])
BUCKETS = 8


def epoch_batches(epochs: int, keys: int, rows: int, seed: int = 7):
    """Yields ``(upserts, delete_ids)`` per epoch: ``rows`` distinct random keys
    upserted, and 1 % of ``rows`` (at least one) other keys deleted."""
    rng = np.random.default_rng(seed)
    for e in range(epochs):
        ids = rng.choice(keys, size=rows + max(1, rows // 100), replace=False)
        up, dels = np.sort(ids[:rows]), np.sort(ids[rows:])
        yield pa.table({"id": up, "bucket": (up % BUCKETS).astype(np.int32),
                        "value": rng.random(rows), "epoch": np.full(rows, e, np.int64),
                        "note": [f"n{i % 97}" for i in up]}, schema=SCHEMA), dels


def model_states(epochs: int, keys: int, rows: int) -> list[dict[int, tuple]]:
    """Table contents after each epoch: ``{id: (value, epoch)}``."""
    state: dict[int, tuple] = {}
    out = []
    for up, dels in epoch_batches(epochs, keys, rows):
        for i, v, e in zip(up["id"].to_pylist(), up["value"].to_pylist(), up["epoch"].to_pylist()):
            state[i] = (v, e)
        for i in dels.tolist():
            state.pop(int(i), None)
        out.append(dict(state))
    return out


def as_model(t: pa.Table) -> dict[int, tuple]:
    return {i: (v, e) for i, v, e in zip(t["id"].to_pylist(), t["value"].to_pylist(), t["epoch"].to_pylist())}


def files_under(path: str, suffix: str = ".parquet") -> int:
    return sum(1 for _, _, fs in os.walk(path) for f in fs if f.endswith(suffix))


# ---------------------------------------------------------------------- Delta Lake
def run_delta(root: str, epochs: int, keys: int, rows: int, lookups: int) -> dict:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    uri = os.path.join(root, "delta")
    write_deltalake(uri, SCHEMA.empty_table(), partition_by=["bucket"])
    commit_s, versions = [], []
    for e, (up, dels) in enumerate(epoch_batches(epochs, keys, rows), start=1):
        t0 = time.perf_counter()
        dt = DeltaTable(uri)
        if dt.transaction_version("bench") is not None and dt.transaction_version("bench") >= e:
            continue  # exactly-once skip: this is what the sink does on a replayed epoch
        # Deletes ride in the same MERGE: one commit per epoch, as the sink needs.
        changes = pa.concat_tables([
            up.append_column("_op", pa.array(["upsert"] * up.num_rows)),
            pa.table({"id": pa.array(dels, pa.int64()), "bucket": pa.array((dels % BUCKETS).astype(np.int32)),
                      "value": pa.nulls(len(dels), pa.float64()), "epoch": pa.nulls(len(dels), pa.int64()),
                      "note": pa.nulls(len(dels), pa.string()), "_op": pa.array(["delete"] * len(dels))},
                     schema=SCHEMA.append(pa.field("_op", pa.string())))])
        (dt.merge(changes, predicate="t.bucket = s.bucket AND t.id = s.id", source_alias="s", target_alias="t",
                  commit_properties=CommitProperties(app_transactions=[Transaction("bench", e)],
                                                     custom_metadata={"epoch": str(e)}))
           .when_matched_delete(predicate="s._op = 'delete'")
           .when_matched_update(updates={c: f"s.{c}" for c in SCHEMA.names}, predicate="s._op = 'upsert'")
           .when_not_matched_insert(updates={c: f"s.{c}" for c in SCHEMA.names}, predicate="s._op = 'upsert'")
           .execute())
        commit_s.append(time.perf_counter() - t0)
        versions.append(DeltaTable(uri).version())
    dt = DeltaTable(uri)
    files = files_under(uri)
    live = len(dt.file_uris())
    rng = np.random.default_rng(1)
    probe = rng.integers(0, keys, lookups)
    t0 = time.perf_counter()
    for k in probe.tolist():
        ds = dt.to_pyarrow_dataset()
        ds.to_table(filter=(pc.field("bucket") == k % BUCKETS) & (pc.field("id") == k), columns=["id", "value"])
    lookup_s = (time.perf_counter() - t0) / lookups
    t0 = time.perf_counter()
    scan = dt.to_pyarrow_dataset().to_table(columns=["id", "value"], filter=pc.field("value") > 0.5)
    scan_s = time.perf_counter() - t0
    full = dt.to_pyarrow_dataset().to_table()
    mid = epochs // 2
    t0 = time.perf_counter()
    old = DeltaTable(uri, version=versions[mid - 1]).to_pyarrow_dataset().to_table()
    travel_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dt.optimize.compact()
    compact_s = time.perf_counter() - t0
    return {"commit_s": commit_s, "lookup_s": lookup_s, "scan_s": scan_s, "scan_rows": scan.num_rows,
            "travel_s": travel_s, "files": files, "live": live, "final": as_model(full), "mid": as_model(old),
            "compact_s": compact_s, "files_after_compact": len(DeltaTable(uri).file_uris())}


# ------------------------------------------------------------------------- Iceberg
def run_iceberg(root: str, epochs: int, keys: int, rows: int, lookups: int, upsert: bool = True) -> dict:
    """``upsert``: pyiceberg's ``Transaction.upsert`` (a join on the key); otherwise the
    epoch is a delete of every changed key (``In`` filter) plus an append, which is what
    a sink would do without ``upsert``. Both in one transaction (one catalog commit)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import And, EqualTo, GreaterThan, In
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

    wh = os.path.join(root, "iceberg")
    os.makedirs(wh)
    cat = SqlCatalog("bench", uri=f"sqlite:///{wh}/catalog.db", warehouse=f"file://{wh}")
    cat.create_namespace("ns")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "bucket", IntegerType()),
                    NestedField(3, "value", DoubleType()), NestedField(4, "epoch", LongType()),
                    NestedField(5, "note", StringType()), identifier_field_ids=[1])
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(BUCKETS), "id_bucket"))
    tbl = cat.create_table("ns.t", schema=schema, partition_spec=spec)
    commit_s, snapshots = [], []
    for e, (up, dels) in enumerate(epoch_batches(epochs, keys, rows), start=1):
        t0 = time.perf_counter()
        tbl = cat.load_table("ns.t")
        snap = tbl.current_snapshot()
        if snap is not None and int(snap.summary.additional_properties.get("dkv.epoch", 0)) >= e:
            continue
        # One transaction = one catalog commit: the deletes and the upsert land together.
        props = {"dkv.epoch": str(e)}
        with tbl.transaction() as tx:
            if upsert:
                if len(dels):
                    tx.delete(In("id", [int(d) for d in dels]), snapshot_properties=props)
                tx.upsert(up.cast(tbl.schema().as_arrow()), join_cols=["id"], snapshot_properties=props)
            else:
                changed = [int(i) for i in up["id"].to_pylist()] + [int(d) for d in dels]
                tx.delete(In("id", changed), snapshot_properties=props)
                tx.append(up.cast(tbl.schema().as_arrow()), snapshot_properties=props)
        commit_s.append(time.perf_counter() - t0)
        snapshots.append(cat.load_table("ns.t").current_snapshot().snapshot_id)
    tbl = cat.load_table("ns.t")
    files = files_under(wh)
    live = len(tbl.inspect.files())
    rng = np.random.default_rng(1)
    probe = rng.integers(0, keys, lookups)
    t0 = time.perf_counter()
    for k in probe.tolist():
        tbl.scan(row_filter=EqualTo("id", k), selected_fields=("id", "value")).to_arrow()
    lookup_s = (time.perf_counter() - t0) / lookups
    t0 = time.perf_counter()
    scan = tbl.scan(row_filter=GreaterThan("value", 0.5), selected_fields=("id", "value")).to_arrow()
    scan_s = time.perf_counter() - t0
    full = tbl.scan().to_arrow()
    mid = epochs // 2
    t0 = time.perf_counter()
    old = tbl.scan(snapshot_id=snapshots[mid - 1]).to_arrow()
    travel_s = time.perf_counter() - t0
    del And
    return {"commit_s": commit_s, "lookup_s": lookup_s, "scan_s": scan_s, "scan_rows": scan.num_rows,
            "travel_s": travel_s, "files": files, "live": live, "final": as_model(full), "mid": as_model(old),
            "compact_s": None, "files_after_compact": None}


def _opt(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=1_000)
    ap.add_argument("--lookups", type=int, default=50)
    ap.add_argument("--formats", default="delta,iceberg,iceberg-delete-append")
    ap.add_argument("--plot", metavar="PATH", help="write commit, lookup and scan times as a PNG")
    args = ap.parse_args(argv)
    load_before = load_average()
    warnings.filterwarnings("ignore", message="Delete operation did not match any records")
    states = model_states(args.epochs, args.keys, args.rows)
    results = {}
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory() as root:
            run = {"delta": run_delta, "iceberg": run_iceberg,
                   "iceberg-delete-append": lambda *a: run_iceberg(*a, upsert=False)}[fmt]
            r = run(root, args.epochs, args.keys, args.rows, args.lookups)
        ok = r["final"] == states[-1] and r["mid"] == states[args.epochs // 2 - 1]
        if not ok:
            print(f"{fmt}: result differs from the dict model", file=sys.stderr)
            return 1
        results[fmt] = r
    print(f"{args.epochs} epochs x {args.rows:,} upserts (+1 % deletes) into {args.keys:,} keys, "
          f"{BUCKETS} hash buckets; checked against a dict model "
          f"(final and as of epoch {args.epochs // 2})")
    load = f"{load_before} before, {load_average()} after"
    print(f"wall clock (time.perf_counter), one process; load average (1 / 5 / 15 min) {load}; "
          f"{os.cpu_count()} cores, shared\n")
    print("| format | commit s/epoch (median) | commit s (first / last) | point lookup ms | scan ms "
          "(projection + predicate) | time travel ms | Parquet files on disk | live files | compact s "
          "| live files after compact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fmt, r in results.items():
        c = r["commit_s"]
        print(f"| {fmt} | {statistics.median(c):.3f} | {c[0]:.3f} / {c[-1]:.3f} | {r['lookup_s'] * 1e3:.1f} | "
              f"{r['scan_s'] * 1e3:.1f} | {r['travel_s'] * 1e3:.1f} | {r['files']} | {r['live']} | "
              f"{_opt(r['compact_s'], '.3f')} | {_opt(r['files_after_compact'], 'd')} |")
    d = results.get("delta")
    for name, i in results.items():
        if d is None or name == "delta":
            continue
        print(f"\n{name} / delta: commit {statistics.median(i['commit_s']) / statistics.median(d['commit_s']):.2f}x, "
              f"lookup {i['lookup_s'] / d['lookup_s']:.2f}x, scan {i['scan_s'] / d['scan_s']:.2f}x, "
              f"live files {i['live'] / d['live']:.2f}x")
    if args.plot:
        from bench.plot import bar_panels

        names = list(results)
        bar_panels(args.plot, f"Upsert table: {args.epochs} epochs x {args.rows:,} upserts, "
                              f"{args.keys:,} keys", [
            {"title": "commit, s per epoch (median)", "labels": names, "fmt": "{:.3f}",
             "xlabel": "s", "values": [statistics.median(r["commit_s"]) for r in results.values()]},
            {"title": "point lookup", "labels": names, "fmt": "{:.1f}", "xlabel": "ms",
             "values": [r["lookup_s"] * 1e3 for r in results.values()]},
            {"title": "scan (projection + predicate)", "labels": names, "fmt": "{:.1f}",
             "xlabel": "ms", "values": [r["scan_s"] * 1e3 for r in results.values()]}],
            caption=f"Wall clock; lower is better. Load average {load}; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
