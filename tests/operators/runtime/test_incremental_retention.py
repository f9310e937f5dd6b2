"""The driver's incremental checkpoint retention and parallel publish, at the job level.

Oracles: the bucket against what the retained checkpoints name (``files_named_by``), the
full sweep's verdict (``cleanup_job`` finds nothing left to delete), the pandas answer
of the job, and request counts (never durations).
"""
from __future__ import annotations

from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.storage.dkv.gc import files_named_by
from dkvstream.storage.objectstore.local import LocalObjectStore
from tests.operators import small_keyed_count as small

KINDS = ("GET", "PUT", "LIST", "DELETE", "HEAD", "COPY")


def _named(runner) -> tuple[set[str], set[str]]:
    """(DKV files, staged files) the retained checkpoints name."""
    store, prefix = runner.store, runner.job.prefix
    ckpts = [read_checkpoint(store, prefix, e) for e in list_epochs(store, prefix)]
    manifests = [m for c in ckpts for ranges in c.operators.values() for m in ranges.values()]
    staged = {k for c in ckpts for keys in c.outputs.values() for k in keys}
    return files_named_by(store, manifests), staged


def _assert_exactly_named(runner, what: str) -> None:
    state, staged = _named(runner)
    prefix = runner.job.prefix
    on_state = set(runner.store.list(f"{prefix}/state/"))
    on_staging = set(runner.store.list(f"{prefix}/staging/"))
    assert on_state == state, (f"{what}: unnamed {sorted(on_state - state)[:3]}, "
                               f"missing {sorted(state - on_state)[:3]}")
    assert on_staging == staged, f"{what}: staging differs: {sorted(on_staging ^ staged)[:3]}"


def test_incremental_retention_leaves_exactly_what_retained_checkpoints_name(tmp_path) -> None:
    """Every epoch flushes and compacts (small DKV sizes); after each, the bucket holds
    exactly what the retained checkpoints name, and the full sweep finds nothing."""
    runner = small.runner(str(tmp_path), retain=3, full_sweep_every=None)
    for result in runner.epochs():
        report = runner.last_cleanup
        assert report.full_sweep == "", report.full_sweep
        if result.epoch > 3:
            assert report.checkpoints_deleted == 1 and report.files_deleted > 0
            assert report.bytes_freed > 0
        _assert_exactly_named(runner, f"epoch {result.epoch}")
    assert result.epoch == small.EPOCHS
    sweep = cleanup_job(runner.store, runner.job.prefix, 3, concurrent=True)
    assert (sweep.files_deleted, sweep.checkpoints_deleted, sweep.deferred) == (0, 0, "")
    small.assert_output_exact(runner, "incremental retention")


def test_restart_reads_what_it_needs_and_stays_exact(tmp_path) -> None:
    """A new runner (a restart) knows no checkpoint yet: it reads the two an expiry
    needs, and the result is the same."""
    root = str(tmp_path)
    small.runner(root, retain=2, full_sweep_every=None).run(max_epochs=4)
    runner = small.runner(root, retain=2, full_sweep_every=None)
    before = runner.store.stats.snapshot()
    runner.run(max_epochs=1)
    assert runner.last_cleanup.full_sweep == "" and runner.last_cleanup.checkpoints_deleted == 1
    assert runner.store.stats.snapshot()["GET"] > before["GET"]
    _assert_exactly_named(runner, "after a restart")
    runner.run()
    _assert_exactly_named(runner, "at the end")
    small.assert_output_exact(runner, "incremental retention across a restart")


