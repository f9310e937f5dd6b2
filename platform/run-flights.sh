#!/usr/bin/env bash
# Run the flights example end to end on the embedded default (local[2] Spark, object
# store in ./.dkvstream): set up the machine if needed, materialize the job's Dagster
# assets (each committed epoch becomes a materialization of flights_checkpoint), then
# print the output and compare it with the pandas oracle.
# Usage: platform/run-flights.sh [--fresh]   (--fresh: forget earlier runs of the job)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh
if [ "${1:-}" = "--fresh" ]; then
  rm -rf .dkvstream/jobs/flights
fi
export DAGSTER_HOME="$root" SPARK_CONF_DIR="$root/platform/conf"
export PYSPARK_PYTHON="$root/.venv/bin/python"
# No Dagster daemon here, so no sensors: the job compacts inline and applies checkpoint
# retention itself (under `dagster dev` the sensors' runs do both).
export DKVSTREAM_DKV_INLINE_RETENTION="${DKVSTREAM_DKV_INLINE_RETENTION:-1}"
export DKVSTREAM_DKV_MAX_INLINE_COMPACTION_BYTES="${DKVSTREAM_DKV_MAX_INLINE_COMPACTION_BYTES:-2147483648}"
.venv/bin/dagster asset materialize -m assets.definitions \
  --select 'flights_replay,route_daily_delays,route_daily_delays_late' 2>&1 \
  | grep --line-buffered -E 'epoch [0-9]+ committed|RUN_SUCCESS|RUN_FAILURE|STEP_FAILURE|Error|error' || true
.venv/bin/python -m examples.flights_report --store .dkvstream
