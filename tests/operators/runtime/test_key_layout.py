"""The hashed key layout (``Job.key_layout="hashed"``): every task file under
``jobs/<job>/r/<hh>/``, hh the range's hash; the output, retention, the full sweep, the
state reader and remote compaction as with the flat layout; a job keeps the layout of its
first epoch (existing stores still open).

Oracles: the pandas answer of the job, the state of a flat run of the same job, and the
bucket against what the retained checkpoints name."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from dkvstream.operators import paths
from dkvstream.operators.api.validation import InvalidJobError
from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs, read_checkpoint
from dkvstream.operators.runtime.cleanup import cleanup_job
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.remote_compaction import compact_job
from dkvstream.operators.tools.state_reader import checkpoint_entries
from dkvstream.storage.dkv.gc import files_named_by
from tests.operators import small_keyed_count as small


def _runner(root: str, layout: str, parallelism: int = 2, **kw) -> JobRunner:
    job = dataclasses.replace(small.job(parallelism), key_layout=layout)
    return JobRunner(job, None, root, dkv_options=small.OPTIONS, **kw)


def _task_files(runner: JobRunner) -> set[str]:
    prefix = runner.job.prefix
    return {k for root in (paths.state_root(prefix), paths.staging_root(prefix), paths.hashed_root(prefix))
            for k in runner.store.list(root)}


def test_paths_of_both_layouts_parse_back() -> None:
    for layout in (paths.LAYOUT_FLAT, paths.LAYOUT_HASHED):
        staged = paths.staging_prefix("jobs/j", 12, "op", "kg-0008-0015", "a1b2", layout) + "/main.parquet"
        assert paths.range_label_of(staged) == "kg-0008-0015"
        assert paths.staged_epoch(staged) == 12
        assert paths.is_staged_key("jobs/j", staged)
        state = paths.state_prefix("jobs/j", "op", "kg-0008-0015", layout) + "/sst/000001.sst"
        assert paths.parse_state_key("jobs/j", state) == (
            "op", "kg-0008-0015", paths.state_prefix("jobs/j", "op", "kg-0008-0015", layout))
        assert not paths.is_staged_key("jobs/j", state)
    hashed = paths.state_prefix("jobs/j", "op", "kg-0008-0015", paths.LAYOUT_HASHED)
    assert hashed == f"jobs/j/r/{paths.range_hash('op', 'kg-0008-0015')}/state/op/kg-0008-0015"
    # The hash spreads ranges over the prefixes (here: 64 ranges over more than 40 of 256).
    assert len({paths.range_hash("op", f"kg-{i:04d}-{i:04d}") for i in range(64)}) > 40


def test_hashed_layout_puts_every_task_file_under_its_range_hash(tmp_path) -> None:
    """Eight epochs with retention (incremental, then a full sweep), a rescale from 2 to
    3 ranges: the output equals the oracle, every task file lies under
    ``r/<range_hash(op, label)>/``, and the bucket holds exactly what the retained
    checkpoints name."""
    root = str(tmp_path / "hashed")
    _runner(root, "hashed", retain_checkpoints=2).run(max_epochs=4)
    runner = _runner(root, "hashed", parallelism=3, retain_checkpoints=2)
    runner.run()
    small.assert_output_exact(runner, "hashed layout")
    prefix = runner.job.prefix
    assert latest_checkpoint(runner.store, prefix).layout == paths.LAYOUT_HASHED
    cleanup_job(runner.store, prefix, 2, concurrent=True)  # the full sweep, in this layout too
    files = _task_files(runner)
    assert files and all(k.startswith(paths.hashed_root(prefix)) for k in files), sorted(files)[:3]
    for key in files:
        parsed = paths.parse_state_key(prefix, key)
        if parsed is not None:
            op, label, _ = parsed
        else:
            assert paths.is_staged_key(prefix, key), key
            op, label = key.split("/staging/", 1)[1].split("/")[:2]
        assert key.startswith(f"{paths.hashed_root(prefix)}{paths.range_hash(op, label)}/"), key
    ckpts = [read_checkpoint(runner.store, prefix, e) for e in list_epochs(runner.store, prefix)]
    named = files_named_by(runner.store, [m for c in ckpts for r in c.operators.values() for m in r.values()])
    named |= {k for c in ckpts for keys in c.outputs.values() for k in keys}
    assert files == named, (sorted(files - named)[:3], sorted(named - files)[:3])


def test_state_reader_and_remote_compaction_in_the_hashed_layout(tmp_path) -> None:
    """The same job in both layouts: equal state at every retained epoch (read by the
    state reader), and a remote compaction of the hashed one installs."""
    flat = _runner(str(tmp_path / "flat"), "flat", retain_checkpoints=None)
    hashed = _runner(str(tmp_path / "hashed"), "hashed", retain_checkpoints=None)
    flat.run(max_epochs=5)
    hashed.run(max_epochs=5)
    for epoch in range(1, 6):
        def entries(r, epoch=epoch):
            return sorted((op, k, v) for op, _, k, v in checkpoint_entries(r.store, r.job.prefix, epoch))
        assert entries(hashed) == entries(flat), f"state of epoch {epoch} differs"
    # Smaller levels than the job's, so there is something to compact outside it.
    results = compact_job(hashed.store, hashed.job.prefix, dataclasses.replace(small.OPTIONS, level_base_bytes=1 << 10))
    assert results and all(k.startswith(paths.hashed_root(hashed.job.prefix)) for k in results), results
    epoch = next(hashed.epochs()).epoch  # installs what was compacted
    installed = read_checkpoint(hashed.store, hashed.job.prefix, epoch).metrics["remote_compactions"]["installed"]
    assert installed == len(results)
    hashed.run()
    small.assert_output_exact(hashed, "hashed layout after a remote compaction")


def test_a_job_keeps_the_layout_of_its_first_epoch(tmp_path, caplog) -> None:
    """A flat job restarted with ``key_layout="hashed"`` (an existing store) keeps its
    flat files and says so; the output equals the oracle."""
    root = str(tmp_path)
    _runner(root, "flat").run(max_epochs=3)
    with caplog.at_level(logging.WARNING):
        runner = _runner(root, "hashed")
        runner.run()
    assert "keeps that one" in caplog.text
    prefix = runner.job.prefix
    assert latest_checkpoint(runner.store, prefix).layout == paths.LAYOUT_FLAT
    assert not runner.store.list(paths.hashed_root(prefix))
    small.assert_output_exact(runner, "flat job restarted as hashed")


def test_key_layout_is_checked() -> None:
    with pytest.raises(InvalidJobError, match="key_layout must be one of"):
        dataclasses.replace(small.job(), key_layout="sharded")
