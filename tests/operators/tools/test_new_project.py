"""``python -m dkvstream.operators.tools.new_project``: the project it creates passes its
own test as created (pytest in a subprocess: the job's output against pandas, the
Dagster definitions load), and a folder it must not fill is refused with a message."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dkvstream.operators.tools.new_project import main

ROOT = Path(__file__).resolve().parents[3]


def test_created_project_passes_its_test(tmp_path, capsys) -> None:
    folder = tmp_path / "my-streams"
    assert main([str(folder)]) == 0
    assert sorted(capsys.readouterr().out.split()) == sorted(
        str(folder / rel) for rel in ("pyproject.toml", "README.md", "my_streams/__init__.py",
                                      "my_streams/jobs.py", "my_streams/definitions.py", "tests/test_jobs.py"))
    # PYTHONPATH: the checkout, for an interpreter whose dkvstream install is elsewhere.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout, run.stdout


def test_refuses_a_folder_that_is_not_empty(tmp_path, capsys) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main([str(tmp_path / "busy")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert os.listdir(tmp_path / "busy") == ["notes.txt"]


def test_refuses_a_folder_name_that_is_no_package_name(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "2fast")]) == 2
    assert "no usable Python package name" in capsys.readouterr().err
    assert not (tmp_path / "2fast").exists()
