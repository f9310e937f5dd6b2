"""Print what the flights job produced and whether it equals the pandas oracle.

Usage: ``python -m examples.flights_report [--store .dkvstream]``
"""
from __future__ import annotations

import argparse
import sys

from examples.flights import flights_job
from examples.flights_oracle import KEY_COLUMNS, route_daily_delays_oracle
from operators.runtime.checkpoints import latest_checkpoint, list_epochs
from storage.objectstore import open_object_store


def main(argv: list[str] | None = None) -> int:
    """Print a summary; exit 1 if the job's output differs from the oracle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=".dkvstream", help="object-store root (default: .dkvstream)")
    args = parser.parse_args(argv)
    job = flights_job()
    store = open_object_store(args.store)
    ckpt = latest_checkpoint(store, job.prefix)
    if ckpt is None:
        print(f"no committed checkpoint of job {job.name} under {store.root_uri}")
        return 1
    out = job.sinks["main"].read(store, job.prefix).to_pandas()
    print(f"job {job.name}: {len(list_epochs(store, job.prefix))} committed epochs, newest {ckpt.epoch}"
          f" ({'finished' if ckpt.finished else 'source not drained yet'})")
    print(f"source offsets: {ckpt.source_offsets}")
    print(f"route_daily_delays: {len(out):,} rows under {store.uri(job.sinks['main'].table_prefix(job.prefix))}")
    if len(out):
        print(out.sort_values(KEY_COLUMNS).head(5).to_string(index=False))
    if not ckpt.finished:
        return 0
    exp = route_daily_delays_oracle()
    got = out.sort_values(KEY_COLUMNS).reset_index(drop=True)
    exp = exp.sort_values(KEY_COLUMNS).reset_index(drop=True)
    same = (len(got) == len(exp) and (got[KEY_COLUMNS + ["flights", "cancelled"]].values
                                      == exp[KEY_COLUMNS + ["flights", "cancelled"]].values).all()
            and ((got["dep_delay_mean"] - exp["dep_delay_mean"]).abs().fillna(0)
                 <= 1e-9 * exp["dep_delay_mean"].abs().fillna(0)).all())
    print(f"equals the pandas oracle ({len(exp):,} rows): {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
