"""Branch, shadow run, diff and promote on the flights job, against oracles.

The oracles: pandas over the replay (which windows a bug fix changes, known before
anything runs), and replays from scratch (a promotion's output is the old code's up to
the promotion and the new code's after it; the operators keep the same state).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime

import pytest

from dkvstream.examples.flights_v2 import RouteDailyDelaysWithSum
from dkvstream.operators.runtime.branches import (
    BranchError,
    branch,
    diff,
    promote,
    promoted_job,
    read_branch,
    read_promotion,
    run_branch,
)
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.runtime.pins import pinned_keys
from dkvstream.storage.objectstore import open_object_store
from tests.operators.branch_jobs import (
    KEY_COLUMNS,
    BuggyRouteDailyDelays,
    FirstFlights,
    RouteDailyDelays,
    expected_mean_changes,
    flights_variant,
)

PER_PARTITION = 8_000
KEYS = {"main": KEY_COLUMNS, "late": ["key", "event_time"]}


def _run(job, store, max_epochs=None):
    with JobRunner(job, None, store, retain_checkpoints=None) as runner:
        return runner.run(max_epochs)


def _rows_by_epoch(store, job, output="main") -> dict[int, Counter]:
    """``{epoch: Counter of rows}`` of a job's published output."""
    from dkvstream.operators.runtime.branches import published_by_epoch, read_epoch

    out = {}
    for epoch, keys in published_by_epoch(store, job, output).items():
        t = read_epoch(store, job, output, keys, epoch)
        out[epoch] = Counter(tuple(r.values()) for r in t.to_pylist())
    return out


@pytest.fixture
def store(tmp_path):
    return open_object_store(str(tmp_path / "store"))


def test_bug_fix_diff_is_the_windows_known_in_advance(store) -> None:
    main = flights_variant("flights", BuggyRouteDailyDelays())
    fixed = flights_variant("flights_fix", RouteDailyDelays())
    _run(main, store, max_epochs=2)
    record = branch(store, main, fixed)
    assert (record.main, record.fork_epoch) == ("flights", 2)
    main_results = _run(main, store)
    results = run_branch(fixed, None, store, retain_checkpoints=None)
    assert [r.epoch for r in results] == [r.epoch for r in main_results]  # the shadow followed every epoch
    assert [r.source_offsets for r in results] == [r.source_offsets for r in main_results]
    assert [r.watermark for r in results] == [r.watermark for r in main_results]

    d = diff(store, main, fixed, key_columns=KEYS)
    assert d.epochs == (3, main_results[-1].epoch)
    # Known in advance: the windows with flights without a reported delay, among those
    # emitted after the fork.
    emitted = {(r[0], r[1], int(r[2].timestamp() * 1000)): e
               for e, rows in _rows_by_epoch(store, main).items() if e > 2 for r in rows}
    expected = expected_mean_changes(PER_PARTITION) & set(emitted)
    out = d.outputs["main"]
    assert (out.columns_added, out.columns_removed) == ([], [])
    assert out.totals()["changed"] == len(expected) > 0
    assert out.totals()["only_in_main"] == out.totals()["only_in_branch"] == 0
    per_epoch = Counter(emitted[k] for k in expected)
    assert {e.epoch: e.changed for e in out.epochs if e.changed} == dict(per_epoch)
    assert all(e.changed_columns == {"dep_delay_mean": e.changed} for e in out.epochs if e.changed)
    for e in out.epochs:
        for s in e.samples.get("changed", []):  # samples are keys of changed rows
            ms = int(datetime.fromisoformat(s["window_start"]).timestamp() * 1000)
            assert (s["origin"], s["dest"], ms) in expected
        assert len(e.samples.get("changed", [])) == min(e.changed, 5)
    assert not d.outputs["late"].totals()["changed"]


def test_new_output_column_diff_is_that_column(store) -> None:
    main = flights_variant("flights", RouteDailyDelays())
    more = flights_variant("flights_sum", RouteDailyDelaysWithSum())
    _run(main, store, max_epochs=1)
    branch(store, main, more)
    _run(main, store)
    run_branch(more, None, store)
    d = diff(store, main, more, key_columns=KEYS)
    out = d.outputs["main"]
    assert (out.columns_added, out.columns_removed) == (["dep_delay_sum"], [])
    assert d.differs
    assert not any(e.differs for o in d.outputs.values() for e in o.epochs)
    assert out.totals()["main_rows"] == out.totals()["branch_rows"] > 0


