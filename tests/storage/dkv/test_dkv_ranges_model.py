"""Several DKV ranges of one operator against dict models: writes, inline and remote
compaction, rescale (split / merge via ``open_from_parents``), retention and GC.

After every GC: every object under the operator's prefixes is named by a retained manifest
(or belongs to a pending remote compaction), every named object exists, and reopening
every retained manifest reproduces its snapshot.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.dkv.gc import collect_garbage, files_named_by
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.paths import parse_result_key
from dkvstream.storage.dkv.remote_compaction import compact_checkpoint, load_result
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.ci_env import scaled

NKEYS = 120
OPTIONS = DKVOptions(
    memtable_bytes=900, block_bytes=128, l0_compaction_trigger=2, wal_flush_bytes=600,
    zstd_level=1, block_cache_bytes=4096, target_file_bytes=500, num_levels=4,
    level_base_bytes=1200, level_multiplier=2, max_inline_compaction_bytes=5000,
)
OP = "jobs/m/state/op"


def key(i: int) -> bytes:
    return b"k%03d" % i


def lo_b(i: int) -> bytes:
    return b"" if i == 0 else key(i)


def hi_b(i: int) -> bytes | None:
    return None if i == NKEYS else key(i)


@dataclass
class Range:
    lo: int
    hi: int
    prefix: str
    db: DKV
    model: dict[bytes, bytes] = field(default_factory=dict)
    manifests: list[tuple[str, dict[bytes, bytes]]] = field(default_factory=list)


class RangesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = LocalObjectStore(self.tmp.name)
        self.n = 0
        self.prefixes: list[str] = []
        self.ranges = [self._new_range(0, NKEYS, None)]

    def teardown(self) -> None:
        for r in self.ranges:
            r.db.close()
        self.tmp.cleanup()

    def _name(self) -> str:
        self.n += 1
        return f"e{self.n:06d}"

    def _new_range(self, lo: int, hi: int, parents: list[str] | None) -> Range:
        prefix = f"{OP}/r{len(self.prefixes):03d}-{lo:03d}-{hi:03d}"
        self.prefixes.append(prefix)
        if parents is None:
            db = DKV.open(self.store, prefix, options=OPTIONS)
        else:
            db = DKV.open_from_parents(self.store, prefix, parents, (lo_b(lo), hi_b(hi)), OPTIONS)
        return Range(lo, hi, prefix, db)

    def _pick(self, i: int) -> Range:
        return self.ranges[i % len(self.ranges)]

    def _checkpoint(self, r: Range) -> str:
        mkey = r.db.checkpoint(self._name())
        r.manifests.append((mkey, dict(r.model)))
        return mkey

    # -- writes and reads ------------------------------------------------------------

    @rule(i=st.integers(0, 7), k=st.integers(0, NKEYS - 1), v=st.binary(max_size=30),
          n=st.integers(1, 40))
    def put_many(self, i: int, k: int, v: bytes, n: int) -> None:
        r = self._pick(i)
        for j in range(n):
            kk = key(r.lo + (k + 7 * j) % (r.hi - r.lo))
            vv = v + bytes([j])
            r.db.put(kk, vv)
            r.model[kk] = vv

    @rule(i=st.integers(0, 7), k=st.integers(0, NKEYS - 1), n=st.integers(1, 10))
    def delete_some(self, i: int, k: int, n: int) -> None:
        r = self._pick(i)
        for j in range(n):
            kk = key(r.lo + (k + 3 * j) % (r.hi - r.lo))
            r.db.delete(kk)
            r.model.pop(kk, None)

    @rule(i=st.integers(0, 7), k=st.integers(0, NKEYS - 1))
    def read(self, i: int, k: int) -> None:
        r = self._pick(i)
        kk = key(r.lo + k % (r.hi - r.lo))
        assert r.db.get(kk) == r.model.get(kk)
        assert list(r.db.scan_prefix(kk[:3])) == sorted(
            (a, b) for a, b in r.model.items() if a.startswith(kk[:3])
        )

    # -- flush, compaction, checkpoints -------------------------------------------------

    @rule(i=st.integers(0, 7))
    def flush(self, i: int) -> None:
        self._pick(i).db.flush()

    @rule(i=st.integers(0, 7))
    def compact_all(self, i: int) -> None:
        self._pick(i).db.compact_all()

    @rule(i=st.integers(0, 7))
    def checkpoint(self, i: int) -> None:
        self._checkpoint(self._pick(i))

    @rule(i=st.integers(0, 7), full=st.booleans())
    def remote_compact(self, i: int, full: bool) -> None:
        r = self._pick(i)
        if r.manifests:
            compact_checkpoint(self.store, r.prefix, r.manifests[-1][0], OPTIONS, full=full)

    @rule(i=st.integers(0, 7))
    def install(self, i: int) -> None:
        r = self._pick(i)
        r.db.install_pending_compactions()
        assert list(r.db.scan_range(b"", None)) == sorted(r.model.items())

    @rule(i=st.integers(0, 7))
    def restart_from_latest(self, i: int) -> None:
        r = self._pick(i)
        mkey = self._checkpoint(r)
        r.db.close()
        r.db = DKV.open(self.store, r.prefix, mkey, OPTIONS)
        if r.prefix != self.prefixes[0]:
            assert r.db.key_range == (lo_b(r.lo), hi_b(r.hi))

    # -- rescale -------------------------------------------------------------------------

    @rule(i=st.integers(0, 7), at=st.integers(1, NKEYS - 1))
    def split(self, i: int, at: int) -> None:
        r = self._pick(i)
        if not r.lo < at < r.hi:
            return
        mkey = self._checkpoint(r)
        r.db.close()
        a = self._new_range(r.lo, at, [mkey])
        b = self._new_range(at, r.hi, [mkey])
        a.model = {k: v for k, v in r.model.items() if k < key(at)}
        b.model = {k: v for k, v in r.model.items() if k >= key(at)}
        for c in (a, b):
            assert list(c.db.scan_range(b"", None)) == sorted(c.model.items())
            self._checkpoint(c)
        j = self.ranges.index(r)
        self.ranges[j : j + 1] = [a, b]

    @precondition(lambda self: len(self.ranges) >= 2)
    @rule(i=st.integers(0, 7))
    def merge(self, i: int) -> None:
        j = i % (len(self.ranges) - 1)
        a, b = self.ranges[j], self.ranges[j + 1]
        keys = [self._checkpoint(a), self._checkpoint(b)]
        a.db.close()
        b.db.close()
        m = self._new_range(a.lo, b.hi, keys)
        m.model = {**a.model, **b.model}
        assert list(m.db.scan_range(b"", None)) == sorted(m.model.items())
        self._checkpoint(m)
        self.ranges[j : j + 2] = [m]

    # -- retention and GC -----------------------------------------------------------------

    @rule(keep=st.integers(1, 3), in_progress=st.booleans())
    def retention_and_gc(self, keep: int, in_progress: bool) -> None:
        for r in self.ranges:  # GC runs between epochs: every range has committed
            self._checkpoint(r)
            r.manifests = r.manifests[-keep:]
        retained = [m for r in self.ranges for m, _ in r.manifests]
        collect_garbage(self.store, self.prefixes, retained, include_in_progress=in_progress)
        named = files_named_by(self.store, retained)
        handled = set()
        for m in retained:
            handled |= set(load_manifest(self.store, m).handled_compactions)
        for p in self.prefixes:
            for obj in self.store.list(p + "/"):
                if obj in named:
                    continue
                # Only a pending remote compaction (result + outputs) may remain unnamed,
                # or the result of one whose installed outputs are still named (the result
                # goes with its last output; see gc.py).
                cid = obj[len(p) + len("/compactions/") :].split("/")[0].removesuffix(".json")
                rkey = f"{p}/compactions/{cid}.json"
                assert parse_result_key(p, rkey) == cid, obj
                assert self.store.exists(rkey), obj  # no output outlives its result
                if obj == rkey and any(n.startswith(f"{p}/compactions/{cid}/") for n in named):
                    continue
                assert cid not in handled, obj
                assert load_result(self.store, rkey).base_manifest in retained, obj
        for obj in named:
            assert self.store.exists(obj), obj
        for r in self.ranges:
            for mkey, snapshot in r.manifests:
                db = DKV.open(self.store, r.prefix, mkey, OPTIONS)
                assert list(db.scan_range(b"", None)) == sorted(snapshot.items())
                db.close()

    @invariant()
    def ranges_tile_the_key_space(self) -> None:
        assert self.ranges[0].lo == 0 and self.ranges[-1].hi == NKEYS
        for a, b in zip(self.ranges, self.ranges[1:]):
            assert a.hi == b.lo


RangesMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None
)
TestRangesModel = RangesMachine.TestCase


@pytest.mark.slow
def test_ranges_model_long_run() -> None:
    """Many more examples (several minutes at full size, ``tests.ci_env.long_run_scale``);
    opt in with -m slow."""
    run_state_machine_as_test(
        RangesMachine, settings=settings(max_examples=scaled(500), stateful_step_count=80, deadline=None)
    )
