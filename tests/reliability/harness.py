"""Shared parts of the reliability tests: the small job, its driver subprocess, the
fault-free reference run and the checks made after every crash.

The job is the keyed counting job (``dkvstream.examples.keyed_count``) over 2 x 6,000
synthetic events in 8 epochs, with DKV sized so that every epoch flushes memtables and
compacts level 0 inline, and with retention of 2 checkpoints, so a run passes every fault
point of ``dkvstream.storage.faults`` (flush, compaction, manifest, commit, publish, cleanup, GC).
One run takes about a second in-process.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.operators.api.job import Job
from dkvstream.operators.runtime.checkpoints import list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import checkpoint_entries
from dkvstream.storage import faults
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.dkv.verify import verify_manifest
from dkvstream.storage.objectstore import ObjectStore
from tests.ci_env import in_ci

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("crash_driver.py")
PYTHON = ROOT / ".venv" / "bin" / "python"
RETAIN = 2
# Small memtables and a low level-0 trigger: every epoch flushes and compacts inline.
OPTIONS = DKVOptions(memtable_bytes=4 << 10, l0_compaction_trigger=2, target_file_bytes=16 << 10,
                     level_base_bytes=64 << 10, block_cache_bytes=1 << 20, table_cache_bytes=1 << 20)


def job(name: str = "keyed_count", events: int = 6_000, events_per_epoch: int = 1_500) -> Job:
    """The crash-test job: 2 partitions x ``events``, 200 keys, an event every 6 s per
    partition, 8 epochs by default; each epoch spans 75 min of event time, so every epoch
    closes a one-hour window and publishes output."""
    return keyed_count_job(events, 200, partitions=2, step_ms=6_000, events_per_epoch=events_per_epoch,
                           parallelism=2, name=name)


def runner(store_uri: str, spark=None, **kw) -> JobRunner:
    """A ``JobRunner`` of ``job(**kw)`` with the crash tests' DKV options and retention."""
    return JobRunner(job(**kw), spark, store_uri, dkv_options=OPTIONS, retain_checkpoints=RETAIN)


def state(store: ObjectStore, job_prefix: str, epoch: int) -> list:
    """Every (operator, range, DKV key, value) of checkpoint ``epoch``, sorted."""
    return sorted(checkpoint_entries(store, job_prefix, epoch))


def rng(salt: str = "") -> tuple[random.Random, int]:
    """A seeded ``Random`` and its seed: ``DKVSTREAM_FAULT_SEED`` if set, 0 in CI (a red CI
    is reproducible), else a new seed per run (printed by the tests, so a failure can be
    replayed with ``DKVSTREAM_FAULT_SEED=<seed>``)."""
    seed = os.environ.get("DKVSTREAM_FAULT_SEED")
    seed = int(seed) if seed else (0 if in_ci() else random.SystemRandom().randrange(1 << 30))
    return random.Random(f"{seed}:{salt}"), seed


@dataclass
class Reference:
    """The fault-free run: state after each epoch, output, and passes per fault point."""

    epochs: int
    states: dict[int, list]
    main: pd.DataFrame
    late_rows: int
    passes: dict[str, int]
    seconds: float


def reference_run(root: Path) -> Reference:
    """Runs the job fault-free in this process, tracing fault points (``root`` is scratch)."""
    trace = root / "trace.txt"
    r = runner(str(root / "store"))
    states = {}
    faults.trace_to(str(trace))
    started = time.perf_counter()
    try:
        for res in r.epochs():
            states[res.epoch] = state(r.store, r.job.prefix, res.epoch)
    finally:
        faults.disarm_all()
    seconds = time.perf_counter() - started
    oracle = keyed_count_oracle(r.job.source)
    main = sorted_frame(r.job.sinks["main"].read(r.store, r.job.prefix).to_pandas())
    assert_frames_equal(main, sorted_frame(oracle), "fault-free run")
    late = r.job.sinks["late"].read(r.store, r.job.prefix).num_rows
    passes = collections.Counter(trace.read_text().split())
    return Reference(max(states), states, main, late, dict(passes), seconds)


def sorted_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df[["key", "window_start", "count", "amount"]].sort_values(
        ["key", "window_start"]).reset_index(drop=True).astype({"count": "int64", "amount": "int64"})


def assert_frames_equal(got: pd.DataFrame, want: pd.DataFrame, what: str) -> None:
    dup = got.duplicated(["key", "window_start"]).sum()
    assert dup == 0, f"{what}: {dup} duplicated output rows"
    assert len(got) == len(want), f"{what}: {len(got)} output rows, oracle has {len(want)}"
    pd.testing.assert_frame_equal(got, want, obj=what)


def assert_named_files_exist(store: ObjectStore, job_prefix: str) -> int:
    """Every file a retained checkpoint names exists and verifies: each range's DKV
    manifest and its tables and WAL objects (``dkvstream.storage.dkv.verify``), each staged output.

    Returns:
        Retained checkpoints checked.
    """
    epochs = list_epochs(store, job_prefix)
    for e in epochs:
        ckpt = read_checkpoint(store, job_prefix, e)
        for op, ranges in ckpt.operators.items():
            for label, mkey in ranges.items():
                rep = verify_manifest(store, mkey)
                assert rep.ok, f"checkpoint {e}, {op} {label}: {rep.errors}"
        for name, keys in ckpt.outputs.items():
            for k in keys:
                assert store.exists(k), f"checkpoint {e}: staged {name} file {store.uri(k)} missing"
    return len(epochs)


