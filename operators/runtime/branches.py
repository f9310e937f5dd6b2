"""Branch, shadow run, diff, promote: try changed operator code on a job's real state and input.

The user's view is ``docs/branches.md``. The steps, on a main job M and a branch job B
(a ``Job`` with the changed code, the same source, its own name and so its own sinks):

1. ``branch(store, M, B)`` forks M's newest checkpoint (or ``epoch``) into B's name
   (``fork_job``: B's first checkpoint names M's range manifests, pinned; no state file
   is copied; ``fork_job``'s ``jobs/B/fork.json`` records M and the epoch) and marks B
   a branch at ``jobs/B/branch.json``.
2. ``run_branch(B, ...)`` runs B as M's shadow: ``JobRunner(..., follow=M)`` plans each
   epoch k of B to read exactly the offsets M's checkpoint k ended at, so epoch k of both
   covers the same input (Kafka offsets, replay positions) at the same processing time,
   and stops once B caught up with M's newest checkpoint. B writes its own sinks, never M's.
3. ``diff(store, M, B)`` compares, per output and per epoch after the fork, the rows M
   and B published: as multisets, or, given key columns, by key (``changed`` rows and
   the columns that differ). Columns only one side has are reported as such and left
   out of the row comparison, so a new output column is exactly that in the diff.
4. ``promote(store, M, B)``, with M stopped at checkpoint N and B at its checkpoint N
   (the same offsets, watermark and processing time): commits M's checkpoint N + 1 (no
   input read, no output) naming B's state (B's range manifests, pinned for M), having recorded at
   ``jobs/M/promoted.json`` that M runs B's code from then on, and marks B promoted. M's next epoch, run with
   ``promoted_job(M, B)`` (B's code under M's name), reads from M's offsets N on. A
   reader of M's sinks sees every input event's output once: epochs up to N from the old
   code, epochs after N + 1 from the new code. A driver that starts M with other
   operator code than the promoted one is refused (``check_promoted_code``). Promote
   sees a running M only by its epoch lease, held while an epoch is in flight: a
   continuous driver of M waiting between epochs holds none, so the promotion goes
   ahead and that driver's next commit is fenced (``JobFencedError``, nothing of its
   epoch published); hence "stop M first".

Costs (requests): ``branch`` is one fork (``fork_job``) plus one PUT; each shadow epoch
one LIST and one GET of M's checkpoint more than a plain epoch; ``diff`` one LIST per
output and side and one GET per published file compared (bytes: the outputs compared,
read once); ``promote`` a few GETs, one GET per range manifest of B (its files, for the
pins), one PUT per pin, one PUT for the checkpoint (put-if-absent), a LIST and a PUT for
the commit record, and three PUTs of records. No state byte is copied.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from dkvstream.operators import paths
from dkvstream.operators.api.job import Job, job_name
from dkvstream.operators.errors import JobFailedError
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.checkpoints import (
    JobCheckpoint,
    commit_checkpoint,
    latest_checkpoint,
    list_epochs,
    read_checkpoint,
    read_commit_log,
)
from dkvstream.operators.runtime.control import read_lease
from dkvstream.storage.errors import CorruptionError, DkvstreamError, ObjectExistsError, ObjectNotFoundError
from dkvstream.storage.objectstore import ObjectStore

FORMAT = 1
# Key samples per kind of difference kept in an ``EpochDiff`` (the Dagster asset shows them).
DEFAULT_SAMPLES = 5


class BranchError(DkvstreamError):
    """A branch step cannot be done as asked; the message says why and what to do."""


# ------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class BranchRecord:
    """A branch job: ``jobs/<branch>/branch.json`` (``branch``, ``created_at_ms``,
    ``promoted_at_epoch``) with, from the fork record ``jobs/<branch>/fork.json``
    (``forks.forked_from``), ``main`` and ``fork_epoch``: stored there only.

    Attributes:
        main: the main job's name (the fork's parent).
        branch: the branch job's name.
        fork_epoch: the main's checkpoint epoch the branch was forked from (its first
            checkpoint has that number and offsets).
        created_at_ms: when, ms since the Unix epoch.
        promoted_at_epoch: the main's epoch whose checkpoint took the branch's state
            (``promote``), or None while the branch is a shadow.
    """

    main: str
    branch: str
    fork_epoch: int
    created_at_ms: int
    promoted_at_epoch: int | None = None

    def encode(self) -> bytes:
        """``branch.json``'s bytes: the fields the fork record does not hold."""
        body = {"format": FORMAT, "branch": self.branch, "created_at_ms": self.created_at_ms,
                "promoted_at_epoch": self.promoted_at_epoch}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str, fork: Mapping, fork_uri: str) -> BranchRecord:
        """``branch.json``'s bytes read from ``uri``, and the branch's fork record (read
        from ``fork_uri``).

        Raises:
            CorruptionError: naming ``uri``, or ``fork_uri`` when it names no parent.
        """
        if "parent" not in fork or "epoch" not in fork:
            raise CorruptionError(f"{fork_uri}: the fork record of branch {uri} names no parent job and epoch "
                                  f"(missing or damaged); branch again under a new name")
        try:
            body = json.loads(data)
            body.pop("format")
            for repeated in ("main", "fork_epoch"):  # in records written before they were read from fork.json
                body.pop(repeated, None)
            return cls(**body, main=fork["parent"], fork_epoch=fork["epoch"])
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptionError(f"{uri}: unreadable branch record: {e}") from None


