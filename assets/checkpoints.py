"""The job's state checkpoint asset: materialization metadata and the verification check.

Every committed epoch is one materialization of ``<job>_checkpoint``. Its numeric
metadata (epoch, events/s, keys, per-level table counts and bytes, size amplification,
lag, latency, rates, progress) is what the Dagster UI plots over time (one point per
epoch, in the asset's Plots tab), and what the compaction sensor reads. Each key is
present in every epoch it can be measured in and names its unit (``_s``, ``_ms``,
``_bytes``, ``_events_per_s``, ``_percent``).

The check ``verified`` (``checkpoint_check_spec``, ``checkpoint_check_result``) is part
of the asset that runs the epochs (``dkvstream.assets.job_assets``): it runs at the end of every
run, and alone when executed from the UI.
"""

import math
from dataclasses import dataclass

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue

from dkvstream.operators.api.job import Job
from dkvstream.operators.api.operator import WATERMARK_MAX
from dkvstream.operators.paths import checkpoint_key
from dkvstream.operators.runtime.checkpoints import JobCheckpoint, latest_checkpoint, list_epochs
from dkvstream.operators.runtime.driver import EpochResult
from dkvstream.operators.runtime.progress import Progress, format_watermark
from dkvstream.operators.runtime.recovery import check_checkpoint
from dkvstream.storage.dkv.compaction import size_amplification
from dkvstream.storage.dkv.manifest import load_manifest
from dkvstream.storage.dkv.verify import VerifyReport, verify_manifest
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.objectstore import ObjectStore

# Metadata keys the compaction sensor reads.
L0_TABLES_MAX = "l0_tables_max_range"
SIZE_AMP_MAX = "size_amplification_max_range"
# Numeric metadata keys of an epoch's live metrics (``live_metadata``), plotted per epoch.
LIVE_METRICS = ("input_events_per_s", "read_events_per_s", "processing_events_per_s", "lag_events", "lag_ms_max",
                "latency_p50_ms", "latency_p99_ms", "latency_max_ms", "watermark_delay_ms")
# Name of the checkpoint's asset check.
VERIFIED = "verified"


def checkpoint_asset_key(job: Job) -> AssetKey:
    """Key of the job's state checkpoint asset."""
    return AssetKey(f"{job.name}_checkpoint")


@dataclass
class LevelStats:
    """DKV shape of one checkpoint over all ranges of all operators.

    Attributes:
        tables_per_level / bytes_per_level: tables and bytes (on the bucket) per level.
        l0_tables_max: the most level-0 tables of any one range (compaction is per range).
        size_amplification_max: the highest size amplification of any range
            (``dkvstream.storage.dkv.compaction.size_amplification``).
        ranges: range manifests read.
    """

    tables_per_level: list[int]
    bytes_per_level: list[int]
    l0_tables_max: int
    size_amplification_max: float
    ranges: int


def level_stats(store: ObjectStore, ckpt: JobCheckpoint) -> LevelStats:
    """Reads every range manifest of ``ckpt`` (one GET each) and sums its levels.

    Raises:
        ObjectNotFoundError / CorruptionError: a range manifest is missing or broken.
    """
    tables: list[int] = []
    sizes: list[int] = []
    l0_max, amp_max, ranges = 0, 0.0, 0
    for op_ranges in ckpt.operators.values():
        for manifest_key in op_ranges.values():
            levels = load_manifest(store, manifest_key).levels
            ranges += 1
            for i, lvl in enumerate(levels.levels):
                if i >= len(tables):
                    tables.append(0)
                    sizes.append(0)
                tables[i] += len(lvl)
                sizes[i] += sum(t.size for t in lvl)
            l0_max = max(l0_max, len(levels.l0))
            amp_max = max(amp_max, size_amplification(levels))
    return LevelStats(tables, sizes, l0_max, amp_max, ranges)


