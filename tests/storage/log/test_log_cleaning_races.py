"""Reads racing a cleaning, interleaved deterministically: the cleaning commits (and
deletes the files it replaced) right after the read took its metadata version. The read
must then retry on the new version and return what the compacted topic holds (a dict
oracle of the latest record per key)."""
from __future__ import annotations

import pytest

from dkvstream.storage.log import COMPACT, Log, TopicConfig
from dkvstream.storage.objectstore.local import LocalObjectStore

NOW = 1_000_000  # ms; every record is older, so the whole topic is cleanable


class CleanAfterMetadataRead(Log):
    """A ``Log`` whose next ``metadata()`` call, once armed, returns the version it read
    and then runs a full cleaning before the caller uses that version."""

    armed = False
    report = None

    def metadata(self):
        md = super().metadata()
        if self.armed:
            self.armed = False  # the cleaner's own metadata reads must not re-enter
            self.report = self.clean(force=True, clock=lambda: NOW)
        return md


@pytest.fixture
def racing_log(tmp_path) -> tuple[CleanAfterMetadataRead, dict[int, dict[bytes, tuple]]]:
    """A compacted topic ``c`` of 2 partitions, 4 files of overwrites; returns the log and
    per partition ``{key: (offset, timestamp, value)}`` of the latest records."""
    log = CleanAfterMetadataRead(LocalObjectStore(tmp_path))
    log.create_topic("c", TopicConfig(partitions=2, cleanup_policy=COMPACT, min_compaction_lag_ms=0,
                                      min_cleanable_dirty_ratio=0.0))
    prod = log.producer(clock=lambda: NOW)
    latest: dict[int, dict[bytes, tuple]] = {0: {}, 1: {}}
    ts = 1_000
    for f in range(4):
        sent = []
        for i in range(30):
            part, key, value = i % 2, b"k%d" % (i % 12), b"v%d-%d" % (f, i)
            prod.send("c", key, value, partition=part, timestamp=ts)
            sent.append((part, key, ts, value))
            ts += 10
        first = {p: lo for (_, p), (lo, _) in prod.flush().items()}
        for part, key, t, value in sent:  # offsets are assigned in send order per partition
            latest[part][key] = (first[part], t, value)
            first[part] += 1
    return log, latest


def _compacted(latest: dict[bytes, tuple]) -> list[tuple]:
    """The oracle's records of one partition as ``(offset, timestamp, key, value)``."""
    return sorted((off, t, key, value) for key, (off, t, value) in latest.items())


def _assert_cleaning_ran_between(log: CleanAfterMetadataRead) -> None:
    assert not log.armed, "the read never took a metadata version"
    assert log.report is not None and log.report.files_deleted, "the cleaning replaced no file"


def test_poll_retries_when_a_cleaning_deletes_its_files(racing_log) -> None:
    log, latest = racing_log
    consumer = log.consumer()
    consumer.assign("c")
    first = consumer.poll(max_records=4)  # partition 0 part-way, before any cleaning
    assert [(p, r.offset) for _, p, r in first] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    log.armed = True
    got = consumer.poll(max_records=1_000)
    _assert_cleaning_ran_between(log)
    expected = [(p, *rec) for p in (0, 1) for rec in _compacted(latest[p]) if p == 1 or rec[0] >= 4]
    assert [(p, r.offset, r.timestamp, r.key, r.value) for _, p, r in got] == expected
    assert consumer.positions == {("c", p): n for p, n in enumerate(log.end_offsets("c"))}
    assert consumer.poll() == []


def test_offsets_for_times_retries_when_a_cleaning_deletes_its_files(racing_log) -> None:
    log, latest = racing_log
    # A target between two records of partition 0 and the very first one of partition 1.
    targets = {0: 1_305, 1: 0}
    log.armed = True
    got = log.offsets_for_times("c", targets)
    _assert_cleaning_ran_between(log)
    expected = {p: next(((off, t) for off, t, _, _ in _compacted(latest[p]) if t >= target), None)
                for p, target in targets.items()}
    assert got == expected
