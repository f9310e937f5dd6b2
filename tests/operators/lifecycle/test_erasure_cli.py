"""The erase CLI on a stopped job: scan finds the key, request + apply erase it, status
reports it, the scan of the state then finds nothing; usage mistakes exit 2."""
from __future__ import annotations

import io
import json

from dkvstream.operators.tools import erase
from tests.operators import small_keyed_count as skc


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return erase.main(list(argv), out), out.getvalue()


def test_request_apply_status_and_scan(tmp_path):
    root = str(tmp_path)
    with skc.runner(root) as r:
        r.run(max_epochs=3)
    state = "jobs/small_count/state/"
    code, text = _cli("scan", "--store", root, "--key", "6b313939", "--hex", "--prefix", state)
    assert code == 1 and json.loads(text)["holding"]
    code, rid = _cli("request", "--store", root, "--job", "small_count", "--key", "k199", "--reason", "t-1")
    assert code == 0
    code, text = _cli("status", "--store", root, "--job", "small_count", "--id", rid.strip(), "--key", "k199")
    assert code == 0 and json.loads(text)["status"] == "pending"
    code, text = _cli("apply", "--store", root, "--job", "small_count")
    assert code == 0 and json.loads(text)[0]["applied_epoch"] == 4
    code, text = _cli("status", "--store", root, "--job", "tests.operators.small_keyed_count:job", "--id",
                      rid.strip(), "--key", "k199", "--key-column", "key", "--scan-prefix", state)
    report = json.loads(text)
    assert code == 0 and report["status"] == "complete" and report["scan"]["holding"] == []
    assert set(report["sinks"]) == {"main", "late", "dead_letter"}
    assert _cli("scan", "--store", root, "--key", "k199", "--prefix", state)[0] == 0


def test_usage_mistakes_exit_2(tmp_path, capsys):
    assert _cli("request", "--store", str(tmp_path), "--job", "j", "--key", "zz", "--hex")[0] == 2
    assert "not hex" in capsys.readouterr().err
    assert _cli("status", "--store", str(tmp_path), "--job", "j", "--id", "nope", "--key", "k")[0] == 2
    assert "no erasure request or record" in capsys.readouterr().err
