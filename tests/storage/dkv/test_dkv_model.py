"""DKV against a dict model: a hypothesis state machine over put/delete/write_batch/get/
scan/flush/checkpoint/reopen, with tiny sizes so flushes, multi-block tables and compaction happen."""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.ci_env import scaled

# Small alphabet so prefixes collide and keys get overwritten and deleted often.
keys = st.binary(min_size=0, max_size=4).map(lambda b: bytes(c % 3 + 0x61 for c in b))
keys |= st.sampled_from([b"", b"\xff", b"\xff\xff", b"a\xff", b"\x00"])
values = st.binary(min_size=0, max_size=40)
prefixes = st.sampled_from([b"", b"a", b"b", b"ab", b"aa", b"c", b"abc", b"\xff", b"cc"])

OPTIONS = DKVOptions(
    memtable_bytes=600,
    block_bytes=128,
    bloom_bits_per_key=10,
    l0_compaction_trigger=2,
    wal_flush_bytes=400,
    zstd_level=1,
    block_cache_bytes=4096,
    target_file_bytes=700,
    num_levels=4,
    level_base_bytes=1500,
    level_multiplier=2,
    max_inline_compaction_bytes=6000,
)


def model_scan(
    model: dict[bytes, bytes], start: bytes, end: bytes | None
) -> list[tuple[bytes, bytes]]:
    return sorted((k, v) for k, v in model.items() if k >= start and (end is None or k < end))


class DKVMachine(RuleBasedStateMachine):
    checkpoints = Bundle("checkpoints")
    options = OPTIONS

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = LocalObjectStore(self.tmp.name)
        self.db = DKV.open(self.store, "jobs/t/state/op/kg-0000-0003", options=self.options)
        self.model: dict[bytes, bytes] = {}
        self.n_ckpt = 0

    def teardown(self) -> None:
        self.db.close()
        self.tmp.cleanup()

    @rule(k=keys, v=values)
    def put(self, k: bytes, v: bytes) -> None:
        self.db.put(k, v)
        self.model[k] = v

    @rule(k=keys)
    def delete(self, k: bytes) -> None:
        self.db.delete(k)
        self.model.pop(k, None)

    @rule(rows=st.lists(st.tuples(keys, values | st.none()), max_size=40))
    def write_batch(self, rows: list[tuple[bytes, bytes | None]]) -> None:
        # One batch = the same writes one by one (later rows win); sizes make the
        # memtable flush inside a batch.
        self.db.write_batch([k for k, _ in rows], [v for _, v in rows])
        for k, v in rows:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    @rule(k=keys)
    def get(self, k: bytes) -> None:
        assert self.db.get(k) == self.model.get(k)

    @rule(ks=st.lists(keys, max_size=12))
    def get_many(self, ks: list[bytes]) -> None:
        assert self.db.get_many(ks) == [self.model.get(k) for k in ks]

    @rule(p=prefixes)
    def scan_prefix(self, p: bytes) -> None:
        expected = sorted((k, v) for k, v in self.model.items() if k.startswith(p))
        assert list(self.db.scan_prefix(p)) == expected

    @rule(a=keys, b=keys | st.none())
    def scan_range(self, a: bytes, b: bytes | None) -> None:
        assert list(self.db.scan_range(a, b)) == model_scan(self.model, a, b)

    @rule(p=prefixes, k=keys, v=values)
    def write_during_scan(self, p: bytes, k: bytes, v: bytes) -> None:
        # A scan sees the state at its start even if the caller writes while iterating.
        expected = sorted((kk, vv) for kk, vv in self.model.items() if kk.startswith(p))
        it = self.db.scan_prefix(p)
        first = next(it, None)
        self.db.put(k, v)
        self.model[k] = v
        got = ([first] if first is not None else []) + list(it)
        assert got == expected

    @rule()
    def flush(self) -> None:
        self.db.flush()
        assert self.db.stats()["memtable_entries"] == 0

    @rule(target=checkpoints)
    def checkpoint(self):
        self.n_ckpt += 1
        key = self.db.checkpoint(f"e{self.n_ckpt:08d}-a0")
        return key, dict(self.model)

    @rule(c=checkpoints)
    def reopen_older(self, c) -> None:
        # An older checkpoint restores exactly its snapshot; the current DB is untouched.
        key, snapshot = c
        old = DKV.open(self.store, "jobs/t/state/op/kg-0000-0003", key, self.options)
        try:
            assert list(old.scan_range(b"", None)) == sorted(snapshot.items())
            for k in list(snapshot)[:5]:
                assert old.get(k) == snapshot[k]
        finally:
            old.close()

    @rule(c=consumes(checkpoints))
    def continue_from_older(self, c) -> None:
        # Restart from an older checkpoint and keep writing (like a job restart).
        key, snapshot = c
        self.db.close()
        self.db = DKV.open(self.store, "jobs/t/state/op/kg-0000-0003", key, self.options)
        self.model = dict(snapshot)

    @rule()
    def checkpoint_and_reopen(self) -> None:
        self.n_ckpt += 1
        key = self.db.checkpoint(f"e{self.n_ckpt:08d}-b1")
        before = self.db.stats()
        self.db.close()
        self.db = DKV.open(self.store, "jobs/t/state/op/kg-0000-0003", key, self.options)
        after = self.db.stats()
        assert after["last_seq"] == before["last_seq"]
        assert after["tables_per_level"] == before["tables_per_level"]
        assert list(self.db.scan_range(b"", None)) == sorted(self.model.items())

    @invariant()
    def levels_are_sorted_runs(self) -> None:
        for lvl in self.db.levels.levels[1:]:
            for a, b in zip(lvl, lvl[1:]):
                assert a.max_key < b.min_key


class WalHeavyMachine(DKVMachine):
    """Larger memtable and WAL limit: several WAL objects pile up and replay on reopen."""

    options = DKVOptions(
        memtable_bytes=6000,
        block_bytes=64,
        l0_compaction_trigger=3,
        wal_flush_bytes=2500,
        zstd_level=1,
        block_cache_bytes=0,  # every block read goes to the store and is verified
        target_file_bytes=300,
    )


DKVMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)
WalHeavyMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=60, deadline=None
)
TestDKVModel = DKVMachine.TestCase
TestDKVModelWalHeavy = WalHeavyMachine.TestCase


@pytest.mark.slow
def test_dkv_model_long_run() -> None:
    """Many more examples of the small-sizes machine (~2.5 minutes at full size,
    ``tests.ci_env.long_run_scale``); opt in with -m slow."""
    run_state_machine_as_test(
        DKVMachine, settings=settings(max_examples=scaled(1500), stateful_step_count=100, deadline=None)
    )
