"""The DKV instances a Spark worker keeps open between epochs (``dkvstream.operators.runtime.open_state``):
a kept or caught-up instance holds exactly what ``DKV.open`` of the same manifest holds
(oracle: a dict of every write, and a fresh open), anything else is reopened."""
from __future__ import annotations

import random
from functools import partial

import pytest

from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.storage.dkv import DKV, DKVOptions
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.storage.random_writes import random_writes

PREFIX = "jobs/j/state/op/kg-0000-0127"
_write = partial(random_writes, keys=range(300), delete_share=0.2, value_bytes=(1, 39))


def _assert_state(db: DKV, model: dict) -> None:
    assert dict(db.scan_prefix(b"k")) == model
    for i in range(0, 300, 7):
        key = f"k{i:04d}".encode()
        assert db.get(key) == model.get(key)


def _kept_after_epoch_1(tmp_path, seed: int, writes: int):
    """A worker's DKV after epoch 1 (``writes`` random writes, checkpoint ``e1-a``), kept
    in a new cache. Returns (store, rng, model, cache, db, manifest key of epoch 1)."""
    store, rng, model = LocalObjectStore(str(tmp_path)), random.Random(seed), {}
    cache = OpenState()
    db = DKV.open(store, PREFIX)
    _write(db, model, rng, writes)
    m1 = db.checkpoint("e1-a")
    cache.keep(store.root_uri, PREFIX, m1, None, db)
    return store, rng, model, cache, db, m1


def test_kept_instance_catches_up_with_epochs_another_worker_ran(tmp_path) -> None:
    store, rng, model, cache, worker_a, m1 = _kept_after_epoch_1(tmp_path, seed=7, writes=500)
    # Epochs 2 and 3 run on another worker, which opens m1 from the store.
    manifest = m1
    for epoch in (2, 3):
        worker_b = DKV.open(store, PREFIX, manifest)
        _write(worker_b, model, rng, 400)
        manifest = worker_b.checkpoint(f"e{epoch}-b")
        worker_b.close()
    db, timers = cache.take(store.root_uri, PREFIX, manifest, None)
    assert db is worker_a and timers is None and cache.caught_up == 1
    _assert_state(db, model)
    _assert_state(DKV.open(store, PREFIX, manifest), model)
    # It goes on from there like a fresh open: its next checkpoint restores the same state.
    _write(db, model, rng, 300)
    m4 = db.checkpoint("e4-a")
    cache.keep(store.root_uri, PREFIX, m4, None, db)
    assert cache.take(store.root_uri, PREFIX, m4, None) == (db, None) and cache.hits == 1
    _assert_state(DKV.open(store, PREFIX, m4), model)


def test_changed_tables_other_options_or_range_reopen(tmp_path) -> None:
    store, rng, model, cache, _, m1 = _kept_after_epoch_1(tmp_path, seed=8, writes=200)
    other = DKV.open(store, PREFIX, m1)
    _write(other, model, rng, 200)
    other.flush()  # tables changed: no catch-up
    m2 = other.checkpoint("e2-b")
    assert cache.take(store.root_uri, PREFIX, m2, None) is None
    assert cache.misses == 1 and len(cache) == 0
    _assert_state(DKV.open(store, PREFIX, m2), model)

    cache.keep(store.root_uri, PREFIX, m2, None, other)
    assert cache.take(store.root_uri, PREFIX, m2, DKVOptions(memtable_bytes=1 << 20)) is None
    fresh = DKV.open(store, PREFIX, m2)
    cache.keep(store.root_uri, PREFIX, m2, None, fresh)
    assert cache.take(store.root_uri, "jobs/j/state/op/kg-0128-0255", m2, None) is None
    assert cache.take(store.root_uri, PREFIX, None, None) is None  # an empty start never reuses


def test_capacity_closes_the_oldest(tmp_path) -> None:
    store = LocalObjectStore(str(tmp_path))
    cache = OpenState(capacity=2)
    kept = []
    for i in range(3):
        db = DKV.open(store, f"{PREFIX}-{i}")
        db.put(b"k", b"v")
        kept.append((db.checkpoint("e1-a"), db))
        cache.keep(store.root_uri, f"{PREFIX}-{i}", kept[-1][0], None, db)
    assert len(cache) == 2
    assert cache.take(store.root_uri, f"{PREFIX}-0", kept[0][0], None) is None
    assert cache.take(store.root_uri, f"{PREFIX}-2", kept[2][0], None) == (kept[2][1], None)


@pytest.mark.parametrize("batch", [pytest.param(False, marks=pytest.mark.slow), True], ids=["on_event", "vectorised"])
def test_job_with_two_workers_caching_state(batch, tmp_path, monkeypatch) -> None:
    """The flights job for 6 epochs, split 2 -> 3 ranges after 3, its tasks run by two
    simulated workers picked at random (as Spark's reused Python workers are), each with
    its own cache: every checkpoint's state and the output equal a run without caches
    (itself checked against the pandas oracle by tests/operators/runtime/test_flights_job.py).
    The ``on_event`` case (~50 s) is slow."""
    import dkvstream.operators.runtime.exchange as runtime
    from dkvstream.examples.flights import flights_job
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.operators.runtime.task import run_task
    from dkvstream.operators.tools.state_reader import checkpoint_entries

    workers, rng = [OpenState(), OpenState()], random.Random(11)

    def on_a_worker(*args, **kwargs):
        return run_task(*args, **{**kwargs, "open_state": workers[rng.randrange(2)]})

    def uncached(*args, **kwargs):
        return run_task(*args, **{**kwargs, "open_state": None})

    def run(root: str, cached: bool) -> JobRunner:
        monkeypatch.setattr(runtime, "run_task", on_a_worker if cached else uncached)
        for parallelism, epochs in ((2, 3), (3, 3)):
            runner = JobRunner(flights_job(events_per_epoch=40_000, parallelism=parallelism, batch=batch), None,
                               root, retain_checkpoints=None)
            runner.run(max_epochs=epochs)
        monkeypatch.setattr(runtime, "run_task", run_task)
        return runner

    plain = run(str(tmp_path / "plain"), cached=False)
    cached = run(str(tmp_path / "cached"), cached=True)
    assert sum(w.hits for w in workers) > 0 and sum(w.caught_up for w in workers) > 0
    def entries(r, epoch):
        return sorted((op, k, v) for op, _, k, v in checkpoint_entries(r.store, r.job.prefix, epoch))
    for epoch in range(1, cached.latest().epoch + 1):
        assert entries(cached, epoch) == entries(plain, epoch), f"state of epoch {epoch} differs"
    def rows(r):
        return r.job.sinks["main"].read(r.store, r.job.prefix).to_pandas().sort_values(
            ["origin", "dest", "window_start"]).reset_index(drop=True)
    assert len(rows(cached)) > 0
    assert rows(cached).equals(rows(plain))