def test_promote_continues_with_the_branch_exactly_once(store) -> None:
    old = flights_variant("flights", BuggyRouteDailyDelays())
    new = flights_variant("flights_fix", RouteDailyDelays())
    _run(old, store, max_epochs=1)
    branch(store, old, new)
    _run(old, store, max_epochs=2)  # main at epoch 3
    run_branch(new, None, store, max_epochs=1)  # branch at epoch 2: behind
    with pytest.raises(BranchError, match="run the branch further"):
        promote(store, old, new)
    run_branch(new, None, store)
    promotion = promote(store, old, new)
    assert (promotion.epoch, promotion.branch_epoch) == (4, 3)
    # The main pins the branch's files it now names (the branch's retention keeps off them).
    assert promotion.pins and all(k.startswith("jobs/flights_fix/pins/flights--") for k in promotion.pins)
    named = {m for ranges in read_checkpoint(store, "jobs/flights", 4).operators.values() for m in ranges.values()}
    assert named and {k for k in named if k.startswith("jobs/flights_fix/")} <= pinned_keys(store, "jobs/flights_fix")
    assert promote(store, old, new).epoch == 4  # idempotent
    assert read_promotion(store, "flights").branch == "flights_fix"
    assert read_branch(store, new).promoted_at_epoch == 4
    with pytest.raises(BranchError, match="promoted_job"):
        _run(old, store)  # the old code no longer runs the main
    with pytest.raises(BranchError, match="was promoted"):
        run_branch(new, None, store)
    _run(promoted_job(old, new), store)

    got = assert_promoted_at_4_equals_replays(store, old)  # oracle: replays from scratch of both codes
    # Each window exactly once over the whole table.
    windows = Counter(r[:3] for rows in got.values() for r in rows.elements())
    assert windows and max(windows.values()) == 1


def test_branch_refusals(store) -> None:
    main = flights_variant("flights", RouteDailyDelays())
    with pytest.raises(BranchError, match="no checkpoint"):
        branch(store, main, flights_variant("b", RouteDailyDelays()))
    _run(main, store, max_epochs=1)
    with pytest.raises(BranchError, match="name of its own"):
        branch(store, main, flights_variant("flights", RouteDailyDelays()))
    with pytest.raises(BranchError, match="same input"):
        branch(store, main, flights_variant("b", RouteDailyDelays(), source=_Other()))
    with pytest.raises(BranchError, match="not a branch"):
        diff(store, main, flights_variant("b", RouteDailyDelays()))


class _Other(FirstFlights):
    name = "other"


