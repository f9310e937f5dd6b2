"""How far a run is, and the one line per committed epoch that says so.

For a bounded source: epochs done of the total, the share of the source's offsets read,
and the time left. For a live source: lag per partition (Kafka's consumer lag) and the
rates. ``dkvstream.operators.tools.run_job`` prints ``epoch_line`` for each committed epoch, and
the Dagster asset that runs a job logs it (``dkvstream.assets.job_assets``).

The total is an estimate (hence "~"): ``epochs_left`` replays ``event_time.plan_epoch``'s
equal shares over what each partition has left, which is exact unless watermark
alignment pauses a partition (its epochs then read less): the estimate is then at
least what is left over the offsets the run's epochs read on average (from its second
epoch on). The time left is the epochs
left times the mean wall time of the run's epochs so far.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from dkvstream.operators.api.operator import WATERMARK_MAX, WATERMARK_MIN
from dkvstream.operators.runtime.driver import EpochResult

# A line names at most this many partitions; the rest are counted ("+N more").
MAX_PARTITIONS_SHOWN = 6


def epochs_left(remaining: dict[str, int], events_per_epoch: int) -> int:
    """Epochs ``event_time.plan_epoch`` needs to read ``remaining`` offsets per partition:
    each epoch gives every partition with input an equal share, ``ceil(events_per_epoch
    / partitions with input)``; one with less reads what it has.

    Computed per phase (a phase ends when the partition with the least left runs out),
    so in O(partitions log partitions) whatever the number of epochs.

    Args:
        remaining: offsets left per partition (<= 0: none).
        events_per_epoch: ``Job.events_per_epoch`` (> 0).

    Returns:
        The epochs, 0 when nothing is left.
    """
    left = sorted(n for n in remaining.values() if n > 0)
    epochs, read, i = 0, 0, 0  # read: offsets each partition still open has read so far
    while i < len(left):
        share = -(-events_per_epoch // (len(left) - i))
        k = -(-(left[i] - read) // share)  # epochs until the partition with least left is done
        epochs += k
        read += k * share
        while i < len(left) and left[i] <= read:
            i += 1
    return epochs


@dataclass(frozen=True)
class Progress:
    """Where a run stands after a committed epoch (``ProgressTracker.update``).

    Attributes:
        epoch: the committed epoch (the job's count, over all its runs).
        bounded: ``Source.bounded``.
        lag_events: offsets left unread per partition (end offsets at the epoch's plan
            minus the committed ones; ``EpochResult.live["lag_events"]``).
        epochs_total: bounded: ``epoch`` + ``epochs_left`` (an estimate, module
            docstring); None for a live source or without lag.
        percent: bounded: offsets read of the source's offsets, 0-100; else None.
        seconds_left: bounded: epochs left x the run's mean epoch time, s; else None.
    """

    epoch: int
    bounded: bool
    lag_events: dict[str, int] = field(default_factory=dict)
    epochs_total: int | None = None
    percent: float | None = None
    seconds_left: float | None = None


class ProgressTracker:
    """Follows a run's committed epochs and tells how far it is (``update``).

    Args:
        source: the job's source, attached (``JobRunner`` attaches it); its
            ``start_offset`` is asked once per partition, for the percentage.
        events_per_epoch: ``Job.events_per_epoch``.
    """

    def __init__(self, source, events_per_epoch: int) -> None:
        self.source = source
        self.events_per_epoch = events_per_epoch
        self._starts: dict[str, int] = {}
        self._seconds: list[float] = []
        self._first_left: int | None = None  # offsets left after the run's first epoch

    def update(self, result: EpochResult) -> Progress:
        """The progress after ``result`` (an epoch of this run, in commit order)."""
        self._seconds.append(result.seconds)
        lag = dict(result.live.get("lag_events") or {})
        if not self.source.bounded:
            return Progress(result.epoch, False, lag)
        if result.finished:
            return Progress(result.epoch, True, lag, result.epoch, 100.0, 0.0)
        if not lag:
            return Progress(result.epoch, True)
        remaining = sum(max(0, n) for n in lag.values())
        left = epochs_left(lag, self.events_per_epoch)
        # Epochs that read less than planned (watermark alignment paused a partition)
        # take longer: the offsets the run's epochs after its first read on average
        # bound the rest from below.
        if self._first_left is None:
            self._first_left = remaining
        elif len(self._seconds) > 1 and self._first_left > remaining:
            mean_read = (self._first_left - remaining) // (len(self._seconds) - 1)
            if mean_read > 0:
                left = max(left, -(-remaining // mean_read))
        for p in result.source_offsets.keys() - self._starts.keys():
            self._starts[p] = self.source.start_offset(p)
        read = sum(max(0, o - self._starts[p]) for p, o in result.source_offsets.items())
        total = read + remaining
        mean = sum(self._seconds) / len(self._seconds)
        return Progress(result.epoch, True, lag, result.epoch + left,
                        100.0 * read / total if total else 100.0, left * mean)


def format_watermark(ms: int) -> str:
    """A watermark (ms since the Unix epoch) as a UTC date and time, to the millisecond
    when it is not a whole second (a watermark is the newest event time minus the bound
    minus 1 ms, so it usually ends in .999), or ``-inf``/``+inf`` with what they mean."""
    if ms >= WATERMARK_MAX:
        return "+inf (end of input)"
    if ms <= WATERMARK_MIN:
        return "-inf (no events yet)"
    at = dt.datetime.fromtimestamp(ms // 1000, tz=dt.timezone.utc)
    millis = f".{ms % 1000:03d}" if ms % 1000 else ""
    return f"{at:%Y-%m-%d %H:%M:%S}{millis} UTC"


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 04 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def per_partition(values: dict[str, int]) -> str:
    """``EWR=1,200 JFK=800``: at most ``MAX_PARTITIONS_SHOWN`` partitions, then ``+N more``."""
    shown = [f"{p}={v:,}" for p, v in list(values.items())[:MAX_PARTITIONS_SHOWN]]
    if len(values) > MAX_PARTITIONS_SHOWN:
        shown.append(f"+{len(values) - MAX_PARTITIONS_SHOWN} more")
    return " ".join(shown)


def epoch_line(result: EpochResult, progress: Progress) -> str:
    """One readable line for a committed epoch.

    Bounded source: ``epoch 3 of ~7 (43%, ~8 s left): 100,002 events in 2.1 s (47,620
    events/s), watermark 2013-05-02 14:04:59.999 UTC, offsets EWR=40,000 JFK=35,000
    LGA=30,000``. Live source: ``epoch 12: ... events/s, arriving 3,500/s), watermark
    ..., lag 120 (EWR=40 JFK=80 LGA=0), offsets ...``. Dead letters and a drain are
    added when there are any.

    Args:
        result: the committed epoch.
        progress: ``ProgressTracker.update(result)``.
    """
    head = f"epoch {result.epoch}"
    if progress.epochs_total is not None:
        head += f" of ~{progress.epochs_total}" if not result.finished else f" of {progress.epochs_total}"
        if result.finished:
            head += " (100%, finished)"
        else:
            head += f" ({progress.percent:.0f}%, ~{format_duration(progress.seconds_left)} left)"
    rates = f"{result.events_per_second:,.0f} events/s"
    if not progress.bounded and result.live.get("input_rate") is not None:
        rates += f", arriving {result.live['input_rate']:,.0f}/s"
    parts = [f"{head}: {result.events:,} events in {result.seconds:.1f} s ({rates})"]
    dead = result.dead_letter.get("total", 0)
    if dead:
        parts.append(f"{dead:,} dead letters")
    if result.drained:
        parts.append("drained: watermark +inf, every window emitted")
    else:
        parts.append(f"watermark {format_watermark(result.watermark)}")
    if not progress.bounded and progress.lag_events:
        parts.append(f"lag {sum(progress.lag_events.values()):,} ({per_partition(progress.lag_events)})")
    parts.append(f"offsets {per_partition(result.source_offsets)}")
    return ", ".join(parts)
