"""The driver coordinates and never carries events: the same job with ten times the
events per epoch makes the driver receive no more bytes from its tasks and use no more
memory (within 10 %). Each run is its own driver process (peak RSS is per process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EPOCHS = 3
SMALL = 30_000  # events per epoch; the large run reads ten times as many


def _run(store: Path, events_per_epoch: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.operators.driver_load", str(store), str(events_per_epoch), str(EPOCHS)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
        check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_driver_bytes_and_memory_do_not_grow_with_events(tmp_path) -> None:
    small = _run(tmp_path / "small", SMALL)
    large = _run(tmp_path / "large", 10 * SMALL)
    print("small", small, "large", large)
    assert small["events"] == [SMALL] * EPOCHS
    assert large["events"] == [10 * SMALL] * EPOCHS  # the large run did read 10x
    for a, b in zip(small["driver_bytes_received"], large["driver_bytes_received"]):
        assert 0 < b <= 1.1 * a, (small, large)
    assert large["peak_rss_kib"] <= 1.1 * small["peak_rss_kib"], (small, large)
