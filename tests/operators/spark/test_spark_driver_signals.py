"""Signals to a Spark driver's whole process group (``systemctl stop`` with
``KillMode=mixed``, Ctrl-C, ``kill -TERM -<pgid>``): ``run_job --continuous`` on local
Spark stops at a checkpoint and exits 0, also when the signal comes during Spark's
start-up, and no Spark process outlives the driver, even one killed with SIGKILL.

Each test starts the driver in a process group of its own and signals that group, as a
service manager does; the live source is ``tests.operators.live_sources.GrowingSource``
and the output is compared with its pandas oracle."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.local_server import pid_alive
from tests.operators import live_sources
from tests.operators.live_sources import EVENTS, reveal

REPO = Path(__file__).resolve().parents[3]
ALL = {"p0": EVENTS, "p1": EVENTS}
# Generous: a process told to exit is given this long before the test fails (this is a
# bound on a hang, not a speed requirement).
EXIT_DEADLINE_S = 120.0

# run_job, with PySpark's gateway launcher wrapped so the driver signals its own process
# group as soon as the JVM is up, while the SparkContext is still being created (under
# both names: a SparkContext that launches the JVM itself calls its module's import).
SIGNAL_DURING_START_UP = """
import os, signal, sys
import pyspark.core.context, pyspark.java_gateway
from dkvstream.operators.tools import run_job

launch = pyspark.java_gateway.launch_gateway

def launch_then_signal(*args, **kwargs):
    gateway = launch(*args, **kwargs)
    os.killpg(0, signal.SIGTERM)
    return gateway

pyspark.java_gateway.launch_gateway = pyspark.core.context.launch_gateway = launch_then_signal
sys.exit(run_job.main(sys.argv[1:]))
"""


def _env(visible: Path) -> dict[str, str]:
    return {**os.environ, live_sources.VISIBLE_FILE_ENV: str(visible),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _run_job_args(root: str) -> list[str]:
    return ["--job", "tests.operators.live_sources:live_job", "--store", root, "--create-store", "--master", "local[2]",
            "--continuous", "--events-per-epoch", "300", "--json"]


def _parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (children, theirs, ...): the JVM and Spark's
    Python daemon and workers."""
    parents = {int(p): _parent_pid(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        todo += children
    return found


def _survivors(pids: list[int]) -> list[str]:
    """The command lines of the ``pids`` still running once they all exited or
    ``EXIT_DEADLINE_S`` passed."""
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            for p in pids if pid_alive(p)]


@contextlib.contextmanager
def _driver(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A Python process running ``args`` in a process group (and session) of its own,
    killed with its group if the test fails before it exits."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
            proc.communicate()


def _assert_output_is_oracle(runner: JobRunner) -> int:
    """Asserts the published output is the oracle of the windows the newest checkpoint's
    watermark closed; returns their count."""
    got = live_sources.output(runner)
    want = live_sources.oracle(runner.job.source, runner.latest().watermark)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_index_type=False)
    return len(want)


def test_run_job_on_spark_stops_at_a_checkpoint_on_a_group_sigterm(tmp_path) -> None:
    """SIGTERM to run_job's whole process group after an epoch committed: the epoch in
    flight commits, the run prints ``stopped`` and exits 0; the newest checkpoint is the
    last epoch printed, the output is the oracle up to its watermark, a restart continues
    from it to the oracle; no Spark process of the driver is left."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)
    root = str(tmp_path / "store")
    lines, spark_processes = [], []
    with _driver(["-m", "dkvstream.operators.tools.run_job", *_run_job_args(root)], _env(visible)) as proc:
        for line in proc.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == "committed":
                spark_processes = _descendants(proc.pid)
                os.killpg(proc.pid, signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=EXIT_DEADLINE_S)
    assert proc.returncode == 0, err
    assert spark_processes, "the driver had no Spark JVM below it"
    assert _survivors(spark_processes) == []
    lines += [json.loads(line) for line in out.splitlines()]
    assert lines[0]["event"] == "started"
    assert re.fullmatch(r"http://[^ /]+:\d+", lines[0]["ui"]), lines[0]  # the Spark UI, on at a free port
    committed = [r["epoch"] for r in lines if r["event"] == "committed"]
    assert committed == list(range(1, len(committed) + 1))
    assert lines[-1] == {"event": "stopped", "epoch": committed[-1], "drained": False}
    assert "run_job: SIGTERM: stopping after the epoch in flight" in err

    runner = JobRunner(live_sources.job(visible), None, root)
    assert runner.latest().epoch == committed[-1]
    _assert_output_is_oracle(runner)
    rest = runner.run()
    assert rest and rest[0].epoch == committed[-1] + 1
    assert runner.latest().source_offsets == ALL
    assert _assert_output_is_oracle(runner) > 0


def test_run_job_on_spark_stops_cleanly_on_a_group_sigterm_during_start_up(tmp_path) -> None:
    """SIGTERM to the group while the SparkContext is being created: start-up finishes,
    no epoch runs, the run prints ``stopped`` (epoch 0) and exits 0; a restart runs the
    job from the start to the oracle."""
    visible = tmp_path / "visible.json"
    reveal(visible, ALL)
    root = str(tmp_path / "store")
    with _driver(["-c", SIGNAL_DURING_START_UP, *_run_job_args(root)], _env(visible)) as proc:
        out, err = proc.communicate(timeout=EXIT_DEADLINE_S)
    assert proc.returncode == 0, err
    assert [r["event"] for r in map(json.loads, out.splitlines())] == ["started", "stopped"]
    assert json.loads(out.splitlines()[-1]) == {"event": "stopped", "epoch": 0, "drained": False}
    assert "run_job: SIGTERM: stopping once started, before any epoch" in err

    runner = JobRunner(live_sources.job(visible), None, root)
    assert runner.latest() is None
    assert runner.run()[0].epoch == 1
    assert _assert_output_is_oracle(runner) > 0


def test_spark_jvm_does_not_outlive_a_driver_killed_with_sigkill(tmp_path) -> None:
    """The JVM is in a session of its own, out of reach of the driver's group: a
    driver killed with SIGKILL (no cleanup runs) still takes the JVM and Spark's Python
    workers with it (the JVM exits when its stdin, the pipe from the driver, closes)."""
    driver = ("from dkvstream.operators.spark.session import get_spark\n"
              "spark = get_spark({'spark.master': 'local[1]'})\n"
              "assert spark.sparkContext.parallelize(range(4), 1).map(lambda x: x + 1).sum() == 10\n"
              "print('up', flush=True)\n"
              "import time; time.sleep(600)\n")
    with _driver(["-c", driver]) as proc:
        assert proc.stdout.readline() == "up\n", proc.stderr.read()
        spark_processes = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=EXIT_DEADLINE_S) == -signal.SIGKILL
    assert len(spark_processes) >= 2  # the JVM and the Python daemon it started
    assert _survivors(spark_processes) == []
