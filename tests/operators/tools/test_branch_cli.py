"""The branch CLI in process: create, shadow, diff, promote, run-main, and its errors."""
from __future__ import annotations

import json

from dkvstream.operators.runtime.branches import diff, read_promotion
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.branch import main
from dkvstream.storage.objectstore import open_object_store
from tests.operators.branch_jobs import KEY_COLUMNS, buggy_flights, fixed_flights

MAIN = "tests.operators.branch_jobs:buggy_flights"
BRANCH = "tests.operators.branch_jobs:fixed_flights"


def test_branch_cli_workflow(tmp_path, capsys) -> None:
    root = str(tmp_path)
    store = open_object_store(root)
    with JobRunner(buggy_flights(), None, store) as runner:
        runner.run(max_epochs=2)
    both = ["--main", MAIN, "--branch", BRANCH, "--store", root]
    assert main(["create", *both]) == 0
    assert "forked from flights's checkpoint 2" in capsys.readouterr().out
    with JobRunner(buggy_flights(), None, store) as runner:
        runner.run(max_epochs=2)
    assert main(["promote", *both]) == 1  # the branch is behind
    assert "run the branch further" in capsys.readouterr().err
    assert main(["shadow", "--branch", BRANCH, "--store", root, "--in-process", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == [3, 4]
    assert main(["diff", *both, "--key", "main=" + ",".join(KEY_COLUMNS), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = diff(store, buggy_flights(), fixed_flights(), key_columns={"main": KEY_COLUMNS})
    assert got == json.loads(json.dumps(want.as_dict(), default=str))
    assert main(["diff", *both, "--key", "main=" + ",".join(KEY_COLUMNS)]) == 0
    assert f"changed {want.outputs['main'].totals()['changed']};" in capsys.readouterr().out
    assert main(["promote", *both]) == 0
    assert "run-main" in capsys.readouterr().out
    assert read_promotion(store, "flights").epoch == 5
    assert main(["run-main", *both, "--in-process", "--json"]) == 0
    epochs = json.loads(capsys.readouterr().out)["epochs"]
    assert epochs and epochs[0] == 6


def test_branch_cli_usage_errors(tmp_path, capsys) -> None:
    both = ["--main", MAIN, "--branch", BRANCH, "--store", str(tmp_path)]
    assert main(["diff", *both, "--key", "main"]) == 2
    assert "expected OUTPUT=COL" in capsys.readouterr().err
    assert main(["create", *both[:-1], str(tmp_path / "missing")]) == 2
    assert main(["diff", *both]) == 1
    assert "is not a branch" in capsys.readouterr().err
