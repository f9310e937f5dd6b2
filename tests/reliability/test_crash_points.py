"""SIGKILL of a real driver process at named and random points, then restart.

Each run starts ``crash_driver.py`` (the keyed counting job, in-process tasks, inline
flush and compaction, retention of 2 checkpoints) and kills it with SIGKILL either at a
random pass of a named fault point (``dkvstream.storage.faults``: inside a task, between an
SSTable or compaction output and its install, before a DKV manifest, after the tasks and
before the commit, after the commit, between sink publishes, during cleanup and GC) or
at a random time (points nobody named; a kill that would come after the job's end is
retried from the same store with a shorter delay until one lands,
``harness.kill_at_random_time``). After each kill: the surviving checkpoint's state
equals the fault-free run's at that epoch and every file a retained checkpoint names
exists and verifies; a restart to the end matches the fault-free state after every epoch
and its output equals the pandas oracle exactly (``harness.check_recovery``).

The default suite kills once at each of the 14 named points and once at a random time; the slow
test (``-m slow``) makes ``DKVSTREAM_CRASH_RUNS`` runs (default 40) of up to 3
successive kills each, plus kills of a driver running on Spark local mode, and writes a
summary of the crash points exercised (``DKVSTREAM_CRASH_REPORT``, default
``crash-points.json`` in the test's temporary directory).
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
from pathlib import Path

import pytest

from dkvstream.storage import faults
from tests.reliability import harness

# Points that exist only in the driver process when tasks run on Spark.
DRIVER_POINTS = ["epoch_planned", "after_tasks", "after_commit", "publish_file", "before_cleanup",
                 "cleanup_checkpoint", "gc_delete", "cleanup_staged", "after_cleanup"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> harness.Reference:
    ref = harness.reference_run(tmp_path_factory.mktemp("reference"))
    assert set(ref.passes) == set(faults.POINTS), f"a fault-free run misses points: {ref.passes}"
    return ref


def _kill_at(point: str, hit: int, store: str, workdir: Path, **cfg) -> harness.DriverRun:
    run = harness.run_driver({"store": store, "fault": [point, hit], **cfg}, workdir)
    assert run.killed, f"driver not killed at {point} #{hit}: rc={run.returncode}\n{run.stderr[-2000:]}"
    assert run.last_point == point and run.passed.count(point) == hit
    return run


@pytest.mark.parametrize("point", faults.POINTS)
def test_sigkill_at_fault_point_then_restart(point, reference, tmp_path) -> None:
    rnd, seed = harness.rng(point)
    hit = rnd.randint(1, reference.passes[point])
    print(f"seed {seed}: SIGKILL at pass {hit} of {reference.passes[point]} of {point}")
    store = str(tmp_path / "store")
    _kill_at(point, hit, store, tmp_path)
    harness.check_recovery(store, reference)


def test_sigkill_at_random_time_then_restart(reference, tmp_path) -> None:
    rnd, seed = harness.rng("time")
    store = str(tmp_path / "store")
    run = harness.kill_at_random_time({"store": store}, tmp_path, rnd, reference.seconds)
    print(f"seed {seed}: SIGKILL {run.delay_s:.2f} s in, after {run.last_point} "
          f"(pass {len(run.passed)}; missed first: {run.missed})")
    assert run.killed and not run.completed, run.stdout  # the kill interrupted the job
    harness.check_recovery(store, reference)


class _AtTheBound(random.Random):
    """Draws every delay at 90 % of its upper bound."""

    def uniform(self, a: float, b: float) -> float:
        return a + 0.9 * (b - a)


def test_kill_after_the_jobs_end_is_retried_until_it_lands(reference, tmp_path) -> None:
    """A delay far beyond the job's end (600 s for a job of seconds): the driver completes
    first, which must not count as a kill; the store is put back and a shorter delay
    lands; recovery from that kill is exact."""
    store = str(tmp_path / "store")
    run = harness.kill_at_random_time({"store": store}, tmp_path, _AtTheBound(), 600.0)
    print(f"missed: {run.missed}; landed {run.delay_s:.2f} s in, after {run.last_point}")
    assert run.missed and run.missed[0][0] == 540.0, run.missed
    assert run.killed and not run.completed and run.returncode == -signal.SIGKILL
    assert run.delay_s < run.missed[0][1], "the delay that landed is shorter than the job"
    harness.check_recovery(store, reference)


@pytest.mark.slow
def test_many_randomized_sigkills(reference, tmp_path) -> None:
    """Runs of 1-3 successive kills each, at named points (random pass) or random times;
    recovery checked after each kill and at the end of each run. The first kill of each
    of the first 14 runs takes the named points in turn (a fault-free run from scratch
    passes each of them, so each is killed); the rest are drawn at random."""
    rnd, seed = harness.rng("many")
    runs = int(os.environ.get("DKVSTREAM_CRASH_RUNS", "40"))
    named: collections.Counter = collections.Counter()
    positions: set[tuple[str, int]] = set()
    timed: collections.Counter = collections.Counter()
    committed_after_kill: collections.Counter = collections.Counter()
    kills = named_missed = 0
    for i in range(runs):
        store = str(tmp_path / f"run{i}")
        for k in range(rnd.randint(1, 3)):
            latest = harness.runner(store).latest()
            if latest is not None and latest.finished:
                break  # nothing left to kill: a kill can land only in a job that runs
            # The first kill of run i < 14 is at named point i, so every point is killed
            # at least once whatever the seed; every other kill is drawn at random.
            first_of_its_point = k == 0 and i < len(faults.POINTS)
            if first_of_its_point or rnd.random() < 0.7:
                point = faults.POINTS[i] if first_of_its_point else rnd.choice(faults.POINTS)
                # Later kills restart mid-job: aim at passes the rest of the job makes.
                hit = rnd.randint(1, max(1, reference.passes[point] // (k + 1)))
                run = harness.run_driver({"store": store, "fault": [point, hit]}, tmp_path)
                if run.killed:
                    named[point] += 1
                    positions.add((point, hit))
                else:  # the rest of the job passed the point fewer times: it ran to its end
                    named_missed += 1
            else:
                # Retried with a shorter delay when the job ends first: a kill that never
                # lands would count a fault-free run as a crash survived.
                run = harness.kill_at_random_time({"store": store}, tmp_path, rnd,
                                                  reference.seconds)
                timed[f"after {run.last_point}"] += 1
            assert run.killed or run.returncode == 0, run.stderr[-2000:]
            kills += run.killed
            r = harness.runner(store)
            latest = r.latest()
            committed_after_kill[latest.epoch if latest else 0] += 1
            if latest is not None:
                assert harness.state(r.store, r.job.prefix, latest.epoch) == reference.states[latest.epoch]
                harness.assert_named_files_exist(r.store, r.job.prefix)
        harness.check_recovery(store, reference)
        print(f"run {i + 1}/{runs}: {kills} kills so far", flush=True)
    summary = {
        "seed": seed, "runs": runs, "kills": kills,
        "named_points_hit": dict(sorted(named.items())), "distinct_named_points": len(named),
        "distinct_named_positions": len(positions), "named_kills_missed": named_missed,
        "random_time_kills_landed_after": dict(sorted(timed.items())),
        "distinct_random_time_intervals": len(timed),
        "surviving_checkpoint_epochs": dict(sorted(committed_after_kill.items())),
    }
    out = Path(os.environ.get("DKVSTREAM_CRASH_REPORT", tmp_path / "crash-points.json"))
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    assert len(named) == len(faults.POINTS) or runs < len(faults.POINTS), (
        f"named points never killed: {summary}")


@pytest.mark.slow
def test_sigkill_driver_on_spark_then_restart(reference, tmp_path) -> None:
    """The driver runs its tasks on Spark local mode (its own session in the subprocess):
    killed at a random driver-side point, then at a random time; recovered in-process."""
    rnd, seed = harness.rng("spark")
    point = rnd.choice(DRIVER_POINTS)
    hit = rnd.randint(1, max(1, reference.passes[point] // 2))  # leave work for the second kill
    print(f"seed {seed}: Spark driver SIGKILL at pass {hit} of {point}")
    store = str(tmp_path / "store")
    _kill_at(point, hit, store, tmp_path, spark="local[2]")
    run = harness.kill_at_random_time({"store": store, "spark": "local[2]"}, tmp_path, rnd,
                                      8.0)  # Spark epochs take seconds
    print(f"then SIGKILL of the process group {run.delay_s:.2f} s in, after {run.last_point}")
    assert run.killed and not run.completed, run.stdout
    harness.check_recovery(store, reference)
