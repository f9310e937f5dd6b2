"""The Dagster side of erasure: an op and job that erase a key from a stream job and
record the report as an asset materialization (``erasure/<job>``).

``erase_key`` (job ``erasure``) writes the request (``dkvstream.operators.runtime.erasure``);
for a stopped job (``offline: true``) it serves it at once with an epoch of its own, for a
running one it waits up to ``wait_s`` for the job's next epoch to serve it. Once served, it
erases the sinks' rows (with ``job_spec`` and ``key_column``), names the savepoints still
holding the key, scans the store, writes the report and materializes the asset with it.
A request not served within ``wait_s`` is reported ``pending``: run the op again with the
printed ``request_id`` to finish it. Only the object store is used, no Spark.
"""

import time

from dagster import AssetKey, AssetMaterialization, MetadataValue, OpExecutionContext, Output, job, op

from dkvstream.assets.jobs import StreamJobConfig, job_prefix
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.runtime import erasure
from dkvstream.operators.tools.state_reader import load_job
from dkvstream.storage.cli import parse_bytes


class ErasureConfig(StreamJobConfig):
    """Config of ``erase_key``.

    Attributes:
        key: the subject key (UTF-8 text, or hex digits with ``hex``).
        hex: ``key`` is hex.
        reason: free text for the report (a ticket number).
        request_id: finish this earlier request instead of writing a new one.
        offline: the job is stopped: serve the request now (``erasure.apply_offline``).
        wait_s: for a running job, wait up to this many seconds for its next epoch.
        job_spec: ``module:attribute`` of the Job, whose sinks and dead-letter table are
            erased too ("": none).
        key_column: the sinks' column holding the key ("" : sinks are not erased).
        scan_prefix: prefix of the final scan ("" = the whole store).
        scan: run the final scan.
    """

    key: str
    hex: bool = False
    reason: str = ""
    request_id: str = ""
    offline: bool = False
    wait_s: float = 0.0
    job_spec: str = ""
    key_column: str = ""
    scan_prefix: str = ""
    scan: bool = True


def erasure_asset_key(job: str) -> AssetKey:
    """The asset key of a stream job's erasure reports."""
    return AssetKey(["erasure", job])


@op(description="Erase a key from a stream job's state, retained checkpoints and sinks; report it")
def erase_key(context: OpExecutionContext, config: ErasureConfig, object_store: ObjectStoreResource):
    store = object_store.open()
    prefix = job_prefix(config.job)
    key = parse_bytes(config.key, config.hex)
    rid = config.request_id or erasure.request_erasure(store, prefix, key,
                                                       config.reason or f"dagster run {context.run_id}")
    if config.offline:
        erasure.apply_offline(store, prefix)
    deadline = time.monotonic() + config.wait_s
    while erasure.read_report(store, prefix, rid).status == "pending" and time.monotonic() < deadline:
        time.sleep(0.5)
    sinks = {}
    if config.job_spec:
        sinks = erasure.job_sinks(load_job(config.job_spec))
    report = erasure.complete_erasure(store, prefix, rid, key, sinks=sinks, key_column=config.key_column or None,
                                      scan_prefix=config.scan_prefix if config.scan else None)
    if report.status == "pending":
        context.log.warning(f"job {config.job}: erasure {rid} not served yet; run again with request_id={rid}")
    elif report.status == "held":
        context.log.warning(f"job {config.job}: erasure {rid}: pins still keep files holding the key (metadata "
                            f"held_by and savepoints_holding name the commands that release them); release them "
                            f"and run again with request_id={rid}")
    holding = [] if report.scan is None else report.scan["holding"]
    metadata = {
        "request_id": MetadataValue.text(rid),
        "status": MetadataValue.text(report.status),
        "applied_epoch": MetadataValue.int(report.applied_epoch or 0),
        "key_sha256": MetadataValue.text(report.key_sha256),
        "objects_that_held": MetadataValue.json(report.objects_that_held()),
        "savepoints_holding": MetadataValue.json(report.savepoints),
        "held_by": MetadataValue.json(report.retention.get("held_by", {})),
        "sinks": MetadataValue.json(report.sinks),
        "scan_holding": MetadataValue.json(holding),
        "scan_objects": MetadataValue.int(0 if report.scan is None else report.scan["objects_scanned"]),
    }
    yield AssetMaterialization(asset_key=erasure_asset_key(config.job), metadata=metadata)
    yield Output(report.to_json(), metadata={"status": metadata["status"], "request_id": metadata["request_id"]})


@job(name="erasure", description="Erase a key from a stream job (GDPR) and record the report")
def erasure_job():
    erase_key()
