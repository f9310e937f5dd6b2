"""The built wheel, installed into a fresh venv beside a Dagster project that has its own
``assets`` package: the project defines a job with dkvstream and materializes it.
Oracle: the pandas running maximum of the job's events (``tests.running_max_job``) against
the sink's Parquet files.

The venv gets its third-party dependencies from this interpreter's site-packages (a .pth
file) instead of the package index (an index install of pyspark and dagster takes minutes);
the wheel itself is installed with ``--no-deps``. Still over a minute (building the wheel
and its C module, a venv, Spark's start): marked slow. The interpreter's own dkvstream (an editable
install or the checkout) is not visible there: its finder is never run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.running_max_job import running_maxima

ROOT = Path(__file__).resolve().parents[1]

# The user's project: a package named ``assets``, as many Dagster projects have, holding a
# dkvstream job (the README's first job) and its Definitions.
PROJECT = {
    "assets/__init__.py": "from .streams import defs\n",
    "assets/streams.py": Path(__file__).with_name("running_max_job.py").read_text() + """
from dkvstream import dkvstream_definitions

defs = dkvstream_definitions(running_max_job("maxima_job"))
""",
    # Proves the project's ``assets`` is the one imported, and dkvstream brought no
    # top-level package of its own.
    "check_imports.py": """
import importlib.util, os, assets
assert assets.__file__.startswith(os.getcwd()), assets.__file__
for name in ("operators", "storage", "examples"):
    assert importlib.util.find_spec(name) is None, name
print("imports ok")
""",
}


def build_wheel(out: Path) -> Path:
    """Builds dkvstream's wheel into ``out``, from a copy of the checkout: pip builds in
    the source tree, and the checkout's own ``build/`` may hold modules deleted since."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".dkvstream*", ".dagster_home", ".hypothesis",
        ".pytest_cache", "*.so", "tests", "bench", "docs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                   check=True, timeout=600)
    (wheel,) = out.glob("dkvstream-*.whl")
    return wheel


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A venv holding ``wheel``, with this interpreter's third-party packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
                    str(wheel)], check=True, timeout=300)
    return python


@pytest.mark.slow("builds the wheel, a venv and starts Spark: about 65 s")
def test_wheel_in_a_project_with_its_own_assets_package(tmp_path) -> None:
    python = fresh_venv(tmp_path / "venv", build_wheel(tmp_path / "dist"))
    project = tmp_path / "project"
    for rel, text in PROJECT.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON")}
    env.update(PYSPARK_PYTHON=str(python), DAGSTER_HOME=str(tmp_path / "home"),
               DKVSTREAM_STORE=str(tmp_path / "store"), SPARK_CONF_DIR=str(ROOT / "platform" / "conf"),
               PATH=f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    check = subprocess.run([str(python), "check_imports.py"], cwd=project, env=env, capture_output=True, text=True)
    assert check.returncode == 0 and "imports ok" in check.stdout, check.stderr

    run = subprocess.run([str(python), "-m", "dagster", "asset", "materialize", "-m", "assets",
                          "--select", "events,maxima"], cwd=project, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    got = pq.read_table(tmp_path / "store" / "jobs" / "maxima_job" / "sinks" / "maxima").to_pandas()
    assert sorted(zip(got["key"], got["max"])) == running_maxima()
