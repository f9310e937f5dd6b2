"""Print what the flights job produced and whether it equals the pandas oracle.

Usage: ``python -m dkvstream.examples.flights_report [--store URI] [--job-name NAME]``; the store
defaults to ``$DKVSTREAM_STORE`` or ``.dkvstream``, the store the job's Dagster assets
use; the job name to ``flights`` (``flights_live``: the job of ``dkvstream.examples.flights_live``,
same sinks).
Exit status: 0 when the finished job's output equals the oracle (or the job has not
finished yet), 1 when it differs or nothing was committed.
"""
from __future__ import annotations

import argparse
import sys

from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.examples.flights import flights_job
from dkvstream.examples.flights_oracle import KEY_COLUMNS, assert_equals_oracle, route_daily_delays_oracle
from dkvstream.operators.runtime.checkpoints import latest_checkpoint, list_epochs


def main(argv: list[str] | None = None) -> int:
    """Print a summary of the job's store; compare a finished job's output with the oracle.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 1 if nothing was committed or the output differs from the oracle.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None,
                        help="object-store root (default: $DKVSTREAM_STORE or .dkvstream)")
    parser.add_argument("--job-name", default="flights",
                        help="the flights job's name (default flights; flights_live for "
                             "dkvstream.examples.flights_live)")
    args = parser.parse_args(argv)
    # The Dagster resource reads $DKVSTREAM_STORE: the report reads where the run wrote.
    resource = ObjectStoreResource() if args.store is None else ObjectStoreResource(
        root_uri=args.store)
    store = resource.open()
    job = flights_job(name=args.job_name)  # only its name and sinks are used
    ckpt = latest_checkpoint(store, job.prefix)
    if ckpt is None:
        print(f"no committed checkpoint of job {job.name} under {store.root_uri}")
        return 1
    output = job.sinks["main"].read(store, job.prefix)
    out = output.to_pandas()
    print(f"job {job.name}: {len(list_epochs(store, job.prefix))} committed epochs, newest {ckpt.epoch}"
          f" ({'finished' if ckpt.finished else 'source not drained yet'})")
    print(f"source offsets: {ckpt.source_offsets}")
    print(f"route_daily_delays: {len(out):,} rows under "
          f"{store.uri(job.sinks['main'].table_prefix(job.prefix))}")
    if len(out):
        print(out.sort_values(KEY_COLUMNS).head(5).to_string(index=False))
    if not ckpt.finished:
        return 0
    oracle = route_daily_delays_oracle()
    try:
        assert_equals_oracle(output, oracle)
    except AssertionError as e:
        print(f"equals the pandas oracle ({len(oracle):,} rows): NO: {e}")
        return 1
    print(f"equals the pandas oracle ({len(oracle):,} rows): yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
