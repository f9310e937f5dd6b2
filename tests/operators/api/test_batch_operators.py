"""The vectorised operator form (dkvstream.operators.api.batch) gives the output of the on_event form.

Each job runs in both forms; outputs are compared with each other and with an oracle
(pandas for the flights and counting jobs, a replay for the timer chain).
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.flights import flights_job
from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.batch import BatchContext, BatchOperator
from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import ValueSpec
from dkvstream.operators.io.sinks import ParquetSink
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.dkv import DKVOptions

COUNT_KEYS = ["key", "window_start"]


def _output(job: Job, runner: JobRunner, sink: str = "main") -> pd.DataFrame:
    return job.sinks[sink].read(runner.store, job.prefix).to_pandas()


def _sorted(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)


def test_flights_batch_form_equals_oracle(tmp_path, check_flights_output) -> None:
    # In-process (the batch form on Spark is covered by the counting job below).
    job = flights_job(events_per_epoch=60_000, batch=True, name="flights_batch")
    runner = JobRunner(job, None, str(tmp_path / "store"))
    runner.run()
    out = job.sinks["main"].read(runner.store, job.prefix)
    check_flights_output(out)  # the on_event form meets the same oracle in test_flights_job
    assert job.sinks["late"].read(runner.store, job.prefix).num_rows == 0


@pytest.mark.parametrize("zipf", [None, 1.1])
def test_keyed_count_forms_agree_with_pandas(tmp_path, zipf) -> None:
    outs = {}
    for batch in (False, True):
        job = keyed_count_job(6_000, 500, batch=batch, zipf=zipf, step_ms=1_000, events_per_epoch=2_500,
                              parallelism=3, name=f"kc_{batch}")
        runner = JobRunner(job, None, str(tmp_path / "store"))
        runner.run()
        outs[batch] = _sorted(_output(job, runner), COUNT_KEYS)
        assert _output(job, runner, "late").empty
    exp = _sorted(keyed_count_oracle(job.source), COUNT_KEYS)
    assert len(exp) > 500  # several windows per key: timers fire across epochs
    pd.testing.assert_frame_equal(outs[True], outs[False])
    pd.testing.assert_frame_equal(outs[True][exp.columns], exp, check_dtype=False)


def test_keyed_count_with_state_capped_equals_uncapped(tmp_path) -> None:
    # A few KiB of memtable and block cache: state lives in SSTables across flushes and
    # compactions, and the output must not change.
    capped = DKVOptions(memtable_bytes=16 << 10, block_cache_bytes=8 << 10, table_cache_bytes=16 << 10,
                        target_file_bytes=32 << 10, level_base_bytes=128 << 10)
    outs = []
    for options in (None, capped):
        job = keyed_count_job(5_000, 2_000, step_ms=1_000, events_per_epoch=2_000, parallelism=2)
        runner = JobRunner(job, None, str(tmp_path / f"store{len(outs)}"), dkv_options=options)
        runner.run()
        outs.append(_sorted(_output(job, runner), COUNT_KEYS))
        tables = [k for k in runner.store.list(job.prefix + "/state/") if k.endswith(".sst")]
        if options is capped:
            assert len(tables) > 4, tables  # the capped run really went through SSTables
    pd.testing.assert_frame_equal(outs[0], outs[1])
    exp = _sorted(keyed_count_oracle(job.source), COUNT_KEYS)
    pd.testing.assert_frame_equal(outs[1][exp.columns], exp, check_dtype=False)


def test_keyed_count_batch_form_on_spark(spark, tmp_path) -> None:
    job = keyed_count_job(4_000, 300, step_ms=1_000, events_per_epoch=3_000, parallelism=2)
    runner = JobRunner(job, spark, str(tmp_path / "store"))
    runner.run()
    got = _sorted(_output(job, runner), COUNT_KEYS)
    exp = _sorted(keyed_count_oracle(job.source), COUNT_KEYS)
    pd.testing.assert_frame_equal(got[exp.columns], exp, check_dtype=False)


# -- timers that set timers ---------------------------------------------------------------

CHAIN_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("fired_at", pa.int64()),
                          pa.field("hop", pa.int64())])
HOP_MS = 7_000
HOPS = 3


class TimerChain(Operator):
    """On the first event of a key, a timer HOP_MS later; each timer emits and sets the
    next one, HOPS times (timers set while timers fire)."""

    name = "timer_chain"
    outputs = {"main": CHAIN_SCHEMA}
    hop = ValueSpec(IntCodec(), id="hop")

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        state = self.hop.state_for(subject)
        if state.get() is None:
            state.set(0)
            subject.set_timer(event.timestamp + HOP_MS)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        state = self.hop.state_for(subject)
        hop = state.get() + 1
        subject.emit({"key": subject.key.decode(), "fired_at": timestamp, "hop": hop})
        state.set(hop)
        if hop < HOPS:
            subject.set_timer(timestamp + HOP_MS)


class TimerChainBatch(BatchOperator):
    name = TimerChain.name
    outputs = TimerChain.outputs
    hop = TimerChain.hop

    def on_batch(self, ctx: BatchContext, events: pa.Table) -> None:
        keys = events.column("key").to_pylist()
        kgs = events.column("key_group").to_pylist()
        stamps = events.column("timestamp").to_pylist()
        first = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]  # sorted by key, time
        keys, kgs, stamps = [keys[i] for i in first], [kgs[i] for i in first], [stamps[i] for i in first]
        state = ctx.state(self.hop)
        new = [i for i, h in enumerate(state.get(keys, kgs)) if h is None]
        state.set([keys[i] for i in new], [kgs[i] for i in new], [0] * len(new))
        ctx.set_timers([keys[i] for i in new], [kgs[i] for i in new], [stamps[i] + HOP_MS for i in new])

    def on_timers(self, ctx: BatchContext, timers: pa.Table) -> None:
        keys = timers.column("key").to_pylist()
        kgs = timers.column("key_group").to_pylist()
        stamps = timers.column("timestamp").to_pylist()
        state = ctx.state(self.hop)
        hops = [h + 1 for h in state.get(keys, kgs)]
        ctx.emit({"key": [k.decode() for k in keys], "fired_at": stamps, "hop": hops}, keys=keys, timestamps=stamps)
        state.set(keys, kgs, hops)
        more = [i for i, h in enumerate(hops) if h < HOPS]
        ctx.set_timers([keys[i] for i in more], [kgs[i] for i in more], [stamps[i] + HOP_MS for i in more])


def test_timers_that_set_timers_agree_in_both_forms(tmp_path) -> None:
    source = SyntheticSource(events=400, keys=60, partitions=2, step_ms=100)
    outs = {}
    for op in (TimerChain(), TimerChainBatch()):
        job = Job(name=f"chain_{type(op).__name__}", source=source, operators=[op],
                  sinks={"main": ParquetSink("chain", CHAIN_SCHEMA)}, key_groups=32, parallelism=2,
                  events_per_epoch=150, max_out_of_orderness_ms=100)
        runner = JobRunner(job, None, str(tmp_path / "store"))
        runner.run()
        outs[type(op).__name__] = _sorted(_output(job, runner), ["key", "hop"])
    # Replay oracle: every key fires HOPS timers, HOP_MS apart from its first event.
    events = pd.concat([source.full_partition(p).to_pandas() for p in source.partitions()])
    first = events.groupby("key")["timestamp"].min()
    exp = pd.DataFrame([(k.decode(), t + h * HOP_MS, h) for k, t in first.items() for h in range(1, HOPS + 1)],
                       columns=["key", "fired_at", "hop"])
    exp = _sorted(exp, ["key", "hop"])
    pd.testing.assert_frame_equal(outs["TimerChain"], outs["TimerChainBatch"])
    pd.testing.assert_frame_equal(outs["TimerChainBatch"], exp, check_dtype=False)


def test_batch_emit_checks_lengths_and_outputs(tmp_path) -> None:
    from dkvstream.operators.runtime.timers import TimerService
    from dkvstream.storage.dkv import DKV
    from dkvstream.storage.objectstore.local import LocalObjectStore

    db = DKV.open(LocalObjectStore(tmp_path), "s", None)
    ctx = BatchContext(db, TimerService(db, range(4)), TimerChain.outputs)
    with pytest.raises(KeyError, match="no output 'late'"):
        ctx.emit({"key": ["a"], "fired_at": [1], "hop": [1]}, output="late", keys=[b"a"], timestamps=[1])
    with pytest.raises(ValueError, match="1 rows, 2 keys"):
        ctx.emit({"key": ["a"], "fired_at": [1], "hop": [1]}, keys=[b"a", b"b"], timestamps=[1, 2])
    with pytest.raises(TypeError, match="BatchOperator"):
        TimerChainBatch().on_event(None, None)  # type: ignore[arg-type]
