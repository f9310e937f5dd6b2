"""``erase_subjects`` removes every entry of a subject under every schema byte (state,
TTL'd state of both clocks, event-time and processing-time timers) and nothing of keys
that share bytes with it (a longer key, a shorter one, the same key in another key group)."""
from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from dkvstream.operators.api.state import (
    SCHEMA_PROCESSING_TIMER,
    SCHEMA_STATE,
    SCHEMA_STATE_TTL_EVENT,
    SCHEMA_STATE_TTL_PROCESSING,
    SCHEMA_TIMER,
    subject_prefix,
)
from dkvstream.operators.runtime.erasure import erase_subjects
from dkvstream.operators.runtime.timers import timer_key
from dkvstream.storage.dkv import DKV
from dkvstream.storage.objectstore.memory import MemoryObjectStore
from tests.operators.lifecycle.erasure_model import subject_of
from tests.storage.dkv.test_dkv_model import OPTIONS

SUBJECT, KG = b"user-7", 5
NEIGHBOURS = [(KG, b"user-77"), (KG, b"user-"), (KG, b"xuser-7"), (KG + 1, SUBJECT), (KG - 1, SUBJECT)]


def _entries(kg: int, key: bytes, n: int) -> list[bytes]:
    out = [subject_prefix(kg, key, s) + b"\x00\x02id" + b"%d" % i
           for s in (SCHEMA_STATE, SCHEMA_STATE_TTL_EVENT, SCHEMA_STATE_TTL_PROCESSING) for i in range(n)]
    out += [timer_key(kg, 1000 * i, key, s) for s in (SCHEMA_TIMER, SCHEMA_PROCESSING_TIMER) for i in range(n)]
    return out


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), flush_at=st.lists(st.integers(0, 400), max_size=4), deleted=st.integers(0, 5))
def test_every_entry_of_the_subject_goes_and_nothing_else(n, flush_at, deleted):
    db = DKV.open(MemoryObjectStore(), "p", options=OPTIONS)
    mine = _entries(KG, SUBJECT, n)
    others = [k for kg, key in NEIGHBOURS for k in _entries(kg, key, n)]
    model = {}
    for i, k in enumerate(sorted(mine + others, key=lambda k: k[::-1])):  # not in key order
        db.put(k, b"v" + k)
        model[k] = b"v" + k
        if i in flush_at:
            db.flush()
    for k in mine[:deleted]:  # tombstones of the subject too
        db.delete(k)
    summary = erase_subjects(db, [(KG, SUBJECT)])
    assert summary["entries"] >= len(mine) - deleted  # a deleted key may be compacted away already
    assert dict(db.scan_range(b"", None)) == {k: v for k, v in model.items() if k not in set(mine)}
    for t in db.levels.all_tables():
        assert not [k for k, _s, _v in db._tables.iter_table(t) if subject_of(k) == SUBJECT
                    and k[:2] == KG.to_bytes(2, "big")]