def checkpoint_metadata(result: EpochResult, stats: LevelStats, progress: Progress | None = None) -> dict:
    """Dagster metadata of one committed epoch (numeric values are plotted by the UI).

    Args:
        result: the committed epoch.
        stats: its DKV shape (``level_stats``).
        progress: the run's progress after it (``dkvstream.operators.runtime.progress``): for a
            bounded source ``epochs_total_estimate``, ``progress_percent`` and
            ``time_left_s`` are added; None: none.
    """
    amp = stats.size_amplification_max
    md = {
        "epoch": MetadataValue.int(result.epoch),
        "watermark": MetadataValue.text(format_watermark(result.watermark)),
        "watermark_ms": MetadataValue.int(result.watermark if result.watermark < WATERMARK_MAX else -1),
        "source_offsets": MetadataValue.json(result.source_offsets),
        "manifest_uri": MetadataValue.path(result.checkpoint_uri),
        "tables": MetadataValue.int(result.tables),
        "table_bytes": MetadataValue.int(result.table_bytes),
        "keys": MetadataValue.int(result.keys),
        "events": MetadataValue.int(result.events),
        "duration_s": MetadataValue.float(round(result.seconds, 3)),
        "events_per_s": MetadataValue.float(round(result.events_per_second, 1)),
        L0_TABLES_MAX: MetadataValue.int(stats.l0_tables_max),
        SIZE_AMP_MAX: MetadataValue.float(round(amp, 4) if math.isfinite(amp) else 1e9),
        "output_rows": MetadataValue.json(result.output_rows),
        "finished": MetadataValue.bool(result.finished),
    }
    if result.drained:  # the job was stopped with a drain: it is finished for good
        md["drained"] = MetadataValue.bool(True)
    for reason, n in result.dead_letter.items():  # bad input rows this epoch, per reason
        md[f"dead_letter_{reason}"] = MetadataValue.int(n)
    if result.recovery:  # this run fell back from an unusable checkpoint
        md["fell_back_from_epoch"] = MetadataValue.int(result.recovery["fell_back_from_epoch"])
        md["recovery"] = MetadataValue.json(result.recovery)
    for i, (n, size) in enumerate(zip(stats.tables_per_level, stats.bytes_per_level)):
        md[f"L{i}_tables"] = MetadataValue.int(n)
        md[f"L{i}_bytes"] = MetadataValue.int(size)
    md.update(live_metadata(result.live))
    if progress is not None and progress.epochs_total is not None:
        md["epochs_total_estimate"] = MetadataValue.int(progress.epochs_total)
        md["progress_percent"] = MetadataValue.float(round(progress.percent, 1))
        md["time_left_s"] = MetadataValue.float(round(progress.seconds_left, 1))
    return md


def live_metadata(live: dict) -> dict:
    """An epoch's live metrics (``EpochResult.live``, ``dkvstream.operators.runtime.live.epoch_metrics``)
    as Dagster metadata: one number per metric, so the UI plots each across epochs.

    Entries (a metric the epoch could not measure, null in ``live``, is left out, so its
    plot has a gap rather than a false zero):

    - ``input_events_per_s``: events/s arriving (the growth of the source's end offsets)
      between the previous epoch's plan and this one's (``live["input_rate"]``);
      ``read_events_per_s``: events/s this epoch read over the same time
      (``read_rate``); ``processing_events_per_s``: events/s processed from this epoch's
      plan to its publish (``processing_rate``).
    - ``lag_events``: offsets left unread after the epoch (end offsets at its plan minus
      committed offsets), summed over the partitions (Kafka consumer lag);
      ``lag_events_by_partition`` (JSON) the same per partition.
    - ``lag_ms_max``: the most any partition's newest event read is behind the wall
      clock, ms.
    - ``latency_p50_ms`` / ``latency_p99_ms`` / ``latency_max_ms``: end-to-end latency of
      the epoch's events, ingest time to publish, ms (sources with ``_ingest_time`` only,
      and events whose ingest time is not their event time).
    - ``event_time_lag_p50_ms`` / ``event_time_lag_p99_ms`` / ``event_time_lag_max_ms``:
      the same for events whose ingest time is their event time (a Kafka record
      timestamp used as both): publish minus event time, not a latency unless the
      producer stamped records when it sent them.
    - ``watermark_delay_ms``: wall clock minus the watermark, ms.

    Args:
        live: the metrics dict (empty: nothing measured, no entries).
    """
    md = {}
    for name in ("input", "read", "processing"):
        if live.get(f"{name}_rate") is not None:
            md[f"{name}_events_per_s"] = MetadataValue.float(round(float(live[f"{name}_rate"]), 1))
    lag = live.get("lag_events")
    if lag:
        md["lag_events"] = MetadataValue.int(int(sum(lag.values())))
        md["lag_events_by_partition"] = MetadataValue.json(lag)
    lag_ms = [v for v in (live.get("lag_ms") or {}).values() if v is not None]
    if lag_ms:
        md["lag_ms_max"] = MetadataValue.int(int(max(lag_ms)))
    for name in ("latency", "event_time_lag"):
        for quantile, value in (live.get(f"{name}_ms") or {}).items():
            if value is not None:
                md[f"{name}_{quantile}_ms"] = MetadataValue.int(int(value))
    if live.get("watermark_delay_ms") is not None:
        md["watermark_delay_ms"] = MetadataValue.int(int(live["watermark_delay_ms"]))
    return md


