"""The job author's API: keyed events, operators and the subject they act on.

No PySpark here: an operator is plain Python, run by ``dkvstream.operators.runtime.task`` inside Spark
tasks and directly by unit tests.

Timestamps are event time in milliseconds since the Unix epoch (UTC), as int; processing
time is the epoch's wall clock in the same unit (``Subject.processing_time``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import pyarrow as pa

MAIN_OUTPUT = "main"
WATERMARK_MIN = -(1 << 63)
WATERMARK_MAX = (1 << 63) - 1  # end of input: every timer fires


class TimeDomain(StrEnum):
    """Which clock a timer follows (Flink's ``TimeDomain``): ``subject.time_domain`` in
    ``on_timer_expired``, the ``domain`` column of ``on_timers``' table (its values are
    these strings).

    * ``EVENT_TIME``: the watermark; set with ``set_timer``.
    * ``PROCESSING_TIME``: the epoch's processing time (``Subject.processing_time``); set
      with ``set_processing_timer``.
    """

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True, slots=True)
class KeyedEvent:
    """One event routed by key.

    Attributes:
        key: the subject key (bytes); decides key group, task and state.
        timestamp: event time, ms since the Unix epoch (UTC).
        value: the payload, a ``{column: value}`` dict of the source's value columns.
    """

    key: bytes
    timestamp: int
    value: Any


class Subject(ABC):
    """What an operator acts on while handling one event or timer.

    Attributes:
        key: the subject key (bytes).
        key_group: the key group of ``key``.
        timestamp: the event's timestamp, or the timer's timestamp in
            ``on_timer_expired`` (ms).
        watermark: the current event-time watermark (ms). In ``on_event`` it is the
            watermark reached before this epoch: an event with ``timestamp <=
            watermark`` is late. In ``on_timer_expired`` it is the watermark being
            advanced to.
        processing_time: the epoch's processing time (ms since the Unix epoch, UTC): the
            driver's wall clock when it planned the epoch, never below the previous
            epoch's; the same for every event and timer of the epoch, and on every retry
            of it while the driver runs (an epoch planned again after a driver restart
            gets a new one) (Flink's ``currentProcessingTime``).
        time_domain: in ``on_timer_expired``, the domain of the timer firing
            (``TimeDomain``); in ``on_event``, None.
    """

    key: bytes
    key_group: int
    timestamp: int
    watermark: int
    processing_time: int
    time_domain: TimeDomain | None

    @abstractmethod
    def set_timer(self, timestamp: int) -> None:
        """Register an event-time timer for this key at ``timestamp`` (ms).

        It fires (``on_timer_expired``) once the watermark reaches it, in timestamp
        order across keys. Setting the same timer twice registers it once. A timer set
        while handling a timer fires in the same advance if the watermark covers it.
        """

    @abstractmethod
    def delete_timer(self, timestamp: int) -> None:
        """Remove a timer of this key; no error if none is set."""

    def set_processing_timer(self, timestamp: int) -> None:
        """Register a processing-time timer for this key at ``timestamp`` (ms since the
        Unix epoch, wall clock).

        It fires (``on_timer_expired`` with ``subject.time_domain ==
        TimeDomain.PROCESSING_TIME``) in the first epoch whose processing time reaches it,
        after that epoch's event-time timers, in timestamp order across keys. Setting the
        same timer twice registers it once; one already due fires in this epoch.

        Raises:
            NotImplementedError: this subject has no processing-time timers (a subject
                not made by the runtime).
        """
        raise NotImplementedError(f"{type(self).__name__} has no processing-time timers")

    def delete_processing_timer(self, timestamp: int) -> None:
        """Remove a processing-time timer of this key; no error if none is set.

        Raises:
            NotImplementedError: as ``set_processing_timer``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no processing-time timers")

    @abstractmethod
    def emit(self, value: dict, *, output: str = MAIN_OUTPUT, key: bytes | None = None,
             timestamp: int | None = None) -> None:
        """Emit one record to an output.

        Args:
            value: ``{column: value}`` matching the operator's ``outputs[output]`` schema.
            output: output name, ``"main"`` by default; others are side outputs such as
                ``"late"``.
            key: key of the emitted event for a downstream operator (default: subject key).
            timestamp: event time of the emitted event (default: ``subject.timestamp``).

        Raises:
            KeyError: if the operator declares no such output.
        """


class Operator(ABC):
    """A keyed, stateful operator.

    Subclasses set ``name``, ``outputs`` (output name -> Arrow schema of emitted
    records; ``"main"`` feeds the next operator or the job's sink) and implement
    ``on_event``; ``on_timer_expired`` if they set timers. State is declared as class
    attributes holding ``ValueSpec``/``ListSpec``/``MapSpec`` objects and used through
    ``spec.state_for(subject)``. Operators must be picklable (Spark ships them to tasks).
    """

    name: ClassVar[str] = "operator"
    outputs: ClassVar[dict[str, pa.Schema]] = {}

    @abstractmethod
    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        """Handle one event of ``subject.key``, in event-time order within an epoch."""

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        """Handle a timer of ``subject.key`` at ``timestamp`` (ms) that the watermark
        (``subject.time_domain == TimeDomain.EVENT_TIME``) or the epoch's processing
        time (``TimeDomain.PROCESSING_TIME``) passed."""
