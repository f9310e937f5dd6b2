"""Dead letters where the user looks: the Dagster run log of a job's run says, per
epoch, how many records went to the dead-letter table and why; ``run_job`` prints them in
each epoch's line, and an epoch over ``DeadLetter.max_ratio`` ends it with the error.

Oracle: ``tests.operators.io.test_dead_letter.BAD``, the rows the source breaks."""
from __future__ import annotations

import dataclasses
import json

from dagster import instance_for_test, materialize

from dkvstream.assets.job_assets import job_assets
from dkvstream.assets.resources import DKVSettingsResource, ObjectStoreResource
from dkvstream.operators.io.dead_letter import REASONS, DeadLetter
from dkvstream.operators.tools import run_job
from tests.assets.live_job import NoSpark
from tests.operators.io.test_dead_letter import BAD, _job

EVENTS_PER_EPOCH = 200  # two epochs: offsets [0, 100) then [100, 200) of each partition


def _expected(epoch: int) -> dict[str, int]:
    """Dead letters of ``epoch`` per reason (those present) and in total."""
    bad = [r for (_, offset), r in BAD.items() if (offset < 100) == (epoch == 1)]
    return {"total": len(bad), **{r: bad.count(r) for r in REASONS if r in bad}}


def test_the_dagster_run_log_names_dead_letters_per_epoch(tmp_path) -> None:
    job = _job(events_per_epoch=EVENTS_PER_EPOCH)
    resources = {"object_store": ObjectStoreResource(root_uri=str(tmp_path / "store")),
                 "pyspark": NoSpark(spark_config={}), "dkv": DKVSettingsResource(memtable_bytes=64 << 10)}
    with instance_for_test() as instance:
        result = materialize(job_assets(job), resources=resources, instance=instance)
        assert result.success
        logs = [e for e in instance.all_logs(result.run_id) if not e.is_dagster_event]
    for epoch in (1, 2):
        want = _expected(epoch)
        info = [e.user_message for e in logs if e.user_message.startswith(f"epoch {epoch} of ")]
        assert len(info) == 1 and f", {want['total']} dead letters," in info[0], info
        reasons = ", ".join(f"{r} {n}" for r, n in want.items() if r != "total")
        warning = [e for e in logs if e.user_message.startswith(f"epoch {epoch}: {want['total']} records went to "
                                                                f"the dead-letter table 'dead_letter' ({reasons})")]
        assert len(warning) == 1 and warning[0].level == 30  # logging.WARNING


def dead_letter_job():
    """``run_job --job`` target: the dead-letter test job, two epochs."""
    return _job(events_per_epoch=EVENTS_PER_EPOCH)


def strict_dead_letter_job():
    """The same job with a limit its first epoch is over."""
    job = dead_letter_job()
    return dataclasses.replace(job, dead_letter=DeadLetter(max_ratio=0.01, min_records=1))


def test_run_job_prints_dead_letters_per_epoch(tmp_path, capsys) -> None:
    assert run_job.main(["--job", f"{__name__}:dead_letter_job", "--store", str(tmp_path / "a"),
                         "--create-store", "--in-process", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = {r["epoch"]: {k: v for k, v in r["dead_letter"].items() if v or k == "total"} for r in lines}
    assert got == {1: _expected(1), 2: _expected(2)}

    assert run_job.main(["--job", f"{__name__}:strict_dead_letter_job", "--store", str(tmp_path / "b"),
                         "--create-store", "--in-process", "--json"]) == 1
    out = capsys.readouterr()
    [failed] = [json.loads(line) for line in out.out.splitlines()]
    assert failed["event"] == "failed" and failed["error"].startswith(
        f"job dl: epoch 1 sent {_expected(1)['total']} of its ")
    assert out.err.startswith("error: TooManyDeadLettersError: job dl: epoch 1 sent") and out.err.count("\n") == 1
