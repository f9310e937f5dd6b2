"""A newcomer's mistakes on the command line: one line on stderr saying what to do, exit
2 for a mistake on the command line, 1 for an environment that cannot work (no Java, no
S3 credentials), never a traceback (``dkvstream.storage.cli``). Each runs the tool as a user
would, in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dkvstream.operators.tools import run_job

REPO = Path(__file__).resolve().parents[3]
JOB = "tests.operators.small_keyed_count:job"


def _tool(module: str, *argv: str, env: dict[str, str] | None = None,
          unset: str | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m module argv`` with this environment, ``env`` over it, without the
    variables starting with ``unset``."""
    env = {**{k: v for k, v in os.environ.items() if not (unset and k.startswith(unset))}, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess, status: int, *says: str) -> str:
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    err = done.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for text in says:
        assert text in err, err
    return err


def test_run_job_refuses_a_store_that_does_not_exist(tmp_path) -> None:
    """A misspelled ``--store`` must not start the job again from the beginning."""
    missing = tmp_path / "stroe"
    done = _tool("dkvstream.operators.tools.run_job", "--job", JOB, "--store", str(missing), "--in-process")
    _one_line_error(done, 2, f"no store at {missing}: no such directory", "--create-store")
    assert done.stdout == "" and not missing.exists()


def test_create_store_starts_a_job_and_a_rerun_continues_it(tmp_path, capsys) -> None:
    store = str(tmp_path / "new")
    argv = ["--job", JOB, "--store", store, "--in-process", "--max-epochs", "1", "--json"]
    assert run_job.main([*argv, "--create-store"]) == 0
    assert run_job.main(argv) == 0  # the store exists now: no flag needed
    epochs = [json.loads(line)["epoch"] for line in capsys.readouterr().out.splitlines()]
    assert epochs == [1, 2]


@pytest.mark.parametrize(("job", "says"), [
    ("dkvstream.examples.keyed_count:keyed_count_job", "takes arguments ['events', 'keys']"),
    ("tests.operators.small_keyed_count:jbo", "has no attribute 'jbo'"),
])
def test_run_job_names_a_job_it_cannot_load(tmp_path, job, says) -> None:
    done = _tool("dkvstream.operators.tools.run_job", "--job", job, "--store", str(tmp_path), "--in-process")
    _one_line_error(done, 2, says)


@pytest.mark.parametrize(("env", "says"), [
    ({"PATH": str(Path(sys.executable).parent), "JAVA_HOME": ""}, "no `java` on PATH"),
    ({"JAVA_HOME": "/nonexistent/jdk"}, "JAVA_HOME=/nonexistent/jdk has no bin/java"),
])
def test_run_job_on_spark_without_java_says_how_to_install_it(tmp_path, env, says) -> None:
    done = _tool("dkvstream.operators.tools.run_job", "--job", JOB, "--store", str(tmp_path), "--max-epochs", "1",
                 env=env)
    _one_line_error(done, 1, "error: JavaNotFoundError: Spark cannot start", says, "bash platform/install-java.sh",
                    "openjdk-17-jre-headless")


# No credentials anywhere botocore looks (environment, files, instance metadata).
NO_CREDENTIALS = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


@pytest.mark.parametrize("tool", ["dkvstream.operators.tools.run_job", "dkvstream.operators.tools.state_reader"])
def test_missing_s3_credentials_say_which_variables_to_set(tool) -> None:
    argv = ["--in-process"] if tool.endswith("run_job") else ["--list"]
    done = _tool(tool, "--job", JOB, "--store", "s3://bucket/prefix", *argv, env=NO_CREDENTIALS, unset="AWS_")
    _one_line_error(done, 1, "error: S3CredentialsError: ", "s3://bucket/prefix/", "no credentials",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    assert "attempts" not in done.stderr  # tried once: retrying cannot find credentials
