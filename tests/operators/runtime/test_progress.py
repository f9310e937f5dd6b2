"""Progress of a run (``dkvstream.operators.runtime.progress``) and ``run_job``'s output: the readable
line per epoch against the ``EpochResult``'s offsets and watermark, the progress numbers
against a hand computation and against ``event_time.plan_epoch`` itself, and ``--json``'s lines
as scripts parse them."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dkvstream.operators.runtime.driver import EpochResult
from dkvstream.operators.runtime.event_time import plan_epoch
from dkvstream.operators.runtime.progress import ProgressTracker, epoch_line, epochs_left, format_duration
from dkvstream.operators.tools import run_job

SMALL_JOB = "tests.operators.small_keyed_count:job"  # 2 x 3,000 events, 750 an epoch


class _Source:
    """What ``ProgressTracker`` asks of a source."""

    def __init__(self, bounded: bool = True, start: int = 0) -> None:
        self.bounded, self.start = bounded, start

    def start_offset(self, partition: str) -> int:
        return self.start


def _result(epoch: int, offsets: dict[str, int], lag: dict[str, int], seconds: float, events: int,
            finished: bool = False, watermark: int = 0, **live_metrics) -> EpochResult:
    return EpochResult(epoch=epoch, watermark=watermark, source_offsets=offsets, checkpoint_uri="x", events=events,
                       seconds=seconds, finished=finished, tables=0, table_bytes=0, keys=0, output_rows={},
                       published=[], live={"lag_events": lag, **live_metrics})


def test_epochs_left_by_hand() -> None:
    # 300 an epoch over a (1,000 left) and b (100): 150 each, b is done after one epoch
    # (it reads its 100); then a alone reads 300 an epoch: 850 left -> 3 more. 4 in all.
    assert epochs_left({"a": 1_000, "b": 100}, 300) == 4
    assert epochs_left({"a": 0, "b": 0}, 300) == 0
    assert epochs_left({"a": 7}, 300) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2_000), min_size=1, max_size=6), st.integers(1, 700))
def test_epochs_left_is_what_plan_epoch_takes(left, events_per_epoch) -> None:
    """The oracle: plan epochs with ``event_time.plan_epoch`` until nothing is left."""
    parts = [f"p{i}" for i in range(len(left))]
    committed, ends = dict.fromkeys(parts, 0), dict(zip(parts, left))
    epochs = 0
    while any(committed[p] < ends[p] for p in parts):
        plan = plan_epoch(committed, ends, dict.fromkeys(parts, 0), {}, now_ms=0,
                               events_per_epoch=events_per_epoch, bounded=True)
        committed = {p: end for p, (_, end) in plan.offsets.items()}
        epochs += 1
    assert epochs_left(dict(zip(parts, left)), events_per_epoch) == epochs


def test_bounded_progress_by_hand() -> None:
    # Offsets start at 100 in both partitions; 2 x 1,000 offsets; 500 an epoch.
    tracker = ProgressTracker(_Source(start=100), events_per_epoch=500)
    first = tracker.update(_result(1, {"a": 350, "b": 350}, {"a": 750, "b": 750}, seconds=2.0, events=500))
    # Read 2 x 250 = 500 of 2,000 offsets: 25%; 1,500 left at 500 an epoch: 3 more
    # epochs, of 2.0 s each (the mean so far).
    assert (first.epochs_total, first.percent, first.seconds_left) == (4, 25.0, 6.0)
    second = tracker.update(_result(2, {"a": 600, "b": 600}, {"a": 500, "b": 500}, seconds=4.0, events=500))
    # 1,000 of 2,000 read: 50%; 2 epochs left of 3.0 s (mean of 2.0 and 4.0).
    assert (second.epochs_total, second.percent, second.seconds_left) == (4, 50.0, 6.0)
    last = tracker.update(_result(4, {"a": 1_100, "b": 1_100}, {"a": 0, "b": 0}, 1.0, 1_000, finished=True))
    assert (last.epochs_total, last.percent, last.seconds_left) == (4, 100.0, 0.0)


def test_epochs_that_read_less_than_planned_lengthen_the_estimate() -> None:
    # Watermark alignment paused a partition: epoch 2 read 200 offsets where 500 were
    # planned, so the 1,600 left take ceil(1,600 / 200) = 8 epochs, not the 4 the plan's
    # shares give.
    tracker = ProgressTracker(_Source(), events_per_epoch=500)
    first = tracker.update(_result(1, {"a": 200, "b": 0}, {"a": 800, "b": 1_000}, seconds=1.0, events=200))
    assert first.epochs_total == 1 + 4  # one epoch says nothing yet: the plan's shares
    second = tracker.update(_result(2, {"a": 400, "b": 0}, {"a": 600, "b": 1_000}, seconds=1.0, events=200))
    assert second.epochs_total == 2 + 8


def test_live_progress_is_lag_per_partition() -> None:
    tracker = ProgressTracker(_Source(bounded=False), events_per_epoch=500)
    result = _result(12, {"EWR": 1_200, "JFK": 900}, {"EWR": 40, "JFK": 80}, seconds=2.0, events=4_000,
                     watermark=1_357_034_400_000, input_rate=3_500.0)
    progress = tracker.update(result)
    assert progress.epochs_total is None and progress.percent is None and progress.lag_events == {"EWR": 40, "JFK": 80}
    assert epoch_line(result, progress) == (
        "epoch 12: 4,000 events in 2.0 s (2,000 events/s, arriving 3,500/s), watermark 2013-01-01 10:00:00 UTC, "
        "lag 120 (EWR=40 JFK=80), offsets EWR=1,200 JFK=900")


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.4, 42, 185, 7_440)] == ["0 s", "42 s", "3 min 05 s", "2 h 04 min"]


def test_run_job_prints_a_readable_line_per_epoch(tmp_path, capsys) -> None:
    """The small job: 750 an epoch, 375 per partition, an event every 6 s per partition
    from 0 and a watermark bound of 12 s: epoch 1 reaches offsets 375 and watermark
    374 x 6 s - 12 s - 1 ms = 2,231.999 s = 00:37:11.999; epoch 2 offsets 750 and
    749 x 6 s - 12 s - 1 ms = 01:14:41.999. 6,000 events are 8 epochs."""
    assert run_job.main(["--job", SMALL_JOB, "--store", str(tmp_path), "--in-process", "--max-epochs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("epoch 1 of ~8 (12%, ~")
    assert lines[0].endswith(", watermark 1970-01-01 00:37:11.999 UTC, offsets p0=375 p1=375")
    assert lines[1].startswith("epoch 2 of ~8 (25%, ~")
    assert lines[1].endswith(", watermark 1970-01-01 01:14:41.999 UTC, offsets p0=750 p1=750")
    assert ": 750 events in " in lines[1] and "dead letters" not in lines[1]


def test_run_job_json_lines_are_unchanged(tmp_path, capsys) -> None:
    """``--json``: exactly the records scripts parse, nothing else on stdout."""
    assert run_job.main(["--job", SMALL_JOB, "--store", str(tmp_path), "--in-process", "--max-epochs", "1",
                         "--json"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(record) == {"event", "epoch", "events", "dead_letter", "seconds", "finished", "drained",
                           "parallelism", "requests", "watermark", "source_offsets", "live"}
    assert (record["event"], record["epoch"], record["events"], record["watermark"], record["source_offsets"]) == (
        "committed", 1, 750, 2_232_000 - 1, {"p0": 375, "p1": 375})
    assert set(record["requests"]) == {"driver", "tasks"} and record["live"]["lag_events"] == {"p0": 2_625,
                                                                                               "p1": 2_625}
