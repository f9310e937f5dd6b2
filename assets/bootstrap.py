"""The Dagster op and job that write a new stream job's initial state from tables
(``dkvstream.operators.runtime.bootstrap``; docs/bootstrap.md).

``write_initial_state`` (job ``bootstrap_state``) takes the stream job as ``module:attribute``
and each state's table as a Parquet or Delta path, writes one DKV instance per key-group
range and the job's first checkpoint on the ``object_store`` resource's store, and
reports what each range holds. The stream job's epochs job then runs on from it. The
op runs in the Dagster process; tables too large for one process are written with
``bootstrap(..., spark=...)`` from Python or the CLI's ``--master``.
"""

from dagster import Config, MetadataValue, OpExecutionContext, Output, job, op
from pydantic import Field

from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.runtime.bootstrap import bootstrap
from dkvstream.operators.tools.state_reader import load_job


class BootstrapConfig(Config):
    """Config of ``write_initial_state``.

    Attributes:
        job: ``module:attribute`` of the stream Job (or a function returning it).
        states: ``{"operator.state_id": Parquet or Delta path}``.
        timers: ``{"operator": path}`` of tables of key, timestamp (ms)[, domain].
        epoch: the checkpoint's epoch (>= 1); the job's next run starts after it.
        ttl_from_ms: for TTL'd states without an ``expiry`` column, when their TTL starts (ms).
    """

    job: str
    states: dict[str, str] = Field(default_factory=dict)
    timers: dict[str, str] = Field(default_factory=dict)
    epoch: int = 1
    ttl_from_ms: int | None = None


@op(description="Write a new stream job's initial state from Parquet/Delta tables as its first checkpoint")
def write_initial_state(context: OpExecutionContext, config: BootstrapConfig,
                    object_store: ObjectStoreResource) -> Output[dict]:
    states: dict[str, dict[str, str]] = {}
    for name, path in config.states.items():
        operator, dot, state_id = name.partition(".")
        if not dot or not operator or not state_id:
            raise ValueError(f"states key {name!r}: give 'operator.state_id'")
        states.setdefault(operator, {})[state_id] = path
    stream_job = load_job(config.job)
    result = bootstrap(object_store.open(), stream_job, states, timers=config.timers, epoch=config.epoch,
                       ttl_from_ms=config.ttl_from_ms)
    context.log.info(f"job {result.job}: {result.entries} entries in {len(result.ranges)} ranges; "
                     f"checkpoint {result.checkpoint_uri}")
    ranges = "\n".join(["| operator | range | entries | SSTables | bytes |", "|---|---|---|---|---|",
                        *(f"| {r.operator} | {r.range_label} | {r.entries} | {r.tables} | {r.table_bytes} |"
                          for r in result.ranges)])
    return Output({"job": result.job, "epoch": result.epoch, "checkpoint": result.checkpoint_uri,
                   "entries": result.entries, "tables": result.tables, "table_bytes": result.table_bytes},
                  metadata={"checkpoint": MetadataValue.url(result.checkpoint_uri),
                            "entries": MetadataValue.int(result.entries),
                            "tables": MetadataValue.int(result.tables),
                            "table_bytes": MetadataValue.int(result.table_bytes),
                            "ranges": MetadataValue.md(ranges)})


@job(name="bootstrap_state", description="Write a new stream job's initial state from tables")
def bootstrap_state_job():
    write_initial_state()
