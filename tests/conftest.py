"""Fixtures shared by all tests: one Spark session per test run, the flights oracle
and the comparison of the flights sink with it."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import settings

from dkvstream.examples.flights_oracle import assert_equals_oracle
from dkvstream.operators.spark.session import ensure_python_workers_use_this_interpreter
from tests.ci_env import in_ci

ensure_python_workers_use_this_interpreter()

# Tests never write into the clone's own Dagster instance (.dagster_home) or store
# (.dkvstream): both go to a directory of this run, set before anything reads them. The
# instance settings are the repository's dagster.yaml with its directories moved there.
ROOT = Path(__file__).resolve().parents[1]
_SANDBOX = Path(tempfile.mkdtemp(prefix="dkvstream-tests-"))
_CLONE_STATE = (ROOT / ".dagster_home", ROOT / ".dkvstream")
os.environ["DAGSTER_HOME"] = str(_SANDBOX / "dagster_home")
os.environ["DKVSTREAM_STORE"] = str(_SANDBOX / "store")
(_SANDBOX / "dagster_home").mkdir()
(_SANDBOX / "dagster_home" / "dagster.yaml").write_text(
    re.sub(r"base_dir: \.dagster_home", f"base_dir: {_SANDBOX / 'dagster_home'}", (ROOT / "dagster.yaml").read_text()))


def _listing(paths: tuple[Path, ...]) -> set[tuple[str, int]]:
    """(path, mtime in ns) of every file under ``paths``: what a test run must not change."""
    return {(str(f), f.stat().st_mtime_ns) for p in paths if p.exists() for f in p.rglob("*") if f.is_file()}


_CLONE_BEFORE = _listing(_CLONE_STATE)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the run when a test wrote into the clone's Dagster instance or store."""
    changed = sorted(_listing(_CLONE_STATE) ^ _CLONE_BEFORE)
    if changed:
        print(f"\nconftest: tests wrote into the clone's own Dagster instance or store: "
              f"{[p for p, _ in changed][:10]}; a test must use tmp_path or the run's sandbox")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(_SANDBOX, ignore_errors=True)

# CI explores the same examples on every run (a red CI is then reproducible, never a
# coin toss); developers' runs keep exploring new ones. Hypothesis loads its own "ci"
# profile whenever CI is set at all (CI=false too), so the profile is chosen here.
# Neither profile has Hypothesis's per-example deadline: on a shared machine it is a timed
# assertion that fails for the machine's load, not for the code.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if in_ci() else "dev")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` are skipped unless the ``-m`` expression selects ``slow``, so
    a plain ``pytest`` runs only the fast default suite (CI runs ``-m slow`` as a second
    step). ``@pytest.mark.slow("why")`` puts the why into the skip reason."""
    markexpr = config.getoption("markexpr") or ""
    if "slow" in markexpr and "not slow" not in markexpr:
        return
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is not None:
            why = marker.args[0] if marker.args else "long run"
            item.add_marker(pytest.mark.skip(reason=f"{why}: select it with -m slow"))


@pytest.fixture(autouse=True)
def _faults_disarmed():
    """No fault point armed, callback or trace outlives the test that set it
    (``dkvstream.storage.faults``: the registry is per process)."""
    yield
    from dkvstream.storage import faults

    faults.disarm_all()


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by the whole run (starting one takes 10-20 s)."""
    from dkvstream.operators.spark.session import get_spark

    session = get_spark({"spark.master": "local[2]"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def flights_oracle() -> pd.DataFrame:
    """The spec's pandas oracle over the full data set."""
    from dkvstream.examples.flights_oracle import route_daily_delays_oracle

    return route_daily_delays_oracle()


@pytest.fixture(scope="session")
def check_flights_output(flights_oracle):
    """``check(output_table)`` asserts the flights sink equals the oracle."""
    return lambda output: assert_equals_oracle(output, flights_oracle)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real SeaweedFS S3 server on free loopback ports for the whole run
    (``dkvstream.storage.objectstore.seaweedfs.SeaweedFSServer``: ``.endpoint_url``, ``.bucket``,
    ``.env()``, ``.restart()``). While it runs, the AWS environment variables point at
    it, so ``open_object_store("s3://<bucket>/...")`` works in this process and in
    Spark workers (a session started earlier needs them in
    ``spark.sparkContext.environment``)."""
    from dkvstream.storage.objectstore.seaweedfs import SeaweedFSServer

    server = SeaweedFSServer(tmp_path_factory.mktemp("seaweedfs"), stop_timeout_s=3.0)
    server.start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Kafka-compatible broker (Tansu, ``dkvstream.operators.io.kafka_broker.TansuBroker``:
    ``.bootstrap``, ``.pid``) on a free loopback port for the whole run, in-memory
    storage; tests create their own topics (``tests/operators/io/test_kafka.py``). At teardown the
    broker is stopped and its process must be gone."""
    from dkvstream.operators.io.kafka_broker import TansuBroker
    from dkvstream.storage.local_server import pid_alive

    broker = TansuBroker(tmp_path_factory.mktemp("tansu"), stop_timeout_s=3.0).start()
    pid = broker.pid
    try:
        yield broker
    finally:
        broker.stop()
        assert not pid_alive(pid), f"tansu (pid {pid}) still running after stop"


@pytest.fixture
def s3_store(s3_server, request):
    """An empty ``S3ObjectStore`` under a prefix unique to the test, in the server's bucket."""
    import re
    import uuid

    from dkvstream.storage.objectstore.s3 import S3ObjectStore

    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]
    return S3ObjectStore(
        s3_server.bucket, f"tests/{name}-{uuid.uuid4().hex[:8]}",
        endpoint_url=s3_server.endpoint_url, region=s3_server.region,
        access_key_id=s3_server.access_key, secret_access_key=s3_server.secret_key)