def test_live_kafka_branch_follows_the_mains_epochs(kafka_broker, store) -> None:
    """On a live topic the epochs depend on what had arrived when each was planned: the
    branch (another epoch size) still reads exactly the main's epochs, its diff equals a
    pandas comparison of the two outputs, and the promoted main's output equals the
    replay oracle."""
    import time

    import pandas as pd

    from dkvstream.examples.flights_live import VALUE_SCHEMA
    from dkvstream.examples.flights_producer import create_topic, produce
    from dkvstream.operators.io.kafka import KafkaSource

    topic = f"flights-branch-{time.time_ns() % 10**9}"
    create_topic(kafka_broker.bootstrap, topic)

    def source():
        return KafkaSource(kafka_broker.bootstrap, topic, value_format="json", value_schema=VALUE_SCHEMA,
                           bounded=False)

    main = flights_variant("flights", BuggyRouteDailyDelays(), source=source(), events_per_epoch=3_000)
    fixed = flights_variant("flights_fix", RouteDailyDelays(), source=source(), events_per_epoch=7_000)
    assert produce(kafka_broker.bootstrap, topic, rate=1e6, limit=6_000) == 6_000
    _run(main, store, max_epochs=1)
    branch(store, main, fixed)
    _run(main, store)
    produce(kafka_broker.bootstrap, topic, rate=1e6, limit=4_000)  # the same first flights again: later epochs
    main_results = _run(main, store)
    results = run_branch(fixed, None, store, retain_checkpoints=None)
    assert [(r.epoch, r.source_offsets, r.watermark) for r in results][-len(main_results):] == [
        (r.epoch, r.source_offsets, r.watermark) for r in main_results]

    d = diff(store, main, fixed, key_columns=KEYS)
    frames = {}
    for side, job in (("main", main), ("branch", fixed)):
        rows = [{**r, "epoch": e} for e, c in _rows_by_epoch(store, job).items() if e > 1 for r in _dicts(job, c)]
        frames[side] = pd.DataFrame(rows)
    m = frames["main"].merge(frames["branch"], on=["epoch", *KEY_COLUMNS], suffixes=("_m", "_b"))
    assert len(m) == len(frames["main"]) == len(frames["branch"])  # the same windows in the same epochs
    differs = m[~((m["dep_delay_mean_m"] == m["dep_delay_mean_b"])
                  | (m["dep_delay_mean_m"].isna() & m["dep_delay_mean_b"].isna()))]
    out = d.outputs["main"]
    assert {e.epoch: e.changed for e in out.epochs if e.changed} == differs.groupby("epoch").size().to_dict()
    assert out.totals()["changed"] > 0 and out.totals()["only_in_main"] == out.totals()["only_in_branch"] == 0

    # Promote, then drain the main with the new code. Oracle: each code from scratch on the
    # whole topic, drained: every window once, as the old code made it up to the promotion
    # and as the new code did after it.
    promotion = promote(store, main, fixed)

    def drained(job) -> None:
        with JobRunner(job, None, store, retain_checkpoints=None) as runner:
            runner.run()
            runner.stop(drain=True)
            runner.run()

    drained(promoted_job(main, fixed))
    refs = {}
    for name, op in (("ref_old", BuggyRouteDailyDelays()), ("ref_new", RouteDailyDelays())):
        job = flights_variant(name, op, source=source(), events_per_epoch=3_000)
        drained(job)
        refs[name] = {r[:3]: r for rows in _rows_by_epoch(store, job).values() for r in rows.elements()}
    got = _rows_by_epoch(store, main)
    windows = Counter(r[:3] for rows in got.values() for r in rows.elements())
    assert max(windows.values()) == 1 and set(windows) == set(refs["ref_new"])
    for epoch, rows in got.items():
        ref = refs["ref_old"] if epoch <= promotion.branch_epoch else refs["ref_new"]
        assert all(r == ref[r[:3]] for r in rows), epoch
    after = [r for e, rows in got.items() if e > promotion.branch_epoch for r in rows]
    assert any(r != refs["ref_old"][r[:3]] for r in after)  # the new code's rows are told apart


def assert_promoted_at_4_equals_replays(store, main) -> dict:
    """Oracle of a main promoted at epoch 4 (the branch at its epoch 3): replays from
    scratch of the old code (the main's epochs 1-3) and of the new code (its epoch e is the
    main's e + 1); the promotion epoch reads and writes nothing. Returns the main's rows
    by epoch (``_rows_by_epoch``)."""
    _run(flights_variant("ref_old", BuggyRouteDailyDelays()), store)
    _run(flights_variant("ref_new", RouteDailyDelays()), store)
    got = _rows_by_epoch(store, main)
    ref_old = _rows_by_epoch(store, flights_variant("ref_old", BuggyRouteDailyDelays()))
    ref_new = _rows_by_epoch(store, flights_variant("ref_new", RouteDailyDelays()))
    assert {e: got[e] for e in got if e <= 3} == {e: ref_old[e] for e in ref_old if e <= 3}
    assert 4 not in got or not got[4]
    assert {e - 1: got[e] for e in got if e > 4} == {e: ref_new[e] for e in ref_new if e > 3}
    return got


def _dicts(job, rows: Counter) -> list[dict]:
    names = job.sinks["main"].schema.names
    return [dict(zip(names, r)) for r in rows.elements()]


def test_branch_and_promote_on_spark(spark, store) -> None:
    """The shadow run and the promoted main on Spark local[2] (tasks open the other job's
    ranges from its manifests); the oracle is the in-process replay from scratch."""
    old = flights_variant("flights", BuggyRouteDailyDelays())
    new = flights_variant("flights_fix", RouteDailyDelays())
    _run(old, store, max_epochs=3)
    branch(store, old, new, epoch=1)
    results = run_branch(new, spark, store)
    assert [r.epoch for r in results] == [2, 3]
    promote(store, old, new)
    with JobRunner(promoted_job(old, new), spark, store) as runner:
        runner.run()
    assert_promoted_at_4_equals_replays(store, old)