@dataclass(frozen=True)
class Promotion:
    """``jobs/<main>/promoted.json``: the main job continues with a branch's state and code.

    Attributes:
        main, branch: job names.
        epoch: the main's checkpoint epoch that names the branch's state (N + 1).
        branch_epoch: the branch's checkpoint it took (N: the same source offsets as the
            main's checkpoint N).
        code: ``code_fingerprint`` of the branch's job: the main's driver runs only it.
        pins: the pin records written for the main on the branch's files.
        promoted_at_ms: when, ms since the Unix epoch.
    """

    main: str
    branch: str
    epoch: int
    branch_epoch: int
    code: dict
    pins: list[str]
    promoted_at_ms: int

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT, **dataclasses.asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str) -> Promotion:
        """Raises: CorruptionError naming ``uri``."""
        try:
            body = json.loads(data)
            body.pop("format")
            return cls(**body)
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptionError(f"{uri}: unreadable promotion record: {e}") from None


def read_branch(store: ObjectStore, branch: Job | str) -> BranchRecord:
    """The branch record of job ``branch`` (two GETs: ``branch.json``, ``fork.json``).

    Raises:
        BranchError: ``branch`` is no branch (never forked with ``branch``).
        CorruptionError: a record does not read, or the fork record names no parent.
    """
    from dkvstream.operators.runtime.forks import forked_from

    prefix = paths.job_prefix(job_name(branch))
    key = paths.branch_record_key(prefix)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        raise BranchError(f"job {job_name(branch)} is not a branch ({store.uri(key)} does not exist); "
                          f"create it with branch(store, main_job, branch_job)") from None
    return BranchRecord.decode(data, store.uri(key), forked_from(store, job_name(branch)),
                               store.uri(paths.fork_record_key(prefix)))


def read_promotion(store: ObjectStore, main: Job | str) -> Promotion | None:
    """The promotion record of job ``main``, or None if it was never promoted.

    Raises:
        CorruptionError: the record does not read.
    """
    key = paths.promotion_key(paths.job_prefix(job_name(main)))
    try:
        return Promotion.decode(store.get(key), store.uri(key))
    except ObjectNotFoundError:
        return None


def code_fingerprint(job: Job) -> dict:
    """What identifies a job's code for ``check_promoted_code``: its operators' classes
    (``module.qualname``, in order) and each output's sink name."""
    return {"operators": [f"{type(op).__module__}.{type(op).__qualname__}" for op in job.operators],
            "sinks": {name: sink.name for name, sink in sorted(job.sinks.items())}}