def test_driver_requests_per_epoch_are_flat_and_linear_in_ranges(tmp_path) -> None:
    """Steady epochs (retention active) cost the driver the same requests each, and at
    most 3P + 50 of them; only the publish's COPYs grow with P (one per staged file)."""
    per_p = {}
    for parallelism in (2, 8):
        root = str(tmp_path / f"p{parallelism}")
        runner = small.runner(root, retain=2, parallelism=parallelism, full_sweep_every=None)
        reader = LocalObjectStore(root)  # the test's reads are not the driver's requests
        steady, previous_staged = [], 0
        for result in runner.epochs():
            ckpt = latest_checkpoint(reader, runner.job.prefix)
            # A checkpoint's counts hold the previous epoch's publish and retention; from
            # epoch 3 on a checkpoint expires in each, so from epoch 4 on all is steady.
            counts = ckpt.metrics["requests"]["driver"]
            if result.epoch >= 4:
                assert sum(counts[k] for k in KINDS) <= 3 * parallelism + 50, counts
                assert counts["COPY"] == previous_staged, counts
                assert counts["HEAD"] == 0, counts
                # DELETE: the lease, one batch of expired checkpoints and markers, one of
                # DKV files, one of staged files if the expired epoch had output.
                assert counts["DELETE"] <= 4, counts
                steady.append({k: counts[k] for k in KINDS if k not in ("COPY", "DELETE")})
            previous_staged = len(ckpt.outputs.get("main", []))
        assert len(steady) == small.EPOCHS - 3
        assert all(c == steady[0] for c in steady), steady  # flat in the number of epochs
        per_p[parallelism] = steady[0]
    assert per_p[2] == per_p[8], per_p  # besides the copies, independent of P


def test_republish_after_a_crash_is_idempotent(tmp_path) -> None:
    """Publishing the newest checkpoint again (what a restart does) copies the same
    files to the same names: one COPY each, nothing read, no row duplicated."""
    runner = small.runner(str(tmp_path), retain=2, full_sweep_every=None)
    runner.run(max_epochs=5)
    ckpt = runner.latest()
    sink = runner.job.sinks["main"]
    staged = ckpt.outputs["main"]
    assert staged, "epoch 5 must publish output"
    listed = runner.store.list(sink.table_prefix(runner.job.prefix))
    before = runner.store.stats.snapshot()
    for _ in range(2):
        assert sink.publish(runner.store, runner.job.prefix, ckpt.epoch, staged) == [
            sink.published_key(runner.job.prefix, ckpt.epoch, k) for k in staged]
    after = runner.store.stats.snapshot()
    assert after["COPY"] - before["COPY"] == 2 * len(staged)
    assert (after["GET"], after["PUT"], after["bytes_read"]) == (before["GET"], before["PUT"], before["bytes_read"])
    assert runner.store.list(sink.table_prefix(runner.job.prefix)) == listed
    restarted = small.runner(str(tmp_path), retain=2, full_sweep_every=None)
    restarted.run()  # its restart re-publishes epoch 5 once more
    small.assert_output_exact(restarted, "after re-publishing")


def test_rescale_falls_back_to_the_full_sweep_and_keeps_shared_tables(tmp_path) -> None:
    """A rescale's new ranges share their parents' tables: the expiry of the last
    checkpoint before it runs the full sweep, and no file a retained checkpoint names
    is ever deleted."""
    root = str(tmp_path)
    small.runner(root, retain=2, full_sweep_every=None).run(max_epochs=3)
    runner = small.runner(root, retain=2, parallelism=3, full_sweep_every=None)
    sweeps = []
    for result in runner.epochs():
        sweeps.append((result.epoch, runner.last_cleanup.full_sweep))
        state, _ = _named(runner)
        missing = state - set(runner.store.list(f"{runner.job.prefix}/state/"))
        assert not missing, f"epoch {result.epoch}: retained checkpoints name deleted files {sorted(missing)[:3]}"
    # Epoch 4 rescaled: when epoch 3 expires (at epoch 5), what epoch 4 dropped is unknown.
    assert sweeps[1][0] == 5 and "epoch 4 dropped is unknown" in sweeps[1][1], sweeps
    sweep = cleanup_job(runner.store, runner.job.prefix, 2, concurrent=True)
    assert not sweep.deferred and not sweep.damaged
    _assert_exactly_named(runner, "after the rescale and a full sweep")
    small.assert_output_exact(runner, "rescaled with incremental retention")


def test_incremental_retention_and_publish_on_s3(s3_store) -> None:
    """The same on SeaweedFS S3: published by CopyObject, garbage deleted by
    DeleteObjects, the bucket left holding exactly what the retained checkpoints name."""
    runner = small.runner(s3_store, retain=2, full_sweep_every=None)
    copies = 0
    for result in runner.epochs():
        assert runner.last_cleanup.full_sweep == ""
        copies += len(result.published)
    _assert_exactly_named(runner, "on S3")
    assert copies > 0
    small.assert_output_exact(runner, "incremental retention on S3")
