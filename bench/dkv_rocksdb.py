"""DKV against RocksDB (via rocksdict) on the same workload, each engine in its own process.

Usage: ``.venv/bin/python bench/dkv_rocksdb.py [--keys 1000000] [--repeat 1] [--quick]
[--clock cpu|wall] [--cache-mib 320] [--pure-python] [--profile PHASE] [--plot PATH]``
(needs the ``bench`` extra: ``pip install -e '.[bench]'``).
``--pure-python`` adds a third child, DKV with its C module off (``DKVSTREAM_DKV_NATIVE=0``),
and a column with DKV's speed-up over it.

The parent spawns one fresh child process per engine and repeat (``multiprocessing``
spawn), so each engine's peak RSS is its own; the children rebuild the same workload from
one seed and the parent prints a table of ops/s per phase and the ratio DKV / RocksDB,
medians over ``--repeat`` runs.

Workload (``N = --keys``): keys are 16 bytes, an 8-byte big-endian prefix id (``N / 100``
ids, so a prefix holds ~100 keys) followed by 8 random bytes; values are 100 bytes, 50
random and 50 of a fixed filler (about half compressible, like typical operator state).

Phases, in order, on one open DB per engine:

1. ``put``: N puts in random key order; for RocksDB the phase ends once no background
   flush or compaction runs or is pending (the memtables that filled during the puts are
   written inside the phase's clocks, as DKV writes them inside ``put``);
2. ``get present (pre-flush)``: gets with the last memtable still in memory (both: the
   latest memtable plus the L0 tables flushed when the earlier ones filled);
3. ``flush``: DKV ``flush()``; RocksDB ``flush(wait=True)`` then waiting until no
   background flush or compaction runs (DKV compacts synchronously inside ``flush``);
   reported as keys/s over the keys in the memtable(s) the flush writes, each engine's
   own count: the engines account memtable bytes differently, so their last memtables
   differ (at 1,000,000 keys DKV's holds about 254,000 keys, RocksDB's about 78,000;
   printed after the phase);
4. ``get present``: 200,000 random gets of present keys, from tables;
5. ``get absent``: 200,000 gets of absent keys (present prefixes, so they fall inside the
   tables' key ranges and exercise the Bloom filters);
6. ``scan prefix``: 1,000 prefix scans of ~100 keys each (scans/s);
7. ``compact all``: DKV ``compact_all()`` if the DB has it, else ``flush()`` +
   ``checkpoint()`` (flagged in the output: a checkpoint compacts only if L0 reached its
   trigger); RocksDB ``compact_range(None, None)`` (synchronous), then waiting for any
   background work as after the flush; keys/s over N;
8. ``get present (compacted)``: the get phase again on the compacted tree.

Correctness is checked before any number is printed: after the flush a sample of gets
must return the values put, absent keys must be absent, and sample scans must return
exactly the expected pairs; every timed phase's results are then verified (all values,
all absent, every scan's count), and the parent checks that both engines returned the
same digest of sampled results.

Like-for-like settings (see ``dkv_options`` and ``_open_rocksdb``): DKV's defaults
(``DKVOptions()``) but for the cache, and for RocksDB a 64 MiB write buffer (DKV
``memtable_bytes``), 4 KiB blocks, a full Bloom filter of 10 bits/key, zstd (RocksDB's
default level maps to zstd level 3, as DKV's ``zstd_level``), L0 trigger 4, 8 MiB target
files, raw mode (bytes in, bytes out; no pickling), and:

* Durability: the WAL off in both (``disable_wal``; DKV buffers WAL records in memory
  until ``checkpoint``, which the benchmark never calls), so neither writes a log per
  put; every table either engine writes (flush or compaction) is ``fsync``-ed once, when
  complete, before it is used: DKV's ``LocalObjectStore.put`` fsyncs its temp file before
  the rename, RocksDB syncs each SST file it finishes, with ``use_fsync`` on so it calls
  ``fsync`` rather than ``fdatasync``; no incremental syncs (``bytes_per_sync`` 0, its
  default). RocksDB also appends its MANIFEST and fsyncs it and the directory per flush
  and compaction; DKV writes no manifest until a checkpoint.
* Cache: the same kind and size, ``--cache-mib`` (default 320 MiB) of decompressed data
  blocks in an LRU each: RocksDB's block cache (an ``LRUCache``); DKV's
  ``block_cache_bytes``, with its cache of whole compressed tables off
  (``table_cache_bytes=0``; rocksdict exposes no compressed secondary cache to give
  RocksDB the same split), so both read a missed block from the file with one ``pread``
  and decompress it. Index and Bloom filter blocks stay with each open table's reader,
  outside the cache, in both (RocksDB's ``cache_index_and_filter_blocks`` default off).
* Background work: RocksDB flushes and compacts on up to 2 background threads, DKV
  synchronously in the caller. Every phase that makes RocksDB write tables (put, flush,
  compact all) ends, inside its clocks, only once none runs or is pending, so each
  engine's flushes and compactions are charged to the phase that caused them; the CPU
  clock counts all the process's threads.

Both end the flush phase with 3 L0 tables at 1,000,000 keys (printed as the tree shape).
With ``--quick`` everything fits one memtable, so the compaction has one table to rewrite
(RocksDB moves it down without rewriting): read that row only at full size.

Memory: each child reports its peak RSS (``ru_maxrss``), the RSS once the workload is built
(identical for both engines, ~260 MiB at 1,000,000 keys) and the difference, which is what
the engine itself added at its peak (memtables, caches, readers, allocator slack).

Clocks: every phase is timed twice, by the child's CPU time (``time.process_time``:
``CLOCK_PROCESS_CPUTIME_ID``, the sum over all its threads, so RocksDB's background
flushes and compactions count; time blocked in ``fsync`` or reads does not) and by wall
time (``time.perf_counter``: RocksDB's background threads may run on the second core,
DKV works in the caller; ``fsync`` counts). The table prints both ratios (medians over
the runs; with ``--repeat`` above 1 also each run's ratio); ops/s and the target verdicts
use ``--clock`` (default ``cpu``, which a shared, loaded machine disturbs far less). The
load average before and after the runs is printed. ``--plot PATH`` writes both ratios
per phase as a PNG.

``--profile PHASE`` runs only the DKV child, with cProfile enabled around that phase, and
prints the top functions by own time and by cumulative time.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import multiprocessing as mp
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# Run as a script from the repo root (``python bench/dkv_rocksdb.py``): make ``storage``
# importable in the spawned children too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plot import load_average  # noqa: E402

SEED = 20240601
VALUE_FILLER = b"state:" + b"\x00" * 20 + b"0123456789" * 2 + b"\xff" * 4  # 50 bytes
assert len(VALUE_FILLER) == 50
N_GETS = 200_000
N_SCANS = 1_000
CHUNKS = 20  # slices of a long phase; a progress line at most every PROGRESS_EVERY_S
PROGRESS_EVERY_S = 2.0
CHECK_SAMPLE = 2_000
CHECK_SCANS = 20

PHASES = [
    # (name, unit, target ratio DKV / RocksDB or None)
    ("put", "puts/s", 0.5),
    ("get present (pre-flush)", "gets/s", 0.8),
    ("flush", "keys/s", 0.5),
    ("get present", "gets/s", 0.8),
    ("get absent", "gets/s", 0.8),
    ("scan prefix", "scans/s", 1.0),
    ("compact all", "keys/s", 0.5),
    ("get present (compacted)", "gets/s", 0.8),
]
PHASE_NAMES = [p[0] for p in PHASES]
DEFAULT_CACHE_BYTES = 320 << 20  # DKVOptions' default budgets together (64 + 256 MiB)


def _cache_bytes() -> int:
    """Each engine's cache of decompressed blocks, bytes (the parent passes ``--cache-mib``
    in the environment)."""
    return int(os.environ.get("DKV_BENCH_CACHE_BYTES", DEFAULT_CACHE_BYTES))


def dkv_options(cache_bytes: int):
    """DKV's defaults with RocksDB's kind of cache: ``cache_bytes`` of decompressed blocks
    (``block_cache_bytes``) and no cache of whole compressed tables."""
    from dkvstream.storage.dkv import DKVOptions

    return DKVOptions(block_cache_bytes=cache_bytes, table_cache_bytes=0)


# -- workload -----------------------------------------------------------------------------


class Workload:
    """The same keys, values and probes in every process (rebuilt from ``SEED``)."""

    def __init__(self, n_keys: int) -> None:
        rng = random.Random(SEED)
        self.n_prefixes = n_prefixes = max(1, n_keys // 100)
        seen: set[bytes] = set()
        keys: list[bytes] = []
        while len(keys) < n_keys:
            k = rng.randrange(n_prefixes).to_bytes(8, "big") + rng.randbytes(8)
            if k not in seen:
                seen.add(k)
                keys.append(k)
        self.keys = keys  # insertion order: random
        self.values = [rng.randbytes(50) + VALUE_FILLER for _ in range(n_keys)]
        n_gets = min(N_GETS, 2 * n_keys)
        idx = [rng.randrange(n_keys) for _ in range(n_gets)]
        self.present = [keys[i] for i in idx]
        self.present_expected = [self.values[i] for i in idx]
        absent: list[bytes] = []
        while len(absent) < n_gets:
            k = rng.randrange(n_prefixes).to_bytes(8, "big") + rng.randbytes(8)
            if k not in seen:
                absent.append(k)
        self.absent = absent
        counts = Counter(k[:8] for k in keys)
        prefixes = sorted(counts)
        self.scan_prefixes = rng.sample(prefixes, min(N_SCANS, len(prefixes)))
        self.scan_expected_counts = [counts[p] for p in self.scan_prefixes]
        checked = set(self.scan_prefixes[:CHECK_SCANS])
        exp: dict[bytes, list[tuple[bytes, bytes]]] = {p: [] for p in checked}
        for k, v in zip(keys, self.values):
            if k[:8] in checked:
                exp[k[:8]].append((k, v))
        self.scan_expected = {p: sorted(kvs) for p, kvs in exp.items()}


def prefix_successor(prefix: bytes) -> bytes | None:
    p = prefix.rstrip(b"\xff")
    return None if not p else p[:-1] + bytes([p[-1] + 1])


# -- engines: a uniform facade ------------------------------------------------------------


class _Engine:
    """What both engines share: ``self.db`` has ``put(key, value)``, ``get(key)`` (bytes or
    None) and ``close()``; the per-key loops look the method up once."""

    def put_all(self, keys, values) -> None:
        put = self.db.put
        for k, v in zip(keys, values):
            put(k, v)

    def get_all(self, keys) -> list:
        get = self.db.get
        return [get(k) for k in keys]

    def close(self) -> None:
        self.db.close()


class DKVEngine(_Engine):
    name = "DKV"

    def __init__(self, root: str) -> None:
        from dkvstream.storage.dkv import DKV
        from dkvstream.storage.objectstore.local import LocalObjectStore

        self.options = dkv_options(_cache_bytes())
        self.db = DKV.open(LocalObjectStore(root), "bench", None, self.options)
        self.notes: list[str] = []
        self._ckpt = 0

    def scan_all(self, prefixes) -> list[list[tuple[bytes, bytes]]]:
        scan = self.db.scan_prefix
        return [list(scan(p)) for p in prefixes]

    def flush(self) -> None:
        self.db.flush()

    def wait_background(self) -> None:
        """Nothing: DKV flushes and compacts in the caller."""

    def memtable_entries(self) -> int:
        return self.db.stats()["memtable_entries"]

    def compact_all(self) -> None:
        db = self.db
        if hasattr(db, "compact_all"):
            db.compact_all()
        else:
            db.flush()
            self._ckpt += 1
            db.checkpoint(f"bench-{self._ckpt:04d}")
            self.notes.append(
                "DKV has no compact_all(): 'compact all' ran flush() + checkpoint(), which "
                "compacts only if L0 reached l0_compaction_trigger"
            )

    def shape(self) -> str:
        return "tables per level " + str(self.db.stats()["tables_per_level"])


class RocksDBEngine(_Engine):
    name = "RocksDB"

    def __init__(self, root: str) -> None:
        import rocksdict as r

        self.r = r
        self.db = _open_rocksdb(r, root)
        self.notes: list[str] = []

    def scan_all(self, prefixes) -> list[list[tuple[bytes, bytes]]]:
        # The RocksDB idiom for a prefix scan without a prefix extractor: seek to the
        # prefix with an iterate_upper_bound at its successor, so the iterator stops in C++.
        items = self.db.items
        ReadOptions = self.r.ReadOptions
        out = []
        for p in prefixes:
            ro = ReadOptions()
            ro.set_iterate_upper_bound(prefix_successor(p))
            out.append(list(items(from_key=p, read_opt=ro)))
        return out

    def memtable_entries(self) -> int:
        prop = self.db.property_int_value
        return (prop("rocksdb.num-entries-active-mem-table")
                + prop("rocksdb.num-entries-imm-mem-tables"))

    def wait_background(self) -> None:
        """Returns once no flush or compaction runs or is pending."""
        prop = self.db.property_int_value
        while (prop("rocksdb.num-running-flushes") or prop("rocksdb.num-running-compactions")
               or prop("rocksdb.compaction-pending") or prop("rocksdb.mem-table-flush-pending")):
            time.sleep(0.005)

    def flush(self) -> None:
        self.db.flush(True)
        self.wait_background()

    def compact_all(self) -> None:
        self.db.compact_range(None, None)
        self.wait_background()

    def shape(self) -> str:
        prop = self.db.property_int_value
        files = [prop(f"rocksdb.num-files-at-level{i}") for i in range(7)]
        while len(files) > 1 and not files[-1]:
            files.pop()
        return "files per level " + str(files)


def _open_rocksdb(r, root: str):
    opts = r.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(64 << 20)  # DKV memtable_bytes
    opts.set_max_write_buffer_number(2)
    opts.set_compression_type(r.DBCompressionType.zstd())
    opts.set_level_zero_file_num_compaction_trigger(4)  # DKV l0_compaction_trigger
    opts.set_target_file_size_base(8 << 20)  # DKV target_file_bytes
    opts.set_max_background_jobs(2)
    # DKV fsyncs every table it writes (LocalObjectStore.put), once, when complete;
    # RocksDB syncs every SST file it finishes, with fdatasync unless use_fsync.
    opts.set_use_fsync(True)
    opts.set_bytes_per_sync(0)  # no incremental syncs while a file is written (default)
    table = r.BlockBasedOptions()
    table.set_block_size(4096)  # DKV block_bytes
    table.set_bloom_filter(10, False)  # full filter, 10 bits/key
    # Decompressed blocks, LRU: the same kind and bytes as DKV's block cache (dkv_options).
    table.set_block_cache(r.Cache(_cache_bytes()))
    opts.set_block_based_table_factory(table)
    db = r.Rdict(root, opts)
    wo = r.WriteOptions()
    wo.disable_wal = True  # DKV buffers its WAL in memory until checkpoint
    db.set_write_options(wo)
    return db


class DKVPurePythonEngine(DKVEngine):
    """DKV with its C read-path loops switched off (``DKVSTREAM_DKV_NATIVE=0``, set by
    the child before DKV is imported): the baseline of the ``--pure-python`` column."""

    name = "DKV-py"

    def __init__(self, root: str) -> None:
        from dkvstream.storage.dkv.native import NATIVE

        if NATIVE is not None:
            raise RuntimeError("DKV-py child imported the C module")
        super().__init__(root)


ENGINES = {"dkv": DKVEngine, "rocksdb": RocksDBEngine, "dkv-py": DKVPurePythonEngine}


# -- the child ----------------------------------------------------------------------------


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _clock() -> tuple[float, float]:
    """``(CPU seconds, wall seconds)``: the process's CPU time, all threads (RocksDB's
    background flushes and compactions included; time blocked on I/O, such as fsync or
    cold reads, left out), and ``time.perf_counter``."""
    return time.process_time(), time.perf_counter()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    cpu, wall = _clock()
    return cpu - t[0], wall - t[1]


def _chunked(label: str, fn, n: int, chunks: int = CHUNKS) -> tuple[float, list]:
    """Calls ``fn(lo, hi)`` over ``chunks`` slices of ``range(n)``; times only ``fn``.

    Returns ``((CPU seconds, wall seconds), concatenated results)``; prints progress on
    long phases.
    """
    step = max(1, -(-n // chunks))
    cpu = wall = 0.0
    out: list = []
    last_print = time.perf_counter()
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        t = _clock()
        res = fn(lo, hi)
        dc, dw = _since(t)
        cpu, wall = cpu + dc, wall + dw
        now = time.perf_counter()
        if res is not None:
            out += res
        if hi < n and now - last_print >= PROGRESS_EVERY_S:
            print(f"    {label}: {hi:,}/{n:,}  {hi / max(cpu, 1e-9):,.0f}/CPU s", flush=True)
            last_print = now
    return (cpu, wall), out


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"correctness check failed: {what}")


def child(engine_name: str, n_keys: int, profile_phase: str | None, conn) -> None:
    try:
        conn.send(_child(engine_name, n_keys, profile_phase))
    except BaseException as e:  # report, then fail the child
        conn.send({"error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        conn.close()


def _child(engine_name: str, n_keys: int, profile_phase: str | None) -> dict:
    if engine_name == "dkv-py":
        os.environ["DKVSTREAM_DKV_NATIVE"] = "0"  # read once, when dkvstream.storage.dkv is imported
    tag = f"[{ENGINES[engine_name].name} pid {os.getpid()}]"
    print(f"{tag} building workload ({n_keys:,} keys)", flush=True)
    w = Workload(n_keys)
    # The workload's lists (millions of items) are not part of either engine: move them
    # out of the collector's reach, or each full collection an engine's allocations
    # trigger would traverse them (~80 ms at 1M keys) and charge that to the engine.
    gc.collect()
    gc.freeze()
    baseline = _rss()
    times: dict[str, tuple[int, float]] = {}
    rss_after: dict[str, int] = {}
    digest = hashlib.sha256()
    profiler = None
    profile_text = ""

    with tempfile.TemporaryDirectory(prefix=f"bench-{engine_name}-") as tmp:
        eng = ENGINES[engine_name](tmp)

        def phase(name: str, n_ops: int, fn):
            nonlocal profiler
            print(f"{tag} {name} ...", flush=True)
            if name == profile_phase:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            t = _clock()
            res = fn()
            secs = _since(t)
            if profiler is not None and name == profile_phase:
                profiler.disable()
            if isinstance(res, tuple):  # ((CPU s, wall s) measured inside, results)
                secs, res = res
            times[name] = (n_ops, *secs)
            rss_after[name] = _rss()
            print(f"{tag} {name}: {secs[0]:.2f} CPU s, {secs[1]:.2f} wall s, "
                  f"{n_ops / secs[0]:,.0f}/CPU s, RSS {rss_after[name] / 2**20:,.0f} MiB",
                  flush=True)
            return res

        keys, values = w.keys, w.values

        def put_phase() -> None:
            # Timed whole by ``phase`` (not the chunks' sum): RocksDB's background flushes
            # of the memtables that filled count wherever they ran, until the wait ends.
            _chunked("put", lambda lo, hi: eng.put_all(keys[lo:hi], values[lo:hi]), n_keys)
            eng.wait_background()

        phase("put", n_keys, put_phase)

        def gets(label: str, probe: list[bytes]):
            return _chunked(label, lambda lo, hi: eng.get_all(probe[lo:hi]), len(probe))

        def verify_present(name: str, got: list) -> None:
            bad = sum(1 for a, b in zip(got, w.present_expected) if a != b)
            _check(len(got) == len(w.present) and not bad, f"{name}: {bad} wrong values")

        got = phase("get present (pre-flush)", len(w.present),
                    lambda: gets("get present (pre-flush)", w.present))
        verify_present("get present (pre-flush)", got)

        unflushed = eng.memtable_entries()
        print(f"{tag} flush writes {unflushed:,} keys", flush=True)
        phase("flush", unflushed, eng.flush)
        shape_flushed = eng.shape()
        print(f"{tag} after flush: {shape_flushed}", flush=True)

        # Correctness before the timed table reads: values, absence, exact scan pairs.
        sample = w.present[:CHECK_SAMPLE]
        _check(eng.get_all(sample) == w.present_expected[:CHECK_SAMPLE], "sample gets")
        _check(all(v is None for v in eng.get_all(w.absent[:CHECK_SAMPLE])), "sample absent")
        chk = w.scan_prefixes[:CHECK_SCANS]
        _check(all(got == w.scan_expected[p] for p, got in zip(chk, eng.scan_all(chk))),
               "sample scans return exactly the pairs put")
        print(f"{tag} correctness sample ok", flush=True)

        got = phase("get present", len(w.present), lambda: gets("get present", w.present))
        verify_present("get present", got)
        digest.update(b"".join(got[:CHECK_SAMPLE]))

        got = phase("get absent", len(w.absent), lambda: gets("get absent", w.absent))
        found = sum(1 for v in got if v is not None)
        _check(len(got) == len(w.absent) and not found, f"get absent: {found} found")

        prefixes = w.scan_prefixes
        got = phase("scan prefix", len(prefixes), lambda: _chunked(
            "scan prefix", lambda lo, hi: eng.scan_all(prefixes[lo:hi]), len(prefixes)))
        counts = [len(r) for r in got]
        _check(counts == w.scan_expected_counts, "scan counts differ from the keys put")
        for r in got[:CHECK_SCANS]:
            for k, v in r:
                digest.update(k + v)
        digest.update(str(counts).encode())

        phase("compact all", n_keys, eng.compact_all)
        shape_compacted = eng.shape()
        print(f"{tag} after compaction: {shape_compacted}", flush=True)

        got = phase("get present (compacted)", len(w.present),
                    lambda: gets("get present (compacted)", w.present))
        verify_present("get present (compacted)", got)

        if profiler is not None:
            import io
            import pstats

            buf = io.StringIO()
            st = pstats.Stats(profiler, stream=buf)
            st.sort_stats("tottime").print_stats(12)
            buf.write("\n--- by cumulative time ---\n")
            st.sort_stats("cumulative").print_stats(15)
            profile_text = buf.getvalue()
        eng.close()
        notes = eng.notes
    return {
        "times": times,
        "baseline_rss": baseline,
        "peak_rss": _peak_rss(),
        "rss_after": rss_after,
        "digest": digest.hexdigest(),
        "shape_flushed": shape_flushed,
        "shape_compacted": shape_compacted,
        "notes": notes,
        "compact_fallback": bool(notes),
        "profile": profile_text,
    }


# -- the parent ---------------------------------------------------------------------------


def run_child(ctx, engine: str, n_keys: int, profile_phase: str | None) -> dict:
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=child, args=(engine, n_keys, profile_phase, send))
    p.start()
    send.close()
    try:
        result = recv.recv()
    except EOFError:
        result = {"error": "child died without a result"}
    p.join()
    if "error" in result or p.exitcode:
        raise SystemExit(f"{engine} child failed (exit {p.exitcode}): {result.get('error')}")
    return result


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="100,000 keys (smoke run)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the clock of ops/s and target verdicts: process CPU time "
                             "(default) or wall time; both ratios are printed")
    parser.add_argument("--cache-mib", type=int, default=DEFAULT_CACHE_BYTES >> 20,
                        help="cache of decompressed blocks of each engine, MiB (RocksDB block "
                             "cache, DKV block_cache_bytes; DKV's table cache off)")
    parser.add_argument("--pure-python", action="store_true",
                        help="also run DKV without its C module; adds a DKV/DKV-py column")
    parser.add_argument("--profile", metavar="PHASE", choices=PHASE_NAMES,
                        help="run only the DKV child, with cProfile on PHASE; print the top")
    parser.add_argument("--plot", metavar="PATH", help="write the ratios per phase as a PNG")
    args = parser.parse_args()
    n_keys = 100_000 if args.quick else args.keys
    cache_bytes = args.cache_mib << 20
    os.environ["DKV_BENCH_CACHE_BYTES"] = str(cache_bytes)  # the spawned children inherit it
    ctx = mp.get_context("spawn")
    clock = 1 if args.clock == "cpu" else 2  # index in a phase's (ops, CPU s, wall s)

    if args.profile:
        res = run_child(ctx, "dkv", n_keys, args.profile)
        n, cpu, wall = res["times"][args.profile]
        print(f"\nDKV {args.profile!r} under cProfile: {n:,} ops in {cpu:.2f} CPU s, "
              f"{wall:.2f} wall s "
              f"({n / cpu:,.0f}/CPU s; profiling slows it)\n")
        print(res["profile"])
        return

    load_before = load_average()
    engines = ("dkv", "rocksdb", "dkv-py") if args.pure_python else ("dkv", "rocksdb")
    runs: dict[str, list[dict]] = {eng: [] for eng in engines}
    for i in range(args.repeat):
        for eng in engines:
            print(f"== run {i + 1}/{args.repeat}: {ENGINES[eng].name} ==", flush=True)
            runs[eng].append(run_child(ctx, eng, n_keys, None))
    load_after = load_average()

    digests = {eng: {r["digest"] for r in rs} for eng, rs in runs.items()}
    if len(set().union(*digests.values())) != 1:
        raise SystemExit(f"engines disagree on sampled results: {digests}")

    def secs(eng: str, phase: str, which: int) -> float:
        return statistics.median(r["times"][phase][which] for r in runs[eng])

    def rate(eng: str, phase: str, which: int) -> float:
        # Median of each run's ops / s: a flush's key count may differ between runs.
        return statistics.median(r["times"][phase][0] / r["times"][phase][which]
                                 for r in runs[eng])

    print()
    counts = runs["dkv"][0]["times"]
    print(f"{n_keys:,} keys (16 B keys, 100 B values), {counts['get present'][0]:,} gets, "
          f"{counts['scan prefix'][0]:,} prefix scans; "
          f"{'median of ' + str(args.repeat) + ' runs' if args.repeat > 1 else '1 run'}; "
          "each engine in its own process; results verified, both engines agree")
    print(f"cache: {_mib(cache_bytes)} of decompressed blocks each (RocksDB block cache, DKV "
          f"block cache; DKV table cache off); WAL off, every table fsynced once in both; "
          f"ops/s and targets on {args.clock} time; "
          f"CPU = time.process_time (all threads), wall = time.perf_counter; "
          f"load average (1 / 5 / 15 min) {load_before} before, {load_after} after; "
          f"{os.cpu_count()} cores, shared")
    head = (f"{'phase':26} {'unit':8} {'DKV ops/s':>12} {'RocksDB ops/s':>14} "
            f"{'ratio CPU':>10} {'ratio wall':>10} {'DKV CPU s':>10} {'DKV wall s':>10} "
            f"{'RDB CPU s':>10} {'RDB wall s':>10}  {'target':22}"
            + (f"{'DKV/DKV-py':>14}" if args.pure_python else ""))
    print("(ratio = DKV ops/s / RocksDB ops/s on that clock)")
    print(head)
    print("-" * len(head))
    misses = []
    plot_rows = []
    for name, unit, target in PHASES:
        d, r = rate("dkv", name, clock), rate("rocksdb", name, clock)
        ratio = d / r
        ratio_cpu = rate("dkv", name, 1) / rate("rocksdb", name, 1)
        ratio_wall = rate("dkv", name, 2) / rate("rocksdb", name, 2)
        plot_rows.append((name, ratio_cpu, ratio_wall))
        if name == "compact all" and any(r["compact_fallback"] for r in runs["dkv"]):
            verdict = "DKV fallback, see note"
        elif target is None:
            verdict = "-"
        elif ratio >= target:
            verdict = f">={target:g}x ok"
        else:
            verdict = f">={target:g}x MISS"
            misses.append(name)
        py = ""
        if args.pure_python:
            py = f"{d / rate('dkv-py', name, clock):14.2f}"
        print(f"{name:26} {unit:8} {d:12,.0f} {r:14,.0f} {ratio_cpu:10.3f} {ratio_wall:10.3f} "
              f"{secs('dkv', name, 1):10.2f} {secs('dkv', name, 2):10.2f} "
              f"{secs('rocksdb', name, 1):10.2f} {secs('rocksdb', name, 2):10.2f}  "
              f"{verdict:22}{py}")
    if args.repeat > 1:
        print(f"\nratio per run on {args.clock} time (run i: DKV run i / RocksDB run i)")
        for name, _unit, _target in PHASES:
            per_run = [d["times"][name][0] / d["times"][name][clock]
                       / (r["times"][name][0] / r["times"][name][clock])
                       for d, r in zip(runs["dkv"], runs["rocksdb"])]
            print(f"{name:26} " + "  ".join(f"{x:6.3f}" for x in per_run))
    print()
    for eng, rs in runs.items():
        peak = max(r["peak_rss"] for r in rs)
        base = max(r["baseline_rss"] for r in rs)
        print(f"{ENGINES[eng].name:8} peak RSS {_mib(peak)} (workload alone {_mib(base)}, "
              f"engine +{_mib(peak - base)}); after flush: {rs[0]['shape_flushed']}; "
              f"after compaction: {rs[0]['shape_compacted']}")
    notes = sorted({n for rs in runs.values() for r in rs for n in r["notes"]})
    for n in notes:
        print(f"note: {n}")
    print("targets missed: " + (", ".join(misses) if misses else "none"))
    if args.plot:
        from bench.plot import bar_panels

        labels = [p[0] for p in plot_rows]
        bar_panels(args.plot, f"DKV / RocksDB, {n_keys:,} keys, {_mib(cache_bytes)} cache each", [
            {"title": "CPU time (process_time, all threads)", "labels": labels, "ref": 1.0,
             "fmt": "{:.2f}x", "xlabel": "DKV ops/s / RocksDB ops/s", "log": True,
             "values": [p[1] for p in plot_rows]},
            {"title": "wall time (perf_counter)", "labels": labels, "ref": 1.0, "fmt": "{:.2f}x",
             "xlabel": "DKV ops/s / RocksDB ops/s", "log": True,
             "values": [p[2] for p in plot_rows]}],
            caption=f"Each engine in its own process; median of {args.repeat} run(s). "
                    f"Load average {load_before} before, {load_after} after; "
                    f"{os.cpu_count()} cores, shared.")
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
