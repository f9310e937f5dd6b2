"""``platform/setup.sh`` reinstalls the project into its own ``.venv`` only: through a
``.venv`` that links to another checkout's venv (a git worktree sharing it), an editable
install would point that venv, and every process using it, at this checkout. It needs no
browser (Chromium is the UI test's, installed by ``platform/test.sh``), says what it does,
and ``platform/apt-install.sh`` waits while apt's lock is busy instead of failing."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

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
        (checkout / "platform" / stub).write_text(f"echo {stub} >> {log}\n")
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
    calls = log.read_text()
    assert "-m pip install -q -e .[examples,test,bench]" in calls
    assert "install-java.sh" in calls and "install-chromium.sh" not in calls  # a job needs no browser
    assert "setup: installing dkvstream" in done.stderr and "setup: done" in done.stderr
    assert (checkout / ".venv" / ".dkvstream-installed").exists()
    again = _setup(checkout)
    assert again.returncode == 0 and "setup: .venv is up to date" in again.stderr


def test_linked_venv_of_another_checkout_is_left_alone(tmp_path) -> None:
    checkout, log = _checkout(tmp_path, shared_venv=True)
    done = _setup(checkout)
    assert done.returncode == 0, done.stderr
    assert "-m pip" not in log.read_text(), f"setup.sh ran the shared venv's python: {log.read_text()}"
    assert "not reinstalling into another checkout's venv" in done.stderr
    assert not (tmp_path / "owner" / ".venv" / ".dkvstream-installed").exists()


def _fake_apt(tmp_path: Path, busy_calls: int) -> tuple[dict, Path]:
    """A PATH whose ``apt-get`` fails with apt's lock error ``busy_calls`` times, then
    succeeds, logging every call; and ``sleep`` that returns at once."""
    bin_dir, log, count = tmp_path / "bin", tmp_path / "apt.log", tmp_path / "count"
    bin_dir.mkdir()
    count.write_text("0")
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
n=$(cat {count}); echo $((n + 1)) > {count}
echo "apt-get $*" >> {log}
if [ "$n" -lt {busy_calls} ]; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
""")
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DKVSTREAM_APT_WAIT_S": "20"}, log


def test_apt_install_waits_while_apts_lock_is_busy(tmp_path) -> None:
    """A busy lock is waited for with a message naming it; the install then runs."""
    if os.getuid() != 0:
        pytest.skip("the fake apt-get runs through sudo when not root")
    env, log = _fake_apt(tmp_path, busy_calls=2)
    done = subprocess.run(["bash", str(ROOT / "platform" / "apt-install.sh"), "a test", "pkg-a"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "apt is busy" in done.stderr and "held by process 4242" in done.stderr
    assert log.read_text().splitlines() == ["apt-get update -q"] * 3 + [
        "apt-get install -y -q --no-install-recommends pkg-a"]


def test_apt_install_gives_up_on_a_lock_held_too_long_with_advice(tmp_path) -> None:
    if os.getuid() != 0:
        pytest.skip("the fake apt-get runs through sudo when not root")
    env, log = _fake_apt(tmp_path, busy_calls=1000)
    done = subprocess.run(["bash", str(ROOT / "platform" / "apt-install.sh"), "a test", "pkg-a"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert "still held after 20 s" in done.stderr and "run again" in done.stderr
    assert "install" not in log.read_text()
