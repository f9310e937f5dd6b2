#!/usr/bin/env bash
# Run the flights job live from Kafka, end to end: set up the machine if needed, start a
# local Kafka broker (Tansu, platform/kafka-broker.sh) on a free loopback port, create the
# `flights` topic (3 partitions), run the job of examples/flights_live.py continuously on
# local Spark (run_job --continuous --drain-on-stop), replay the 2013 flights into the
# topic at a steady rate (examples/flights_producer.py) and print a line per epoch (lag,
# latency, watermark). Once the producer has finished and the job has read every flight,
# stop the job with a drain (SIGTERM: every open window is emitted) and compare its
# output with the pandas oracle (examples/flights_report.py).
#
# Usage: platform/run-live.sh [--fresh] [--rate EVENTS_PER_S]
#   --fresh   forget an earlier run of the job flights_live in the store first
#   --rate    producer rate, events/s (default $DKVSTREAM_LIVE_RATE, else 20000)
# Environment: DKVSTREAM_STORE (object store, default .dkvstream), DKVSTREAM_LIVE_RATE,
#   DKVSTREAM_LIVE_JOB (the job, module:function; default dkvstream.examples.flights_live:flights_live_job),
#   DKVSTREAM_SPARK_MASTER (default local[2]).
# Exit status: 0 when the drained job's output equals the oracle; 1 when it differs or
# the job, the producer or the drain failed; 2 on a usage error. Everything the script
# started (broker, producer, job) is stopped when it exits, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fresh=0
rate=${DKVSTREAM_LIVE_RATE:-20000}
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) fresh=1 ;;
    --rate) rate=${2:?--rate needs a value (events/s)}; shift ;;
    --rate=*) rate=${1#--rate=} ;;
    *) echo "run-live.sh: unknown argument $1 (usage: platform/run-live.sh [--fresh] [--rate N])" >&2
       exit 2 ;;
  esac
  shift
done
store=${DKVSTREAM_STORE:-.dkvstream}
job_spec=${DKVSTREAM_LIVE_JOB:-dkvstream.examples.flights_live:flights_live_job}
py="$root/.venv/bin/python"

bash platform/setup.sh
if [ "$fresh" = 1 ]; then
  case "$store" in
    file://*) rm -rf "${store#file://}/jobs/flights_live" ;;
    *://*) echo "run-live.sh: --fresh deletes in a local store only;" \
             "delete $store/jobs/flights_live yourself" >&2
           exit 2 ;;
    *) rm -rf "$store/jobs/flights_live" ;;
  esac
elif "$py" -m dkvstream.examples.flights_live has-run --store "$store"; then
  # Its offsets are those of a topic that went with its broker (in-memory storage), and
  # it was drained: it is finished.
  echo "run-live.sh: $store already holds a run of the job flights_live;" \
    "run with --fresh to delete it, or set DKVSTREAM_STORE to another store" >&2
  exit 2
fi

# Logs of this run; every process started here carries DKVSTREAM_LIVE_RUN in its
# environment (the tests find leftovers by it).
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/dkvstream-live.XXXXXX")
export DKVSTREAM_LIVE_RUN="$run_dir"
echo "logs: $run_dir (deleted after a successful run)"
job_pid="" producer_pid="" broker_started=0

stop_pid() {  # stop_pid PID: SIGTERM, then SIGKILL after 30 s
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 300); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  [ -n "$producer_pid" ] && stop_pid "$producer_pid"
  [ -n "$job_pid" ] && stop_pid "$job_pid"
  if [ "$broker_started" = 1 ]; then
    "$py" -m dkvstream.operators.io.kafka_broker stop --dir "$run_dir/kafka" 2>/dev/null || true
  fi
  if [ "$status" -eq 0 ]; then
    rm -rf "$run_dir"
  else
    echo "run-live.sh: failed (exit status $status); logs in $run_dir" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

broker_started=1
if ! bootstrap=$(bash platform/kafka-broker.sh start --dir "$run_dir/kafka" 2>"$run_dir/broker.err"); then
  echo "run-live.sh: the broker did not start:" >&2
  cat "$run_dir/broker.err" >&2
  exit 1
fi
echo "broker: Tansu on $bootstrap (pid $("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$run_dir/kafka/broker.json"))"
"$py" -c 'import sys; from dkvstream.examples.flights_producer import create_topic; create_topic(sys.argv[1], "flights")' \
  "$bootstrap"
echo "topic: flights, 3 partitions (EWR, JFK, LGA)"

export DKVSTREAM_KAFKA_BOOTSTRAP="$bootstrap" DKVSTREAM_FLIGHTS_TOPIC=flights
export SPARK_CONF_DIR="$root/platform/conf" PYSPARK_PYTHON="$py"
"$py" -m dkvstream.operators.tools.run_job --job "$job_spec" --store "$store" --create-store --continuous --drain-on-stop --json \
  >"$run_dir/job.out" 2>"$run_dir/job.err" &
job_pid=$!
echo "job: flights_live (pid $job_pid), store $store; starting Spark"
# The producer starts once Spark is up, so the job sees the feed live, not as a backlog.
until grep -q '"event": "started"' "$run_dir/job.out" 2>/dev/null; do
  if ! kill -0 "$job_pid" 2>/dev/null; then
    echo "run-live.sh: the job exited while starting; its log ($run_dir/job.err) ends:" >&2
    tail -n 20 "$run_dir/job.err" >&2
    exit 1
  fi
  sleep 0.2
done
"$py" -m dkvstream.examples.flights_producer --bootstrap "$bootstrap" --topic flights --rate "$rate" \
  >"$run_dir/producer.out" 2>"$run_dir/producer.err" &
producer_pid=$!
echo "producer: replaying 336,776 flights at $rate events/s (pid $producer_pid)"

if ! "$py" -m dkvstream.examples.flights_live watch --job-out "$run_dir/job.out" --producer-out "$run_dir/producer.out" \
    --job-pid "$job_pid" --producer-pid "$producer_pid" --rate "$rate"; then
  for log in job producer; do
    echo "--- $log.err (tail) ---" >&2
    tail -n 20 "$run_dir/$log.err" >&2
  done
  exit 1
fi

echo "job: stopping with a drain (SIGTERM)"
kill -TERM "$job_pid"
set +e
wait "$job_pid"
job_status=$?
set -e
job_pid=""
"$py" -m dkvstream.examples.flights_live last-epoch --job-out "$run_dir/job.out"
if [ "$job_status" -ne 0 ] || ! tail -n 1 "$run_dir/job.out" | grep -q '"drained": true'; then
  echo "run-live.sh: the job did not stop with a drain (exit status $job_status); its log" \
    "($run_dir/job.err) ends:" >&2
  tail -n 20 "$run_dir/job.err" >&2
  exit 1
fi
wait "$producer_pid" || true
producer_pid=""
"$py" -m dkvstream.examples.flights_report --store "$store" --job-name flights_live
