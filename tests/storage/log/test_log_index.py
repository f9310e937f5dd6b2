"""Offset and time indexes: every lookup agrees with a linear scan; tail lookups touch
a constant number of pages."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.storage.log import Log, TopicConfig
from dkvstream.storage.log.index import OFFSET_ENTRY, OffsetIndex, TimeIndex

ts_st = st.lists(st.integers(0, 50), min_size=1, max_size=300)


@given(ts_st, st.integers(10, 400), st.integers(1, 60))
@settings(max_examples=25, deadline=None)
def test_fetch_and_offsets_for_times_agree_with_linear_scan(tmp_path_factory, ts, interval, flush_every) -> None:
    from dkvstream.storage.objectstore.local import LocalObjectStore

    log = Log(LocalObjectStore(tmp_path_factory.mktemp("log")))
    log.create_topic("t", TopicConfig(partitions=1, index_interval_bytes=interval))
    prod = log.producer()
    from dkvstream.storage.log.config import ProducerConfig
    prod.config = ProducerConfig(batch_bytes=64)
    for i, t in enumerate(ts):
        prod.send("t", b"k%d" % (i % 7), b"v" * (i % 13), partition=0, timestamp=t)
        if (i + 1) % flush_every == 0:
            prod.flush()
    prod.flush()
    all_recs = log.read("t", 0)
    assert [r.timestamp for r in all_recs] == ts
    for off in range(len(ts) + 1):
        got = log.fetch("t", 0, off, max_records=2).records
        assert [r.offset for r in got] == list(range(off, min(off + 2, len(ts))))
    for target in range(-1, 53):
        expected = next(((i, t) for i, t in enumerate(ts) if t >= target), None)
        assert log.offsets_for_times("t", {0: target}) == {0: expected}


@given(st.lists(st.integers(0, 2**31), min_size=0, max_size=5000, unique=True), st.data())
@settings(max_examples=40, deadline=None)
def test_warm_cold_search_equals_bisect(offsets, data) -> None:
    offsets = sorted(offsets)
    idx = OffsetIndex(np.array([(o, i) for i, o in enumerate(offsets)], OFFSET_ENTRY))
    targets = data.draw(st.lists(st.integers(0, 2**31 + 5), max_size=50)) + offsets[-3:]
    for t in targets:
        i = int(np.searchsorted(np.array(offsets, np.int64), t, side="right")) - 1
        assert idx.lookup(t) == ((0, 0) if i < 0 else (offsets[i], i))


def test_time_index_is_strict() -> None:
    idx = TimeIndex(np.array([(10, 5), (20, 9)], TimeIndex.dtype))
    assert idx.lookup(10) == 0 and idx.lookup(11) == 5 and idx.lookup(20) == 5 and idx.lookup(21) == 9


def test_tail_lookup_pages_stay_constant() -> None:
    pages = []
    for n in (1_000, 10_000, 100_000, 1_000_000):
        offs = np.arange(n, dtype=np.uint32) * 3
        idx = OffsetIndex(np.rec.fromarrays([offs, offs], dtype=OFFSET_ENTRY).view(np.ndarray))
        touched: set[int] = set()
        for t in offs[-100:]:
            assert idx.lookup(int(t), touched)[0] == t
        pages.append(len(touched))
    assert max(pages) <= 3 and len(set(pages[1:])) == 1, pages
