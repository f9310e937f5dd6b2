"""The savepoints CLI: create, list, drop, restore, fork, with exit statuses and messages."""
from __future__ import annotations

import io
import json

from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.tools.savepoints import main
from dkvstream.storage.objectstore import open_object_store
from tests.operators import fork_jobs


def _run(root: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(["--store", root, *args], out), out.getvalue()


def test_cli_create_list_restore_fork_drop(tmp_path, capsys) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent").run(max_epochs=2)
    code, text = _run(root, "create", "parent", "sp")
    assert code == 0 and "epoch 2" in text, text
    assert _run(root, "create", "parent", "sp")[0] == 2
    assert "exists" in capsys.readouterr().err
    code, text = _run(root, "list", "parent", "--json")
    assert code == 0 and json.loads(text)["name"] == "sp" and json.loads(text)["files"] > 0
    fork_jobs.runner(root, "parent").run(max_epochs=3)  # later epochs publish output
    code, _ = _run(root, "restore", "--job", "tests.operators.fork_jobs:parent_job", "sp")
    assert code == 1 and "fork a new job from the savepoint" in capsys.readouterr().err
    code, text = _run(root, "fork", "parent", "child", "--savepoint", "sp")
    assert code == 0 and "no state file copied" in text
    assert list_epochs(open_object_store(root), "jobs/child") == [2]
    assert _run(root, "drop", "parent", "sp")[0] == 0
    assert _run(root, "list", "parent")[1] == ""
    assert _run(root, "drop", "parent", "sp")[0] == 2
    assert "no savepoint 'sp'" in capsys.readouterr().err


def test_cli_drop_fork(tmp_path, capsys) -> None:
    root = str(tmp_path)
    fork_jobs.runner(root, "parent").run(max_epochs=1)
    assert _run(root, "fork", "parent", "child")[0] == 0
    code, text = _run(root, "drop-fork", "child")
    assert code == 0 and "cannot run again" in text and "jobs/parent" in text, text
    assert _run(root, "drop-fork", "parent")[0] == 2
    assert "not a fork" in capsys.readouterr().err


def test_cli_list_shows_a_savepoint_being_taken(tmp_path) -> None:
    from dkvstream.operators import paths
    from dkvstream.operators.runtime.savepoints import savepoint

    root = str(tmp_path)
    fork_jobs.runner(root, "parent").run(max_epochs=1)
    sp = savepoint(root, "parent", "sp")
    sp.pending = True  # as a taker that crashed after claiming the name leaves it
    open_object_store(root).put(paths.savepoint_key("jobs/parent", "sp"), sp.encode())
    assert json.loads(_run(root, "list", "parent", "--json")[1])["pending"] is True
    assert "being taken" in _run(root, "list", "parent")[1]
    assert _run(root, "drop", "parent", "sp")[0] == 0 and _run(root, "list", "parent")[1] == ""
