"""bench/fork_cost.py stays runnable and its claim holds on a tiny state: the fork
copies nothing (no COPY, a few small PUTs), each baseline copies every state object."""
from __future__ import annotations

import re

from bench.fork_cost import main


def test_tiny_fork_cost_copies_nothing(capsys) -> None:
    assert main(["--state-bytes", "2M", "--value-bytes", "4096"]) == 0
    out = capsys.readouterr().out
    objects = int(re.search(r"parent state: (\d+) objects", out).group(1))
    rows = {line.split("|")[1].strip(): [int(c.strip().replace(",", "")) for c in line.split("|")[2:-2]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| method")}
    _get, put, _list, _delete, _head, copy, _read, written, copied = rows["fork_job (zero-copy)"]
    assert (copy, copied) == (0, 0) and put == 4 and written < 10_000
    assert rows["full copy: server-side COPY"][5] == objects
    assert rows["full copy: GET + PUT"][1] == objects
