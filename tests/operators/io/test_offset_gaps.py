"""Sources whose offsets have gaps (Kafka transaction markers, compacted topics) name
each row's offset in an ``_offset`` column (``dkvstream.operators.io.sources.check_slice``).

Oracles: the keyed-count pandas computation over the rows that exist; the checkpoint's
offsets; for refusals, the error naming source, partition and offsets.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dkvstream.examples.keyed_count import keyed_count_job, keyed_count_oracle
from dkvstream.examples.synthetic import SyntheticSource
from dkvstream.operators.api.columns import INGEST_TIME_COLUMN, OFFSET_COLUMN
from dkvstream.operators.io.sources import check_slice
from dkvstream.operators.runtime.driver import JobRunner


class GappySource(SyntheticSource):
    """``SyntheticSource`` with every third offset missing (as compaction leaves a topic)."""

    def full_partition(self, partition: str) -> pa.Table:
        t = super().full_partition(partition)
        return t.filter(pa.array(np.arange(t.num_rows) % 3 != 2))

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        full = SyntheticSource.full_partition(self, partition)
        offsets = np.arange(start, end, dtype=np.int64)
        keep = offsets % 3 != 2
        t = full.slice(start, end - start).filter(pa.array(keep))
        return (t.append_column(OFFSET_COLUMN, pa.array(offsets[keep]))
                 .append_column(INGEST_TIME_COLUMN, pa.array(np.zeros(int(keep.sum()), np.int64))))


def test_gappy_source_counts_each_existing_row_once(tmp_path) -> None:
    job = keyed_count_job(300, 7, events_per_epoch=100)
    job.source = GappySource(300, 7, step_ms=1)
    runner = JobRunner(job, None, str(tmp_path / "store"))
    results = runner.run()
    assert results[-1].finished and results[-1].source_offsets == {"p0": 300, "p1": 300}
    got = job.sinks["main"].read(runner.store, job.prefix).to_pandas()
    got = got.sort_values(["key", "window_start"]).reset_index(drop=True)
    want = keyed_count_oracle(job.source).sort_values(["key", "window_start"]).reset_index(drop=True)
    assert got[want.columns].equals(want)
    assert sum(r.events for r in results) == 2 * 200


@pytest.mark.parametrize("offsets, message", [
    ([3, 3], "not strictly increasing at row 1"),
    ([2, 4], "outside the slice read"),
    ([3, None], "has nulls"),
])
def test_bad_offset_column_is_refused(offsets, message) -> None:
    source = SyntheticSource(10, 2, partitions=1)
    t = source.read("p0", 3, 5).append_column(OFFSET_COLUMN, pa.array(offsets, pa.int64()))
    with pytest.raises(ValueError, match=f"source synthetic partition p0 offsets \\[3, 5\\).*{message}"):
        check_slice(source, "p0", 3, 5, t)


def test_fewer_rows_without_offset_column_is_refused() -> None:
    source = SyntheticSource(10, 2, partitions=1)
    with pytest.raises(ValueError, match="1 rows for 2 offsets.*_offset"):
        check_slice(source, "p0", 3, 5, source.read("p0", 3, 4))
