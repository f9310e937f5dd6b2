"""``bench/driver_scaling.py --quick``: the driver's requests per steady epoch stay within
3P + 50, retention is incremental (no full sweep, no HEAD, no manifest read) and the
publish is one COPY per staged file. Counts only, never durations."""
from __future__ import annotations

from bench import driver_scaling


def test_quick_driver_requests_within_bound(capsys) -> None:
    results = driver_scaling.main(["--quick"])
    assert [r["P"] for r in results] == [2, 16]
    for r in results:
        d, p = r["driver"], r["P"]
        assert r["steady_epochs"] >= 2 and r["full_sweeps"] == 0, r
        assert r["max_total"] <= 3 * p + 50, r
        assert d["COPY"] == r["published"] == p, r  # every range publishes one file per epoch
        assert d["HEAD"] == 0 and d["GET"] <= 2, r  # no manifest or checkpoint read back
    # Besides the copies, the same requests at 2 and 16 ranges: O(1) retention and commit.
    rest = [{k: r["driver"][k] for k in ("GET", "PUT", "LIST", "DELETE", "HEAD")} for r in results]
    assert rest[0] == rest[1], rest
    assert "| 16 |" in capsys.readouterr().out
