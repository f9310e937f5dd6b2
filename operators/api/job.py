"""A job: one source -> one or more keyed operators -> sinks."""
from __future__ import annotations

from dataclasses import dataclass, field

from dkvstream.operators import paths
from dkvstream.operators.api.keygroups import DEFAULT_KEY_GROUPS
from dkvstream.operators.api.operator import Operator
from dkvstream.operators.io.dead_letter import DEAD_LETTER_OUTPUT, DeadLetter
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.io.sources import Source


@dataclass
class Job:
    """A streaming job definition.

    Attributes:
        name: job name; its files live under ``jobs/<name>/`` in the object store.
        source: where events come from.
        operators: keyed operators in order; operator i's ``"main"`` output feeds
            operator i+1 (re-keyed by the emitted key), the last one's outputs feed
            ``sinks``.
        sinks: last operator's output name -> sink. Every declared output of the last
            operator needs a sink; intermediate operators may only emit to ``"main"``.
        key_groups: K, fixed for the job's lifetime (default 256).
        parallelism: P, tasks (and DKV instances) per operator, unless
            ``operator_parallelism`` says otherwise.
        operator_parallelism: ``{operator name: P}`` for operators that run with their
            own number of key-group ranges (Flink's per-operator ``setParallelism``); the
            exchange between two operators re-routes events by the next one's ranges.
        key_layout: where a new job's tasks put their DKV and staged files:
            ``"flat"`` (``jobs/<job>/state/...``, ``staging/...``) or ``"hashed"`` (a
            two-hex-digit hash of operator and range first, ``jobs/<job>/r/<hh>/...``,
            spreading an epoch's requests over 256 S3 prefixes: for jobs with hundreds of
            ranges; Iceberg's ``write.object-storage.enabled``). Fixed at the job's first
            epoch and recorded in its checkpoints; a restart keeps the recorded layout.
        events_per_epoch: events read per micro-batch epoch, over all partitions.
        max_out_of_orderness_ms: watermark bound: watermark = min over unfinished
            source partitions of the max event time seen, minus this (>= 0), minus
            1 ms (Flink's ``forBoundedOutOfOrderness``): an event this far behind its
            partition's newest, or tied with it, is not late.
        dead_letter: where malformed events go and the future-timestamp bound
            (``dkvstream.operators.io.dead_letter.DeadLetter``).
        trigger_interval_ms: a continuous run (``JobRunner.epochs(continuous=True)``)
            starts an epoch at most this often, ms (Spark's processing-time trigger);
            0 starts the next epoch as soon as the previous one commits and input waits.
        idle_timeout_ms: a source partition without new events for this long (wall
            clock, ms) stops holding back the watermark until it receives events again
            (Flink's ``withIdleness``); None: never idle.
        quiet_timeout_ms: a live source none of whose partitions has received an event
            for this long (wall clock, ms) is quiet: its watermark then advances with
            processing time, from the largest event time read plus the time quiet, minus
            ``max_out_of_orderness_ms`` and 1 ms, so the last windows of a stream that
            went quiet are emitted (``dkvstream.operators.runtime.event_time.quiet_watermark``;
            Kafka Streams' wall-clock punctuation). Events that arrive after it are late
            if older than that watermark. None: the watermark waits for events.
        max_watermark_drift_ms: watermark alignment: a partition whose event time is
            more than this ahead of the slowest non-idle partition reads nothing until
            the others catch up (Flink's ``withWatermarkAlignment``); None: no alignment.
        on_operator_error: ``"fail"`` (an operator raising fails the epoch) or
            ``"dead_letter"`` (the event goes to the dead-letter table with the
            operator, the exception and its source position, its state changes are
            discarded, and the rest of the epoch commits: Kafka Streams' processing
            exception handler).

    Raises:
        InvalidJobError: (a ``ValueError``) from ``validate()`` on an inconsistent
            definition: a bad name, no operators or one that is not an ``Operator``,
            duplicate operator names, an output without a sink, zero key groups,
            parallelism above key groups, a state spec whose codec is not a ``Codec``,
            a negative watermark bound, ...
    """

    name: str
    source: Source
    operators: list[Operator]
    sinks: dict[str, Sink]
    key_groups: int = DEFAULT_KEY_GROUPS
    parallelism: int = 2
    events_per_epoch: int = 50_000
    max_out_of_orderness_ms: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    dead_letter: DeadLetter = field(default_factory=DeadLetter)
    trigger_interval_ms: int = 1_000
    idle_timeout_ms: int | None = None
    quiet_timeout_ms: int | None = None
    max_watermark_drift_ms: int | None = None
    on_operator_error: str = "fail"
    operator_parallelism: dict[str, int] = field(default_factory=dict)
    key_layout: str = "flat"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the definition (``dkvstream.operators.api.validation.check_job``).

        Raises:
            InvalidJobError: (a ``ValueError``) naming the job, the problem and what to do.
        """
        from dkvstream.operators.api.validation import check_job  # imports state specs and codecs

        check_job(self)

    def parallelism_of(self, operator: str) -> int:
        """The number of key-group ranges (tasks) of ``operator``."""
        return self.operator_parallelism.get(operator, self.parallelism)

    def output_sink(self, output: str) -> Sink:
        """The sink of a checkpoint output name (a last-operator output or the dead-letter table)."""
        return self.dead_letter.sink if output == DEAD_LETTER_OUTPUT else self.sinks[output]

    @property
    def prefix(self) -> str:
        """Object-store prefix of everything the job writes."""
        return paths.job_prefix(self.name)


def job_name(job: Job | str) -> str:
    """The name of ``job`` (a ``Job`` or a name): for functions that take either."""
    return job if isinstance(job, str) else job.name
