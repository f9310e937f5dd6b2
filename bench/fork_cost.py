"""What a zero-copy fork costs, against a full copy of the same state.

Usage: ``.venv/bin/python bench/fork_cost.py [--state-bytes 1G] [--ranges 4] [--value-bytes 65536]
[--root DIR]`` (or ``DKVSTREAM_BENCH_FORK_BYTES=64M``; ``--state-bytes`` wins).

1. Builds a parent job's state: ``--ranges`` key-group ranges of one operator, each a
   DKV instance holding ``state-bytes / ranges`` bytes of random (incompressible)
   values, flushed into SSTables, and commits a job checkpoint naming their manifests
   (the same objects a running job's epoch leaves).
2. Forks a child job from it (``dkvstream.operators.runtime.forks.fork_job``) and prints
   the fork's object-store requests by kind and the bytes it wrote and copied.
3. The baselines, in the same run, over the same objects: a full copy of every state
   object the checkpoint names into the child's prefix, once with server-side COPY
   (S3 ``CopyObject``; a local store hard-links, but S3 duplicates the bytes) and once
   with GET + PUT (bytes through the client, as a copy between stores would move them).

The store is a local directory (requests are counted the same as on S3:
tests/storage/dkv/test_dkv_s3.py). Wall times are printed for reference; the claims
are the request and byte counts.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dkvstream.operators import paths  # noqa: E402
from dkvstream.operators.api.keygroups import key_group_ranges  # noqa: E402
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, commit_checkpoint  # noqa: E402
from dkvstream.operators.runtime.forks import fork_job  # noqa: E402
from dkvstream.operators.runtime.pins import files_by_owner  # noqa: E402
from dkvstream.storage.dkv import DKV, DKVOptions  # noqa: E402
from dkvstream.storage.objectstore import REQUEST_KINDS, ObjectStore, open_object_store  # noqa: E402

KEY_GROUPS = 256
OPERATOR = "state"
COLUMNS = (*REQUEST_KINDS, "bytes_read", "bytes_written")


def parse_size(text: str) -> int:
    """``1G``, ``64M``, ``512K`` or a plain number of bytes.

    Raises:
        ValueError: not a size, naming it.
    """
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 1G, 64M, 512K, 1000000)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def build_parent(store: ObjectStore, job: str, state_bytes: int, ranges: int, value_bytes: int) -> JobCheckpoint:
    """Writes the parent's state and commits its checkpoint (epoch 1); returns it."""
    prefix = paths.job_prefix(job)
    options = DKVOptions(memtable_bytes=8 << 20)  # tables of about 8 MiB, as by default
    manifests = {}
    per_range = max(1, state_bytes // ranges // value_bytes)
    for kr in key_group_ranges(KEY_GROUPS, ranges):
        db = DKV.open(store, paths.state_prefix(prefix, OPERATOR, kr.label), options=options)
        lo = kr.key_interval[0]
        for start in range(0, per_range, 256):
            keys = [lo + i.to_bytes(8, "big") for i in range(start, min(per_range, start + 256))]
            db.write_batch(keys, [os.urandom(value_bytes) for _ in keys])
        db.flush()
        manifests[kr.label] = db.checkpoint("e0000000001-bench")
        db.close()
    ckpt = JobCheckpoint(job=job, epoch=1, watermark=0, source_offsets={"p0": 0}, partition_max_ts={"p0": 0},
                         finished=False, key_groups=KEY_GROUPS, parallelism=ranges,
                         operators={OPERATOR: manifests}, outputs={})
    commit_checkpoint(store, prefix, ckpt)
    return ckpt


def measured(store: ObjectStore, fn) -> tuple[dict[str, int], float]:
    """``(requests and bytes spent by fn(), seconds)``."""
    before, t0 = store.stats.snapshot(), time.perf_counter()
    fn()
    after = store.stats.snapshot()
    return {k: after.get(k, 0) - before.get(k, 0) for k in COLUMNS}, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark (module docstring) and prints its table; returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-bytes", default=os.environ.get("DKVSTREAM_BENCH_FORK_BYTES", "1G"),
                   help="parent state size (default 1G, or $DKVSTREAM_BENCH_FORK_BYTES)")
    p.add_argument("--ranges", type=int, default=4, help="key-group ranges of the parent")
    p.add_argument("--value-bytes", type=int, default=64 << 10, help="bytes per value")
    p.add_argument("--root", help="store directory (default: a temporary one, removed after)")
    a = p.parse_args(argv)
    state_bytes = parse_size(a.state_bytes)
    with tempfile.TemporaryDirectory(prefix="fork_cost_") as tmp:
        store = open_object_store(a.root or tmp)
        t0 = time.perf_counter()
        ckpt = build_parent(store, "parent", state_bytes, a.ranges, a.value_bytes)
        files = files_by_owner(store, ckpt)["jobs/parent"]
        total = sum(files.values())
        print(f"parent state: {len(files)} objects, {total:,} bytes ({a.ranges} ranges, "
              f"built in {time.perf_counter() - t0:.1f} s)")
        fork, fork_s = measured(store, lambda: fork_job(store, "parent", "child"))
        copy, copy_s = measured(store, lambda: [store.copy(k, f"jobs/copy/{k}") for k in files])
        rewrite, rewrite_s = measured(store, lambda: [store.put(f"jobs/rewrite/{k}", store.get(k)) for k in files])
        rows = [("fork_job (zero-copy)", fork, 0, fork_s),
                ("full copy: server-side COPY", copy, total, copy_s),
                ("full copy: GET + PUT", rewrite, total, rewrite_s)]
        print("| method | " + " | ".join(COLUMNS) + " | bytes copied | seconds |")
        print("|---" * (len(COLUMNS) + 3) + "|")
        for name, spent, copied, seconds in rows:
            print(f"| {name} | " + " | ".join(f"{spent[c]:,}" for c in COLUMNS) + f" | {copied:,} | {seconds:.3f} |")
        if fork["COPY"] or fork["bytes_written"] >= total:
            print("error: the fork copied state", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