def check_recovery(store_uri: str, ref: Reference, **job_kw) -> int:
    """After a crash: the newest checkpoint's state equals the fault-free run's at that
    epoch and its files exist; a restart to the end matches the reference after every
    epoch; the output equals the oracle (nothing missing, nothing twice).

    Returns:
        The epoch the crash left committed (0: none).
    """
    r = runner(store_uri, **job_kw)
    latest = r.latest()
    committed = latest.epoch if latest else 0
    if committed:
        assert state(r.store, r.job.prefix, committed) == ref.states[committed], \
            f"state of surviving checkpoint {committed} differs from the fault-free run"
        assert_named_files_exist(r.store, r.job.prefix)
    for res in r.epochs():
        assert state(r.store, r.job.prefix, res.epoch) == ref.states[res.epoch], \
            f"state after re-run epoch {res.epoch} differs from the fault-free run"
        assert_named_files_exist(r.store, r.job.prefix)
    assert r.latest().epoch == ref.epochs and r.latest().finished
    got = sorted_frame(r.job.sinks["main"].read(r.store, r.job.prefix).to_pandas())
    assert_frames_equal(got, ref.main, "output after crash and restart")
    assert r.job.sinks["late"].read(r.store, r.job.prefix).num_rows == ref.late_rows
    return committed


@dataclass
class DriverRun:
    """One driver subprocess: exit code (-9 = SIGKILL), the fault points it passed in order,
    its stderr and stdout (a JSON line per committed epoch, then ``{"completed": true}``
    when the job ran to its end), its duration and, for a kill from outside, the delay."""

    returncode: int
    passed: list[str] = field(default_factory=list)
    stderr: str = ""
    seconds: float = 0.0
    stdout: str = ""
    delay_s: float | None = None
    seconds_after_first_point: float | None = None
    # kill_at_random_time: (delay s, seconds the job ran after its first point) of the
    # attempts whose kill came after the job's end.
    missed: list[tuple[float, float]] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """The driver reported that the job ran to its end."""
        return '{"completed": true}' in self.stdout.splitlines()

    @property
    def killed(self) -> bool:
        """Died by SIGKILL before it reported the job's end: the kill interrupted the job."""
        return self.returncode == -signal.SIGKILL and not self.completed

    @property
    def last_point(self) -> str:
        """Where the process was: after this point (``start`` if before the first)."""
        return self.passed[-1] if self.passed else "start"


def driver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": str(PYTHON),
           "SPARK_CONF_DIR": str(ROOT / "platform" / "conf")}
    env.update(extra or {})
    return env


def start_driver(cfg: dict, workdir: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Starts ``crash_driver.py`` with ``cfg`` (see its docstring) in its own process group,
    stdout and stderr piped."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / f"trace-{time.time_ns()}.txt"
    trace.touch()
    cfg = {**cfg, "trace": str(trace)}
    proc = subprocess.Popen([str(PYTHON), str(DRIVER), json.dumps(cfg)], env=driver_env(env), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, trace


def run_driver(cfg: dict, workdir: Path, kill_after_s: float | None = None, timeout_s: float = 600,
               env: dict[str, str] | None = None) -> DriverRun:
    """Runs the driver to its end, or SIGKILLs its process group (the driver and its Spark
    JVM, if any) ``kill_after_s`` seconds after it passed its first fault point (so the
    random delay is spent in the job, not in Python's imports). Whether the kill landed
    is ``DriverRun.killed``: a driver that ended before it is not killed."""
    started = time.perf_counter()
    proc, trace = start_driver(cfg, workdir, env)
    after_first = None
    if kill_after_s is not None:
        while proc.poll() is None and trace.stat().st_size == 0:
            time.sleep(0.005)
        first = time.perf_counter()
        while proc.poll() is None and (left := first + kill_after_s - time.perf_counter()) > 0:
            time.sleep(min(left, 0.005))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        after_first = time.perf_counter() - first
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        # A named fault kills only the driver: also end a Spark JVM it leaves behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return DriverRun(proc.returncode, trace.read_text().split(), err,
                     time.perf_counter() - started, out, kill_after_s, after_first)


def kill_at_random_time(cfg: dict, workdir: Path, rnd: random.Random, max_delay_s: float,
                        attempts: int = 6) -> DriverRun:
    """Runs the driver on the local store ``cfg["store"]`` and SIGKILLs it a random
    ``uniform(0, max_delay_s)`` seconds after its first fault point, until a kill lands.

    A delay that outlasts the job would leave a fault-free run, so a driver that ends
    before the kill does not count: the store is put back as it was before the attempt
    and the next delay is drawn below half the time the job ran after its first point.

    Returns:
        The killed run (``killed`` is true; ``delay_s`` is the delay that landed,
        ``missed`` the attempts before it).

    Raises:
        AssertionError: the driver failed (an exit other than 0 or the kill), or no kill
            landed in ``attempts`` attempts (e.g. the job had nothing left to run).
    """
    store = Path(cfg["store"])
    snapshot = workdir / f"{store.name}-before-kill"
    shutil.rmtree(snapshot, ignore_errors=True)
    if store.exists():
        shutil.copytree(store, snapshot)
    bound, missed = max_delay_s, []
    for _ in range(attempts):
        run = run_driver(cfg, workdir, kill_after_s=rnd.uniform(0, bound))
        if run.killed:
            shutil.rmtree(snapshot, ignore_errors=True)
            run.missed = missed
            return run
        assert run.returncode in (0, -signal.SIGKILL) and run.completed, (
            f"driver failed: rc={run.returncode}\n{run.stderr[-2000:]}")
        missed.append((round(run.delay_s, 3), round(run.seconds_after_first_point, 3)))
        shutil.rmtree(store)
        if snapshot.exists():
            shutil.copytree(snapshot, store)
        bound = min(bound, run.seconds_after_first_point) / 2
    raise AssertionError(f"no kill landed in {attempts} attempts: the job ended first each time "
                         f"(delay s, seconds the job ran after its first fault point): {missed}")
