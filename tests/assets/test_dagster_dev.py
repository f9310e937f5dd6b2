"""End to end: ``dagster dev`` (webserver, daemon, code server) on loopback with a
temporary DAGSTER_HOME; the flights job launched through the GraphQL API on real Spark;
the compaction sensor starts a compaction run while the job runs and the cleanup sensor
a cleanup run; a headless Chromium looks at the checkpoint asset's page.

Oracles: every published compaction result's output tables verify, the newest
checkpoint's files all exist and verify (the cleanup raced the running job), the number
of checkpoint materializations equals the epochs run. The screenshot goes to the test's
temporary directory, or with ``DKVSTREAM_UPDATE_DOCS=1`` to
``docs/dagster-checkpoint-asset.png`` (the README's picture).

A second ``dagster dev`` serves a live job (``tests.assets.live_definitions``, no
Spark): its continuous run is terminated through the GraphQL API, as the UI's
"Terminate" does, after 2 committed epochs. Oracles: the run ends SUCCESS, the epochs
Dagster recorded are 1..n with n the store's newest checkpoint, and no epoch lease is
left (nothing was in flight when the run ended).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
DOCS_SCREENSHOT = ROOT / "docs" / "dagster-checkpoint-asset.png"
EPOCHS = 6

pytestmark = pytest.mark.slow("long run (4 to 8 minutes)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dagster:
    """GraphQL over HTTP against the webserver at ``base``."""

    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, text: str, variables: dict | None = None) -> dict:
        r = requests.post(f"{self.base}/graphql", json={"query": text, "variables": variables or {}}, timeout=30)
        r.raise_for_status()
        body = r.json()
        assert "errors" not in body, body["errors"]
        return body["data"]

    def runs(self, job: str) -> list[dict]:
        data = self.query("""query($f: RunsFilter) { runsOrError(filter: $f) {
            ... on Runs { results { runId status tags { key value } } } } }""", {"f": {"pipelineName": job}})
        return data["runsOrError"]["results"]

    def wait_for_run(self, job: str, timeout_s: float, done=("SUCCESS",)) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for run in self.runs(job):
                assert run["status"] not in ("FAILURE", "CANCELED"), f"{job} run {run['runId']} {run['status']}"
                if run["status"] in done:
                    return run
            time.sleep(2)
        raise AssertionError(f"no {job} run reached {done} within {timeout_s} s: {self.runs(job)}")


@contextmanager
def _dagster_dev(home: Path, workspace: Path, env: dict[str, str]):
    """``dagster dev`` on a free loopback port with ``workspace``, DAGSTER_HOME ``home``
    (the repository's ``dagster.yaml``, storage moved into ``home``) and ``env`` added
    to the environment; yields a ``Dagster`` client once the webserver answers."""
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text().replace(".dagster_home", str(home)))
    port = _free_port()
    log = open(home / "dagster-dev.log", "w")  # noqa: SIM115 - the process writes it until the finally
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "dagster"), "dev", "-w", str(workspace),
                             "-h", "127.0.0.1", "-p", str(port)],
                            cwd=ROOT, env={**os.environ, "DAGSTER_HOME": str(home), **env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (home / "dagster-dev.log").read_text()[-3000:]
            try:
                if requests.get(f"{base}/server_info", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "dagster dev did not come up in 120 s"
            time.sleep(1)
        yield Dagster(base)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # the process group this fixture started; dagster dev's Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # code servers and run workers left in the group
        except ProcessLookupError:
            pass
        log.close()


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    home = tmp_path_factory.mktemp("dagster_home")
    store = home / "store"
    env = {"DKVSTREAM_STORE": str(store),
           "DKVSTREAM_EVENTS_PER_EPOCH": "25000", "DKVSTREAM_SENSOR_INTERVAL_S": "5",
           # Small memtables make level-0 tables pile up within a few epochs, and a short
           # retention makes the cleanup sensor fire while the job still runs.
           "DKVSTREAM_DKV_MEMTABLE_BYTES": str(256 << 10), "DKVSTREAM_DKV_RETAIN_CHECKPOINTS": "3",
           "SPARK_CONF_DIR": str(ROOT / "platform" / "conf"), "PYSPARK_PYTHON": str(ROOT / ".venv" / "bin" / "python")}
    with _dagster_dev(home, ROOT / "workspace.yaml", env) as dagster:
        yield dagster, store


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                    reason=f"the UI screenshot needs Chromium at {CHROMIUM}: run bash platform/install-chromium.sh")
def test_dagster_dev_runs_flights_and_sensors_compact_and_clean_up(dagster_dev, tmp_path) -> None:
    from dagster_graphql import DagsterGraphQLClient

    from dkvstream.assets.checkpoints import verify_checkpoint
    from dkvstream.operators.runtime.checkpoints import latest_checkpoint
    from dkvstream.storage.dkv.remote_compaction import load_result
    from dkvstream.storage.dkv.verify import verify_table
    from dkvstream.storage.objectstore import open_object_store

    dagster, store_root = dagster_dev
    port = int(dagster.base.rsplit(":", 1)[1])
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    run_id = client.submit_job_execution(
        "flights", run_config={"ops": {"run_flights": {"config": {"max_epochs": EPOCHS}}}})

    compaction = dagster.wait_for_run("compaction", timeout_s=600)
    tags = {t["key"]: t["value"] for t in compaction["tags"]}
    assert tags["dagster/sensor_name"] == "flights_compaction_sensor" and tags["dkvstream/job"] == "flights"
    flights = dagster.wait_for_run("flights", timeout_s=600)
    assert flights["runId"] == run_id
    dagster.wait_for_run("garbage_collection", timeout_s=300)

    store = open_object_store(str(store_root))
    results = [k for k in store.list("jobs/flights/state/") if "/compactions/" in k and k.endswith(".json")]
    assert results, "the compaction run published no result"
    for key in results:
        for table in load_result(store, key).outputs:
            verify_table(store, table)
    newest = latest_checkpoint(store, "jobs/flights")
    assert newest.epoch == EPOCHS
    report = verify_checkpoint(store, "jobs/flights", newest)
    assert report.ok, report.errors

    # The job installs the published results at its next epoch.
    client.submit_job_execution("flights", run_config={"ops": {"run_flights": {"config": {"max_epochs": 1}}}})
    deadline = time.monotonic() + 420
    while [r["status"] for r in dagster.runs("flights")] != ["SUCCESS", "SUCCESS"]:
        assert time.monotonic() < deadline and "FAILURE" not in str(dagster.runs("flights"))
        time.sleep(2)
    installed = latest_checkpoint(store, "jobs/flights")
    assert installed.epoch == EPOCHS + 1 and installed.metrics["remote_compactions"]["installed"] >= 1
    assert verify_checkpoint(store, "jobs/flights", installed).ok

    data = dagster.query("""{ assetOrError(assetKey: {path: ["flights_checkpoint"]}) {
        ... on Asset { assetMaterializations(limit: 100) { metadataEntries { label } } } } }""")
    materializations = data["assetOrError"]["assetMaterializations"]
    assert len(materializations) == EPOCHS + 1
    assert {"L0_tables", "size_amplification_max_range", "events_per_s"} <= {
        e["label"] for e in materializations[0]["metadataEntries"]}

    update_docs = os.environ.get("DKVSTREAM_UPDATE_DOCS") == "1"
    _screenshot(dagster.base, DOCS_SCREENSHOT if update_docs else tmp_path / "checkpoint-asset.png")


def _screenshot(base: str, path: Path) -> None:
    from playwright.sync_api import sync_playwright

    path.parent.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{base}/assets/flights_checkpoint?view=events", wait_until="networkidle")
            page.get_by_text(f"epoch {EPOCHS + 1}").first.wait_for(timeout=60_000)
            skip = page.get_by_role("button", name="Skip")  # first-visit newsletter dialog
            if skip.count():
                skip.first.click()
            page.screenshot(path=str(path))
            assert "flights_checkpoint" in page.inner_text("body")
        finally:
            browser.close()
    assert path.stat().st_size > 10_000


def test_dagster_dev_terminating_a_continuous_run_stops_it_at_a_checkpoint(tmp_path) -> None:
    from dagster_graphql import DagsterGraphQLClient

    from dkvstream.operators.runtime.checkpoints import latest_checkpoint
    from dkvstream.operators.runtime.control import read_lease
    from dkvstream.storage.objectstore import open_object_store
    from tests.assets.live_job import NAME, PREFIX

    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: tests.assets.live_definitions\n"
                         f"      working_directory: {ROOT}\n")
    store_root = tmp_path / "store"
    with _dagster_dev(tmp_path, workspace, {"DKVSTREAM_STORE": str(store_root)}) as dagster:
        port = int(dagster.base.rsplit(":", 1)[1])
        run_id = DagsterGraphQLClient("127.0.0.1", port_number=port).submit_job_execution(NAME)

        def recorded() -> list[int]:
            data = dagster.query("""query($key: [String!]!) { assetOrError(assetKey: {path: $key}) {
                ... on Asset { assetMaterializations(limit: 100) { runId metadataEntries {
                    label ... on IntMetadataEntry { intValue } } } } } }""", {"key": [f"{NAME}_checkpoint"]})
            return sorted(e["intValue"] for m in data["assetOrError"]["assetMaterializations"]
                          if m["runId"] == run_id for e in m["metadataEntries"] if e["label"] == "epoch")

        def status() -> str:
            return dagster.query("""query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }""",
                                 {"id": run_id})["runOrError"]["status"]

        deadline = time.monotonic() + 180
        while len(recorded()) < 2:
            assert status() in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED"), status()
            assert time.monotonic() < deadline, "no 2 epochs within 180 s"
            time.sleep(0.5)
        data = dagster.query("""mutation($id: String!) { terminateRun(runId: $id) { __typename } }""",
                             {"id": run_id})
        assert data["terminateRun"]["__typename"] == "TerminateRunSuccess"
        while status() not in ("SUCCESS", "FAILURE", "CANCELED"):
            assert time.monotonic() < deadline, f"run still {status()} after the termination"
            time.sleep(0.5)
        assert status() == "SUCCESS"
        epochs = recorded()
        store = open_object_store(str(store_root))
        assert epochs == list(range(1, len(epochs) + 1)) and epochs[-1] == latest_checkpoint(store, PREFIX).epoch
        assert read_lease(store, PREFIX) is None
        data = dagster.query("""query($key: [String!]!) { assetOrError(assetKey: {path: $key}) {
            ... on Asset { assetMaterializations(limit: 1) { metadataEntries { label } } } } }""",
                             {"key": [f"{NAME}_checkpoint"]})
        labels = {e["label"] for e in data["assetOrError"]["assetMaterializations"][0]["metadataEntries"]}
        assert {"lag_events", "lag_ms_max", "processing_events_per_s", "watermark_delay_ms"} <= labels
