"""The worker-scaling benchmark (``bench/cluster_scaling.py``): ``--quick`` end to end
(its own SeaweedFS, a 1-worker then a 2-worker Spark standalone cluster), and its rate
and ratio arithmetic on hand-made records. The figures are never asserted (shared
machine); what is asserted is that both runs completed, read every event, ran tasks on
each worker's executor and matched the oracle."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from bench.cluster_scaling import (
    EVENTS_PER_SCALE,
    QUICK,
    check_run,
    rates,
    ratios,
    tasks_halved_bound,
    write_plot,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow("starts SeaweedFS and two Spark standalone clusters (70-110 s)")
def test_quick_run_completes_and_matches_oracle(tmp_path) -> None:
    out = tmp_path / "scaling.json"
    # Its SeaweedFS and clusters live under TMPDIR: every process it started names tmp_path.
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cluster_scaling.py"), "--quick", "--json", str(out)],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    left = _processes_naming(str(tmp_path))
    assert not left, f"processes left running by the benchmark: {left}"
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [r["workers"] for r in runs] == [1, 2]
    for r in runs:
        assert "error" not in r, r
        assert r["events"] == EVENTS_PER_SCALE * QUICK["scale"]
        # run_once records a rate only after check_run passed: every executor ran tasks.
        assert len(r["tasks"]) == r["workers"] and all(n > 0 for n in r["tasks"].values())
    assert runs[0]["epochs"] == runs[1]["epochs"] > 1  # the same epoch plan on both clusters
    assert len(report["ratios"]) == 1 and report["ratios"][0]["whole"] is not None
    assert report["setup"]["cpu_count"] >= 1 and report["setup"]["scale"] == QUICK["scale"]
    assert "output equals the oracle" in done.stdout and "2 workers / 1 worker" in done.stdout


def _processes_naming(text: str) -> list[str]:
    """Command lines of running processes whose command line or environment contains
    ``text`` (a worker's executors and their Python workers inherit its environment)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if text.encode() in cmdline or text.encode() in environ:
            args = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {args[:200]}")
    return found


def _committed(events_at: list[tuple[int, float]]) -> list[dict]:
    return [{"event": "committed", "epoch": i, "events": n, "at": at} for i, (n, at) in enumerate(events_at, 1)]


def test_rates_whole_run_and_steady_state() -> None:
    r = rates(_committed([(100, 2.0), (300, 3.0), (300, 5.0)]))
    assert r == {"events": 700, "epochs": 3, "seconds": 5.0, "events_per_s": 140.0, "steady_events_per_s": 200.0}
    assert rates(_committed([(50, 0.5)]))["steady_events_per_s"] is None  # one epoch: no steady state


def test_ratios_pair_runs_in_order_and_skip_failed_pairs() -> None:
    rows = [{"run": 1, "workers": 1, "events_per_s": 100.0, "steady_events_per_s": 120.0, "seconds": 10.0,
             "task_seconds": {"0": 10.0}},
            {"run": 2, "workers": 2, "events_per_s": 150.0, "steady_events_per_s": 240.0},
            {"run": 3, "workers": 1, "error": "RuntimeError: driver exited with 1"},
            {"run": 4, "workers": 2, "events_per_s": 170.0, "steady_events_per_s": 200.0}]
    # Run 1's 10 s were all task time: halving it would double the rate.
    assert ratios(rows) == [{"runs": [1, 2], "whole": 1.5, "steady": 2.0, "tasks_halved": 2.0},
                            {"runs": [3, 4], "whole": None, "steady": None, "tasks_halved": None}]


def test_plot_draws_every_run_and_pair_failed_ones_without_bars(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib comes with the bench extra")
    rows = [{"run": 1, "workers": 1, "events_per_s": 100.0, "steady_events_per_s": 120.0},
            {"run": 2, "workers": 2, "error": "RuntimeError: driver exited with 1"}]
    pairs = [{"runs": [1, 2], "whole": None, "steady": None, "tasks_halved": None}]
    path = tmp_path / "scaling.png"
    write_plot(str(path), {"scale": 1, "cpu_count": 2, "load_start": "0.1 / 0.2 / 0.3"}, rows, pairs)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tasks_halved_bound_keeps_the_drivers_share() -> None:
    # 12 s on one worker, 8 s of them in its tasks:
    # 4 s of driver time stay, the tasks' 8 s become 4 s: 12 / 8.
    assert tasks_halved_bound({"seconds": 12.0, "task_seconds": {"0": 8.0}}) == pytest.approx(1.5)


def test_check_run_refuses_missing_events_an_idle_worker_and_wrong_output(flights_oracle) -> None:
    output = pa.Table.from_pandas(flights_oracle, preserve_index=False)
    records = _committed([(EVENTS_PER_SCALE, 1.0)]) + [{"event": "tasks", "per_executor": {"0": 2, "1": 3}}]
    check_run(records, 2, 1, output, flights_oracle)  # the oracle's own rows pass
    with pytest.raises(AssertionError):
        check_run(records, 2, 1, output.slice(1), flights_oracle)  # one route-day missing
    idle = records[:-1] + [{"event": "tasks", "per_executor": {"0": 5, "1": 0}}]
    with pytest.raises(AssertionError, match="each of the 2 workers"):
        check_run(idle, 2, 1, output, flights_oracle)
    short = _committed([(EVENTS_PER_SCALE - 1, 1.0)]) + [{"event": "tasks", "per_executor": {"0": 2}}]
    with pytest.raises(AssertionError, match="336,775 events"):
        check_run(short, 1, 1, None, flights_oracle)
