"""Rescaling, checkpoint retention and remote compaction at the job level.

Oracles: the flights pandas oracle for output, and the state of a run that never
rescaled (same key groups, same events) for restored state.
"""
from __future__ import annotations

from collections import Counter

import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs, read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.remote_compaction import compact_job
from dkvstream.operators.tools.state_reader import checkpoint_entries
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.dkv.gc import files_named_by

EPOCH_EVENTS = 40_000  # 9 epochs


def _state(runner: JobRunner, epoch: int | None = None) -> Counter:
    """Live entries regardless of which range holds them."""
    return Counter((op, k, v) for op, _, k, v in checkpoint_entries(runner.store, runner.job.prefix, epoch))


def _job(parallelism: int):
    return flights_job(events_per_epoch=EPOCH_EVENTS, parallelism=parallelism)


@pytest.fixture(scope="module")
def unscaled(tmp_path_factory):
    runner = JobRunner(_job(2), None, str(tmp_path_factory.mktemp("unscaled")), retain_checkpoints=None)
    results = runner.run()
    return runner, {r.epoch: _state(runner, r.epoch) for r in results}


def _assert_files_exactly_named(runner: JobRunner) -> None:
    """Every DKV file is named by a retained checkpoint, and every named file exists."""
    manifests = [m for e in list_epochs(runner.store, runner.job.prefix)
                 for ranges in read_checkpoint(runner.store, runner.job.prefix, e).operators.values()
                 for m in ranges.values()]
    named = files_named_by(runner.store, manifests)
    on_store = set(runner.store.list(f"{runner.job.prefix}/state/"))
    assert on_store - named == set(), f"unreferenced files: {sorted(on_store - named)[:5]}"
    assert named - on_store == set(), f"missing files: {sorted(named - on_store)[:5]}"


@pytest.mark.parametrize("plan", [(2, 3, 1), (2, 1, 4)], ids=["split-then-merge", "merge-then-split"])
def test_rescale_keeps_state_and_output(plan, tmp_path, unscaled, check_flights_output) -> None:
    _, clean_state = unscaled
    root = str(tmp_path / "store")
    epoch = 0
    for parallelism, epochs in zip(plan, (3, 3, None)):
        runner = JobRunner(_job(parallelism), None, root, retain_checkpoints=2)
        results = runner.run(max_epochs=epochs)
        epoch = results[-1].epoch
        ckpt = runner.latest()
        assert ckpt.parallelism == parallelism and len(ckpt.operators["route_daily_delays"]) == parallelism
        assert _state(runner) == clean_state[epoch], f"state after rescale to {parallelism} differs"
        _assert_files_exactly_named(runner)
    check_flights_output(runner.job.sinks["main"].read(runner.store, runner.job.prefix))


def test_retention_keeps_last_n_and_frees_files(tmp_path, unscaled, check_flights_output) -> None:
    _, clean_state = unscaled
    runner = JobRunner(_job(2), None, str(tmp_path / "store"), retain_checkpoints=3,
                       dkv_options=DKVOptions(memtable_bytes=256 << 10, wal_flush_bytes=64 << 10))
    runner.run()
    epochs = list_epochs(runner.store, runner.job.prefix)
    assert epochs == sorted(clean_state)[-3:]
    assert runner.last_cleanup is not None and runner.last_cleanup.retained_epochs == epochs
    for e in epochs:
        assert _state(runner, e) == clean_state[e]
    _assert_files_exactly_named(runner)
    named_staged = {k for e in epochs for keys in read_checkpoint(runner.store, runner.job.prefix, e).outputs.values()
                    for k in keys}
    assert set(runner.store.list(f"{runner.job.prefix}/staging/")) == named_staged
    check_flights_output(runner.job.sinks["main"].read(runner.store, runner.job.prefix))


def test_remote_compaction_between_epochs(tmp_path, unscaled, check_flights_output) -> None:
    """Results published between epochs are installed (or discarded if an input died);
    either way state equals the uncompacted run."""
    _, clean_state = unscaled
    opts = DKVOptions(memtable_bytes=128 << 10, wal_flush_bytes=32 << 10, l0_compaction_trigger=100)
    runner = JobRunner(_job(2), None, str(tmp_path / "store"), dkv_options=opts, retain_checkpoints=None)
    published, installed, discarded = 0, 0, 0
    while True:
        results = runner.run(max_epochs=1)
        assert _state(runner) == clean_state[results[-1].epoch]
        remote = latest_checkpoint(runner.store, runner.job.prefix).metrics["remote_compactions"]
        installed, discarded = installed + remote["installed"], discarded + remote["discarded"]
        if results[-1].finished:
            break
        published += len(compact_job(runner.store, runner.job.prefix,
                                     DKVOptions(l0_compaction_trigger=2, memtable_bytes=128 << 10)))
    assert published > 0, "the workload must give the remote compactor something to do"
    assert installed > 0 and installed + discarded == published
    check_flights_output(runner.job.sinks["main"].read(runner.store, runner.job.prefix))


def test_rescale_on_spark(spark, tmp_path, unscaled, check_flights_output) -> None:
    _, clean_state = unscaled
    root = str(tmp_path / "store")
    JobRunner(_job(2), spark, root).run(max_epochs=3)
    runner = JobRunner(_job(3), spark, root)
    results = runner.run(max_epochs=1)
    assert _state(runner) == clean_state[results[-1].epoch]
    runner.run()
    check_flights_output(runner.job.sinks["main"].read(runner.store, runner.job.prefix))