def test_promote_refuses_a_running_main(store) -> None:
    from dkvstream.operators.runtime.control import acquire_lease

    main = flights_variant("flights", RouteDailyDelays())
    more = flights_variant("flights_sum", RouteDailyDelaysWithSum())
    _run(main, store, max_epochs=1)
    branch(store, main, more)
    acquire_lease(store, main.prefix, 2)  # a driver has epoch 2 in flight
    with pytest.raises(BranchError, match="is running"):
        promote(store, main, more)
    assert read_promotion(store, main) is None


def test_promote_interrupted_before_its_commit_blocks_every_driver_until_run_again(store, monkeypatch) -> None:
    from dkvstream.operators.runtime import branches

    old = flights_variant("flights", BuggyRouteDailyDelays())
    new = flights_variant("flights_fix", RouteDailyDelays())
    _run(old, store, max_epochs=2)
    branch(store, old, new)

    def crash(*_args, **_kwargs):
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(branches, "commit_checkpoint", crash)
    with pytest.raises(RuntimeError, match="killed"):
        promote(store, old, new)
    monkeypatch.undo()
    for code in (old, promoted_job(old, new)):  # neither code may run on the main now
        with pytest.raises(BranchError, match="run promote again"):
            _run(code, store)
    assert promote(store, old, new).epoch == 3
    assert _run(promoted_job(old, new), store)[0].epoch == 4


def test_promote_refuses_a_branch_whose_watermark_differs(store) -> None:
    """A branch with another watermark bound reads the same offsets but reaches another
    watermark: promoted, it would emit the main's windows again (or never): refused,
    naming both watermarks; nothing is written for the main."""
    main = flights_variant("flights", RouteDailyDelays())
    later = dataclasses.replace(flights_variant("flights_late", RouteDailyDelays()),
                                max_out_of_orderness_ms=3 * main.max_out_of_orderness_ms)
    _run(main, store, max_epochs=1)
    branch(store, main, later)
    _run(main, store, max_epochs=1)
    run_branch(later, None, store)
    m, b = read_checkpoint(store, "jobs/flights", 2), read_checkpoint(store, "jobs/flights_late", 2)
    assert m.source_offsets == b.source_offsets and m.watermark > b.watermark
    with pytest.raises(BranchError, match=f"watermark {b.watermark} ms.*{m.watermark} ms.*max_out_of_orderness_ms"):
        promote(store, main, later)
    assert read_promotion(store, main) is None
    assert read_branch(store, later).promoted_at_epoch is None


def test_promote_refuses_a_branch_whose_processing_time_differs(store) -> None:
    """A branch checkpoint at the main's offsets and watermark but another processing
    time (not written by a shadow run) is refused, naming both."""
    from dkvstream.operators import paths

    main = flights_variant("flights", RouteDailyDelays())
    more = flights_variant("flights_sum", RouteDailyDelaysWithSum())
    _run(main, store, max_epochs=1)
    branch(store, main, more)
    _run(main, store, max_epochs=1)
    run_branch(more, None, store)
    b = read_checkpoint(store, "jobs/flights_sum", 2)
    store.put(paths.checkpoint_key("jobs/flights_sum", 2),
              dataclasses.replace(b, processing_time_ms=b.processing_time_ms + 1).encode())
    with pytest.raises(BranchError, match=f"processing time {b.processing_time_ms + 1} ms.*"
                                          f"{b.processing_time_ms} ms"):
        promote(store, main, more)
    assert read_promotion(store, main) is None


