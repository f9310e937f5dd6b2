"""The state reader's command line on the small keyed counting job: listing, decoded
state and timers in a subject-key range as JSON, verify, and one-line usage errors.
The oracle is what the run stored: its checkpoints, and ``read_state``/``list_timers``
(checked against a pandas replay in ``test_state_reader.py``)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dkvstream.operators.tools.state_reader import list_timers, main, read_state
from dkvstream.storage.dkv.manifest import load_manifest
from tests.operators import small_keyed_count as small

JOB = "tests.operators.small_keyed_count:job"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    runner = small.runner(str(root), retain=3)
    assert len(runner.run(max_epochs=5)) == 5
    return root, runner


def run(root: Path, *argv: str) -> str:
    out = io.StringIO()
    assert main(["--store", str(root), "--job", JOB, *argv], out) == 0
    return out.getvalue()


def test_list_names_retained_epochs_ranges_and_state_ids(stored) -> None:
    root, runner = stored
    ckpt = runner.latest()
    listing = json.loads(run(root, "--list", "--json"))
    (op,) = listing["operators"]
    assert listing["epochs"] == [3, 4, 5] and listing["epoch"] == ckpt.epoch == 5
    assert op["ranges"] == {label: runner.store.uri(key) for label, key in ckpt.operators[op["name"]].items()}
    assert op["states"] == {"windows": "map<int64, record<count:int64,amount:int64>>"}
    text = run(root, "--list")
    assert "retained epochs: 3, 4, 5" in text and "  state windows: map<int64, record<" in text


def test_state_in_a_key_range_as_json_equals_what_is_stored(stored) -> None:
    root, runner = stored
    table = read_state(runner.store, runner.job, "windows", epoch=4).to_pylist()
    want = sorted((r["subject_key"].decode(), r["map_key"], r["value"]["count"]) for r in table
                  if b"k1" <= r["subject_key"] < b"k15")
    got = [json.loads(line) for line in run(root, "--state-id", "windows", "--epoch", "4",
                                            "--from", "k1", "--to", "k15", "--json").splitlines()]
    assert len(want) > 10 and len(want) < len(table)
    assert sorted((r["subject_key"], r["map_key"], r["value"]["count"]) for r in got) == want
    hexed = run(root, "--state-id", "windows", "--epoch", "4", "--from", b"k1".hex(), "--to",
                b"k15".hex(), "--hex", "--json")
    assert sorted(json.loads(line)["subject_key"] for line in hexed.splitlines()) == \
        sorted(k.encode().hex() for k, _, _ in want)


def test_timers_in_a_key_range(stored) -> None:
    root, runner = stored
    timers = list_timers(runner.store, runner.job).to_pylist()
    want = sorted((t["subject_key"].decode(), int(t["timestamp"].timestamp() * 1000)) for t in timers
                  if t["subject_key"] >= b"k5")
    got = [json.loads(line) for line in run(root, "--timers", "--from", "k5", "--json").splitlines()]
    assert want and sorted((t["subject_key"], t["timestamp"]) for t in got) == want


def test_verify_exits_1_on_a_damaged_table(tmp_path: Path) -> None:
    runner = small.runner(str(tmp_path), retain=2)
    runner.run(max_epochs=2)
    assert run(tmp_path, "--verify") == "epoch 2: ok\n"
    manifest_key = next(iter(runner.latest().operators["keyed_window_count"].values()))
    table = next(load_manifest(runner.store, manifest_key).levels.all_tables()).key
    data = bytearray((tmp_path / table).read_bytes())
    data[10] ^= 0xFF
    (tmp_path / table).write_bytes(bytes(data))
    out = io.StringIO()
    assert main(["--store", str(tmp_path), "--job", JOB, "--verify"], out) == 1
    assert f"FAILED: {runner.store.uri(table)}" in out.getvalue()
    assert out.getvalue().endswith("epoch 2: 1 damaged files\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--job", JOB, "--state-id", "windos"], "declares no state 'windos' (has ['windows'])"),
    (["--job", JOB, "--state-id", "windows", "--epoch", "1"], "epoch 1 is not retained under "),
    (["--job", JOB, "--state-id", "windows", "--operator", "nope"], "has no operator 'nope'"),
    (["--job", "tests.operators.small_keyed_count:jobb", "--list"], "has no attribute 'jobb'"),
    (["--job", "tests.operators.small_keyd_count:job", "--list"], "cannot import"),
    (["--job", "tests.operators.small_keyed_count", "--list"], "give module:attribute"),
    (["--job", "tests.operators.small_keyed_count:OPTIONS", "--list"], "is a DKVOptions, not a Job"),
    (["--job", JOB, "--list", "--store", "{missing}"], "no checkpoint found under {missing}"),
    (["--job", JOB, "--list", "--store", "{empty}"], "no checkpoint found under file://{empty}/jobs/"),
])
def test_user_mistakes_exit_2_with_one_line(stored, tmp_path: Path, capsys, argv, message) -> None:
    root, _ = stored
    where = {"missing": str(tmp_path / "nowhere"), "empty": str(tmp_path)}
    argv = [a.format(**where) for a in argv]
    assert main(["--store", str(root), *argv], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message.format(**where) in err
    assert not (tmp_path / "nowhere").exists()