def verify_checkpoint(store: ObjectStore, job_prefix: str, ckpt: JobCheckpoint) -> VerifyReport:
    """Verifies every file checkpoint ``ckpt`` names: each range manifest with its tables
    and WAL objects (``dkvstream.storage.dkv.verify``) and each staged output file (exists, size).

    Returns:
        The summed ``VerifyReport``; ``errors`` names every missing or corrupt file.
    """
    report = VerifyReport()
    for op_ranges in ckpt.operators.values():
        for manifest_key in op_ranges.values():
            report.add(verify_manifest(store, manifest_key))
    for keys in ckpt.outputs.values():
        for key in keys:
            if not store.exists(key):
                report.errors.append(f"{store.uri(key)}: staged output named by epoch {ckpt.epoch} is missing")
    return report


def check_older_checkpoints(store: ObjectStore, job_prefix: str,
                            newest: int) -> dict[int, list[str]]:
    """The retained checkpoints before ``newest`` a restart could fall back to, checked
    cheaply (``dkvstream.operators.runtime.recovery.check_checkpoint`` in ``"names"`` mode: each
    checkpoint and range manifest verifies, each file it names exists at its size).

    Returns:
        ``{epoch: [error naming a URI, ...]}`` for each damaged checkpoint (empty: none).
    """
    damaged = {}
    for epoch in list_epochs(store, job_prefix):
        if epoch < newest:
            _, errors = check_checkpoint(store, job_prefix, epoch, "names")
            if errors:
                damaged[epoch] = errors
    return damaged


def checkpoint_check_spec(job: Job) -> AssetCheckSpec:
    """The asset check ``verified`` on ``<job>_checkpoint`` (``checkpoint_check_result``),
    declared by the asset that runs the job's epochs, which yields its result at the end
    of each run."""
    return AssetCheckSpec(VERIFIED, asset=checkpoint_asset_key(job),
                          description="Every file the newest checkpoint names exists and its checksums "
                                      "verify; older retained checkpoints are readable")


def checkpoint_check_result(store: ObjectStore, job: Job) -> AssetCheckResult:
    """The result of ``verified``: the newest checkpoint's files all exist and their
    checksums verify, and every older retained checkpoint (a restart's fallback) and the
    files it names are readable (``check_older_checkpoints``).

    Returns:
        Passed, with metadata ``epoch``, ``checkpoint_uri``, ``manifests``, ``tables``,
        ``table_bytes``, ``blocks``, ``wal_objects`` (what was verified); or failed with
        severity ERROR naming each bad file in ``errors`` (the first 20) and each damaged
        older checkpoint in ``damaged_epochs``. Passed with ``epoch`` 0 when nothing is
        committed yet.
    """
    key = checkpoint_asset_key(job)
    try:
        ckpt = latest_checkpoint(store, job.prefix)
    except CorruptionError as e:
        return AssetCheckResult(asset_key=key, check_name=VERIFIED, passed=False, severity=AssetCheckSeverity.ERROR,
                                metadata={"errors": MetadataValue.json([str(e)])})
    if ckpt is None:
        return AssetCheckResult(asset_key=key, check_name=VERIFIED, passed=True,
                                metadata={"epoch": MetadataValue.int(0), "note": "no committed checkpoint yet"})
    report = verify_checkpoint(store, job.prefix, ckpt)
    older = check_older_checkpoints(store, job.prefix, ckpt.epoch)
    errors = report.errors + [f"epoch {e}: {msg}" for e, msgs in older.items() for msg in msgs]
    return AssetCheckResult(
        asset_key=key, check_name=VERIFIED, passed=not errors, severity=AssetCheckSeverity.ERROR,
        metadata={
            "epoch": MetadataValue.int(ckpt.epoch),
            "checkpoint_uri": MetadataValue.path(store.uri(checkpoint_key(job.prefix, ckpt.epoch))),
            "manifests": MetadataValue.int(report.manifests),
            "tables": MetadataValue.int(report.tables),
            "table_bytes": MetadataValue.int(report.table_bytes),
            "blocks": MetadataValue.int(report.blocks),
            "wal_objects": MetadataValue.int(report.wal_objects),
            "damaged_epochs": MetadataValue.json(sorted(older)),
            "errors": MetadataValue.json(errors[:20]),
        })
