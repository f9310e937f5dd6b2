"""A state record changed between releases across a restart (and a rescale): old entries
are read lazily in the new fields, in both operator forms, in process and on Spark; an
incompatible change is refused before any epoch. Oracles: pandas over the events
(``keyed_count_oracle``) and the state a run of release 1 alone holds at the same epoch."""
from __future__ import annotations

import re

import pandas as pd
import pyarrow as pa
import pytest

from dkvstream.examples.keyed_count import keyed_count_oracle
from dkvstream.operators.api.codecs import VERSION_MARK, IntCodec, RecordCodec, StrCodec
from dkvstream.operators.api.state import MapSpec, decode_state_key
from dkvstream.operators.errors import StateSchemaError
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.operators.tools.state_reader import checkpoint_entries, describe, read_state
from tests.operators import evolving_state as ev

FIRST_EPOCHS = 3


def _published(runner: JobRunner, after: int = 0) -> pd.DataFrame:
    """The ``main`` sink's rows of epochs after ``after`` (a restart republishes the last
    epoch of release 1 into release 2's sink, which has other columns)."""
    sink = runner.job.sinks["main"]
    keys = [k for k in runner.store.list(sink.table_prefix(runner.job.prefix)) if k.endswith(".parquet")]
    epochs = [int(re.search(r"epoch=(\d+)", k).group(1)) for k in keys]
    return pa.concat_tables([sink.read_published(runner.store, k, e) for k, e in zip(keys, epochs)
                             if e > after]).to_pandas()


