"""Two drivers on one job: the commit of an epoch is a put-if-absent of its checkpoint
manifest, so when both run the same epoch exactly one commits it and the other stops
with ``JobFencedError`` naming the job, the epoch and the checkpoint object; it publishes
nothing. Real processes, on a local directory and on the S3 server (SeaweedFS).

A driver that falls behind by the retention count finds the checkpoint it commits
deleted; the fence (``dkvstream.operators.runtime.checkpoints``) still refuses its commit, and
its cleanup never runs. Tested in process with exact interleavings, below."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dkvstream.operators.errors import JobFencedError
from dkvstream.operators.runtime.checkpoints import list_epochs
from dkvstream.operators.runtime.recovery import check_checkpoint
from dkvstream.storage import faults
from tests.operators import small_keyed_count as small
from tests.reliability import harness


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> harness.Reference:
    return harness.reference_run(tmp_path_factory.mktemp("reference"))


def _race_to_commit(store_uri: str, tmp_path: Path) -> list[harness.DriverRun]:
    """Two drivers meet before their first commit (both ran epoch 1's tasks), then both
    commit; returns both runs."""
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        ready = tmp_path / f"ready{i}"
        cfg = {"store": store_uri, "barrier": ["after_tasks", str(ready), str(go)]}
        procs.append((*harness.start_driver(cfg, tmp_path / f"driver{i}"), ready))
    deadline = time.monotonic() + 300
    while not all(ready.exists() for _, _, ready in procs):
        assert all(p.poll() is None for p, _, _ in procs), [p.communicate()[1][-2000:] for p, _, _ in procs]
        assert time.monotonic() < deadline, "drivers never reached their commit"
        time.sleep(0.01)
    go.touch()
    runs = []
    for p, trace, _ in procs:
        _, err = p.communicate(timeout=300)
        runs.append(harness.DriverRun(p.returncode, trace.read_text().split(), err))
    return runs


def _check_fenced(runs: list[harness.DriverRun], store_uri: str, reference: harness.Reference) -> None:
    codes = sorted(r.returncode for r in runs)
    assert codes == [0, 3], f"exit codes {codes}: " + "\n".join(r.stderr[-2000:] for r in runs)
    winner, loser = sorted(runs, key=lambda r: r.returncode)
    assert "FENCED: job keyed_count: epoch 1 was committed by another driver" in loser.stderr, loser.stderr
    assert "checkpoints/epoch-0000000001.json already exists" in loser.stderr, loser.stderr
    assert store_uri.split("://")[-1].rstrip("/") in loser.stderr  # the object's full URI
    # The loser stopped at its commit: it never published or cleaned up anything.
    assert "after_commit" not in loser.passed and "publish_file" not in loser.passed
    assert winner.passed.count("after_commit") == reference.epochs
    harness.check_recovery(store_uri, reference)  # the winner's state and output are exact


def test_second_driver_is_fenced(reference, tmp_path) -> None:
    store = str(tmp_path / "store")
    _check_fenced(_race_to_commit(store, tmp_path), store, reference)


def test_second_driver_is_fenced_on_s3(reference, s3_store, tmp_path) -> None:
    _check_fenced(_race_to_commit(s3_store.root_uri, tmp_path), s3_store.root_uri, reference)


def test_unsynchronised_drivers_never_both_commit(reference, tmp_path) -> None:
    """Started together and left alone: each epoch is committed once (each driver either
    finishes or is fenced) and the output is exact."""
    store = str(tmp_path / "store")
    procs = [harness.start_driver({"store": store}, tmp_path / f"driver{i}") for i in range(2)]
    runs = []
    for p, trace in procs:
        _, err = p.communicate(timeout=300)
        runs.append(harness.DriverRun(p.returncode, trace.read_text().split(), err))
    for r in runs:
        assert r.returncode in (0, 3), r.stderr[-2000:]
    commits = sum(r.passed.count("after_commit") for r in runs)
    assert commits == reference.epochs, f"{commits} commits of {reference.epochs} epochs"
    harness.check_recovery(store, reference)


# ----------------------------------------------------------------------------------------
# Two drivers in one process, interleaved step by step (no sleeps): each runs in its own
# thread, but only one runs at a time. A driver stops at the (point, epoch) the schedule
# names at a fault point and waits there until the schedule resumes it; in between, the
# other one runs. Retention 1 and 2: the lagging driver falls behind by at least the
# retention count, so the checkpoint it is about to commit was deleted (the gap the
# put-if-absent fence alone does not close).
#
# Oracle, after both drivers ended: no epoch was committed twice (a commit is counted
# when the driver passes "after_commit", i.e. its commit returned); a fresh driver
# restarts (full verification) and finishes; every file a retained checkpoint names
# verifies; the output equals the pandas answer (no row duplicated or lost).
# ----------------------------------------------------------------------------------------
class _Driver:
    """One driver thread of a schedule. ``restarts``: how often it starts itself again
    (a new ``JobRunner``, as a supervisor would) after being fenced."""

    def __init__(self, name: str, root: str, retain: int, commits: list, restarts: int = 0) -> None:
        self.name, self.root, self.retain = name, root, retain
        self.commits, self.restarts = commits, restarts
        self.stops: set[tuple[str, int]] = set()
        self.fenced: list[str] = []
        self.error: BaseException | None = None
        self.ended = False
        self.at: tuple[str, int] | None = None
        self._go = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def _at_point(self, point: str, epoch: int | None) -> None:
        if threading.current_thread() is not self._thread:
            return  # the other driver's
        if point == "after_commit":
            self.commits.append((epoch, self.name))
        if (point, epoch) in self.stops:
            self.stops.discard((point, epoch))
            self.at = (point, epoch)
            self._stopped.set()
            self._go.wait()
            self._go.clear()
            self.at = None

    def _main(self) -> None:
        try:
            for attempt in range(self.restarts + 1):
                runner = small.runner(self.root, retain=self.retain)
                try:
                    with faults.callback(self._at_point):
                        runner.run()
                    return
                except JobFencedError as e:
                    self.fenced.append(str(e))
                    if attempt == self.restarts:
                        return
                finally:
                    runner.close()
        except BaseException as e:  # noqa: BLE001 - reported by the schedule
            self.error = e
        finally:
            self.ended = True
            self._stopped.set()

    def run_until(self, point: str | None = None, epoch: int | None = None) -> None:
        """Starts or resumes the driver; returns once it stopped at ``(point, epoch)`` or
        ended (None: run it to its end)."""
        if point is not None:
            self.stops.add((point, epoch))
        self._stopped.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()
        else:
            assert self.at is not None and not self.ended, f"{self.name} is not stopped"
            self._go.set()
        # A deadlock guard, not a timing assumption: each step takes well under a second.
        assert self._stopped.wait(300), f"{self.name} never reached {point} of epoch {epoch}"
        if point is not None and not self.ended:
            assert self.at == (point, epoch), (self.name, self.at, point, epoch)

    def finish(self) -> None:
        if not self.ended:
            self.run_until()
        self._thread.join(300)
        assert self.error is None, f"{self.name} failed: {self.error!r}"


def _check_oracle(root: str, retain: int, commits: list[tuple[int, str]],
                  *drivers: _Driver) -> None:
    for d in drivers:
        d.finish()
    twice = {e: [n for ce, n in commits if ce == e] for e, _ in commits}
    twice = {e: names for e, names in twice.items() if len(names) > 1}
    assert not twice, f"epochs committed more than once: {twice}"
    assert sorted(e for e, _ in commits) == list(range(1, small.EPOCHS + 1)), commits
    final = small.runner(root, retain=retain, verify_restart="full")
    assert final.run() == []  # restarts from the newest checkpoint, which is finished
    latest = final.latest()
    assert latest.epoch == small.EPOCHS and latest.finished
    for e in list_epochs(final.store, final.job.prefix):
        _, errors = check_checkpoint(final.store, final.job.prefix, e, "full")
        assert not errors, f"retained checkpoint {e}: {errors}"
    small.assert_output_exact(final, "two drivers")


@pytest.mark.parametrize("retain", [1, 2])
def test_driver_started_while_another_runs(tmp_path, retain) -> None:
    """B starts from A's checkpoint 2 while A runs epoch 3, runs epoch 3's tasks and
    stops; A commits 3..3+retain (retention deletes checkpoint 3) and has epoch 4+retain
    in flight; B commits epoch 3: fenced, and it cleans up nothing of A's epoch."""
    root, commits = str(tmp_path), []
    a, b = _Driver("A", root, retain, commits), _Driver("B", root, retain, commits)
    a.run_until("after_tasks", 3)
    b.run_until("after_tasks", 3)
    a.run_until("after_tasks", 4 + retain)
    b.run_until()
    _check_oracle(root, retain, commits, a, b)
    assert "epoch 3 was committed before by another driver" in b.fenced[0], b.fenced


@pytest.mark.parametrize("retain", [1, 2])
def test_fenced_driver_restarting_itself(tmp_path, retain) -> None:
    """A and B both run epoch 2; A commits it, B is fenced and starts itself again from
    checkpoint 2, runs epoch 3's tasks and stops; A commits 3..3+retain and stops in
    flight; B commits epoch 3 into the gap: fenced again, starts again and runs to the
    end; A, resumed, commits an epoch B committed and retired: fenced, starts again and
    finds the job finished."""
    root, commits = str(tmp_path), []
    a = _Driver("A", root, retain, commits, restarts=2)
    b = _Driver("B", root, retain, commits, restarts=2)
    a.run_until("after_tasks", 2)
    b.run_until("after_tasks", 2)
    a.run_until("after_tasks", 3)
    b.run_until("after_tasks", 3)  # fenced at epoch 2, started again, ran epoch 3's tasks
    assert "epoch 2 was committed by another driver" in b.fenced[0], b.fenced
    a.run_until("after_tasks", 4 + retain)
    b.run_until()
    a.run_until()
    _check_oracle(root, retain, commits, a, b)
    assert len(b.fenced) == 2 and "epoch 3 was committed before" in b.fenced[1], b.fenced
    assert a.fenced, "A's in-flight epoch was committed by B"


@pytest.mark.parametrize("retain", [1, 2])
@pytest.mark.parametrize("pause", ["after_tasks", "before_cleanup"])
def test_driver_paused_mid_epoch(tmp_path, retain, pause) -> None:
    """A stops in epoch 3 (tasks done, or committed and published but not cleaned up), as
    a SIGSTOPped process would; B starts, runs on and stops with an epoch in flight; A
    resumes: after its tasks, its commit is fenced; before its cleanup, the cleanup must
    leave B's in-flight files alone. Then both go on to the end."""
    root, commits = str(tmp_path), []
    a = _Driver("A", root, retain, commits, restarts=1)
    b = _Driver("B", root, retain, commits, restarts=1)
    a.run_until(pause, 3)
    in_flight = 4 + retain if pause == "after_tasks" else 4
    b.run_until("after_tasks", in_flight)
    a.run_until()
    b.run_until()
    _check_oracle(root, retain, commits, a, b)
    if pause == "after_tasks":
        assert "epoch 3 was committed before by another driver" in a.fenced[0], a.fenced
