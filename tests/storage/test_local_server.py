"""``dkvstream.storage.local_server``: the launcher of the SeaweedFS server and the Kafka-compatible
broker, on small Python servers whose behaviour each test chooses."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from dkvstream.storage.local_server import (
    LOOPBACK,
    LocalServer,
    LocalServerError,
    free_ports,
    pid_alive,
    recorded,
    stop_recorded,
)


class HttpServer(LocalServer):
    """``python -m http.server`` on a free port; ready once it serves ``GET /``."""

    program = "http"

    def __init__(self, data_dir: Path, **kwargs) -> None:
        super().__init__(data_dir, **{"start_timeout_s": 30.0, **kwargs})
        self.port = free_ports(1)[0]
        self.cleanups = 0

    def command(self) -> list[str]:
        return [sys.executable, "-m", "http.server", str(self.port), "--bind", LOOPBACK]

    def readiness(self) -> Callable[[], str | None]:
        def probe() -> str | None:
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=1):
                    return None
            except OSError as e:
                return str(e)
        return probe

    def cleanup(self) -> None:
        self.cleanups += 1


class Script(LocalServer):
    """A Python script as the server; ready once its log holds a line ``ready``."""

    program = "script"

    def __init__(self, data_dir: Path, code: str, **kwargs) -> None:
        super().__init__(data_dir, **{"start_timeout_s": 30.0, **kwargs})
        self.code = code

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]

    def readiness(self) -> Callable[[], str | None]:
        return lambda: None if "ready" in self.log_path.read_text().splitlines() else "no 'ready' line yet"


IGNORES_SIGTERM = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "print('ready', flush=True)\ntime.sleep(120)\n")


def test_start_serves_and_stop_ends_the_process(tmp_path: Path) -> None:
    server = HttpServer(tmp_path / "srv")
    with server:
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        with urllib.request.urlopen(f"http://{LOOPBACK}:{server.port}/") as response:
            assert response.status == 200
        assert server.start() is server and server.pid == pid  # already running: no second process
    assert server.pid is None and not pid_alive(pid)
    assert server.cleanups == 1
    assert server.log_path == tmp_path / "srv" / "http.log" and server.log_path.exists()
    server.stop()  # idempotent
    assert server.cleanups == 1


def test_a_process_that_exits_fails_start_with_its_log(tmp_path: Path) -> None:
    server = Script(tmp_path, "import sys\nprint('bad flag --x', flush=True)\nsys.exit(3)\n")
    with pytest.raises(LocalServerError, match=r"(?s)script exited with status 3.*script.log \(tail\).*bad flag --x"):
        server.start()
    assert server.pid is None


def test_a_server_never_ready_is_stopped_and_says_why(tmp_path: Path) -> None:
    server = Script(tmp_path, "import time\ntime.sleep(120)\n", start_timeout_s=0.5)
    with pytest.raises(LocalServerError, match="not ready after .* no 'ready' line yet"):
        server.start()
    assert server.process is None  # stopped, not left running


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    server = Script(tmp_path, IGNORES_SIGTERM, stop_timeout_s=0.2).start()
    process = server.process
    server.stop()
    assert process.returncode == -9  # SIGKILL after stop_timeout_s


def test_pid_alive_counts_a_zombie_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not reaped
        time.sleep(0.01)
    os.kill(child.pid, 0)  # the pid still exists...
    assert not pid_alive(child.pid)  # ...but nothing runs
    child.wait()
    assert not pid_alive(child.pid)
    assert pid_alive(os.getpid())


def test_a_recorded_server_is_found_and_stopped(tmp_path: Path) -> None:
    """The command lines' path: a detached server, its pid in a state file."""
    server = Script(tmp_path, IGNORES_SIGTERM, die_with_parent=False).start()
    process = server.process
    try:
        pid = server.detach()
        assert server.process is None and server.pid is None
        state = tmp_path / "server.json"
        state.write_text(json.dumps({"pid": pid, "stop_timeout_s": 0.2}))
        assert recorded(state) == {"pid": pid, "stop_timeout_s": 0.2}
        assert stop_recorded(state) == {"pid": pid, "stop_timeout_s": 0.2}
        assert not state.exists() and not pid_alive(pid)
        assert recorded(state) is None and stop_recorded(state) is None
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert process.returncode == -9


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as s:
            s.bind((LOOPBACK, port))
