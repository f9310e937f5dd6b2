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


def test_state_ttl_bench_keeps_state_flat_only_with_a_ttl(tmp_path) -> None:
    from bench.state_ttl import FirstSeen, first_seen_with_ttl, run
    from dkvstream.storage.dkv import DKVOptions

    tiny = DKVOptions(memtable_bytes=16 << 10, wal_flush_bytes=16 << 10, target_file_bytes=16 << 10,
                      level_base_bytes=64 << 10, l0_compaction_trigger=2, block_bytes=1024)
    plain = run(FirstSeen(), 24_000, 2_000, str(tmp_path / "plain"), tiny)
    ttl = run(first_seen_with_ttl(4_000), 24_000, 2_000, str(tmp_path / "ttl"), tiny)
    assert len(plain) == len(ttl) == 11  # the end-of-input epoch is left out
    assert plain[-1] > 2 * plain[3]  # grows with the keys
    assert max(ttl[5:]) < plain[-1] / 2 and max(ttl[5:]) < 2 * min(ttl[5:])  # flat


def test_state_ttl_bench_plots(tmp_path, capsys) -> None:
    from bench.state_ttl import main

    path = tmp_path / "ttl.png"
    main(["--epochs", "3", "--epoch-events", "500", "--ttl-epochs", "1", "--plot", str(path)])
    assert "no TTL, KiB" in capsys.readouterr().out
    assert path.read_bytes()[:8] == PNG