def check_promoted_code(store: ObjectStore, job: Job, newest: JobCheckpoint | None) -> None:
    """Refuses to run ``job`` with other code than the branch it was promoted to.

    Called by ``JobRunner`` before a run; ``newest`` is the checkpoint it continues from.
    ``promote`` writes ``promoted.json`` before it commits the promotion's checkpoint, so
    a record naming an epoch newer than ``newest`` is a promotion not finished (the
    promote crashed or runs now): no code may run until it is.

    Raises:
        BranchError: the code differs, naming the branch and the helper to use; or a
            promotion is not finished.
    """
    record = read_promotion(store, job)
    if record is None:
        return
    if newest is None or newest.epoch < record.epoch:
        raise BranchError(
            f"job {job.name} is being promoted to branch {record.branch} (its checkpoint {record.epoch} is not "
            f"committed yet): run promote again to finish it ({store.uri(paths.promotion_key(job.prefix))})")
    promoted = {"branch": record.branch, "epoch": record.epoch, "code": record.code}
    if code_fingerprint(job) == promoted["code"]:
        return
    raise BranchError(
        f"job {job.name} was promoted to the state and code of branch {promoted['branch']} at epoch "
        f"{promoted['epoch']} (operators {promoted['code']['operators']}); this run has operators "
        f"{code_fingerprint(job)['operators']}. Run the branch's code under the main's name: "
        f"promoted_job(main_job, branch_job) (dkvstream.operators.runtime.branches)")


def promoted_job(main: Job | str, branch_job: Job) -> Job:
    """``branch_job``'s code under the main's name (what runs the main after ``promote``):
    its operators, sinks and settings, writing the main's sinks and checkpoints."""
    return dataclasses.replace(branch_job, name=job_name(main))


def job_to_run(store: ObjectStore, main_job: Job, branches: Mapping[str, Job]) -> Job:
    """The job to run under ``main_job``'s name: ``main_job`` itself, or, once it was
    promoted, ``promoted_job`` of the branch named in its promotion record.

    Args:
        branches: branch job name -> its ``Job`` (the code the main may be promoted to).

    Raises:
        BranchError: the promoted branch is not among ``branches``.
    """
    record = read_promotion(store, main_job)
    if record is None:
        return main_job
    if record.branch not in branches:
        raise BranchError(f"job {main_job.name} was promoted to branch {record.branch} at epoch {record.epoch}, "
                          f"whose code is not defined here (known branches: {sorted(branches)}); define it")
    return promoted_job(main_job, branches[record.branch])


