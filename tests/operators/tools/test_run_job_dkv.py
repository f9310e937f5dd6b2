"""``run_job --dkv FIELD=VALUE``: the DKV options reach the ``JobRunner``; a wrong field
or value is a usage error naming it."""
from __future__ import annotations

import pytest

from dkvstream.operators.tools import run_job
from dkvstream.storage.dkv import DKVOptions


def test_dkv_options_reach_the_runner(tmp_path, monkeypatch, capsys) -> None:
    seen = {}
    real = run_job.JobRunner

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    monkeypatch.setattr(run_job, "JobRunner", spy)
    assert run_job.main(["--job", "tests.operators.small_keyed_count:job", "--store", str(tmp_path), "--in-process",
                         "--max-epochs", "1", "--dkv", "wal_flush_bytes=65536",
                         "--dkv", "size_amp_threshold=0.25", "--json"]) == 0
    assert seen["dkv_options"] == DKVOptions(wal_flush_bytes=65536, size_amp_threshold=0.25)
    assert '"event": "committed"' in capsys.readouterr().out


@pytest.mark.parametrize(("setting", "message"), [
    ("wal_bytes=1", "FIELD one of"), ("memtable_bytes", "FIELD one of"),
    ("memtable_bytes=64k", "memtable_bytes takes an integer"),
    ("size_amp_threshold=half", "size_amp_threshold takes a number")])
def test_a_wrong_dkv_option_is_a_usage_error(setting, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        run_job.main(["--job", "tests.operators.small_keyed_count:job", "--dkv", setting])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
