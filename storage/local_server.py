"""A throw-away server process on loopback, for tests and local development.

The one launcher behind the SeaweedFS S3 server (``dkvstream.storage.objectstore.seaweedfs``) and
the Kafka-compatible broker (``dkvstream.operators.io.kafka_broker``): a subclass gives the command
line and a readiness probe; ``LocalServer`` owns the process. It starts the process in
its own session with its output appended to a log file in the server's directory, polls
the probe until the server answers (failing early, with the log's tail, if the process
exits), and stops it with SIGTERM, then SIGKILL after ``stop_timeout_s``. Only the
process the object started is ever signalled, by pid.

The command-line side (``python -m ... start|stop|status``) keeps a started server's pid
in a JSON state file: ``recorded`` reads it back while that pid runs and
``stop_recorded`` stops it the same way.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from dkvstream.storage.errors import DkvstreamError

LOOPBACK = "127.0.0.1"
S = TypeVar("S", bound="LocalServer")  # typing.Self needs Python 3.11


class LocalServerError(DkvstreamError, RuntimeError):
    """Raised when a local server cannot be found, started or reached."""


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports that were free on ``host`` a moment ago.

    All sockets are held open until every port is chosen, so the ports are distinct;
    another process may still take one before the server binds it (then start fails
    with a clear error and can be retried).
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs. An exited child nobody reaped yet (a zombie)
    counts as gone; a process of another user counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): signal 0 reached it
        return True


def kill_when_parent_dies() -> None:
    """Runs in the child before exec: PR_SET_PDEATHSIG(SIGKILL) (Linux only); a prctl
    only, no locks, so safe in a threaded parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it still runs after ``timeout_s`` seconds, and
    return once it is gone. For a process this one did not start as a child (the command
    line's server): a child's exit is awaited with ``Popen.wait`` (``LocalServer.stop``).

    Raises:
        LocalServerError: ``pid`` still runs 10 s after SIGKILL (uninterruptible I/O).
    """
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        if not pid_alive(pid):
            return
        os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if pid_alive(pid):
        raise LocalServerError(f"process {pid} still runs 10 s after SIGKILL")


class LocalServer(ABC):
    """One server process on loopback, started and stopped by this object.

    Subclasses set ``program`` (the name in errors and of the log, ``<program>.log``)
    and ``error`` (the exception they raise), and give ``command`` and ``readiness``.

    Args:
        data_dir: the server's directory, its working directory and that of its log;
            created if missing.
        start_timeout_s / stop_timeout_s: how long to wait for readiness / for a
            graceful exit before SIGKILL, s.
        die_with_parent: on Linux, the kernel SIGKILLs the server when the process that
            started it dies (a killed test run leaves no server behind; strictly, when
            the thread that called ``start`` ends, so start it from a long-lived thread);
            the command lines turn it off, their server outlives the command.
    """

    program: ClassVar[str]
    error: ClassVar[type[Exception]] = LocalServerError
    probe_interval_s: ClassVar[float] = 0.1

    def __init__(self, data_dir: str | Path, *, start_timeout_s: float, stop_timeout_s: float = 5.0,
                 die_with_parent: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen | None = None

    @abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    @abstractmethod
    def readiness(self) -> Callable[[], str | None]:
        """A probe, made once per ``start``: it returns None once the server serves,
        else why not yet (it is called again after ``probe_interval_s``)."""

    def prepare(self) -> None:
        """Before the process starts (``data_dir`` exists): files the server reads."""

    def cleanup(self) -> None:
        """After the process stopped: what it leaves behind outside ``data_dir``."""

    @property
    def pid(self) -> int | None:
        """Pid of the running server process, or None."""
        return self.process.pid if self.process and self.process.poll() is None else None

    @property
    def log_path(self) -> Path:
        """The server's output, appended across restarts: ``data_dir/<program>.log``."""
        return self.data_dir / f"{self.program}.log"

    def start(self: S) -> S:
        """Start the process and wait until the probe says it serves. No-op if running.

        Returns:
            self.

        Raises:
            ``error``: the process exited or was not ready in ``start_timeout_s`` (the
                message ends with the tail of the log).
        """
        if self.pid is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self.process = subprocess.Popen(
                self.command(), cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=kill_when_parent_dies if self.die_with_parent else None)
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        probe = self.readiness()
        deadline = time.monotonic() + self.start_timeout_s
        last = "no attempt"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.error(f"{self.program} exited with status {self.process.returncode}{self.log_tail()}")
            last = probe()
            if last is None:
                return
            time.sleep(self.probe_interval_s)
        raise self.error(f"{self.program} in {self.data_dir} not ready after {self.start_timeout_s:.0f} s "
                         f"(last error: {last}){self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines under a header line, for error messages; ""
        if there is no log."""
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- {self.log_path.name} (tail) ---\n" + "\n".join(tail)

    def stop(self) -> None:
        """Stop the process: SIGTERM, then SIGKILL after ``stop_timeout_s``; then
        ``cleanup``. Idempotent. Only the process this object started is signalled (by
        pid; it leads its own session)."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self.cleanup()

    def detach(self) -> int:
        """Forget the running process, which outlives this object (the command line's
        ``start``); its pid, for a state file."""
        pid, self.process = self.process.pid, None
        return pid

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def recorded(state: Path) -> dict | None:
    """The record (a JSON object with ``pid``) of the state file ``state`` if that pid
    still runs, else None."""
    if state.exists():
        info = json.loads(state.read_text())
        if pid_alive(info["pid"]):
            return info
    return None


def stop_recorded(state: Path) -> dict | None:
    """Stops the process the state file ``state`` records (``stop_pid``, waiting its
    ``stop_timeout_s``, default 5 s) and removes the file.

    Returns:
        the record, or None if there is no state file (nothing started).
    """
    if not state.exists():
        return None
    info = json.loads(state.read_text())
    stop_pid(info["pid"], float(info.get("stop_timeout_s", 5.0)))
    state.unlink()
    return info
