"""The batch merge used by scans agrees with the entry-at-a-time heap merge."""

from __future__ import annotations

import random

import pytest

from dkvstream.storage.dkv import merge, native
from dkvstream.storage.dkv.merge import merge_batches_live
from tests.storage.heap_merge import live_only, merge_newest


def _batches(entries: list, rng: random.Random) -> list[tuple]:
    out, i = [], 0
    while i < len(entries):
        n = rng.randrange(0, 6)  # empty batches are allowed
        part = entries[i : i + n]
        out.append(([e[0] for e in part], [e[1] for e in part], [e[2] for e in part]))
        i += n
    return out


@pytest.fixture(params=["native", "python"])
def merge_impl(request, monkeypatch):
    """Runs a test with the compiled ``merge_live`` and again with the Python reference."""
    if request.param == "native":
        if merge.NATIVE is None:
            if native.DISABLED:
                pytest.skip("DKVSTREAM_DKV_NATIVE=0: pure-Python paths forced")
            pytest.fail("dkvstream.storage.dkv._native was not built (see tests/storage/dkv/test_native.py)")
        monkeypatch.setattr(merge, "merge_live", merge.NATIVE.merge_live)
    else:
        monkeypatch.setattr(merge, "merge_live", merge.merge_live_py)
    return request.param


@pytest.mark.parametrize("seed", range(40))
def test_batch_merge_matches_heap_merge(seed: int, merge_impl: str) -> None:
    rng = random.Random(seed)
    seq = 0
    sources = []
    for _ in range(rng.randrange(0, 5)):
        keys = sorted(rng.sample(range(60), rng.randrange(0, 30)))
        src = []
        for k in keys:
            seq += 1
            src.append((b"k%03d" % k, seq, None if rng.random() < 0.2 else b"v%d" % seq))
        sources.append(src)
    expected = list(live_only(merge_newest(sources)))
    got = list(merge_batches_live([_batches(s, rng) for s in sources]))
    assert got == expected
