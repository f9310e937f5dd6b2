"""The console producer, consumer and consumer-groups tool against what was produced
and committed (the log's own reads and ``committed_offsets`` are the oracle)."""
from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.log import Log
from dkvstream.storage.log.console import main
from dkvstream.storage.log.producer import partition_for
from dkvstream.storage.objectstore.local import LocalObjectStore

LINES = [f"k{i % 7}\tv{i}" for i in range(40)] + ["k3\tNULL"]


def run(store: Path, *argv: str, stdin: str = "") -> str:
    out = io.StringIO()
    assert main([*argv, "--store", str(store)], out, io.StringIO(stdin)) == 0
    return out.getvalue()


def fails(store: Path, capsys: pytest.CaptureFixture[str], *argv: str, stdin: str = "") -> str:
    """Runs a command that must exit 2; returns its one-line message."""
    assert main([*argv, "--store", str(store)], io.StringIO(), io.StringIO(stdin)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


@pytest.fixture
def orders(tmp_path: Path) -> Path:
    run(tmp_path, "create-topic", "--topic", "orders", "--partitions", "3")
    run(tmp_path, "produce", "--topic", "orders", "--property", "parse.key=true",
        "--property", "null.marker=NULL", stdin="\n".join(LINES) + "\n")
    return tmp_path


def _log(store: Path) -> Log:
    return Log(LocalObjectStore(store))


def test_produce_writes_each_line_as_a_keyed_record(orders: Path) -> None:
    log = _log(orders)
    want: dict[int, list] = {}
    for line in LINES:
        key, value = line.split("\t")
        want.setdefault(partition_for(key.encode(), 3), []).append(
            (key.encode(), None if value == "NULL" else value.encode()))
    for p in range(3):
        assert [(r.key, r.value) for r in log.read("orders", p)] == want.get(p, [])


_KEYS = st.binary(max_size=8).filter(lambda b: not set(b) & set(b"\t\r\n"))
_VALUES = st.binary(max_size=12).filter(lambda b: not set(b) & set(b"\r\n"))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(_KEYS, _VALUES), min_size=1, max_size=30))
def test_produce_keeps_the_bytes_of_each_line(records: list[tuple[bytes, bytes]]) -> None:
    """Any bytes but line breaks (and tabs in keys) reach the log unchanged; consume
    --json --hex prints them back."""
    with tempfile.TemporaryDirectory() as root:
        run(Path(root), "create-topic", "--topic", "t", "--partitions", "2")
        stdin = io.TextIOWrapper(io.BytesIO(b"".join(k + b"\t" + v + b"\n" for k, v in records)))
        assert main(["produce", "--topic", "t", "--property", "parse.key=true", "--store", root],
                    io.StringIO(), stdin) == 0
        # In each partition in the order of the lines.
        want = [(p, k, v) for p in range(2) for k, v in records if partition_for(k, 2) == p]
        log = _log(Path(root))
        assert [(p, r.key, r.value) for p in range(2) for r in log.read("t", p)] == want
        text = run(Path(root), "consume", "--topic", "t", "--from-beginning", "--json", "--hex")
        got = [json.loads(line) for line in text.splitlines()]
        assert [(r["partition"], bytes.fromhex(r["key"]), bytes.fromhex(r["value"])) for r in got] == want


def test_consume_from_beginning_prints_every_record(orders: Path) -> None:
    log = _log(orders)
    text = run(orders, "consume", "--topic", "orders", "--from-beginning", "--json")
    got = [json.loads(line) for line in text.splitlines()]
    want = [{"topic": "orders", "partition": p, "offset": r.offset, "timestamp": r.timestamp,
             "key": r.key.decode(), "value": None if r.value is None else r.value.decode(),
             "headers": []} for p in range(3) for r in log.read("orders", p)]
    assert got == want
    # Kafka's default start without a committed offset is the end of the log.
    assert run(orders, "consume", "--topic", "orders") == ""


