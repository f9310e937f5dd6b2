"""Long-lived tasks: a continuous job's data plane as one barrier Spark job for its whole run.

Per-epoch stages (``dkvstream.operators.spark.stage``) pay two Spark jobs' scheduling, task
launch and shuffle every epoch (about 170 ms on ``local[2]``), and reopen nothing but what
a worker process happened to keep. A continuous job instead runs ``W`` long-lived tasks
(``W`` = the cluster's task slots, at most the job's largest parallelism) as one Spark job
in barrier execution mode (``RDD.barrier()``): Spark places them, starts them together,
and when one fails it restarts them all (a new stage attempt). Each task:

* serves Arrow Flight (``pyarrow.flight``) on a free port of its executor's host and
  registers its location with the driver's ``Coordinator`` (a Flight server too);
* owns a contiguous share of every operator's key-group ranges (``owner``) and keeps their
  DKV instances, timer services and decoded state open between epochs (``OpenState``);
* per epoch, takes the driver's commands as Flight actions: ``read`` (read its share of the
  planned slices, send each range's events to the range's owner with a Flight ``DoPut``),
  ``run`` (run one operator over the events its ranges received, forwarding an
  intermediate operator's output the same way) and ``map`` (publishing, sink checks,
  source surveys: ``JobRunner._map_in_tasks``, which cannot start Spark tasks while the
  barrier job holds every slot).

The driver sends plans (splits, task specs) and receives task results and split summaries,
never an event: the same bytes as per-epoch stages, without a Spark job. Each epoch's
exchange has an id of its own, and a task keeps exchanged events by (exchange, stage,
range): two epochs' events never mix, which is what lets the driver pipeline epochs (the
read of epoch e+1 runs while epoch e's operators do, ``LongLivedExchange.start_read``).

**Failures.** A task's own error (an operator's, a bad input row, the store's) comes back
as the command's answer (``dkvstream.operators.runtime.task_errors``). As Spark retries a
failed task up to ``spark.task.maxFailures`` attempts, the driver runs the epoch again
from the last checkpoint, up to that many attempts in all, unless the error says it is
not retryable (a ``DkvstreamError`` with ``retryable`` False: a bad input row, an
operator's error under ``on_operator_error="fail"``); then the epoch fails at once. A
lost task (its process killed, its executor lost) breaks the Flight calls to it: the
driver marks the tasks lost, Spark restarts the barrier stage, the new tasks register,
and the driver runs the epoch again from the last checkpoint (nothing of the failed
attempt was committed), so exactly-once holds. A stage restarted more than
``spark.stage.maxConsecutiveAttempts`` times fails the job.

Spark's real-time mode (Spark 4.1) and Flink take the same shape: long-running tasks
exchanging over a pipelined transport, with the engine's scheduler placing and restarting
them.
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import os
import pickle
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from dkvstream.operators.api.operator import Operator
from dkvstream.operators.errors import JobFailedError
from dkvstream.operators.io.sinks import Sink
from dkvstream.operators.io.sources import Source
from dkvstream.operators.runtime.exchange import DeadLetterResult, Exchange, FirstStage, run_range
from dkvstream.operators.runtime.open_state import OpenState
from dkvstream.operators.runtime.splits import ReadContext, Split, SplitSummary, read_split
from dkvstream.operators.runtime.task import TaskResult, TaskSpec
from dkvstream.operators.runtime.task_errors import encode, task_error
from dkvstream.storage.dkv import DKVOptions
from dkvstream.storage.errors import DkvstreamError
from dkvstream.storage.objectstore import ObjectStore

log = logging.getLogger(__name__)

# How long the driver waits for every task of a (re)started barrier stage to register, s:
# a stage start on a loaded 2-core machine takes a few seconds (worker fork, imports).
READY_TIMEOUT_S = 180.0
# How often a waiting task checks whether it should still run, s.
POLL_S = 1.0
# A task whose driver has not answered for this long ends (a driver killed with -9 leaves
# its barrier job to Spark, which ends with the application anyway).
DRIVER_LOST_S = 60.0

DEAD = "dead"  # the inbox slot of the read tasks' dead-letter rows (range 0 of the first operator)
# Commands in flight per task at once: an epoch's read beside the previous epoch's operators
# (pipelining), and a publish or check.
COMMANDS_PER_TASK = 4


def owner(range_index: int, parallelism: int, workers: int) -> int:
    """The task that runs key-group range ``range_index`` of an operator with
    ``parallelism`` ranges: contiguous shares, as Flink assigns key groups to subtasks."""
    return range_index * workers // parallelism


@dataclass(frozen=True)
class TaskConfig:
    """What every long-lived task gets once, pickled with the barrier job's closure.

    Attributes:
        coordinator: the driver's Flight location (``grpc://host:port``).
        run_id: this run's id; a task of another run is refused.
        workers: the number of tasks ``W``.
        operators / sinks / store / dkv_options: the job's (they do not change during a run).
        loopback: bind on 127.0.0.1 (a ``local`` master) rather than the executor's host.
        open_ranges: the most ranges one task owns, over all operators: its ``OpenState``
            keeps that many DKV instances open between epochs.
    """

    coordinator: str
    run_id: str
    workers: int
    operators: tuple[Operator, ...]
    sinks: dict[str, Sink]
    store: ObjectStore
    dkv_options: DKVOptions | None
    loopback: bool
    open_ranges: int = 8


class LongLivedTaskError(Exception):
    """A task's failure as the driver receives it: the task's traceback text, ending with
    the ``dkvstream-task-error`` line of a ``DkvstreamError`` (``task_errors.task_error``
    rebuilds it)."""


class TasksLostError(JobFailedError):
    """A long-lived task stopped answering (its process or executor was lost); Spark
    restarts the barrier stage and the epoch runs again from the last checkpoint."""

    retryable = True


# ----------------------------------------------------------------------------- task side
@dataclass
class _TaskState:
    """A long-lived task's state between commands."""

    config: TaskConfig
    index: int
    peers: list[str] = field(default_factory=list)
    inbox: dict[tuple, list[pa.Table]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    open_state: OpenState = field(default_factory=OpenState)
    clients: dict[int, object] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    last_command: float = field(default_factory=time.monotonic)


def _flight():
    # Imported in the task, never in Spark's forking daemon (gRPC's threads and fork).
    import pyarrow.flight as flight

    return flight


def _deliver(state: _TaskState, key: tuple, table: pa.Table, to: int) -> None:
    """``table`` into task ``to``'s inbox under ``key``: in place, or a Flight ``DoPut``."""
    if to == state.index:
        with state.lock:
            state.inbox.setdefault(key, []).append(table)
        return
    flight = _flight()
    client = state.clients.get(to)
    if client is None:
        client = state.clients[to] = flight.FlightClient(state.peers[to])
    descriptor = flight.FlightDescriptor.for_command(json.dumps(list(key)).encode())
    writer, _ = client.do_put(descriptor, table.schema)
    writer.write_table(table)
    writer.close()


def _take(state: _TaskState, key: tuple) -> list[pa.Table]:
    with state.lock:
        return state.inbox.pop(key, [])


def _drop(state: _TaskState, exchange: str) -> None:
    """``drop`` command: forgets an exchange's events (an epoch read ahead and not run)."""
    with state.lock:
        for key in [k for k in state.inbox if k[0] == exchange]:
            del state.inbox[key]


def _read(state: _TaskState, exchange: str, source: Source, splits: list[Split],
          ctx: ReadContext) -> list[SplitSummary]:
    """``read`` command: this task's share of the epoch's slices, each range's events sent
    to its owner (stage 0), the dead-letter rows to range 0's owner."""
    w = state.config.workers
    summaries = []
    for split in splits:
        out = read_split(source, split, ctx)
        for r, table in out.events:
            _deliver(state, (exchange, 0, int(r)), table, owner(int(r), ctx.parallelism, w))
        if out.dead.num_rows:
            _deliver(state, (exchange, 0, DEAD), out.dead, 0)
        summaries.append(out.summary)
    return summaries


def _run(state: _TaskState, exchange: str, op_index: int, specs: list[TaskSpec], input_schema: pa.Schema,
         last: bool, first: FirstStage | None, summaries: list[SplitSummary]
         ) -> list[TaskResult | DeadLetterResult]:
    """``run`` command: operator ``op_index``'s tasks for this task's ranges (``specs``);
    an intermediate operator's output goes to the next operator's owners (stage
    ``op_index + 1``)."""
    cfg = state.config
    operator = cfg.operators[op_index]
    out: list[TaskResult | DeadLetterResult] = []
    for spec in specs:
        tables = _take(state, (exchange, op_index, spec.range_index))
        dead = _take(state, (exchange, 0, DEAD)) if first is not None and spec.range_index == 0 else []
        res, forwarded, dead_result = run_range(
            operator, spec, tables, input_schema, cfg.store, cfg.sinks if last else None, cfg.dkv_options,
            state.open_state, first, summaries, dead)
        for r, table in forwarded:
            _deliver(state, (exchange, op_index + 1, int(r)), table,
                     owner(int(r), spec.next_parallelism, cfg.workers))
        out.append(res)
        if dead_result is not None:
            out.append(dead_result)
    return out


def _answer(fn: Callable[[], object]) -> bytes:
    """``fn()``'s value, or its error, pickled as the command's answer."""
    try:
        return pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # every task error goes back to the driver, which decides
        text = traceback.format_exc()
        if isinstance(e, DkvstreamError):
            text += encode(e)
        return pickle.dumps(("error", text), protocol=pickle.HIGHEST_PROTOCOL)


def _make_server(state: _TaskState, location: str):
    flight = _flight()
    from pyspark import cloudpickle

    class TaskServer(flight.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            key = tuple(json.loads(descriptor.command))
            table = reader.read_all()
            with state.lock:
                state.inbox.setdefault(key, []).append(table)

        def do_action(self, context, action):
            state.last_command = time.monotonic()
            kind, body = action.type, action.body.to_pybytes()
            if kind == "peers":
                state.peers = pickle.loads(body)
                answer = pickle.dumps(("ok", os.getpid()))
            elif kind == "read":
                answer = _answer(lambda: _read(state, *cloudpickle.loads(body)))
            elif kind == "run":
                answer = _answer(lambda: _run(state, *pickle.loads(body)))
            elif kind == "map":
                fn, items = cloudpickle.loads(body)
                answer = _answer(lambda: [fn(item) for item in items])
            elif kind == "drop":
                answer = _answer(lambda: _drop(state, body.decode()))
            elif kind == "ping":
                answer = pickle.dumps(("ok", os.getpid()))
            elif kind == "stop":
                state.stop.set()
                answer = pickle.dumps(("ok", None))
            else:
                raise flight.FlightServerError(f"unknown command {kind!r}")
            return [flight.Result(pa.py_buffer(answer))]

    return TaskServer(location)


def run_task(config: TaskConfig, _partition) -> list[int]:
    """A long-lived task's body (the barrier job's ``mapPartitions`` function): serve
    until the driver says ``stop``, or until the driver is gone (``DRIVER_LOST_S``)."""
    from pyspark import BarrierTaskContext

    flight = _flight()
    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    host = "127.0.0.1" if config.loopback else ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
    state = _TaskState(config, index, open_state=OpenState(capacity=config.open_ranges))
    server = _make_server(state, f"grpc://{host}:0")
    location = f"grpc://{host}:{server.port}"
    try:
        coordinator = flight.FlightClient(config.coordinator)
        register = pickle.dumps((config.run_id, index, ctx.taskAttemptId(), location, os.getpid()))
        list(coordinator.do_action(flight.Action("register", register)))
        while not state.stop.wait(POLL_S):
            if time.monotonic() - state.last_command > DRIVER_LOST_S:
                try:  # the driver may just be idle (a long trigger): ask it
                    list(coordinator.do_action(flight.Action("alive", config.run_id.encode())))
                    state.last_command = time.monotonic()
                except flight.FlightError:
                    log.warning("long-lived task %d: driver %s gone, ending", index, config.coordinator)
                    break
    finally:
        state.open_state.close_all()
        server.shutdown()
    return [index]


# --------------------------------------------------------------------------- driver side
def task_slots(sc, timeout_s: float = READY_TIMEOUT_S) -> int:
    """Tasks the cluster can run at once now (Spark's ``maxNumConcurrentTasks`` for the
    default resource profile: the executors' cores over ``spark.task.cpus``), waiting up
    to ``timeout_s`` for a first executor to register.

    Raises:
        JobFailedError: no executor registered within ``timeout_s``.
    """
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    deadline = time.monotonic() + timeout_s
    while True:
        slots = int(jsc.maxNumConcurrentTasks(profile))
        if slots > 0:
            return slots
        if time.monotonic() > deadline:
            raise JobFailedError(f"no Spark executor registered within {timeout_s:.0f} s (master {sc.master}); "
                                 f"check that the cluster's workers are up")
        time.sleep(POLL_S)


def task_attempts(sc) -> int:
    """Attempts Spark gives a task, so also an epoch on long-lived tasks:
    ``local[N,F]`` -> F, ``local[N]`` and ``local`` -> 1 (Spark's local mode does not
    retry), else ``spark.task.maxFailures`` (4)."""
    master = sc.master
    if master.startswith("local"):
        inside = master[master.find("[") + 1:master.rfind("]")] if "[" in master else ""
        return int(inside.split(",")[1]) if "," in inside else 1
    return int(sc.getConf().get("spark.task.maxFailures", "4"))


def retryable(error: BaseException) -> bool:
    """Whether an epoch that failed with ``error`` may run again: a long-lived task's
    failure (found along the error's causes) that is not a ``DkvstreamError`` saying it
    is not retryable. Errors of the driver itself are not retried."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, LongLivedTaskError):
            cause = task_error(error)
            return cause is None or cause.retryable
        error = error.__cause__ or error.__context__
    return False


def _keyed(index: int) -> tuple[int, int]:
    return index, index


class Coordinator:
    """The driver's side of a run's long-lived tasks: starts the barrier job, takes the
    tasks' registrations, sends them commands, restarts after a loss, stops them.

    Args:
        spark: the ``SparkSession``.
        config_for: ``config_for(coordinator location, run id, workers, loopback)`` ->
            ``TaskConfig``.
        workers: the number of tasks; must not exceed the cluster's task slots (a barrier
            stage needs all its tasks running at once).

    Raises:
        JobFailedError: the tasks did not all register within ``READY_TIMEOUT_S``, or
            the barrier job failed.
    """

    def __init__(self, spark, config_for: Callable[[str, str, int, bool], TaskConfig], workers: int) -> None:
        flight = _flight()
        self.sc = spark.sparkContext
        self.workers = workers
        self.run_id = uuid.uuid4().hex[:12]
        self.restarts = 0  # stage restarts seen (a lost task)
        self.max_attempts = task_attempts(self.sc)
        self.bytes_received = 0
        loopback = self.sc.master.startswith("local")
        host = "127.0.0.1" if loopback else self.sc.getConf().get("spark.driver.host", "127.0.0.1")
        # index -> (Spark task attempt id, location, pid); the ids grow across the application,
        # so a restarted stage's tasks have larger ones than the tasks they replace.
        self._registered: dict[int, tuple[int, str, int]] = {}
        self._in_use = -1  # the largest task attempt id of the tasks in use
        self._cond = threading.Condition()
        self._lost = False
        self._job_error: BaseException | None = None
        self._job_done = threading.Event()
        self._clients: list = []
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=COMMANDS_PER_TASK * workers,
                                                           thread_name_prefix="long-lived")
        coordinator = self

        class CoordinatorServer(flight.FlightServerBase):
            def do_action(self, context, action):
                if action.type == "register":
                    coordinator._register(*pickle.loads(action.body.to_pybytes()))
                return [flight.Result(pa.py_buffer(b"ok"))]

        self._server = CoordinatorServer(f"grpc://{host}:0")
        self.location = f"grpc://{host}:{self._server.port}"
        self._group = f"dkvstream-long-lived-{self.run_id}"
        config = config_for(self.location, self.run_id, workers, loopback)
        self._thread = threading.Thread(target=self._run_job, args=(config,), daemon=True,
                                        name=f"long-lived-job-{self.run_id}")
        self._thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _run_job(self, config: TaskConfig) -> None:
        try:
            self.sc.setJobGroup(self._group, "dkvstream long-lived tasks", interruptOnCancel=True)
            # A shuffle after the barrier stage: Spark restarts a failed barrier
            # ShuffleMapStage (up to spark.stage.maxConsecutiveAttempts), never a ResultStage.
            self.sc.parallelize(range(self.workers), self.workers).barrier().mapPartitions(
                functools.partial(run_task, config)).map(_keyed).partitionBy(1).count()
        except BaseException as e:  # reported by the next command or wait (_wait_ready)
            self._job_error = e
        finally:
            self._job_done.set()
            with self._cond:
                self._cond.notify_all()

    def _register(self, run_id: str, index: int, attempt: int, location: str, pid: int) -> None:
        if run_id != self.run_id:
            return
        with self._cond:
            self._registered[index] = (attempt, location, pid)
            self._cond.notify_all()

    def _wait_ready(self) -> None:
        """Waits until every task of one stage attempt newer than the one in use registered,
        then sends each the others' locations."""
        flight = _flight()
        deadline = time.monotonic() + READY_TIMEOUT_S
        with self._cond:
            while True:
                ids = [a for a, _, _ in self._registered.values()]
                if len(ids) == self.workers and min(ids) > self._in_use:
                    break
                if self._job_done.is_set():
                    raise JobFailedError(f"the long-lived tasks' Spark job ended: {self._job_error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JobFailedError(
                        f"{len(self._registered)} of {self.workers} long-lived tasks registered within "
                        f"{READY_TIMEOUT_S:.0f} s; a barrier stage needs {self.workers} free task slots at "
                        f"once (check the cluster's cores, or run with long_lived_tasks=False)")
                self._cond.wait(min(left, POLL_S))
            self._in_use = max(ids)
            locations = [self._registered[i][1] for i in range(self.workers)]
            self.pids = [self._registered[i][2] for i in range(self.workers)]
        self._clients = [flight.FlightClient(loc) for loc in locations]
        self._lost = False
        self._call_all("peers", [pickle.dumps(locations)] * self.workers)
        log.info("long-lived tasks ready: %s", locations)

    @property
    def lost(self) -> bool:
        """True when a task stopped answering since the tasks were last ready."""
        return self._lost

    def restart(self) -> None:
        """After a loss: waits for Spark's restarted barrier stage and its tasks.

        Raises:
            JobFailedError: the stage was not restarted (the barrier job failed: too
                many attempts), or its tasks did not register in time.
        """
        self.restarts += 1
        log.warning("long-lived tasks lost; waiting for Spark to restart their stage")
        self._wait_ready()

    def _call(self, i: int, kind: str, body: bytes):
        flight = _flight()
        try:
            results = list(self._clients[i].do_action(flight.Action(kind, body)))
        except (flight.FlightUnavailableError, flight.FlightInternalError, flight.FlightCancelledError,
                flight.FlightTimedOutError, OSError) as e:
            self._lost = True
            raise TasksLostError(f"long-lived task {i} stopped answering ({type(e).__name__}: {e}); "
                                 f"Spark restarts the stage") from e
        data = results[0].body.to_pybytes()
        self.bytes_received += len(data)
        status, value = pickle.loads(data)
        if status == "error":
            raise LongLivedTaskError(f"long-lived task {i} failed:\n{value}")
        return value

    def _call_all(self, kind: str, bodies: list[bytes | None]) -> list:
        """Sends command ``kind`` to every task with a body (None: skip it), at once;
        returns the answers in task order. A lost task's error wins over others (they
        may be failures to reach it)."""
        futures = {i: self._pool.submit(self._call, i, kind, body) for i, body in enumerate(bodies)
                   if body is not None}
        answers, errors = {}, []
        for i, fut in futures.items():
            try:
                answers[i] = fut.result()
            except Exception as e:  # all answers first: one failure must not hide a loss
                errors.append(e)
        if errors:
            raise next((e for e in errors if isinstance(e, TasksLostError)), errors[0])
        return [answers.get(i) for i in range(len(bodies))]

    def map(self, fn: Callable, items: list) -> list:
        """``[fn(item) for item in items]`` in the tasks, items spread over them, in order;
        a lost task restarts the stage and the whole map runs again (every caller's
        ``fn`` is idempotent: publishing, checks, surveys)."""
        from pyspark import cloudpickle

        while True:
            shares = [list(range(i, len(items), self.workers)) for i in range(self.workers)]
            bodies = [cloudpickle.dumps((fn, [items[j] for j in share])) if share else None for share in shares]
            try:
                answers = self._call_all("map", bodies)
            except TasksLostError:
                self.restart()
                continue
            out: list = [None] * len(items)
            for share, values in zip(shares, answers):
                for j, value in zip(share, values or []):
                    out[j] = value
            return out

    def close(self) -> None:
        """Stops the tasks (``stop``; the barrier job then ends), or cancels the job when
        they do not answer, and the coordinator's server. Idempotent."""
        flight = _flight()
        for client in self._clients:
            try:
                list(client.do_action(flight.Action("stop", b"")))
            except flight.FlightError:
                pass  # a lost task: the job group's cancel below ends the rest
        self._clients = []
        if not self._job_done.wait(10 * POLL_S):
            self.sc.cancelJobGroup(self._group)
            self._job_done.wait(60)
        self._pool.shutdown(wait=False)
        self._server.shutdown()


class LongLivedExchange(Exchange):
    """One epoch's ``Exchange`` over the run's long-lived tasks (module docstring).

    ``read`` always returns the split summaries: the driver computes the epoch's event
    time itself (the same function the first operator's tasks would run), so it can plan
    the next epoch before this one's operators run (pipelining, ``start_read``).

    Args:
        tasks: the run's ``Coordinator``.
        epoch: the epoch.
        parallelism: the first operator's number of ranges.
    """

    def __init__(self, tasks: Coordinator, epoch: int, parallelism: int) -> None:
        self.tasks, self.epoch, self._parallelism = tasks, epoch, parallelism
        self.id = f"{epoch}-{uuid.uuid4().hex[:8]}"
        self._summaries: list[SplitSummary] = []
        self._reading: concurrent.futures.Future | None = None
        self._received_mark = tasks.bytes_received

    @property
    def bytes_received(self) -> int:  # type: ignore[override]
        return self.tasks.bytes_received - self._received_mark

    def start_read(self, source: Source, splits: list[Split], ctx: ReadContext) -> None:
        """Sends the ``read`` commands and returns at once; ``read`` with the same
        arguments then waits for them. The tasks read while the driver goes on (the
        previous epoch's operators and commit: pipelining)."""
        from pyspark import cloudpickle

        w = self.tasks.workers
        bodies = [cloudpickle.dumps((self.id, source, splits[i::w], ctx)) for i in range(w)]
        order = {s: i for i, s in enumerate(splits)}

        def read_all() -> list[SplitSummary]:
            answers = self.tasks._call_all("read", bodies)
            return sorted((s for a in answers for s in a), key=lambda s: order[s.split])

        self._reading = self.tasks._pool.submit(read_all)

    def read(self, source: Source, splits: list[Split], ctx: ReadContext) -> list[SplitSummary]:
        if self._reading is None:
            self.start_read(source, splits, ctx)
        self._summaries = self._reading.result()
        return list(self._summaries)

    def discard(self) -> None:
        """Forgets a read that will not run (the run stopped after it was started)."""
        try:
            if self._reading is not None:
                self._reading.result()
            self.tasks._call_all("drop", [self.id.encode()] * self.tasks.workers)
        except Exception:  # noqa: BLE001 - the run is ending; a lost task holds nothing
            log.debug("discarding the read of epoch %d failed", self.epoch, exc_info=True)

    def run_operator(self, operator: Operator, specs: list[TaskSpec], input_schema: pa.Schema,
                     sinks: dict[str, Sink] | None, first: FirstStage | None
                     ) -> tuple[list[TaskResult], DeadLetterResult | None]:
        w, p = self.tasks.workers, len(specs)
        last = sinks is not None
        summaries = self._summaries if first is not None and first.event_time is not None else []
        shares: list[list[TaskSpec]] = [[] for _ in range(w)]
        for spec in specs:
            shares[owner(spec.range_index, p, w)].append(spec)
        op_index = specs[0].op_index
        bodies = [pickle.dumps((self.id, op_index, share, input_schema, last, first, summaries),
                               protocol=pickle.HIGHEST_PROTOCOL) if share else None for share in shares]
        out = [r for answer in self.tasks._call_all("run", bodies) if answer for r in answer]
        results = sorted((r for r in out if isinstance(r, TaskResult)), key=lambda r: r.range_index)
        dead = [r for r in out if isinstance(r, DeadLetterResult)]
        if len(results) != p:
            raise RuntimeError(f"operator {operator.name}: {len(results)} task results for {p} ranges")
        return results, (dead[0] if dead else None)
