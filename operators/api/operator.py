"""The job author's API: keyed events, operators and the subject they act on.

No PySpark here: an operator is plain Python, run by ``dkvstream.operators.runtime.task`` inside Spark
tasks and directly by unit tests.

Timestamps are event time in milliseconds since the Unix epoch (UTC), as int.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

MAIN_OUTPUT = "main"
WATERMARK_MIN = -(1 << 63)
WATERMARK_MAX = (1 << 63) - 1  # end of input: every timer fires


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
    """

    key: bytes
    key_group: int
    timestamp: int
    watermark: int

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
        """Handle a timer of ``subject.key`` at ``timestamp`` (ms) that the watermark passed."""
