"""``dkvstream.operators.spark.daemon``: Spark's Python daemon imports the task modules before it
forks workers, only while it is single-threaded, and otherwise falls back to pyspark's
plain daemon.

The oracle for "imported in the daemon" is the daemon's memory map: pyspark's own daemon
never loads Arrow's shared library, ours does before any fork. The oracle for "safe to
fork" is the daemon's OS thread count: 1. A worker inherits the daemon's frozen
objects (``gc.get_freeze_count()``), which its collections skip, and the pyspark the
driver imported (the installed package, not Spark's shipped ``pyspark.zip``)."""
from __future__ import annotations

import gc
import os
import struct
import subprocess
import sys
import time

import pyspark
import pyspark.worker
import pytest
from pyspark import cloudpickle

from dkvstream.operators.spark.daemon import without_shipped_zips
from dkvstream.operators.spark.session import DAEMON_ENV

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark workers cannot import tests


def _process_facts(pid: int) -> dict:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode()
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        maps = f.read()
    return {"cmdline": cmdline, "threads": len(os.listdir(f"/proc/{pid}/task")),
            "arrow_loaded": "libarrow.so" in maps}


def _parent_facts(partition):
    list(partition)  # consume the input, or pyspark does not reuse the worker
    yield {**_process_facts(os.getppid()), "worker_frozen_objects": gc.get_freeze_count(),
           "pyspark_worker_file": sys.modules["pyspark.worker"].__file__}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_spark_workers_fork_from_a_single_threaded_daemon_that_imported_arrow(spark) -> None:
    facts = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(_parent_facts).collect()
    assert len(facts) == 2
    for daemon in facts:
        assert "-m dkvstream.operators.spark.daemon" in daemon["cmdline"], daemon
        assert daemon["threads"] == 1, daemon
        assert daemon["arrow_loaded"], daemon
        assert daemon["worker_frozen_objects"] > 10_000, daemon  # the libraries' objects
        assert daemon["pyspark_worker_file"] == pyspark.worker.__file__, daemon  # not from the zip


def _start_daemon(env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "dkvstream.operators.spark.daemon", "pyspark.worker"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    port = struct.unpack("!i", proc.stdout.read(4))[0]  # the daemon is listening
    assert 0 < port < 65536
    return proc


def _stop(proc: subprocess.Popen) -> str:
    proc.stdin.close()  # Spark stops its daemon by closing stdin
    proc.wait(timeout=30)
    return proc.stderr.read().decode()


def _daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DAEMON_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra.pop("PYTHONPATH", ""), os.getcwd()) if p)
    env.update(extra)
    return env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_daemon_preloads_when_its_environment_keeps_imports_thread_free() -> None:
    proc = _start_daemon(_daemon_env(**DAEMON_ENV))
    try:
        facts = _process_facts(proc.pid)
    finally:
        err = _stop(proc)
    assert "-m dkvstream.operators.spark.daemon" in facts["cmdline"], (facts, err)
    assert facts["threads"] == 1 and facts["arrow_loaded"], (facts, err)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_daemon_falls_back_to_pyspark_daemon_when_a_preload_starts_a_thread(tmp_path) -> None:
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    proc = _start_daemon(_daemon_env(**DAEMON_ENV, PYTHONPATH=str(tmp_path),
                                     DKVSTREAM_SPARK_PRELOAD="starts_a_thread"))
    try:
        deadline = time.monotonic() + 10
        facts = _process_facts(proc.pid)
        while "pyspark.daemon" not in facts["cmdline"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the port is written after the exec, so this is a formality
            facts = _process_facts(proc.pid)
    finally:
        err = _stop(proc)
    # exec replaced the process: same pid, pyspark's daemon, which imports after fork.
    assert "-m pyspark.daemon pyspark.worker" in facts["cmdline"], (facts, err)
    assert facts["threads"] == 1 and not facts["arrow_loaded"], (facts, err)
    assert "forking is unsafe, running pyspark.daemon instead" in err


def _site(root, py4j_version: str | None = "0.10.9.9"):
    """A pip-style site directory: pyspark with its shipped zips, and py4j at a version."""
    lib = root / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    if py4j_version is not None:
        (root / "py4j").mkdir()
        (root / "py4j" / "version.py").write_text(f"__version__ = '{py4j_version}'\n")
    return str(root), str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_shipped_zips_are_dropped_when_the_same_packages_are_installed(tmp_path) -> None:
    site, pyspark_zip, py4j_zip = _site(tmp_path / "site")
    jar = str(tmp_path / "site" / "pyspark" / "jars" / "spark-core.jar")
    assert without_shipped_zips(["/app", pyspark_zip, py4j_zip, jar, site]) == ["/app", jar, site]


def test_shipped_zips_stay_when_they_are_not_the_installed_packages(tmp_path) -> None:
    site, pyspark_zip, py4j_zip = _site(tmp_path / "site", py4j_version="0.10.9.7")
    other = tmp_path / "spark-home" / "python" / "lib"  # a cluster's own SPARK_HOME
    other.mkdir(parents=True)
    foreign = [str(other / "pyspark.zip"), str(other / "py4j-0.10.9.9-src.zip")]
    # py4j at another version: its zip stays, pyspark's copy goes
    assert without_shipped_zips([pyspark_zip, py4j_zip, site]) == [py4j_zip, site]
    # zips outside the installed package stay
    assert without_shipped_zips([*foreign, site]) == [*foreign, site]
    # nothing installed on the path: everything stays
    assert without_shipped_zips([pyspark_zip, py4j_zip, "/app"]) == [pyspark_zip, py4j_zip, "/app"]
