"""Replays of failures found by the long run of ``test_dkv_ranges_model.py`` (shrunk step
sequences, run deterministically in the normal suite)."""

from __future__ import annotations

from tests.storage.dkv.test_dkv_ranges_model import RangesMachine


def replay(steps: list[tuple[str, dict]]) -> None:
    m = RangesMachine()
    try:
        m.ranges_tile_the_key_space()
        for name, kwargs in steps:
            getattr(m, name)(**kwargs)
            m.ranges_tile_the_key_space()
    finally:
        m.teardown()


def test_merge_of_parents_sharing_a_table_partly_compacted_away() -> None:
    """r005 [0,82) and r007 [82,116) share one r000 table, clipped to [, k082) and
    [k095, k116): r007's part [k082, k095) came from r006, which had compacted that part
    of the table away. The join used to raise "shared by non-adjacent parents"; it must
    not join the clips either (k084..k094 in the file are stale)."""
    replay([
        ("put_many", dict(i=0, k=0, n=1, v=b"")),
        ("compact_all", dict(i=0)),
        ("flush", dict(i=0)),
        ("remote_compact", dict(full=False, i=0)),
        ("remote_compact", dict(full=False, i=0)),
        ("compact_all", dict(i=0)),
        ("put_many", dict(i=3, k=0, n=21, v=b'\xbd|\xb0\xaehgn\x92\xea"\xce\xdf\xbb\xe3\xdb"'
                                            b"\x99:\xa8XI\x0f\xb9\x9c\x7f")),
        ("remote_compact", dict(full=False, i=3)),
        ("compact_all", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("remote_compact", dict(full=True, i=2)),
        ("install", dict(i=5)),
        ("delete_some", dict(i=0, k=1, n=1)),
        ("delete_some", dict(i=5, k=100, n=3)),
        ("install", dict(i=4)),
        ("install", dict(i=2)),
        ("compact_all", dict(i=7)),
        ("flush", dict(i=4)),
        ("put_many", dict(i=6, k=102, n=34, v=b"")),
        ("remote_compact", dict(full=True, i=3)),
        ("read", dict(i=3, k=99)),
        ("install", dict(i=3)),
        ("put_many", dict(i=1, k=36, n=9, v=b"f")),
        ("put_many", dict(i=4, k=41, n=8, v=b":")),
        ("remote_compact", dict(full=True, i=0)),
        ("restart_from_latest", dict(i=3)),
        ("install", dict(i=5)),
        ("install", dict(i=5)),
        ("remote_compact", dict(full=False, i=7)),
        ("flush", dict(i=1)),
        ("install", dict(i=7)),
        ("put_many", dict(i=2, k=26, n=7, v=b"\x06\x86\xebz")),
        ("read", dict(i=5, k=118)),
        ("read", dict(i=0, k=91)),
        ("retention_and_gc", dict(in_progress=False, keep=2)),
        ("split", dict(at=95, i=6)),
        ("restart_from_latest", dict(i=3)),
        ("delete_some", dict(i=2, k=91, n=2)),
        ("put_many", dict(i=5, k=112, n=7, v=b"\xc9\xa0~\xef\xea\xee\xda\xbdm\xe2a:\x1d")),
        ("flush", dict(i=1)),
        ("read", dict(i=4, k=86)),
        ("flush", dict(i=5)),
        ("retention_and_gc", dict(in_progress=False, keep=1)),
        ("flush", dict(i=3)),
        ("split", dict(at=116, i=3)),
        ("split", dict(at=82, i=0)),
        ("install", dict(i=7)),
        ("flush", dict(i=2)),
        ("merge", dict(i=1)),
        ("split", dict(at=68, i=4)),
        ("delete_some", dict(i=2, k=32, n=4)),
        ("merge", dict(i=4)),
    ])


def test_installed_outputs_compacted_away_later_are_collected() -> None:
    """An installed remote compaction's result object was collected while its outputs were
    still named; once compacted away they looked like an in-progress directory and leaked
    (and a later GC check found outputs without their result object)."""
    replay([
        ("read", dict(i=0, k=100)),
        ("put_many", dict(i=0, k=21, n=34, v=b"K#")),
        ("flush", dict(i=0)),
        ("put_many", dict(i=0, k=85, n=19, v=b"eg\xfa]\x9c")),
        ("install", dict(i=0)),
        ("split", dict(at=3, i=0)),
        ("compact_all", dict(i=0)),
        ("put_many", dict(i=0, k=75, n=11, v=b"\xe32\x16")),
        ("install", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("read", dict(i=0, k=0)),
        ("install", dict(i=0)),
        ("flush", dict(i=0)),
        ("put_many", dict(i=3, k=79, n=21, v=b'\xbd|\xb0\xaehgn\x92\xea"\xce\xdf\xbb\xe3\xdb"'
                                             b"\x99:\xa8XI\x0f\xb9\x9c\x7f")),
        ("remote_compact", dict(full=False, i=0)),
        ("split", dict(at=100, i=3)),
        ("compact_all", dict(i=0)),
        ("retention_and_gc", dict(in_progress=True, keep=1)),
        ("split", dict(at=89, i=4)),
        ("put_many", dict(i=0, k=119, n=22, v=b"K#")),
        ("restart_from_latest", dict(i=0)),
        ("compact_all", dict(i=0)),
        ("merge", dict(i=0)),
        ("remote_compact", dict(full=True, i=2)),
        ("install", dict(i=5)),
        ("read", dict(i=0, k=117)),
        ("retention_and_gc", dict(in_progress=False, keep=1)),
        ("merge", dict(i=0)),
        ("compact_all", dict(i=7)),
        ("delete_some", dict(i=4, k=0, n=1)),
        ("put_many", dict(i=0, k=0, n=1, v=b"")),
        ("retention_and_gc", dict(in_progress=False, keep=1)),
    ])
