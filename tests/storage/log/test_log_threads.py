"""The log used from several threads at once, against oracles: threads reading one topic
together, and a producer appending while the cleaner compacts.

Each scenario runs in a child process (this file run as a script), so that a crash of the
process (e.g. a segfault of a compression context used by two threads at once) fails the
test rather than killing pytest. The child checks what it read against its oracle and
prints a JSON report; the test asserts on that report.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import threading
from pathlib import Path

from dkvstream import storage
from dkvstream.storage.log import COMPACT, Log, ProducerConfig, TopicConfig
from dkvstream.storage.objectstore.local import LocalObjectStore

REPO = Path(storage.__file__).resolve().parents[1]
# Big batches: the longer each (de)compression runs, the more often two threads overlap in it.
BATCH_BYTES = 64 * 1024


def _value(rng: random.Random, n: int) -> bytes:
    """``n`` bytes that zstd shrinks by about half (hex digits of random bytes)."""
    return rng.randbytes(n // 2).hex().encode()


def _run_child(scenario: str, root: Path, *args) -> dict:
    """Runs ``scenario`` of this file in a child process; returns its JSON report."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, scenario, str(root), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, (f"{scenario} child exited with {proc.returncode} "
                                  f"(negative: killed by that signal)\nstderr:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _records(log: Log, topic: str, partition: int) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in log.read(topic, partition)]


# ----------------------------------------------------------------------------- children
def read_concurrently(root: str, threads: str, rounds: str) -> dict:
    """``threads`` threads each read topic ``t`` partition 0 ``rounds`` times and compare
    every read with the oracle pickled in ``<root>/oracle.pkl``."""
    log = Log(LocalObjectStore(Path(root) / "bucket"))
    expected = pickle.loads((Path(root) / "oracle.pkl").read_bytes())
    lock = threading.Lock()
    report = {"reads": 0, "wrong": 0, "errors": []}

    def reader() -> None:
        for _ in range(int(rounds)):
            try:
                ok = _records(log, "t", 0) == expected
            except Exception as e:  # noqa: BLE001 - any error of a thread goes into the report
                with lock:
                    report["errors"].append(repr(e))
                continue
            with lock:
                report["reads"] += 1
                report["wrong"] += not ok

    ts = [threading.Thread(target=reader) for _ in range(int(threads))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    report["errors"] = report["errors"][:5]
    return report


def produce_while_cleaning(root: str, rounds: str, flushes: str, per_flush: str) -> dict:
    """``rounds`` times, on a fresh compacted topic: a producer thread writes ``flushes``
    files of ``per_flush`` records while a cleaner thread cleans the topic over and over;
    then the topic is read back and compared with the latest value of every key (a dict
    oracle). Several rounds because one round overlaps the two threads' compressions only
    by chance."""
    log = Log(LocalObjectStore(Path(root) / "bucket"))
    report = {"errors": [], "wrong_keys": {}, "rounds_with_cleanings": 0}
    for r in range(int(rounds)):
        topic = f"c{r}"
        errors, wrong, cleanings = _produce_while_cleaning_round(log, topic, r, int(flushes), int(per_flush))
        report["errors"] += errors
        if wrong:
            report["wrong_keys"][topic] = wrong[:10]
        report["rounds_with_cleanings"] += cleanings > 0
    return report


def _produce_while_cleaning_round(log: Log, topic: str, seed: int, flushes: int,
                                  per_flush: int) -> tuple[list[str], list[str], int]:
    """One round of ``produce_while_cleaning``: (errors, keys read back wrong, cleanings)."""
    log.create_topic(topic, TopicConfig(partitions=1, cleanup_policy=COMPACT, delete_retention_ms=10**9,
                                        min_compaction_lag_ms=0, min_cleanable_dirty_ratio=0.0))
    latest: dict[bytes, bytes] = {}
    errors: list[str] = []
    produced = threading.Event()
    cleanings = [0]

    def produce() -> None:
        rng = random.Random(seed)
        prod = log.producer(ProducerConfig(batch_bytes=BATCH_BYTES))
        try:
            for _ in range(flushes):
                for _ in range(per_flush):
                    key, value = b"k%d" % rng.randrange(300), _value(rng, 2000)
                    prod.send(topic, key, value, partition=0, timestamp=1_000)
                    latest[key] = value
                prod.flush()
        except Exception as e:  # noqa: BLE001 - any error of a thread goes into the report
            errors.append(f"{topic} producer: {e!r}")
        finally:
            produced.set()

    def clean() -> None:
        try:
            while not produced.is_set():
                if log.clean(topics=[topic], force=True, clock=lambda: 2_000) is not None:
                    cleanings[0] += 1
        except Exception as e:  # noqa: BLE001 - e.g. CorruptionError reading the producer's file
            errors.append(f"{topic} cleaner: {e!r}")

    ts = [threading.Thread(target=produce), threading.Thread(target=clean)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    try:
        got = {rec.key: rec.value for rec in log.read(topic, 0)}
        wrong = sorted(k.decode() for k in set(got) | set(latest) if got.get(k) != latest.get(k))
    except Exception as e:  # noqa: BLE001 - an unreadable topic goes into the report
        errors.append(f"{topic} read back: {e!r}")
        wrong = ["<unreadable>"]
    return errors, wrong, cleanings[0]


# -------------------------------------------------------------------------------- tests
def test_threads_reading_one_topic_see_its_records(tmp_path: Path) -> None:
    log = Log(LocalObjectStore(tmp_path / "bucket"))
    log.create_topic("t", TopicConfig(partitions=1))
    rng = random.Random(3)
    prod = log.producer(ProducerConfig(batch_bytes=BATCH_BYTES))
    expected = []
    for _ in range(8):
        for _ in range(400):
            key, value = b"k%d" % rng.randrange(1000), _value(rng, 1000)
            prod.send("t", key, value, partition=0, timestamp=5_000 + len(expected))
            expected.append((len(expected), 5_000 + len(expected), key, value))
        prod.flush()
    assert _records(log, "t", 0) == expected  # single-threaded sanity check of the oracle
    (tmp_path / "oracle.pkl").write_bytes(pickle.dumps(expected))
    threads, rounds = 4, 25
    report = _run_child("read_concurrently", tmp_path, threads, rounds)
    assert report == {"reads": threads * rounds, "wrong": 0, "errors": []}


def test_producer_racing_cleaner_leaves_a_readable_topic(tmp_path: Path) -> None:
    rounds = 5
    report = _run_child("produce_while_cleaning", tmp_path, rounds, 25, 150)
    assert report == {"errors": [], "wrong_keys": {}, "rounds_with_cleanings": rounds}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
