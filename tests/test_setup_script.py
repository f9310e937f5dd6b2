"""``platform/setup.sh`` reinstalls the project into its own ``.venv`` only: through a
``.venv`` that links to another checkout's venv (a git worktree sharing it), an editable
install would point that venv, and every process using it, at this checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path, shared_venv: bool) -> tuple[Path, Path]:
    """A checkout with the real setup.sh, stub Java/Chromium installers and a venv whose
    python logs its arguments; returns (checkout, log)."""
    log = tmp_path / "python-calls.log"
    venv = tmp_path / "owner" / ".venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    python.chmod(0o755)
    checkout = tmp_path / "checkout"
    (checkout / "platform").mkdir(parents=True)
    shutil.copy(ROOT / "platform" / "setup.sh", checkout / "platform" / "setup.sh")
    for stub in ("install-java.sh", "install-chromium.sh"):
        (checkout / "platform" / stub).write_text("exit 0\n")
    for f in ("pyproject.toml", "setup.py"):
        (checkout / f).write_text("")  # no stamp yet: a reinstall is due
    (checkout / "storage" / "dkv").mkdir(parents=True)
    (checkout / "storage" / "dkv" / "_native.c").write_text("")
    if shared_venv:
        (checkout / ".venv").symlink_to(venv)
    else:
        shutil.copytree(venv, checkout / ".venv", symlinks=True)
    return checkout, log


def _setup(checkout: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout / "platform" / "setup.sh")], check=False, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": "false"})


def test_own_venv_is_reinstalled(tmp_path) -> None:
    checkout, log = _checkout(tmp_path, shared_venv=False)
    done = _setup(checkout)
    assert done.returncode == 0, done.stderr
    assert "-m pip install -q -e .[examples,test,bench]" in log.read_text()
    assert (checkout / ".venv" / ".dkvstream-installed").exists()


def test_linked_venv_of_another_checkout_is_left_alone(tmp_path) -> None:
    checkout, log = _checkout(tmp_path, shared_venv=True)
    done = _setup(checkout)
    assert done.returncode == 0, done.stderr
    assert not log.exists(), f"setup.sh ran the shared venv's python: {log.read_text()}"
    assert "not reinstalling into another checkout's venv" in done.stderr
    assert not (tmp_path / "owner" / ".venv" / ".dkvstream-installed").exists()
