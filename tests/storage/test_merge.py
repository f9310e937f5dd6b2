"""The batch merge used by scans agrees with the entry-at-a-time heap merge."""

from __future__ import annotations

import random

import pytest

from storage.dkv.merge import live_only, merge_batches_live, merge_newest


def _batches(entries: list, rng: random.Random) -> list[list]:
    out, i = [], 0
    while i < len(entries):
        n = rng.randrange(0, 6)  # empty batches are allowed
        out.append(entries[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(40))
def test_batch_merge_matches_heap_merge(seed: int) -> None:
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
