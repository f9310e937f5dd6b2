#!/usr/bin/env bash
# Run the flights example end to end on the embedded default (local[2] Spark, object
# store $DKVSTREAM_STORE, default ./.dkvstream): set up the machine if needed, materialize
# the job's Dagster assets (each committed epoch becomes a materialization of
# flights_checkpoint, whose check verifies the newest checkpoint at the end), then print
# the output and compare it with the pandas oracle.
# Usage: platform/run-flights.sh [--fresh]   (--fresh: forget earlier runs of the job)
# Exit status: 0 when the run succeeded and its output equals the oracle; Dagster's
# status when the run failed (the store's earlier results are then not printed); 1 when
# the output differs from the oracle.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh
store=${DKVSTREAM_STORE:-.dkvstream}
if [ "${1:-}" = "--fresh" ]; then
  case "$store" in
    file://*) rm -rf "${store#file://}/jobs/flights" ;;
    *://*) echo "run-flights.sh: --fresh deletes in a local store only;" \
             "delete $store/jobs/flights yourself" >&2
           exit 2 ;;
    *) rm -rf "$store/jobs/flights" ;;
  esac
fi
# The repository is the Dagster instance (its dagster.yaml) unless DAGSTER_HOME names another.
export DAGSTER_HOME="${DAGSTER_HOME:-$root}" SPARK_CONF_DIR="$root/platform/conf"
export PYSPARK_PYTHON="$root/.venv/bin/python"
# No Dagster daemon here, so no sensors: the job compacts inline and applies checkpoint
# retention itself (under `dagster dev` the sensors' runs do both).
export DKVSTREAM_DKV_INLINE_RETENTION="${DKVSTREAM_DKV_INLINE_RETENTION:-1}"
export DKVSTREAM_DKV_MAX_INLINE_COMPACTION_BYTES="${DKVSTREAM_DKV_MAX_INLINE_COMPACTION_BYTES:-2147483648}"
# Only progress and errors are shown: Spark's start and UI, a line per epoch (of the
# total, percent, time left), the checkpoint check. The status is Dagster's, not grep's
# (grep finding no line is no failure).
echo "run-flights.sh: materializing the flights assets with Dagster (loading takes a few seconds)"
set +e
.venv/bin/dagster asset materialize -m dkvstream.examples.definitions \
  --select 'flights_replay,route_daily_delays,route_daily_delays_late,flights_checkpoint' 2>&1 \
  | grep --line-buffered -E 'starting Spark|Spark up|epoch [0-9]+( of|:)|ASSET_CHECK_EVALUATION|RUN_SUCCESS|RUN_FAILURE|STEP_FAILURE|Error|error'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "run-flights.sh: the Dagster run failed (exit status $status, errors above);" \
    "not reporting what $store holds: it may be an earlier run's output." >&2
  exit "$status"
fi
.venv/bin/python -m dkvstream.examples.flights_report
