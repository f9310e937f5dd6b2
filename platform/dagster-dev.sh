#!/usr/bin/env bash
# Start the Dagster UI, daemon and code server for dkvstream (`dagster dev`) from the
# repository root: instance settings from ./dagster.yaml (runs and events in
# .dagster_home/), definitions from workspace.yaml. Extra arguments go to `dagster dev`
# (e.g. -p 3001). Open http://127.0.0.1:3000 and materialize the flights job.
#
# Demo settings, each overridable from the environment: small memtables and a short
# checkpoint retention, so one flights run gives the compaction and cleanup sensors
# work to do. Unset, `dagster dev` itself uses 4 MiB memtables and keeps 10 checkpoints.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh
export DAGSTER_HOME="${DAGSTER_HOME:-$root}"  # the repository's dagster.yaml unless DAGSTER_HOME names another instance
export SPARK_CONF_DIR="$root/platform/conf" PYSPARK_PYTHON="$root/.venv/bin/python"
export DKVSTREAM_DKV_MEMTABLE_BYTES="${DKVSTREAM_DKV_MEMTABLE_BYTES:-262144}"
export DKVSTREAM_DKV_RETAIN_CHECKPOINTS="${DKVSTREAM_DKV_RETAIN_CHECKPOINTS:-3}"
export DKVSTREAM_SENSOR_INTERVAL_S="${DKVSTREAM_SENSOR_INTERVAL_S:-10}"
exec .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 "$@"
