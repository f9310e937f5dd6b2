"""The benchmarks' tables and plots stay correct on tiny inputs: ``bench/dkv_ops.py``
checks DKV's results against its baselines' and writes its PNG; ``bench/plot.py`` draws
what it is given."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="matplotlib comes with the bench extra")

PNG = b"\x89PNG\r\n\x1a\n"


def test_dkv_ops_compares_equal_results_and_plots(tmp_path, capsys) -> None:
    from bench.dkv_ops import main

    path = tmp_path / "img" / "ops.png"
    assert main(["--keys", "3000", "--repeat", "1", "--scans", "20", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    for row in ("put ", "get (memtable)", "scan_prefix (memtable)     SortedDict",
                "get (SSTables)", "scan_prefix (SSTables)     SortedDict", "load average"):
        assert row in out
    assert path.read_bytes()[:8] == PNG


def test_dkv_ops_scans_return_what_the_sorted_baseline_returns() -> None:
    """run() asserts equal results per row; a DKV row that differs would raise."""
    from bench.dkv_ops import run

    rows = run(keys=2000, repeat=1, scans=10)
    assert [(op, base) for op, base, *_ in rows] == [
        ("put", "dict"), ("get (memtable)", "dict"), ("scan_prefix (memtable)", "SortedDict"),
        ("get (SSTables)", "dict"), ("scan_prefix (SSTables)", "SortedDict")]
    assert all(n > 0 and dkv > 0 and ref > 0 for _, _, n, dkv, ref in rows)


def test_bar_panels_writes_a_grid_with_missing_values(tmp_path) -> None:
    from bench.plot import bar_panels

    path = tmp_path / "p.png"
    bar_panels(str(path), "t", [
        {"labels": ["a", "b"], "values": [1.0, None], "xlabel": "x", "log": True, "ref": 1.0},
        {"labels": ["a"], "values": [2.0], "xlabel": "y", "hatched": ["a"]},
        {"labels": ["c"], "values": [3.0], "xlabel": "z"}], caption="c", columns=2)
    assert path.read_bytes()[:8] == PNG
