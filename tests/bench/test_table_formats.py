"""bench/table_formats.py stays runnable and correct: on a tiny workload every format's
table (now and as of the middle epoch) equals the dict model, and the table prints."""
from __future__ import annotations

from bench.table_formats import epoch_batches, main, model_states


def test_tiny_comparison_runs_and_checks_every_format(capsys) -> None:
    assert main(["--epochs", "4", "--keys", "300", "--rows", "30", "--lookups", "2"]) == 0
    out = capsys.readouterr().out
    for fmt in ("| delta |", "| iceberg |", "| iceberg-delete-append |"):
        assert fmt in out


def test_model_applies_upserts_then_deletes() -> None:
    states = model_states(3, keys=50, rows=20)
    for (up, dels), before, after in zip(epoch_batches(3, 50, 20), [{}] + states[:-1], states):
        ids = set(up["id"].to_pylist())
        assert len(dels) == 1 and ids.isdisjoint(int(d) for d in dels)
        assert set(after) == (set(before) | ids) - {int(d) for d in dels}