def test_in_process_runner_keeps_ranges_open(tmp_path, monkeypatch) -> None:
    """An in-process runner reuses each range's DKV from the second epoch on, as Spark
    workers do; a new runner (a restart) opens from the store. The output equals the
    pandas oracle."""
    import dkvstream.operators.runtime.exchange as runtime
    from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.operators.runtime.task import run_task

    reused: list[tuple[int, bool]] = []

    def recording(operator, spec, *args, **kwargs):
        res = run_task(operator, spec, *args, **kwargs)
        reused.append((spec.epoch, res.metrics["dkv_reused"]))
        return res

    monkeypatch.setattr(runtime, "run_task", recording)
    job = keyed_count_job(6_000, 500, events_per_epoch=2_000, parallelism=2, step_ms=1_000)
    JobRunner(job, None, str(tmp_path)).run(max_epochs=3)
    assert reused == [(1, False)] * 2 + [(2, True)] * 2 + [(3, True)] * 2
    reused.clear()
    runner = JobRunner(job, None, str(tmp_path))
    runner.run()
    assert reused[:2] == [(4, False)] * 2 and all(r for _, r in reused[2:])
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    cols = ["key", "window_start"]
    exp = keyed_count_oracle(job.source)
    assert got.sort_values(cols).reset_index(drop=True)[exp.columns].equals(
        exp.sort_values(cols).reset_index(drop=True))


def test_in_process_runner_keeps_one_instance_per_range_and_closes_them(tmp_path) -> None:
    """Over 8 ranges the in-process runner keeps at most 8 DKV instances (one per range
    and operator), their timer services hold no set-dedup keys between epochs, and
    ``close()`` (here: leaving the ``with`` block) closes every kept instance."""
    from dkvstream.examples.keyed_count import keyed_count_job
    from dkvstream.operators.runtime.driver import JobRunner

    job = keyed_count_job(4_000, 200, events_per_epoch=1_000, parallelism=8, step_ms=1_000)
    assert len(job.operators) == 1
    with JobRunner(job, None, str(tmp_path)) as runner:
        runner.run(max_epochs=3)
        cache = runner._open_state
        assert cache.capacity == 8 and len(cache) == 8
        kept = list(cache._entries.values())
        assert all(not e.db._closed for e in kept)
        assert all(e.timers is not None and not e.timers.event._set_this_epoch
               and not e.timers.processing._set_this_epoch for e in kept)
    assert len(cache) == 0 and all(e.db._closed for e in kept)
    runner.close()  # idempotent


def test_take_closes_the_instance_when_catching_up_fails(tmp_path) -> None:
    """A catch-up that cannot read the wanted manifest raises and closes the instance
    (it has left the cache, so nothing else would)."""
    from dkvstream.storage.errors import ObjectNotFoundError

    store, _, _, cache, db, _ = _kept_after_epoch_1(tmp_path, seed=9, writes=50)
    with pytest.raises(ObjectNotFoundError):
        cache.take(store.root_uri, PREFIX, f"{PREFIX}/manifest/no-such-manifest", None)
    assert db._closed and len(cache) == 0


def test_keep_hands_back_the_same_timer_service_without_its_epoch_dedup(tmp_path) -> None:
    """A hit returns the timer service kept with the instance (so its lower bound saves the
    next scan), already emptied of the epoch's set-dedup keys; a catch-up returns None."""
    from dkvstream.operators.api.keygroups import KeyGroupRange
    from dkvstream.operators.runtime.timers import TimerService

    store, rng, model, cache, db, m1 = _kept_after_epoch_1(tmp_path, seed=10, writes=50)
    assert cache.take(store.root_uri, PREFIX, m1, None) == (db, None)
    timers = TimerService(db, KeyGroupRange(0, 128))
    timers.set(3, 1_000, b"a")
    m2 = db.checkpoint("e2-a")
    cache.keep(store.root_uri, PREFIX, m2, None, db, timers)
    assert not timers._set_this_epoch
    got_db, got_timers = cache.take(store.root_uri, PREFIX, m2, None)
    assert got_db is db and got_timers is timers
    assert [(ts, kg, k) for ts, kg, k in got_timers.due(2_000)] == [(1_000, 3, b"a")]
    # Kept again, then another worker runs an epoch: the catch-up drops the service.
    m3 = db.checkpoint("e3-a")
    cache.keep(store.root_uri, PREFIX, m3, None, db, timers)
    other = DKV.open(store, PREFIX, m3)
    other.put(b"k9999", b"v")
    m4 = other.checkpoint("e4-b")
    assert cache.take(store.root_uri, PREFIX, m4, None) == (db, None) and cache.caught_up == 1
