"""Compaction: picking (a pure planner) and merging (reads tables, writes new ones).

This version has one policy: when L0 holds at least ``l0_compaction_trigger`` tables,
merge all of L0 plus all of L1 into a new L1 sorted run, split at ~``target_file_bytes``.
L1 is the last level, so the merge drops tombstones and shadowed versions.

Compaction never changes an existing file. Its result names its inputs and outputs;
``LevelList.with_compaction`` installs it only if every input is still live, so a result
computed elsewhere (e.g. a Dagster op) can be installed later or discarded safely.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.dkv.levels import LevelList
from storage.dkv.merge import merge_newest
from storage.dkv.options import DKVOptions
from storage.dkv.sstable import TableInfo
from storage.dkv.tablestore import TableStore


@dataclass(frozen=True)
class CompactionPlan:
    """What to merge: ``inputs`` (newest first) into ``output_level``."""

    inputs: tuple[TableInfo, ...]
    output_level: int
    drop_tombstones: bool


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did: the input table keys it replaces and the tables it wrote."""

    inputs: tuple[str, ...]
    output_level: int
    outputs: tuple[TableInfo, ...]


def plan_compaction(levels: LevelList, options: DKVOptions) -> CompactionPlan | None:
    """Decides whether to compact. Pure: no I/O.

    Args:
        levels: The current level list.
        options: Supplies ``l0_compaction_trigger``.

    Returns:
        A plan merging all L0 and L1 tables into L1, or None if L0 is below the trigger.
    """
    if len(levels.l0) < options.l0_compaction_trigger:
        return None
    deeper = any(levels.level(i) for i in range(2, len(levels.levels)))
    return CompactionPlan(
        inputs=(*levels.l0, *levels.level(1)),
        output_level=1,
        # Tombstones may only be dropped where nothing older can resurface beneath them.
        drop_tombstones=not deeper,
    )


def run_compaction(plan: CompactionPlan, tables: TableStore, target_bytes: int) -> CompactionResult:
    """Executes ``plan``: merges its inputs and writes the output run.

    Args:
        plan: From ``plan_compaction``.
        tables: Reads inputs, writes outputs.
        target_bytes: Split size of output tables (uncompressed bytes).

    Returns:
        The result to install with ``LevelList.with_compaction``.
    """
    sources = [tables.reader(t).iter_from(b"") for t in plan.inputs]
    merged = merge_newest(sources)
    if plan.drop_tombstones:
        merged = (e for e in merged if e[2] is not None)
    outputs = tables.write_run(merged, target_bytes)
    return CompactionResult(
        inputs=tuple(t.key for t in plan.inputs),
        output_level=plan.output_level,
        outputs=tuple(outputs),
    )