def _check_output(v1: JobRunner, v2: JobRunner, last_v1: int = FIRST_EPOCHS,
                  want: pd.DataFrame | None = None) -> None:
    """Release 1's rows (up to its last epoch ``last_v1``) and release 2's together are
    ``want`` (by default the oracle's over the whole source), each window once."""
    old, new = _published(v1), _published(v2, after=last_v1)
    assert len(new) and (new["tag"] == ev.TAG).all(), "a window left by release 1 lost its default"
    new = new.assign(amount=new["amount"].astype("int64")).drop(columns="tag")
    got = pd.concat([old, new]).sort_values(["key", "window_start"]).reset_index(drop=True)
    if want is None:
        want = keyed_count_oracle(v2.job.source)
    want = want.sort_values(["key", "window_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[want.columns.tolist()], want, check_dtype=False)


def _windows(store, job, epoch: int) -> dict:
    """``{(subject key, window start): (count, amount)}`` of the state at ``epoch``."""
    t = read_state(store, job, "windows", epoch=epoch).to_pydict()
    return {(k, m): (v["count"], v["amount"], v.get("tag")) for k, m, v in
            zip(t["subject_key"], t["map_key"], t["value"])}


@pytest.mark.parametrize("v1_op, v2_op", [(ev.CountV1, ev.CountV2), (ev.CountV1Batch, ev.CountV2Batch),
                                          (ev.CountV1Batch, ev.CountV2)],
                         ids=["on_event", "batch", "batch_then_on_event"])
def test_new_release_reads_old_state_across_restart_and_rescale(tmp_path, v1_op, v2_op) -> None:
    store = str(tmp_path / "store")
    with JobRunner(ev.job(v1_op()), None, store) as v1:
        v1.run(max_epochs=FIRST_EPOCHS)
    with JobRunner(ev.job(v2_op(), parallelism=3), None, store) as v2:  # a rescale too
        v2.run(max_epochs=1)
        # The state after one epoch of release 2 holds entries of both versions ...
        entries = [v for _, _, k, v in checkpoint_entries(v2.store, v2.job.prefix)
                   if k[2] == 0 and decode_state_key(k)[2] == "windows"]
        versions = {v[0] == VERSION_MARK for v in entries}
        assert versions == {True, False}, versions
        # ... and reads as release 1's state would be at that epoch, plus the default.
        with JobRunner(ev.job(ev.CountV1()), None, str(tmp_path / "reference")) as ref:
            ref.run(max_epochs=FIRST_EPOCHS + 1)
            want = {k: (c, float(a), ev.TAG) for k, (c, a, _) in
                    _windows(ref.store, ref.job, FIRST_EPOCHS + 1).items()}
        assert _windows(v2.store, v2.job, FIRST_EPOCHS + 1) == want
        # The offline reader reads release 1's checkpoint with release 2's declaration.
        old = _windows(v1.store, v1.job, FIRST_EPOCHS)
        assert _windows(v2.store, v2.job, FIRST_EPOCHS) == {k: (c, float(a), ev.TAG) for k, (c, a, _) in old.items()}
        v2.run()
        recorded = v2.latest().state_schemas[ev.NAME]["windows"]
        assert recorded["versions"] == [[list(f) for f in ev.V1.schema_fields()],
                                        [list(f) for f in ev.V2.schema_fields()]]
        assert recorded["key_codec"] == "int64" and recorded["kind"] == "map"
        assert describe(v2.store, v2.job)["operators"][0]["states"]["windows"].endswith("(schema versions 0..1)")
    _check_output(v1, v2)


def test_new_release_on_spark(spark, tmp_path) -> None:
    store = str(tmp_path / "store")
    v1 = JobRunner(ev.job(ev.CountV1Batch()), spark, store)
    v1.run(max_epochs=FIRST_EPOCHS)
    v2 = JobRunner(ev.job(ev.CountV2Batch(), parallelism=3), spark, store)
    v2.run()
    _check_output(v1, v2)


class _Narrowed(ev.CountV2):
    windows = MapSpec(IntCodec(), RecordCodec({"count": pa.int32(), "amount": pa.int64()}), id="windows")


class _Retyped(ev.CountV2):
    windows = MapSpec(IntCodec(), RecordCodec({"count": pa.int64(), "amount": pa.string()}), id="windows")


class _NewKeyCodec(ev.CountV2):
    windows = MapSpec(StrCodec(), ev.V2, id="windows")


@pytest.mark.parametrize("op, says", [
    (_Narrowed, "field 'count' was int64, is int32: a narrowing"),
    (_Retyped, "field 'amount' was int64, is string: a type change"),
    (_NewKeyCodec, "its map keys were encoded by int64, are declared with str: a new key codec"),
])
def test_incompatible_release_is_refused_before_any_epoch(tmp_path, op, says) -> None:
    store = str(tmp_path / "store")
    with JobRunner(ev.job(ev.CountV1()), None, store) as v1:
        v1.run(max_epochs=FIRST_EPOCHS)
    runner = JobRunner(ev.job(op()), None, store)
    with pytest.raises(StateSchemaError) as raised:
        runner.run()
    message = str(raised.value)
    assert f"operator '{ev.NAME}' state 'windows': {says}" in message
    assert f"epoch {FIRST_EPOCHS}" in message and "new state id" in message
    assert runner.latest().epoch == FIRST_EPOCHS  # nothing ran


def test_a_release_reading_every_older_version(tmp_path) -> None:
    """Version 2 must read version 0's entries too: a field dropped in version 1 cannot
    come back with another type while version-0 entries may still hold it."""
    store = str(tmp_path / "store")
    with JobRunner(ev.job(ev.CountV1()), None, store) as v1:
        v1.run(max_epochs=1)
    with JobRunner(ev.job(ev.CountV2()), None, store) as v2:
        v2.run(max_epochs=1)

    class Back(ev.CountV2):  # last_start, dropped in version 1, back as a string
        windows = MapSpec(IntCodec(), RecordCodec({**ev.V2.fields, "last_start": pa.string()}), id="windows")

    with pytest.raises(StateSchemaError, match="field 'last_start' was int64, is string.*schema version 0"):
        JobRunner(ev.job(Back()), None, store).run()


class _Killed(Exception):
    pass


def _kill(point: str, epoch: int | None) -> None:
    raise _Killed(f"{point} of epoch {epoch}")


@pytest.mark.parametrize("v2_op", [ev.CountV2, ev.CountV2Batch], ids=["on_event", "batch"])
def test_new_release_killed_in_its_first_epoch(tmp_path, v2_op) -> None:
    """Release 2 dies after its first epoch's tasks wrote entries of the new version and
    before the commit; the restart reads the checkpoint of release 1 again."""
    from dkvstream.storage import faults

    store = str(tmp_path / "store")
    with JobRunner(ev.job(ev.CountV1()), None, store) as v1:
        v1.run(max_epochs=FIRST_EPOCHS)
    faults.arm("after_tasks", action=_kill, epoch=FIRST_EPOCHS + 1)
    with JobRunner(ev.job(v2_op()), None, store) as crashed, pytest.raises(_Killed):
        crashed.run()
    assert crashed.latest().epoch == FIRST_EPOCHS
    assert crashed.latest().state_schemas[ev.NAME]["windows"]["versions"] == [
        [list(f) for f in ev.V1.schema_fields()]]
    with JobRunner(ev.job(v2_op(), parallelism=3), None, store) as v2:
        v2.run()
    _check_output(v1, v2)


def test_new_release_on_a_live_source(tmp_path) -> None:
    """An unbounded source: release 1 reads what is there, release 2 goes on as more
    arrives; the output is every window the final watermark closed."""
    from tests.operators.live_sources import GrowingSource, oracle, reveal

    visible, store = tmp_path / "visible.json", str(tmp_path / "store")
    reveal(visible, {"p0": 1_200, "p1": 1_100})
    with JobRunner(ev.job(ev.CountV1Batch(), source=GrowingSource(visible)), None, store) as v1:
        last_v1 = v1.run()[-1].epoch
    reveal(visible, {"p0": 2_500, "p1": 2_600})
    with JobRunner(ev.job(ev.CountV2Batch(), parallelism=3, source=GrowingSource(visible)), None, store) as v2:
        v2.run()
        watermark = v2.latest().watermark
    _check_output(v1, v2, last_v1, oracle(GrowingSource(visible), watermark))