def test_kafka_formatter_properties(orders: Path) -> None:
    log = _log(orders)
    r = log.read("orders", 1)[2]
    text = run(orders, "consume", "--topic", "orders", "--partition", "1", "--offset", "2",
               "--max-messages", "1", *(a for prop in ("print.timestamp", "print.partition",
                                                      "print.offset", "print.key", "print.headers")
                                        for a in ("--property", f"{prop}=true")),
               "--property", "key.separator=|")
    assert text == f"CreateTime:{r.timestamp}|Partition:1|Offset:2|NO_HEADERS|{r.key.decode()}|{r.value.decode()}\n"


def test_a_group_resumes_where_it_committed(orders: Path) -> None:
    log = _log(orders)
    everything = [line for p in range(3) for line in
                  (f"{p}:{r.offset}" for r in log.read("orders", p))]
    seen = []
    for _ in range(4):  # 41 records in runs of at most 12
        text = run(orders, "consume", "--topic", "orders", "--group", "g", "--from-beginning",
                   "--max-messages", "12", "--property", "print.partition=true",
                   "--property", "print.offset=true", "--property", "print.value=false",
                   "--property", "key.separator=:")
        seen += [line.replace("Partition:", "").replace("Offset:", "") for line in text.splitlines()]
    assert seen == everything
    assert log.committed_offsets("g") == {("orders", p): n for p, n in enumerate(log.end_offsets("orders"))}


def test_groups_describe_lag_list_and_reset(orders: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(orders)
    ends = log.end_offsets("orders")
    log.commit_group_offsets("billing", {("orders", 0): 1, ("orders", 2): ends[2]})
    log.commit_group_offsets("audit", {("orders", 1): 0})
    assert run(orders, "groups", "--list") == "audit\nbilling\n"
    rows = [line.split() for line in run(orders, "groups", "--describe", "--group", "billing").splitlines()]
    assert rows == [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"],
                    ["billing", "orders", "0", "1", str(ends[0]), str(ends[0] - 1)],
                    ["billing", "orders", "1", "-", str(ends[1]), "-"],
                    ["billing", "orders", "2", str(ends[2]), str(ends[2]), "0"]]
    assert len(run(orders, "groups", "--describe", "--all-groups").splitlines()) == 1 + 3 + 3
    dry = run(orders, "groups", "--reset-offsets", "--group", "billing", "--topic", "orders", "--to-latest")
    assert "dry run" in dry and log.committed_offsets("billing")[("orders", 0)] == 1
    run(orders, "groups", "--reset-offsets", "--group", "billing", "--topic", "orders",
        "--to-offset", "2", "--execute")
    assert log.committed_offsets("billing") == {("orders", p): min(2, e) for p, e in enumerate(ends)}
    assert "has no committed offsets (groups: ['audit', 'billing'])" in fails(
        orders, capsys, "groups", "--describe", "--group", "biling")


def test_user_mistakes_exit_2_with_one_line(orders: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown topic 'order'" in fails(orders, capsys, "consume", "--topic", "order")
    assert "unknown topic 'order'" in fails(orders, capsys, "produce", "--topic", "order", stdin="x\n")
    assert "has no partition 3" in fails(orders, capsys, "consume", "--topic", "orders", "--partition", "3")
    assert "--offset needs --partition" in fails(orders, capsys, "consume", "--topic", "orders",
                                                 "--offset", "0")
    assert "[0, " in fails(orders, capsys, "consume", "--topic", "orders", "--partition", "0",
                           "--offset", "999")
    assert "unknown property 'print.keys=true'" in fails(orders, capsys, "consume", "--topic", "orders",
                                                         "--property", "print.keys=true")
    assert "line 2 has no key separator" in fails(orders, capsys, "produce", "--topic", "orders",
                                                  "--property", "parse.key=true", stdin="a\tb\nc\n")
    missing = tmp_path / "nowhere"
    assert "no log found under" in fails(missing, capsys, "consume", "--topic", "orders")
    assert not missing.exists()
