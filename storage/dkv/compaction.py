"""Compaction: picking (a pure planner) and merging (reads tables, writes new ones).

Shape of the tree: L0 holds flushed tables whose key ranges may overlap; L1 ..
L(num_levels-1) are sorted runs. ``plan_compaction`` picks at most one plan, with no I/O:

1. Size amplification (checked first, RocksDB universal style): let ``last`` be the deepest
   non-empty level >= 1. If ``bytes(levels above last) / bytes(last) > size_amp_threshold``
   the plan merges *every* table into ``last`` ("full" compaction). Levels above the last
   mostly hold newer versions of (or tombstones for) keys below, so this ratio over-estimates
   the redundant fraction when upper levels hold new keys; it is cheap and errs towards
   rewriting, which also keeps scans over few sorted runs.
2. Otherwise each level gets a score: L0 ``len(L0) / l0_compaction_trigger``; Ln for
   ``1 <= n < num_levels - 1`` ``bytes(Ln) / (level_base_bytes * level_multiplier**(n-1))``.
   L0 fires at a score of 1 (count reached), Ln above 1 (size exceeded); the highest
   firing score wins (ties: the shallower level):
   * L0: all L0 tables plus the L1 tables overlapping their key span, into L1;
   * Ln: one table of Ln, the one with the least overlapping bytes in L(n+1) per byte of
     its own (RocksDB ``kMinOverlappingRatio``), plus those overlapping tables, into L(n+1).

Tombstones (and shadowed versions, which the merge always drops) may only be dropped when
no table outside the inputs in a deeper level overlaps the inputs' key span: otherwise an
older version below would resurface. ``drop_tombstones`` records that decision.

A compaction filter (``expiry.py``), when the instance has one, is applied to each merged
range: expired entries are dropped, or turned into tombstones when tombstones must stay.

Compaction never changes an existing file. Its result names its inputs and outputs;
``LevelList.with_compaction`` installs it only if every input is still live, so a result
computed elsewhere (``remote_compaction.py``) can be installed later or discarded safely.
"""

from __future__ import annotations

from dataclasses import dataclass

from dkvstream.storage.dkv.expiry import ExpiryFilter
from dkvstream.storage.dkv.levels import LevelList
from dkvstream.storage.dkv.merge import ColumnBatch, merge_spans_columns
from dkvstream.storage.dkv.options import DKVOptions
from dkvstream.storage.dkv.read import table_bounds
from dkvstream.storage.dkv.sstable import TableInfo
from dkvstream.storage.dkv.tablestore import TableStore

# The merge reads the inputs one key range at a time, a range spanning about this many
# data blocks of all inputs together (~4 KiB raw each: ~16 MiB of decompressed blocks,
# plus the range's merged columns, in memory at most), and merges each range in one call.
MERGE_RANGE_BLOCKS = 4096


