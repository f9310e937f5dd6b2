"""Live soak: a continuous job on a Kafka topic fed at a steady rate, its driver
SIGKILLed and the broker killed and restarted at random moments; afterwards every record
is in the output exactly once and the running totals equal pandas'.

For ``DKVSTREAM_LIVE_SOAK_SECONDS`` (default 300) a producer thread of this process
writes ``DKVSTREAM_LIVE_SOAK_RATE`` records/s (default 2,000) to a 2-partition topic of a
Tansu broker (``tansu broker --storage-engine s3://``, its log kept on the SeaweedFS test
server, so a restarted broker still has every record it acknowledged). Each record has
a unique sequence number (``tests/reliability/live_soak_job.py``). The job (per key,
the running count and sum, one output row per event) runs as a driver subprocess,
``python -m dkvstream.operators.tools.run_job --in-process --continuous`` (tasks in the driver,
no Spark: the point is the driver and the broker, and it keeps CI cheap), state and
output on a local directory store, 3 checkpoints retained.

Faults, drawn from a seeded ``random.Random`` (``harness.rng``: seed 0 in CI, else
printed): one every ~30 s of the run, between 10 % and 85 % of it, alternating between

* the driver SIGKILLed at whatever it is doing, and started again 0-3 s later; and
* the broker SIGKILLed (``kill -9`` of ``tansu``) and started again on the same port
  1-5 s later (the producer and the driver's consumer reconnect on their own).

A fault counts only if it landed: the process was running when the signal was sent and
its exit status is SIGKILL's. Then the producer stops, the driver reads to the topic's
end, and a SIGTERM stops it (exit 0, ``{"event": "stopped"}``). The assertions, each
against an oracle and none on durations:

* faults: every planned fault landed, and both kinds did;
* no failure: the driver never exits on its own (any exit but our SIGKILLs and the
  final clean stop fails the test at once, with its stderr); the producer has no
  delivery error;
* no loss at the broker: every record the broker acknowledged is in the topic;
* exactly once: the multiset of sequence numbers in the output (all epochs read back)
  equals the topic's (a record the broker holds twice, after a producer retry across a
  broker kill, is two records and two output rows);
* state: per key, the output rows ordered by count are counts 1..n with sums the running
  sums of their amounts, each amount is its record's; the final (count, sum) per key
  equals a pandas ``groupby`` over the topic's records;
* recovery: after every fault a later epoch commits, and one with no lag (the epoch read
  everything the topic had at its planning: ``live.lag_events`` all 0) commits before the
  next fault or the end of the producer;
* bounded storage: the objects and bytes under the job's prefix other than its published
  output (state, checkpoints, staging, control) and the DKV bytes alone: the most seen in
  the last third of the run is at most ``STORE_MARGIN`` times (plus ``STORE_SLACK``
  objects or ``BYTES_SLACK`` bytes) the most seen in the first third;
* flat driver memory: the driver's ``VmRSS`` (``/proc/<pid>/status``, sampled each
  second) in the last third at most ``RSS_MARGIN`` times (plus ``RSS_SLACK``) the most in
  the first third.

Not covered: a broker that loses acknowledged records (Tansu's ``memory://`` storage
does, on any restart; this soak needs ``s3://``), a broker down for longer than the
source's ``timeout_s`` (60 s here: the epoch fails with ``KafkaIOError`` and the driver
exits, to be restarted by its supervisor), Spark executors (``tests/cluster``).

CI runs 180 s (``.ci/run``). The hour-long run::

    DKVSTREAM_LIVE_SOAK_SECONDS=3600 bash platform/test.sh -q -s -m slow tests/reliability/test_live_soak.py

The same file has a fast test: bad records written into the live topic while a
continuous job runs go to the dead-letter table with topic partition and offset, and the
job loses nothing and does not stop.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dkvstream.operators.io.kafka import KafkaSource
from dkvstream.operators.io.kafka_broker import TansuBroker
from dkvstream.operators.runtime.checkpoints import read_checkpoint
from dkvstream.operators.runtime.driver import JobRunner
from dkvstream.storage.objectstore import ObjectNotFoundError, open_object_store
from tests.reliability import harness
from tests.reliability.live_soak_job import amount_of, live_soak_job

ROOT = harness.ROOT
KEYS = 500
PARTITIONS = 2
FAULT_EVERY_S = 30.0
# One record batch a second per partition: Tansu's s3:// storage keeps each batch as one
# object and its fetches slow down as a partition's objects grow (docs/kafka.md), so
# fewer, larger batches keep an hour's run at a few thousand objects per partition.
LINGER_MS = 1_000
STORE_MARGIN, STORE_SLACK, BYTES_SLACK = 1.5, 50, 512 << 10
RSS_MARGIN, RSS_SLACK = 1.25, 48 << 20
# Small memtables and WAL limit: each range's state goes through many flush and
# compaction cycles in a short run (with the defaults its WAL would grow for half an
# hour before the first flush, and a short run could not tell bounded from growing).
DKV = {"memtable_bytes": 64 << 10, "wal_flush_bytes": 64 << 10, "l0_compaction_trigger": 3,
       "target_file_bytes": 64 << 10}
RETAIN = 3
# How long the driver may take to read to the topic's end once the producer stopped (a
# hang fails the test with the driver's state; not an assertion on speed).
DRAIN_TIMEOUT_S = 300.0
READ_SLICE = 20_000  # offsets per read when the test reads the topic back


class DurableTansu(TansuBroker):
    """``TansuBroker`` with its log on S3 (``tansu broker --storage-engine s3://``), under
    its own cluster id in the bucket, so a restarted broker has every record it
    acknowledged. The S3 endpoint and credentials come from the environment (the
    ``s3_server`` fixture's; ``AWS_ALLOW_HTTP``: the test server speaks plain HTTP)."""

    def __init__(self, data_dir: Path, bucket: str, cluster_id: str) -> None:
        super().__init__(data_dir, stop_timeout_s=3.0)
        self.bucket, self.cluster_id = bucket, cluster_id

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--storage-engine") + 1] = f"s3://{self.bucket}/"
        return ["env", "AWS_ALLOW_HTTP=true", *cmd, "--cluster-id", self.cluster_id]

    def kill(self) -> bool:
        """SIGKILL the broker; True if it landed (it was running and died of it)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return False
        proc.kill()
        return proc.wait(timeout=30) == -signal.SIGKILL


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
        future.result(30)


def record(seq: int) -> dict:
    """``Producer.produce`` arguments of good record ``seq`` (its key picks the
    partition, so a key's records keep their order)."""
    return {"key": b"k%04d" % (seq % KEYS),
            "value": json.dumps({"seq": seq, "amount": int(amount_of(seq))}).encode()}


class SteadyProducer(threading.Thread):
    """Produces records 0, 1, ... at ``rate`` records/s (in ticks of 10 ms) until
    ``stop()``; keeps each acknowledged record's partition and offset. Idempotence off
    (Tansu accepts it but a restarted broker may not know the producer id), one request
    in flight per partition (records keep their order across retries), and no delivery
    timeout to speak of: records wait in the producer while the broker is down."""

    def __init__(self, bootstrap: str, topic: str, rate: float, capacity: int) -> None:
        super().__init__(daemon=True, name="live-soak-producer")
        self.topic, self.rate = topic, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS, "acks": "all",
                                  "enable.idempotence": False, "max.in.flight.requests.per.connection": 1,
                                  "message.timeout.ms": 600_000, "retries": 1_000_000,
                                  "queue.buffering.max.messages": 2_000_000})
        self.acked = np.full((capacity, 2), -1, np.int64)  # seq -> (partition, offset)
        self.errors: list[str] = []
        self.produced = 0
        self._halt = threading.Event()
        self.failure: BaseException | None = None

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(f"{err} ({msg.key()!r})")
            return
        seq = json.loads(msg.value())["seq"]
        self.acked[seq] = (msg.partition(), msg.offset())

    def run(self) -> None:
        try:
            started = time.monotonic()
            while not self._halt.is_set():
                due = min(int((time.monotonic() - started) * self.rate), len(self.acked))
                while self.produced < due:
                    self.producer.produce(self.topic, on_delivery=self._delivered, **record(self.produced))
                    self.produced += 1
                self.producer.poll(0)
                self._halt.wait(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failure = e

    def stop(self) -> None:
        """Stops producing and waits until every record produced is acknowledged."""
        self._halt.set()
        self.join()
        if self.failure is not None:
            raise self.failure
        left = self.producer.flush(120)
        assert left == 0, f"{left} records still unacknowledged 120 s after the producer stopped"


@dataclass
class Driver:
    """One driver process (``run_job --continuous``) and what it printed."""

    proc: subprocess.Popen
    incarnation: int
    stderr_path: Path
    lines: list[dict] = field(default_factory=list)
    reader: threading.Thread | None = None

    def stderr_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Fault:
    kind: str  # "driver" | "broker"
    at: float  # planned, s since the start
    landed_at: float | None = None
    landed: bool = False
    detail: str = ""


def vm_rss(pid: int) -> int | None:
    """The process's resident set, bytes (``VmRSS`` of ``/proc/<pid>/status``), or None
    if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def kept_objects(store, prefix: str) -> tuple[int, int, int]:
    """Objects and bytes under the job prefix other than the published output, and the
    bytes of its DKV state alone."""
    objects = size = dkv = 0
    for k in store.list(prefix + "/"):
        if "/sinks/" in k:
            continue
        try:
            n = store.size(k)
        except ObjectNotFoundError:  # deleted by retention since the listing
            continue
        objects, size = objects + 1, size + n
        if "/state/" in k:
            dkv += n
    return objects, size, dkv


def topic_records(bootstrap: str, topic: str) -> pd.DataFrame:
    """Every record of the topic: partition, offset, key, seq, amount (JSON values)."""
    source = KafkaSource(bootstrap, topic, value_format="bytes", bounded=True, timeout_s=60.0)
    rows = []
    try:
        for p, end in source.end_offsets().items():
            # In slices: each read has its own timeout (a slow broker is not a lost record).
            for start in range(source.start_offset(p), end, READ_SLICE):
                t = source.read(p, start, min(start + READ_SLICE, end))
                for off, key, value in zip(t.column("_offset").to_pylist(), t.column("key").to_pylist(),
                                           t.column("value").to_pylist()):
                    v = json.loads(value)
                    rows.append((p, off, key.decode(), v["seq"], v["amount"]))
    finally:
        source.close()
    return pd.DataFrame(rows, columns=["partition", "offset", "key", "seq", "amount"])


def check_running_totals(out: pd.DataFrame, records: pd.DataFrame) -> None:
    """``out`` (one row per event: key, seq, amount, count, sum) against the records:
    every record's seq exactly as often as in the records; per key, counts 1..n with the
    running sums of the amounts in count order; final totals equal pandas'."""
    got, want = collections.Counter(out["seq"].tolist()), collections.Counter(records["seq"].tolist())
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"output vs topic: {sum(missing.values())} records missing (e.g. seq {sorted(missing)[:10]}), "
        f"{sum(extra.values())} extra (e.g. seq {sorted(extra)[:10]})")
    assert (out["amount"].to_numpy() == amount_of(out["seq"].to_numpy())).all(), \
        "an output row's amount is not its record's"
    out = out.sort_values(["key", "count"], kind="stable").reset_index(drop=True)
    position = out.groupby("key").cumcount().to_numpy() + 1
    bad = np.flatnonzero(out["count"].to_numpy() != position)
    assert bad.size == 0, f"running counts are not 1..n per key: {out.iloc[bad[:5]].to_dict('records')}"
    running = out.groupby("key")["amount"].cumsum().to_numpy()
    bad = np.flatnonzero(out["sum"].to_numpy() != running)
    assert bad.size == 0, \
        f"running sums differ from the amounts' cumulative sums: {out.iloc[bad[:5]].to_dict('records')}"
    final = out.groupby("key").agg(count=("count", "max"), sum=("sum", "max")).sort_index()
    oracle = records.groupby("key").agg(count=("seq", "size"), sum=("amount", "sum")).sort_index()
    pd.testing.assert_frame_equal(final.astype("int64"), oracle.astype("int64"), obj="final totals per key")


@pytest.mark.slow("a live Kafka soak of DKVSTREAM_LIVE_SOAK_SECONDS (default 300 s)")
def test_live_soak_driver_and_broker_kills(s3_server, tmp_path) -> None:
    seconds = float(os.environ.get("DKVSTREAM_LIVE_SOAK_SECONDS", "300"))
    rate = float(os.environ.get("DKVSTREAM_LIVE_SOAK_RATE", "2000"))
    rng, seed = harness.rng("live_soak")
    print(f"live soak: {seconds:.0f} s at {rate:.0f} records/s, fault seed {seed} "
          f"(replay: DKVSTREAM_FAULT_SEED={seed})", flush=True)
    # The faults: one per FAULT_EVERY_S between 10 % and 85 % of the run, alternating.
    window = (0.10 * seconds, 0.85 * seconds)
    n = max(2, int((window[1] - window[0]) // FAULT_EVERY_S))
    slot = (window[1] - window[0]) / n
    kinds = ["driver", "broker"] if rng.random() < 0.5 else ["broker", "driver"]
    faults = [Fault(kinds[i % 2], round(window[0] + slot * (i + rng.uniform(0.2, 0.8)), 1)) for i in range(n)]
    print("planned faults: " + ", ".join(f"{f.kind} at {f.at} s" for f in faults), flush=True)

    topic = f"live-soak-{time.time_ns() % 10**9}"
    broker = DurableTansu(tmp_path / "tansu", s3_server.bucket, f"live-soak-{topic}").start()
    create_topic(broker.bootstrap, topic)
    store_uri = str(tmp_path / "store")
    store = open_object_store(store_uri)
    job = live_soak_job(broker.bootstrap, topic)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DKVSTREAM_LIVE_SOAK_BOOTSTRAP": broker.bootstrap,
           "DKVSTREAM_LIVE_SOAK_TOPIC": topic}
    drivers: list[Driver] = []
    commits: list[tuple[float, int, dict]] = []  # (s since start, incarnation, committed line)
    started = time.monotonic()

    def now() -> float:
        return time.monotonic() - started

    def start_driver() -> Driver:
        k = len(drivers)
        err = tmp_path / f"driver-{k}.stderr"
        proc = subprocess.Popen(
            [str(harness.PYTHON), "-m", "dkvstream.operators.tools.run_job",
             "--job", "tests.reliability.live_soak_job:job",
             "--store", store_uri, "--create-store", "--in-process", "--continuous", "--json",
             "--retain-checkpoints", str(RETAIN),
             *(arg for name, value in DKV.items() for arg in ("--dkv", f"{name}={value}"))],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=open(err, "wb"), text=True)  # noqa: SIM115
        d = Driver(proc, k, err)

        def read() -> None:
            for line in proc.stdout:
                rec = json.loads(line)
                d.lines.append(rec)
                if rec.get("event") == "committed":
                    commits.append((now(), k, rec))

        d.reader = threading.Thread(target=read, daemon=True, name=f"driver-{k}-stdout")
        d.reader.start()
        drivers.append(d)
        return d

    def check_alive(d: Driver) -> None:
        code = d.proc.poll()
        assert code is None, (f"driver {d.incarnation} exited with status {code} at {now():.1f} s "
                              f"(not killed by the test):\n{d.stderr_tail()}")

    producer = SteadyProducer(broker.bootstrap, topic, rate, int(rate * seconds * 1.1) + 10_000)
    rss: list[tuple[float, int]] = []
    stored: list[tuple[float, int, int, int]] = []
    driver = start_driver()
    producer.start()
    next_sample = next_store_sample = next_report = 0.0
    pending = list(faults)
    try:
        while (t := now()) < seconds:
            check_alive(driver)
            assert producer.is_alive(), f"producer thread ended: {producer.failure!r}"
            if pending and t >= pending[0].at:
                f = pending.pop(0)
                f.landed_at = round(t, 1)
                epochs = len([c for c in commits if c[1] == driver.incarnation])
                if f.kind == "driver":
                    check_alive(driver)  # a driver that died on its own is a failure, not a fault
                    driver.proc.send_signal(signal.SIGKILL)
                    f.landed = driver.proc.wait(timeout=30) == -signal.SIGKILL
                    delay = rng.uniform(0.0, 3.0)
                    f.detail = f"driver {driver.incarnation} after {epochs} epochs; restarted {delay:.1f} s later"
                    time.sleep(delay)
                    driver = start_driver()
                else:
                    f.landed = broker.kill()
                    down = rng.uniform(1.0, 5.0)
                    f.detail = f"broker down {down:.1f} s (driver {driver.incarnation} at {epochs} epochs)"
                    time.sleep(down)
                    broker.start()  # the same port; returns once it answers metadata requests
                print(f"{now():7.1f} s: fault {f.kind} landed={f.landed}: {f.detail}", flush=True)
                continue
            if t >= next_sample:
                r = vm_rss(driver.proc.pid)
                if r is not None and driver.proc.poll() is None:
                    rss.append((t, r))
                next_sample = t + 1.0
            if t >= next_store_sample:
                stored.append((t, *kept_objects(store, job.prefix)))
                next_store_sample = t + 5.0
            if t >= next_report:
                last = commits[-1][2] if commits else {}
                print(f"{t:7.1f} s: produced {producer.produced}, epochs {len(commits)} (last "
                      f"{last.get('epoch')}: {last.get('events')} events, lag "
                      f"{(last.get('live') or {}).get('lag_events')}), driver RSS "
                      f"{(rss[-1][1] >> 20) if rss else '?'} MiB, kept {stored[-1][1:] if stored else '?'}",
                      flush=True)
                next_report = t + 15.0
            time.sleep(0.2)
        produce_end = now()
        producer.stop()
        assert not producer.errors, f"{len(producer.errors)} delivery errors, e.g. {producer.errors[:5]}"
        # The job reads to the topic's end: the oracle is the topic as it now is.
        records = topic_records(broker.bootstrap, topic)
        ends = records.groupby("partition")["offset"].max().add(1).to_dict()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            check_alive(driver)
            if commits and commits[-1][1] == driver.incarnation:
                offsets = read_checkpoint(store, job.prefix, commits[-1][2]["epoch"]).source_offsets
                if all(offsets.get(p, 0) >= e for p, e in ends.items()):
                    break
            assert time.monotonic() < deadline, (
                f"the driver did not reach the topic's end {ends} within {DRAIN_TIMEOUT_S} s; "
                f"last commit {commits[-1] if commits else None}\n{driver.stderr_tail()}")
            time.sleep(0.5)
        driver.proc.send_signal(signal.SIGTERM)
        code = driver.proc.wait(timeout=120)
        driver.reader.join(timeout=30)
        assert code == 0, f"driver stopped with status {code}:\n{driver.stderr_tail()}"
        assert driver.lines[-1]["event"] == "stopped", driver.lines[-1]
        total = now()
    finally:
        with contextlib.suppress(Exception):
            producer._halt.set()
        for d in drivers:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        broker.stop()

    print(f"done in {total:.0f} s: {producer.produced} records, {len(records)} in the topic, "
          f"{len(commits)} epochs by {len(drivers)} drivers", flush=True)
    for f in faults:
        print(f"fault {f}", flush=True)
    kinds = collections.Counter(k[len(job.prefix) + 1:].split("/")[0] for k in store.list(job.prefix + "/"))
    print(f"objects under {job.prefix} at the end: {dict(kinds)}", flush=True)

    # Faults: each planned one landed; both kinds did.
    assert all(f.landed for f in faults), [f for f in faults if not f.landed]
    assert {f.kind for f in faults if f.landed} == {"driver", "broker"}, faults
    # Every driver but the last died of our SIGKILL (checked as it happened; here again).
    assert [d.proc.returncode for d in drivers[:-1]] == [-signal.SIGKILL] * (len(drivers) - 1)
    # The broker kept every record it acknowledged.
    acked = producer.acked[:producer.produced]
    assert (acked[:, 0] >= 0).all(), f"{int((acked[:, 0] < 0).sum())} records never acknowledged"
    in_topic = set(zip(records["partition"].str.rsplit("-", n=1).str[1].astype(int), records["offset"]))
    lost = [s for s, (p, o) in enumerate(acked.tolist()) if (p, o) not in in_topic]
    assert not lost, f"{len(lost)} acknowledged records not in the topic after broker restarts, e.g. seq {lost[:10]}"
    duplicates = len(records) - records["seq"].nunique()
    print(f"records held twice by the broker (producer retries across a kill): {duplicates}", flush=True)
    assert set(records["seq"]) == set(range(producer.produced)), "the topic holds a record never produced"

    # Exactly once, running totals, final totals.
    out = job.sinks["main"].read(store, job.prefix).to_pandas()
    check_running_totals(out, records)

    # Recovery: after each fault an epoch commits, and one without lag before the next
    # fault (or the end of the producer).
    times = [f.landed_at for f in faults] + [produce_end]
    for f, until in zip(faults, times[1:]):
        after = [(t, rec) for t, _, rec in commits if t > f.landed_at]
        assert after, f"no epoch committed after {f}"
        caught_up = [t for t, rec in after if t <= until and not any(rec["live"]["lag_events"].values())]
        assert caught_up, (f"no epoch without lag between {f} and {until:.1f} s: "
                           f"{[(round(t, 1), rec['live']['lag_events']) for t, rec in after[:20]]}")
        print(f"{f.kind} fault at {f.landed_at} s: first epoch after it at {after[0][0]:.1f} s, "
              f"lag back to 0 at {caught_up[0]:.1f} s", flush=True)
    rates = [rec["live"]["processing_rate"] for _, _, rec in commits if rec["live"].get("processing_rate")]
    print(f"processing rate per epoch: median {np.median(rates):.0f} events/s", flush=True)
    # The producer lets its client stamp records at send time and the job takes that
    # timestamp as event time: the runtime reports now minus it as event-time lag, which
    # here is the end-to-end latency.
    latency = [rec["live"]["event_time_lag_ms"]["p99"] for _, _, rec in commits
               if rec["live"].get("event_time_lag_ms")]
    print(f"end-to-end latency p99 per epoch: median {np.median(latency):.0f} ms, max {max(latency)} ms", flush=True)

    # Bounded storage and flat driver memory: first third against last third.
    first = [s for s in stored if s[0] < seconds / 3]
    last = [s for s in stored if s[0] >= 2 * seconds / 3]
    for i, (what, slack) in enumerate((("objects", STORE_SLACK), ("bytes", BYTES_SLACK),
                                       ("DKV bytes", BYTES_SLACK)), start=1):
        a, b = max(s[i] for s in first), max(s[i] for s in last)
        print(f"kept {what}: first third max {a}, last third max {b}", flush=True)
        assert b <= STORE_MARGIN * a + slack, f"kept {what} grew: first third max {a}, last third max {b}"
    a = max(r for t, r in rss if t < seconds / 3)
    b = max(r for t, r in rss if t >= 2 * seconds / 3)
    print(f"driver RSS: first third max {a >> 20} MiB, last third max {b >> 20} MiB", flush=True)
    assert b <= RSS_MARGIN * a + RSS_SLACK, f"driver RSS grew: first third max {a >> 20} MiB, last {b >> 20} MiB"


# A timestamp in the year 2200 (2200-01-01T00:00:00Z, ms).
YEAR_2200_MS = 7_258_118_400_000


def test_bad_records_on_live_input_go_to_dead_letters_and_the_job_keeps_running(kafka_broker, tmp_path) -> None:
    """While a continuous job runs, good records, then bad ones mixed with good ones, then
    good ones again are written to its topic: every bad record is a dead letter with its
    topic partition and offset and reason, every good record is in the output exactly
    once with the right running totals, and the run never stopped (records written after
    the bad ones were processed by the same run)."""
    topic = f"live-bad-{time.time_ns() % 10**9}"
    create_topic(kafka_broker.bootstrap, topic)
    job = live_soak_job(kafka_broker.bootstrap, topic, name="live_bad_records", trigger_interval_ms=100)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    results, failure = [], []

    def run() -> None:
        try:
            results.extend(runner.epochs(continuous=True))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True, name="live-bad-records-driver")
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5})
    acked: dict[str, tuple[str, int]] = {}  # label -> (partition, offset)

    def produce(label: str, **kw) -> None:
        def report(err, msg) -> None:
            assert err is None, err
            acked[label] = (f"{msg.topic()}-{msg.partition()}", msg.offset())
        producer.produce(topic, on_delivery=report, **kw)

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert not failure, failure
            assert thread.is_alive(), f"the continuous run ended while waiting for {what}"
            assert time.monotonic() < deadline, f"not within 60 s: {what}"
            time.sleep(0.05)

    def read_to_end() -> None:
        ends: dict[str, int] = {}
        for p, o in acked.values():
            ends[p] = max(ends.get(p, 0), o + 1)

        def done() -> bool:
            return bool(results) and all(results[-1].source_offsets.get(p, 0) >= e for p, e in ends.items())
        wait_for(done, f"the job reading to {ends}")

    good = list(range(200))
    thread.start()
    for s in good:
        produce(f"good {s}", **record(s))
    assert producer.flush(30) == 0
    read_to_end()
    epochs_before = len(results)
    bad = {  # label -> (produce arguments, reason)
        "not json": ({"key": b"k0001", "value": b"{oops", "partition": 0}, "unparseable_value"),
        "seq a string": ({"key": b"k0002", "value": b'{"seq": "x", "amount": 1}', "partition": 1},
                         "unparseable_value"),
        "amount a float": ({"key": b"k0003", "value": b'{"seq": 1000001, "amount": 6.5}', "partition": 0},
                           "unparseable_value"),
        "null key": ({"key": None, "value": b'{"seq": 1000002, "amount": 2}', "partition": 1}, "missing_key"),
        "year 2200": ({"key": b"k0004", "value": b'{"seq": 1000003, "amount": 3}', "partition": 0,
                       "timestamp": YEAR_2200_MS}, "timestamp_in_future"),
    }
    more = list(range(200, 400))
    for i, s in enumerate(more):
        produce(f"good {s}", **record(s))
        if i % 40 == 20:  # the bad records among good ones, in both partitions
            label = list(bad)[i // 40]
            produce(label, **bad[label][0])
    assert producer.flush(30) == 0
    read_to_end()
    last = list(range(400, 600))  # after the bad records: the same run reads them
    for s in last:
        produce(f"good {s}", **record(s))
    assert producer.flush(30) == 0
    read_to_end()
    assert thread.is_alive() and not failure, failure
    runner.stop()
    thread.join(30)
    assert not thread.is_alive() and not failure, failure
    assert len(results) > epochs_before

    dead = job.dead_letter.sink.read(runner.store, job.prefix).to_pylist()
    assert sorted((d["partition"], d["offset"], d["reason"]) for d in dead) == sorted(
        (*acked[label], reason) for label, (_, reason) in bad.items())
    assert all(d["source"] == f"kafka:{topic}" for d in dead)
    by_offset = {(d["partition"], d["offset"]): d for d in dead}
    assert by_offset[acked["not json"]]["value"] == b"{oops"
    assert "'seq'" in by_offset[acked["seq a string"]]["error"]
    seqs = good + more + last
    records = pd.DataFrame({"key": [record(s)["key"].decode() for s in seqs], "seq": seqs,
                            "amount": [int(amount_of(s)) for s in seqs]})
    check_running_totals(job.sinks["main"].read(runner.store, job.prefix).to_pandas(), records)
    runner.close()
