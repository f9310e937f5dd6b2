"""``platform/run-live.sh`` end to end: a real broker (Tansu), the producer, the flights
job on local Spark, a drain, the oracle; and that it leaves no process behind, on
success, when the job fails, and on Ctrl-C. Every process the script starts carries
``DKVSTREAM_LIVE_RUN=<its log dir>`` in its environment, so leftovers are found by it.

Also the helpers of the script in ``dkvstream.examples.flights_live`` (progress lines, the
catch-up rule), against hand-made ``run_job`` records."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dkvstream.examples import flights_live
from dkvstream.examples.flights import RouteDailyDelays
from dkvstream.examples.flights_live import flights_live_job, progress_line

ROOT = Path(__file__).resolve().parents[2]
RATE = "100000"  # events/s: the 336,776 flights in about 3.5 s


class FailingRouteDailyDelays(RouteDailyDelays):
    def on_event(self, subject, event) -> None:
        raise RuntimeError("injected operator failure")


def failing_job():
    """``flights_live_job`` whose operator raises on its first event (the job fails)."""
    job = flights_live_job()
    job.operators = [FailingRouteDailyDelays()]
    job.on_operator_error = "fail"
    return job


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # TMPDIR: the script's log directory, kept after a failed run, goes under tmp_path.
    return {**os.environ, "DKVSTREAM_STORE": str(tmp_path / "store"), "DKVSTREAM_LIVE_RATE": RATE,
            "TMPDIR": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _run_dir(stdout: str) -> str:
    found = re.search(r"^logs: (\S+)", stdout, re.MULTILINE)
    assert found, stdout
    return found.group(1)


def _processes_of(run_dir: str) -> list[str]:
    """``pid cmdline`` of the live processes whose environment names this run."""
    marker = f"DKVSTREAM_LIVE_RUN={run_dir}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found


def _assert_nothing_left(run_dir: str) -> None:
    # The script has exited; its children are signalled and waited for, but a JVM may
    # take a moment after its Python parent is gone.
    deadline = time.monotonic() + 30
    while _processes_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_of(run_dir) == []


@pytest.mark.slow("starts Tansu, Spark and the producer: about a minute")
def test_run_live_drains_to_the_oracle_and_stops_everything(tmp_path) -> None:
    proc = subprocess.run(["bash", "platform/run-live.sh", "--fresh"], check=False, cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"equals the pandas oracle \(63,815 rows\): yes", out), out
    assert "job: caught up, all 336,776 flights read" in out
    assert re.search(r"^epoch \d+: 0 events .* drained", out, re.MULTILINE), out
    assert re.search(r"^epoch 1: .* lag [\d,]+/[\d,]+/[\d,]+ events", out, re.MULTILINE), out
    run_dir = _run_dir(out)
    _assert_nothing_left(run_dir)
    assert not Path(run_dir).exists()
    # Again without --fresh: the store holds the drained run; refused, nothing started.
    again = subprocess.run(["bash", "platform/run-live.sh"], check=False, cwd=ROOT, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a run of the job flights_live" in again.stderr
    assert "broker:" not in again.stdout


@pytest.mark.slow("starts Tansu, Spark and the producer: about 30 s")
def test_run_live_fails_when_the_job_fails_and_stops_everything(tmp_path) -> None:
    env = _env(tmp_path, DKVSTREAM_LIVE_JOB="tests.examples.test_run_live:failing_job")
    proc = subprocess.run(["bash", "platform/run-live.sh", "--fresh"], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the job exited before reading everything produced" in proc.stderr
    assert "injected operator failure" in proc.stderr  # the job's log tail
    assert "equals the pandas oracle" not in proc.stdout
    run_dir = _run_dir(proc.stdout)
    _assert_nothing_left(run_dir)
    assert Path(run_dir, "job.err").exists()  # kept for the user


@pytest.mark.slow("starts Tansu, Spark and the producer: about 30 s")
def test_run_live_interrupted_stops_everything(tmp_path) -> None:
    """Ctrl-C (SIGINT to the script's process group) after the first epoch: exit 130,
    nothing left running."""
    proc = subprocess.Popen(["bash", "platform/run-live.sh", "--fresh"], cwd=ROOT,
                            env=_env(tmp_path, DKVSTREAM_LIVE_RATE="20000"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("epoch 1:"):
                os.killpg(proc.pid, signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, "".join(lines) + out + err
    _assert_nothing_left(_run_dir("".join(lines)))


def _record(epoch: int, offsets: dict[str, int], lag: dict[str, int], **kw) -> dict:
    return {"event": "committed", "epoch": epoch, "events": 10, "seconds": 0.5, "drained": False,
            "watermark": 1_357_002_000_000, "source_offsets": offsets,
            "live": {"at_ms": 1_000_000, "lag_events": lag}, **kw}


def test_progress_line_latency_from_the_producer_schedule() -> None:
    """Replay order partitions 0,1,0,2,1 (positions 0..4), 2 records per 100 ms tick at
    20 events/s: partition 1 read to offset 2 means position 4 was read, handed over in
    tick 2, 0.2 s after the first tick."""
    positions = flights_live.newest_positions(np.array([0, 1, 0, 2, 1]))
    record = _record(3, {"flights-0": 1, "flights-1": 2, "flights-2": 0}, {"flights-0": 1, "flights-1": 0,
                                                                            "flights-2": 1})
    line = progress_line(record, positions, first_tick=990.0, rate=20)
    assert line == ("epoch 3: 10 events in 0.50 s, lag 1/0/1 events, latency 9.8 s, "
                    "watermark 2013-01-01 01:00 UTC")
    with_dead = progress_line({**record, "dead_letter": {"total": 1_234, "unparseable_value": 1_234}}, None, None, 20)
    assert with_dead.startswith("epoch 3: 10 events in 0.50 s, lag 1/0/1 events, 1,234 dead letters, watermark")
    drained = progress_line({**record, "drained": True, "watermark": 2**63 - 1}, None, None, 20)
    assert drained.endswith("lag 1/0/1 events, drained: watermark +inf, every window emitted")


def test_watch_returns_once_everything_produced_was_read(tmp_path) -> None:
    """Caught up = the producer's final line and an epoch with offsets summing to it and
    lag 0; an epoch with lag left, or before the producer is done, is not enough; a job
    that exits first fails."""
    job_out, producer_out = tmp_path / "job.out", tmp_path / "producer.out"
    producer_out.write_text(json.dumps({"produced": 6, "first_tick": 1.0, "seconds": 1.0, "rate": 6.0}) + "\n")
    job_out.write_text("\n".join(json.dumps(r) for r in [
        {"event": "started", "app_id": "a", "ui": None, "master": "local[2]"},
        _record(1, {"flights-0": 3, "flights-1": 3}, {"flights-0": 0, "flights-1": 1}),
    ]) + "\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        # The job (sleeper) runs on, lag is left: still watching when the job "exits".
        assert flights_live.watch(str(job_out), str(producer_out), dead.pid, sleeper.pid, 6.0, poll_s=0.01) == 1
        with job_out.open("a") as f:
            f.write(json.dumps(_record(2, {"flights-0": 3, "flights-1": 3},
                                       {"flights-0": 0, "flights-1": 0})) + "\n")
        assert flights_live.watch(str(job_out), str(producer_out), sleeper.pid, dead.pid, 6.0, poll_s=0.01) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