@dataclass(frozen=True)
class CompactionPlan:
    """What to merge: ``inputs`` (newest first) into ``output_level``.

    Attributes:
        inputs: Input tables, newest data first (shallower levels first, L0 newest first).
        output_level: Level receiving the outputs (>= 1).
        drop_tombstones: Whether the merge may drop tombstones (see module docstring).
        input_levels: Level of each input, parallel to ``inputs``.
        reason: ``"l0"``, ``"level"``, ``"size_amp"`` or ``"full"`` (for stats and dumps).
        deeper: Keys of tables outside the inputs, in levels below ``output_level``, that
            overlap the inputs' key span when the plan was made. A result computed
            remotely may be installed only if no *other* such table appeared since.
    """

    inputs: tuple[TableInfo, ...]
    output_level: int
    drop_tombstones: bool
    input_levels: tuple[int, ...] = ()
    reason: str = "l0"
    deeper: tuple[str, ...] = ()

    @property
    def input_bytes(self) -> int:
        """Bytes of the input tables on the bucket."""
        return sum(t.size for t in self.inputs)


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did: the input table keys it replaces and the tables it wrote."""

    inputs: tuple[str, ...]
    output_level: int
    outputs: tuple[TableInfo, ...]


def level_target_bytes(n: int, options: DKVOptions) -> int:
    """Target size of sorted-run level ``n`` (1 <= n < num_levels - 1)."""
    return options.level_base_bytes * options.level_multiplier ** (n - 1)


def _span(tables: tuple[TableInfo, ...] | list[TableInfo]) -> tuple[bytes, bytes]:
    return min(t.min_key for t in tables), max(t.max_key for t in tables)


def _overlapping(run: tuple[TableInfo, ...], lo: bytes, hi: bytes) -> list[TableInfo]:
    return [t for t in run if t.max_key >= lo and t.min_key <= hi]


def _finish(
    levels: LevelList, picked: list[tuple[int, TableInfo]], output_level: int, reason: str
) -> CompactionPlan:
    inputs = tuple(t for _, t in picked)
    lo, hi = _span(inputs)
    deeper = tuple(
        t.key
        for i in range(output_level + 1, len(levels.levels))
        for t in _overlapping(levels.levels[i], lo, hi)
    )
    return CompactionPlan(
        inputs=inputs, output_level=output_level, drop_tombstones=not deeper,
        input_levels=tuple(i for i, _ in picked), reason=reason, deeper=deeper,
    )


def last_level(levels: LevelList) -> int:
    """Deepest non-empty level >= 1, or 0 if only L0 (or nothing) holds tables."""
    for i in range(len(levels.levels) - 1, 0, -1):
        if levels.levels[i]:
            return i
    return 0


def plan_full(levels: LevelList, reason: str = "full") -> CompactionPlan | None:
    """Plans merging every table into the last non-empty level (L1 if only L0 has tables).

    Returns:
        The plan, or None if there are no tables.
    """
    picked = [(i, t) for i, lvl in enumerate(levels.levels) for t in lvl]
    if not picked:
        return None
    return _finish(levels, picked, max(1, last_level(levels)), reason)


def size_amplification(levels: LevelList) -> float:
    """The estimate of the module docstring; 0.0 when there is no level below L0."""
    last = last_level(levels)
    if last == 0:
        return 0.0
    below = sum(t.size for t in levels.levels[last])
    above = sum(t.size for lvl in levels.levels[:last] for t in lvl)
    return above / below if below else float("inf")


def plan_compaction(levels: LevelList, options: DKVOptions) -> CompactionPlan | None:
    """Decides whether and what to compact. Pure: no I/O.

    Args:
        levels: The current level list.
        options: Triggers and level sizes (see the module docstring).

    Returns:
        A plan, or None if no trigger fires.
    """
    if size_amplification(levels) > options.size_amp_threshold:
        return plan_full(levels, "size_amp")
    nlev = len(levels.levels)
    best, best_score = -1, 0.0
    l0_score = len(levels.l0) / options.l0_compaction_trigger
    if l0_score >= 1.0:  # the count trigger fires AT the threshold
        best, best_score = 0, l0_score
    for n in range(1, min(nlev, options.num_levels - 1)):
        score = sum(t.size for t in levels.levels[n]) / level_target_bytes(n, options)
        if score > 1.0 and score > best_score:  # a size trigger fires ABOVE the target
            best, best_score = n, score
    if best < 0:
        return None
    if best == 0:
        lo, hi = _span(levels.l0)
        picked = [(0, t) for t in levels.l0]
        picked += [(1, t) for t in _overlapping(levels.level(1), lo, hi)]
        return _finish(levels, picked, 1, "l0")
    nxt = levels.level(best + 1)

    def overlap_ratio(t: TableInfo) -> tuple[float, bytes]:
        over = sum(o.size for o in _overlapping(nxt, t.min_key, t.max_key))
        return over / max(1, t.size), t.min_key

    t = min(levels.levels[best], key=overlap_ratio)
    picked = [(best, t)] + [(best + 1, o) for o in _overlapping(nxt, t.min_key, t.max_key)]
    return _finish(levels, picked, best + 1, "level")


def run_compaction(plan: CompactionPlan, tables: TableStore, target_bytes: int,
                   compaction_filter: ExpiryFilter | None = None) -> CompactionResult:
    """Executes ``plan``: merges its inputs and writes the output run.

    The inputs are merged one key range at a time (``MERGE_RANGE_BLOCKS``): each input's
    blocks of the range are read (decompressed, through the block cache) and merged in
    one C call that reads them in place and returns the newest version of each key as
    columns (``merge.merge_spans_columns``; without the C module, its pure-Python
    reference), tombstones dropped if the plan allows, then expired entries dropped (or
    made tombstones) by ``compaction_filter``. The columns go to the C block encoder
    (``TableStore.write_run_chunks``), which splits the run into tables.

    Args:
        plan: From ``plan_compaction`` (or ``plan_full``).
        tables: Reads inputs (clipped tables yield only their visible keys), writes outputs.
        target_bytes: Split size of output tables (uncompressed bytes).
        compaction_filter: The filter of the manifest the plan was made from (its clocks
            at that checkpoint), or None.

    Returns:
        The result to install with ``LevelList.with_compaction``.

    Raises:
        CorruptionError: An input block fails its checksum or is malformed (naming the
            table, block and offset).
    """
    chunks = (_merge_range(tables, plan.inputs, lo, hi, plan.drop_tombstones)
              for lo, hi in _merge_ranges(tables, plan.inputs))
    if compaction_filter is not None:
        chunks = (compaction_filter.apply(c, plan.drop_tombstones) for c in chunks)
    # The merge returns each range's keys strictly ascending (it checks its inputs' order).
    outputs = tables.write_run_chunks(chunks, target_bytes, sorted_unique=True)
    return CompactionResult(
        inputs=tuple(t.key for t in plan.inputs),
        output_level=plan.output_level,
        outputs=tuple(outputs),
    )


def _merge_ranges(tables: TableStore, inputs: tuple[TableInfo, ...]) -> list[tuple[bytes, bytes | None]]:
    """Splits the key space into ranges ``[lo, hi)`` of about ``MERGE_RANGE_BLOCKS``
    data blocks of all inputs together, at block first keys (no I/O: sparse indexes)."""
    firsts = sorted(row[0] for t in inputs for row in tables.reader(t).block_index)
    cuts = sorted(set(firsts[MERGE_RANGE_BLOCKS::MERGE_RANGE_BLOCKS]))
    return list(zip([b"", *cuts], [*cuts, None]))


def _merge_range(
    tables: TableStore, inputs: tuple[TableInfo, ...], lo: bytes, hi: bytes | None, drop_tombstones: bool
) -> ColumnBatch:
    """The newest entry per key with ``lo <= key < hi`` of all ``inputs`` as parallel
    lists, ascending (see ``run_compaction``)."""
    readers = []
    spans = []
    for t in inputs:
        bounds = table_bounds(t, lo, hi)  # a clipped table: only its visible keys
        if bounds is None:
            continue
        s, e = bounds
        r = tables.reader(t)
        span = r.read_span(s, e, r.num_blocks)
        if span[0]:
            readers.append(r)
            spans.append(span)
    try:
        return merge_spans_columns([], spans, drop_tombstones)
    except ValueError:
        for r, (_raws, _counts, s, e) in zip(readers, spans):
            r.check_blocks(r.block_span(s, e))  # raises CorruptionError naming the block
        raise