# -------------------------------------------------------------------------------- branch
def branch(store: ObjectStore, main: Job | str, branch_job: Job, *, epoch: int | None = None) -> BranchRecord:
    """Forks the main job's newest checkpoint (or the one of ``epoch``) into
    ``branch_job``'s name: zero-copy (``fork_job``), then writes the branch record.

    Args:
        main: the main job (or its name).
        branch_job: the changed code: the same source as the main, another name.
        epoch: the main's checkpoint to fork (default: its newest).

    Returns:
        The ``BranchRecord``.

    Raises:
        BranchError: the names are equal, the sources differ, the branch job exists
            already, or the main has no checkpoint.
    """
    main_name = job_name(main)
    if branch_job.name == main_name:
        raise BranchError(f"branch job {branch_job.name}: a branch needs a name of its own (its sinks and "
                          f"state live under jobs/<name>/)")
    if isinstance(main, Job) and main.source.name != branch_job.source.name:
        raise BranchError(f"branch job {branch_job.name} reads source {branch_job.source.name}, main job "
                          f"{main_name} reads {main.source.name}: a shadow run needs the same input")
    branch_prefix = paths.job_prefix(branch_job.name)
    if list_epochs(store, branch_prefix):
        raise BranchError(f"job {branch_job.name} has checkpoints already ({store.uri(branch_prefix)}); "
                          f"branch under a new name")
    main_prefix = paths.job_prefix(main_name)
    if epoch is None:
        newest = latest_checkpoint(store, main_prefix)
        if newest is None:
            raise BranchError(f"job {main_name} has no checkpoint to branch from; run it first")
        epoch = newest.epoch
    from dkvstream.operators.runtime.forks import fork_job

    fork_job(store, main_name, branch_job, epoch=epoch)  # checks the branch reads the main's state
    record = BranchRecord(main=main_name, branch=branch_job.name, fork_epoch=epoch,
                          created_at_ms=time.time_ns() // 1_000_000)
    store.put(paths.branch_record_key(branch_prefix), record.encode())
    return record


def run_branch(branch_job: Job, spark, store: ObjectStore | str, *, max_epochs: int | None = None,
               continuous: bool = False, **runner_options) -> list:
    """Runs the branch as its main's shadow (``JobRunner(..., follow=main)``) until it has
    caught up with the main's newest checkpoint (or ``max_epochs``).

    Args:
        branch_job: the branch's ``Job``.
        spark: a ``SparkSession``, or None to run in process.
        store: the object store or its URI.
        continuous: keep following the main as it commits (until ``stop``).
        runner_options: further ``JobRunner`` arguments.

    Returns:
        The ``EpochResult``s committed.

    Raises:
        BranchError: ``branch_job`` is no branch, or it was promoted already.
    """
    from dkvstream.operators.runtime.driver import JobRunner
    from dkvstream.storage.objectstore import open_object_store

    store = store if isinstance(store, ObjectStore) else open_object_store(store)
    record = read_branch(store, branch_job)
    if record.promoted_at_epoch is not None:
        raise BranchError(f"branch {branch_job.name} was promoted into job {record.main} at epoch "
                          f"{record.promoted_at_epoch}; run {record.main} instead")
    with JobRunner(branch_job, spark, store, follow=record.main, **runner_options) as runner:
        return list(runner.epochs(max_epochs, continuous=continuous))


# ---------------------------------------------------------------------------------- diff
@dataclass
class EpochDiff:
    """How one output of one epoch differs between the main and the branch.

    Attributes:
        output: the output's name.
        epoch: the epoch (the same input on both sides).
        main_rows, branch_rows: rows each published.
        only_in_main, only_in_branch: rows without a counterpart (by key, or equal rows).
        changed: rows whose key both have, with other values (0 without key columns).
        changed_columns: per column, how many changed rows differ in it.
        samples: per kind (``only_in_main``, ``only_in_branch``, ``changed``), up to a
            few keys (a dict of the key columns; the whole row without key columns).
    """

    output: str
    epoch: int
    main_rows: int
    branch_rows: int
    only_in_main: int = 0
    only_in_branch: int = 0
    changed: int = 0
    changed_columns: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def differs(self) -> bool:
        return bool(self.only_in_main or self.only_in_branch or self.changed)


@dataclass
class OutputDiff:
    """One output over the epochs compared.

    Attributes:
        output: its name.
        key_columns: the columns rows were matched by (empty: whole rows).
        columns_added, columns_removed: columns only the branch's / the main's rows have
            (left out of the row comparison).
        epochs: one ``EpochDiff`` per epoch compared, in order.
    """

    output: str
    key_columns: list[str]
    columns_added: list[str]
    columns_removed: list[str]
    epochs: list[EpochDiff]

    def totals(self) -> dict[str, int]:
        """Sums over the epochs: rows on each side and each kind of difference."""
        keys = ("main_rows", "branch_rows", "only_in_main", "only_in_branch", "changed")
        return {k: sum(getattr(e, k) for e in self.epochs) for k in keys}


@dataclass
class BranchDiff:
    """``diff``'s result.

    Attributes:
        main, branch: job names.
        epochs: ``[first, last]`` epoch compared (both inclusive; first > last: none).
        outputs: per output both jobs have, its ``OutputDiff``.
        outputs_added, outputs_removed: outputs only the branch / the main has.
    """

    main: str
    branch: str
    epochs: tuple[int, int]
    outputs: dict[str, OutputDiff]
    outputs_added: list[str]
    outputs_removed: list[str]

    @property
    def differs(self) -> bool:
        return bool(self.outputs_added or self.outputs_removed or any(
            o.columns_added or o.columns_removed or any(e.differs for e in o.epochs)
            for o in self.outputs.values()))

    def as_dict(self) -> dict:
        """JSON-ready (the CLI prints it, the Dagster asset returns it)."""
        return dataclasses.asdict(self)


def published_by_epoch(store: ObjectStore, job: Job, output: str) -> dict[int, list[str]]:
    """The published files of ``output`` per epoch (one LIST).

    Raises:
        BranchError: the output's sink cannot be read per epoch (only Parquet sinks can).
    """
    sink = job.output_sink(output)
    if not isinstance(sink, ParquetSink):
        raise BranchError(f"job {job.name}: output {output} goes to a {type(sink).__name__}; diff reads "
                          f"Parquet sinks per epoch only (leave it out with outputs=[...])")
    out: dict[int, list[str]] = defaultdict(list)
    prefix = sink.table_prefix(job.prefix)
    for key in store.list(prefix):
        part = key[len(prefix):].split("/", 1)[0]
        if key.endswith(".parquet") and part.startswith("epoch="):
            out[int(part[len("epoch="):])].append(key)
    return out


def read_epoch(store: ObjectStore, job: Job, output: str, keys: list[str], epoch: int) -> pa.Table:
    """The rows of ``output`` published in ``epoch`` (``keys``: its files, ``published_by_epoch``)."""
    sink = job.output_sink(output)
    tables = [sink.read_published(store, k, epoch) for k in sorted(keys)]
    if tables:
        return pa.concat_tables(tables, promote_options="default")
    return sink.schema.empty_table() if sink.schema is not None else pa.table({})


def _cell(value):
    """A comparable cell: NaN equals NaN (float NaN != NaN would make every row with a
    NaN differ from itself)."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    return value


def diff_rows(output: str, epoch: int, main: pa.Table, branch: pa.Table, columns: list[str],
              key_columns: list[str], samples: int = DEFAULT_SAMPLES) -> EpochDiff:
    """Compares two tables' rows over ``columns`` as multisets: rows equal on both sides
    cancel out; of the rest, with ``key_columns``, a main and a branch row with the same
    key pair up as ``changed`` (in row order), the unpaired ones are ``only_in_*``.

    Returns:
        The ``EpochDiff``.
    """
    def rows(t: pa.Table) -> list[tuple]:
        cols = [[_cell(v) for v in t.column(c).to_pylist()] for c in columns]
        return list(zip(*cols)) if cols else [()] * t.num_rows

    left, right = Counter(rows(main)), Counter(rows(branch))
    only_main, only_branch = left - right, right - left
    out = EpochDiff(output, epoch, main.num_rows, branch.num_rows)
    key_at = [columns.index(c) for c in key_columns]

    def key(row: tuple) -> tuple:
        return tuple(row[i] for i in key_at)

    def sample(kind: str, row: tuple) -> None:
        bucket = out.samples.setdefault(kind, [])
        if len(bucket) < samples:
            names = key_columns or columns
            bucket.append({c: _plain(row[columns.index(c)]) for c in names})

    by_key: dict[tuple, list[tuple]] = defaultdict(list)
    for row in sorted(only_branch.elements(), key=repr):
        by_key[key(row)].append(row)
    for row in sorted(only_main.elements(), key=repr):
        partners = by_key.get(key(row)) if key_at else None
        if partners:
            other = partners.pop(0)
            out.changed += 1
            for i, c in enumerate(columns):
                if row[i] != other[i]:
                    out.changed_columns[c] = out.changed_columns.get(c, 0) + 1
            sample("changed", row)
        else:
            out.only_in_main += 1
            sample("only_in_main", row)
    for rest in by_key.values():
        for row in rest:
            out.only_in_branch += 1
            sample("only_in_branch", row)
    return out


def _plain(value):
    """A JSON-ready cell for samples."""
    if isinstance(value, tuple):  # NaN, see _cell
        return "NaN"
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def diff(store: ObjectStore, main_job: Job, branch_job: Job, *,
         key_columns: Mapping[str, list[str]] | None = None, outputs: list[str] | None = None,
         epochs: tuple[int, int] | None = None, samples: int = DEFAULT_SAMPLES) -> BranchDiff:
    """The rows that differ, per output and per epoch, between the main job's and the
    branch's published outputs, over the epochs both ran since the fork.

    Epoch k of the branch read the same input as the main's epoch k (``run_branch``), so
    the outputs are compared epoch by epoch. Outputs are matched by name; columns are
    compared by name over the columns both sides have.

    Args:
        main_job, branch_job: the two jobs (the branch forked with ``branch``).
        key_columns: output name -> columns identifying a row (a row of the main and one
            of the branch with the same key and other values are one ``changed`` row);
            an output not named is compared by whole rows. Columns absent on a side are
            refused.
        outputs: compare only these outputs (default: every output both have).
        epochs: ``(first, last)`` inclusive (default: after the fork to the newest epoch
            both committed).
        samples: keys sampled per kind of difference and epoch.

    Returns:
        The ``BranchDiff``.

    Raises:
        BranchError: the branch was not forked from ``main_job``, a key column is not
            in both outputs, or an output's sink cannot be read per epoch.
    """
    record = read_branch(store, branch_job)
    if record.main != main_job.name:
        raise BranchError(f"job {branch_job.name} is a branch of {record.main}, not of {main_job.name}")
    if epochs is None:
        newest = min(read_commit_log(store, main_job.prefix).newest_committed,
                     read_commit_log(store, branch_job.prefix).newest_committed)
        epochs = (record.fork_epoch + 1, newest)
    names = [o for o in main_job.sinks if o in branch_job.sinks]
    if outputs is not None:
        unknown = sorted(set(outputs) - set(names))
        if unknown:
            raise BranchError(f"outputs {unknown} are not outputs of both {main_job.name} and "
                              f"{branch_job.name} (both have: {names})")
        names = [o for o in names if o in outputs]
    result = BranchDiff(main_job.name, branch_job.name, epochs, {},
                        outputs_added=sorted(set(branch_job.sinks) - set(main_job.sinks)),
                        outputs_removed=sorted(set(main_job.sinks) - set(branch_job.sinks)))
    for output in names:
        result.outputs[output] = _diff_output(store, main_job, branch_job, output,
                                              list((key_columns or {}).get(output, [])), epochs, samples)
    return result


def _diff_output(store: ObjectStore, main_job: Job, branch_job: Job, output: str, keys: list[str],
                 epochs: tuple[int, int], samples: int) -> OutputDiff:
    main_files = published_by_epoch(store, main_job, output)
    branch_files = published_by_epoch(store, branch_job, output)
    main_schema = main_job.output_sink(output).schema
    branch_schema = branch_job.output_sink(output).schema
    main_cols = list(main_schema.names) if main_schema is not None else None
    branch_cols = list(branch_schema.names) if branch_schema is not None else None
    per_epoch = []
    for epoch in range(epochs[0], epochs[1] + 1):
        m = read_epoch(store, main_job, output, main_files.get(epoch, []), epoch)
        b = read_epoch(store, branch_job, output, branch_files.get(epoch, []), epoch)
        mc = main_cols if main_cols is not None else m.column_names
        bc = branch_cols if branch_cols is not None else b.column_names
        common = [c for c in mc if c in bc]
        missing = [c for c in keys if c not in common]
        if missing:
            raise BranchError(f"output {output}: key columns {missing} are not columns of both "
                              f"{main_job.name} ({mc}) and {branch_job.name} ({bc})")
        per_epoch.append(diff_rows(output, epoch, _columns(m, common), _columns(b, common), common, keys, samples))
    mc = main_cols or []
    bc = branch_cols or []
    return OutputDiff(output, keys, columns_added=[c for c in bc if c not in mc],
                      columns_removed=[c for c in mc if c not in bc], epochs=per_epoch)


def _columns(t: pa.Table, columns: list[str]) -> pa.Table:
    """``t`` with ``columns`` (a column a file lacks, e.g. published before the schema
    gained it, is all null)."""
    return pa.table({c: t.column(c) if c in t.column_names else pa.nulls(t.num_rows) for c in columns})


# ------------------------------------------------------------------------------- promote
def promote(store: ObjectStore, main_job: Job | str, branch_job: Job) -> Promotion:
    """Makes the main job continue from the branch's state and code at the main's newest
    checkpoint N (module docstring, step 4). Idempotent: run again after a crash, it
    finishes what it started.

    Args:
        main_job: the main job (or its name); its driver must be stopped (a driver
            waiting between epochs is not seen: its next commit is fenced).
        branch_job: the branch's ``Job`` (its code is what the main runs from now on).

    Returns:
        The ``Promotion`` record.

    Raises:
        BranchError: a driver of the main has an epoch in flight (a live epoch
            lease), the branch is not the
            main's, is behind (run it further), has no checkpoint at the main's offsets
            (ahead, and that one deleted), its checkpoint N has another watermark,
            processing time or ``finished`` than the main's (``_require_same_time``), or the main committed meanwhile.
    """
    main = job_name(main_job)
    main_prefix, branch_prefix = paths.job_prefix(main), paths.job_prefix(branch_job.name)
    record = read_branch(store, branch_job)
    if record.main != main:
        raise BranchError(f"job {branch_job.name} is a branch of {record.main}, not of {main}")
    newest = latest_checkpoint(store, main_prefix)
    if newest is None:
        raise BranchError(f"job {main} has no checkpoint")
    code = code_fingerprint(branch_job)
    done = newest.metrics.get("promoted")
    if done is not None and done["branch"] == branch_job.name:
        return _record_promotion(store, record, branch_job, newest.epoch, done["branch_epoch"], code,
                                 done["pins"])
    lease = read_lease(store, main_prefix)
    if lease is not None and lease.is_live(newest.epoch):
        raise BranchError(
            f"job {main} is running: a driver holds its epoch lease (epoch {lease.epoch} in flight, lease "
            f"{lease.owner}). Stop that driver (JobRunner.stop, or terminate its Dagster run), then promote. "
            f"A driver waiting between epochs holds no lease and is not seen here: promote would go ahead, and "
            f"that driver's next commit would fail with JobFencedError (nothing of its epoch published)")
    n = newest.epoch
    branch_newest = read_commit_log(store, branch_prefix).newest_committed
    if branch_newest < n:
        raise BranchError(f"branch {branch_job.name} is at epoch {branch_newest}, job {main} at {n}: run the "
                          f"branch further (run_branch) until it reaches epoch {n}, then promote")
    try:
        source = read_checkpoint(store, branch_prefix, n)
    except ObjectNotFoundError:
        raise BranchError(f"branch {branch_job.name} is ahead of job {main} (epoch {branch_newest} > {n}) and "
                          f"its checkpoint {n} is gone; run {main} to epoch {branch_newest}, then promote") from None
    if source.source_offsets != newest.source_offsets:
        raise BranchError(f"branch {branch_job.name}'s epoch {n} ended at offsets {source.source_offsets}, job "
                          f"{main}'s at {newest.source_offsets}: the branch did not follow the main "
                          f"(run_branch); branch again")
    _require_same_time(main, branch_job.name, newest, source)
    new = _promotion_checkpoint(newest, source, branch_job, code)
    pins = _pin_branch_state(store, main, branch_job.name, n, new)
    new.metrics["promoted"]["pins"] = pins
    # First the record: from here no driver of the main starts until the commit below
    # (check_promoted_code), so neither the old code nor the new runs on the wrong state.
    promotion_key = paths.promotion_key(main_prefix)
    store.put(promotion_key, _promotion(main, branch_job, n + 1, n, code, pins).encode())
    try:
        commit_checkpoint(store, main_prefix, new)
    except (ObjectExistsError, JobFailedError) as e:  # JobFencedError is a JobFailedError
        # The pins stay: they keep the branch's files only until the main's next full sweep.
        store.delete(promotion_key)
        raise BranchError(f"job {main} committed epoch {n + 1} meanwhile (it is running): stop it, run the "
                          f"branch to its newest epoch, then promote again ({e})") from None
    return _record_promotion(store, record, branch_job, n + 1, n, code, pins)


def _require_same_time(main: str, branch: str, m: JobCheckpoint, b: JobCheckpoint) -> None:
    """Refuses a promotion at checkpoint N whose time differs between the main's ``m``
    and the branch's ``b``: exactly once for the main's sink readers holds only if the
    timers the old code fired by N are those the branch fired by N. The watermark decides
    that for event-time timers (windows), the processing time for processing-time timers
    (a shadow run takes the main's, ``JobRunner(follow=...)``), and ``finished`` too (a
    finished job's watermark is +infinity and it runs no more epochs). Not compared: the
    timers' lower bounds (``next_*_timer_ms``: the branch's own code and state, taken
    with them) and the partitions' max event times (the same input gives the same ones).

    Raises:
        BranchError: the watermarks, processing times or ``finished`` differ, naming
            both values, the likely cause and what to do.
    """
    if m.watermark != b.watermark:
        effect = ("the main would emit again the windows its old code emitted up to its watermark"
                  if b.watermark < m.watermark else
                  "the windows the branch closed past the main's watermark would never reach the main's sinks")
        raise BranchError(
            f"branch {branch}'s checkpoint {b.epoch} has watermark {b.watermark} ms, job {main}'s checkpoint "
            f"{m.epoch} has {m.watermark} ms: promoted there, {effect}. Likely cause: other event-time "
            f"settings (max_out_of_orderness_ms, idle_timeout_ms, quiet_timeout_ms), or partition idleness, "
            f"which is judged by the wall clock and so can differ between the two runs. Give the branch the "
            f"main's event-time settings and branch again, or run the main and the branch further and promote "
            f"at a checkpoint where their watermarks are equal (metrics['follow']['same_watermark'] in the "
            f"branch's checkpoints)")
    if m.processing_time_ms != b.processing_time_ms:
        raise BranchError(
            f"branch {branch}'s checkpoint {b.epoch} has processing time {b.processing_time_ms} ms, job "
            f"{main}'s checkpoint {m.epoch} has {m.processing_time_ms} ms: promoted there, processing-time "
            f"timers due between the two would fire twice or never in the main's sinks. A shadow run "
            f"(run_branch) takes the main's processing time epoch by epoch; this branch's checkpoint was not "
            f"written by one: branch again and run it with run_branch, then promote")
    if m.finished != b.finished:
        raise BranchError(
            f"job {main}'s checkpoint {m.epoch} has finished={m.finished}, branch {branch}'s has "
            f"finished={b.finished}: one read its bounded source to the end or was drained, the other did not "
            f"(a finished job runs no more epochs); promote at a checkpoint where both or neither finished")


def _promotion_checkpoint(main: JobCheckpoint, branch: JobCheckpoint, branch_job: Job, code: dict) -> JobCheckpoint:
    """The main's checkpoint N + 1: the branch's checkpoint N (state, watermark, timers,
    schemas) under the main's name; nothing read, nothing output; the main's key layout."""
    metrics = {"events": 0, "timers_fired": 0, "output_rows": {name: 0 for name in branch_job.sinks},
               "tables": branch.metrics.get("tables", 0), "table_bytes": branch.metrics.get("table_bytes", 0),
               "keys": branch.metrics.get("keys", 0), "dead_letter": {"total": 0},
               "promoted": {"branch": branch_job.name, "branch_epoch": branch.epoch, "epoch": main.epoch + 1,
                            "code": code, "pins": []}}
    return dataclasses.replace(
        branch, job=main.job, epoch=main.epoch + 1, outputs={}, output_checksums={}, metrics=metrics,
        layout=main.layout, dropped=None, unkept=None,
        partition_active_at_ms=main.partition_active_at_ms)


def _pin_branch_state(store: ObjectStore, main: str, branch: str, epoch: int, new: JobCheckpoint) -> list[str]:
    """Pins, for the main's checkpoints, the files the promotion checkpoint names outside
    the main's prefix (the branch's and, through the fork, its ancestors'; the main's full
    sweep shrinks these pins as its checkpoints stop naming them), then re-checks the
    branch's checkpoint ``epoch`` still exists."""
    from dkvstream.operators.runtime.pins import files_by_owner, hold_for_checkpoints, require_still_there

    keys = hold_for_checkpoints(store, main, files_by_owner(store, new))
    require_still_there(store, paths.checkpoint_key(paths.job_prefix(branch), epoch), keys,
                        f"branch {branch}'s checkpoint {epoch}")
    return keys


def _promotion(main: str, branch_job: Job, epoch: int, branch_epoch: int, code: dict, pins: list[str]) -> Promotion:
    return Promotion(main=main, branch=branch_job.name, epoch=epoch, branch_epoch=branch_epoch,
                     code=code, pins=pins, promoted_at_ms=time.time_ns() // 1_000_000)


def _record_promotion(store: ObjectStore, record: BranchRecord, branch_job: Job, epoch: int,
                      branch_epoch: int, code: dict, pins: list[str]) -> Promotion:
    """After the commit: ``promoted.json`` for the main (again, after a crash), the branch
    ``record`` (read by ``promote``) marked promoted."""
    promotion = _promotion(record.main, branch_job, epoch, branch_epoch, code, pins)
    store.put(paths.promotion_key(paths.job_prefix(record.main)), promotion.encode())
    store.put(paths.branch_record_key(paths.job_prefix(branch_job.name)),
              dataclasses.replace(record, promoted_at_epoch=epoch).encode())
    return promotion