def test_shadow_fires_processing_time_timers_at_the_mains_processing_time(tmp_path, store) -> None:
    """The branch runs later by the wall clock (its own clock, 1,000 s ahead) yet fires
    the main's processing-time timers in the main's epochs, including the main's epochs
    without input (one per run of the main), all in one shadow run: the same processing
    time per epoch, no row differs, and promote accepts it."""
    from tests.operators import processing_time as pt
    from tests.operators.live_sources import reveal

    class Clock:
        def __init__(self, now: float) -> None:
            self.now = now

        def __call__(self) -> float:
            return self.now

    visible, clock = tmp_path / "visible.json", Clock(1_700_000_000.0)
    main = dataclasses.replace(pt.job(visible, pt.TimeoutBatch()), name="timeouts")
    v2 = dataclasses.replace(pt.job(visible, pt.Timeout()), name="timeouts_v2")  # the on_event form

    def step(advance_s: float, visible_events: int) -> list:
        clock.now += advance_s
        reveal(visible, {"p0": visible_events, "p1": visible_events})
        with JobRunner(main, None, store, clock=clock, retain_checkpoints=None) as runner:
            return runner.run()

    step(0, 100)
    branch(store, main, v2)
    # Timers are due 10 s after the epoch that set them: the last two steps read nothing
    # and fire them.
    ran = [r for s in ((4, 180), (7, 180), (4, 180)) for r in step(*s)]
    assert [(r.epoch, r.events) for r in ran] == [(2, 160), (3, 0), (4, 0)]
    results = run_branch(v2, None, store, clock=Clock(clock.now + 1_000), retain_checkpoints=None)
    assert [r.epoch for r in results] == [2, 3, 4]
    for e in range(1, 5):
        assert (read_checkpoint(store, "jobs/timeouts_v2", e).processing_time_ms
                == read_checkpoint(store, "jobs/timeouts", e).processing_time_ms)
    d = diff(store, main, v2, key_columns={"main": ["key", "due"]})
    assert d.outputs["main"].totals()["main_rows"] > 0
    assert not any(e.differs for e in d.outputs["main"].epochs)
    assert promote(store, main, v2).epoch == 5


def test_a_continuous_main_waiting_between_epochs_is_fenced_after_a_promotion(store) -> None:
    """What the docs say of a running main: a continuous driver between epochs holds no
    lease, promote goes ahead, and that driver's next commit raises JobFencedError;
    nothing of its epoch is published, and the main's checkpoints stay the promotion's."""
    from dkvstream.operators.errors import JobFencedError

    main = flights_variant("flights", RouteDailyDelays())
    more = flights_variant("flights_sum", RouteDailyDelaysWithSum())
    with JobRunner(main, None, store, retain_checkpoints=None) as runner:
        epochs = runner.epochs(None, continuous=True)
        assert next(epochs).epoch == 1  # the driver now waits for its next epoch
        branch(store, main, more)
        promotion = promote(store, main, more)
        assert promotion.epoch == 2
        published = _rows_by_epoch(store, main)
        with pytest.raises(JobFencedError, match="epoch 2 was committed by another driver"):
            next(epochs)
    assert _rows_by_epoch(store, main) == published
    assert read_checkpoint(store, "jobs/flights", 2).metrics["promoted"]["branch"] == "flights_sum"


def test_branch_record_reads_its_main_and_epoch_from_the_fork_record(store) -> None:
    """branch.json does not repeat fork.json: the main and the fork epoch come from the
    fork record, a fork record without them is refused by name, and a branch.json that
    still repeats them (written before) reads the same."""
    import json

    from dkvstream.operators import paths
    from dkvstream.operators.runtime.forks import forked_from
    from dkvstream.storage.errors import CorruptionError

    main = flights_variant("flights", RouteDailyDelays())
    more = flights_variant("flights_sum", RouteDailyDelaysWithSum())
    _run(main, store, max_epochs=2)
    branch(store, main, more, epoch=1)
    key = paths.branch_record_key("jobs/flights_sum")
    stored = json.loads(store.get(key))
    assert not {"main", "fork_epoch"} & set(stored)
    fork = forked_from(store, more)
    record = read_branch(store, more)
    assert (record.main, record.fork_epoch) == (fork["parent"], fork["epoch"]) == ("flights", 1)
    store.put(key, json.dumps({**stored, "main": "flights", "fork_epoch": 1}).encode())
    assert read_branch(store, more) == record
    fork_key = paths.fork_record_key("jobs/flights_sum")
    store.put(fork_key, json.dumps({k: v for k, v in fork.items() if k != "parent"}).encode())
    with pytest.raises(CorruptionError, match="fork.json.*names no parent"):
        read_branch(store, more)
