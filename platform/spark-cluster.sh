#!/usr/bin/env bash
# A Spark standalone cluster on loopback: one master and two workers with one core each.
#
#   platform/spark-cluster.sh start     # prints the master URL, e.g. spark://127.0.0.1:41527
#   platform/spark-cluster.sh status    # master URL, web UI and each daemon's pid (exit 1 if down)
#   platform/spark-cluster.sh stop      # ends the daemons, their executors and Python workers
#
# The pip package of pyspark ships bin/spark-class but not sbin/start-master.sh or
# start-worker.sh, so the daemons are started with `spark-class <main class>` in the
# background, each in its own session (setsid), with pid files. Ports are free ones
# chosen by the kernel (port 0) unless set, and read back from the master's log, so
# several clusters can run on one machine.
#
# Environment (all optional):
#   DKVSTREAM_SPARK_CLUSTER_DIR   state directory: logs, pid files, worker dirs
#                                 (default .dkvstream/spark-cluster)
#   DKVSTREAM_SPARK_WORKERS       number of workers (default 2)
#   DKVSTREAM_SPARK_WORKER_CORES  cores per worker (default 1)
#   DKVSTREAM_SPARK_WORKER_MEMORY memory per worker (default 2g)
#   DKVSTREAM_SPARK_MASTER_PORT, DKVSTREAM_SPARK_MASTER_WEBUI_PORT  (default 0: free port)
#
# The daemons start without any AWS_* variable and without SPARK_CONF_DIR: executors get
# the object store's endpoint and credentials from the job's Spark configuration
# (spark.executorEnv.*), as they would on machines that share nothing with the driver.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${DKVSTREAM_SPARK_CLUSTER_DIR:-$root/.dkvstream/spark-cluster}
workers=${DKVSTREAM_SPARK_WORKERS:-2}
cores=${DKVSTREAM_SPARK_WORKER_CORES:-1}
memory=${DKVSTREAM_SPARK_WORKER_MEMORY:-2g}
python=$root/.venv/bin/python
start_timeout_s=120

die() { echo "spark-cluster.sh: $*" >&2; exit 1; }

spark_home() {
  local home
  home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') \
    || die "pyspark is not installed in $root/.venv (run platform/setup.sh)"
  [ -x "$home/bin/spark-class" ] || die "$home/bin/spark-class not found"
  echo "$home"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# pid and every descendant of it (executors under a worker, Python workers under those).
tree() {
  local pid=$1 child
  echo "$pid"
  for child in $(pgrep -P "$pid" 2>/dev/null || true); do tree "$child"; done
}

master_url() { grep -o 'Starting Spark master at spark://[0-9.:]*' "$dir/logs/master.log" | tail -1 | sed 's/.* at //'; }
master_webui() { grep -o 'started at http://[^ ]*' "$dir/logs/master.log" | tail -1 | sed 's/started at //'; }

# Starts one daemon: "$1" name, the rest the spark-class arguments.
launch() {
  local name=$1; shift
  # spark-class ends in `exec java`, so the recorded pid is the JVM's.
  env -u SPARK_CONF_DIR -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN \
      -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_S3 -u AWS_REGION -u AWS_DEFAULT_REGION \
      -u AWS_MAX_ATTEMPTS -u AWS_RETRY_MODE \
      SPARK_HOME="$home" SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS="$dir/local/$name" \
      PYSPARK_PYTHON="$python" SPARK_NO_DAEMONIZE=1 \
      setsid "$home/bin/spark-class" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name.pid"
}

# Waits until the master's web UI lists $workers ALIVE workers.
wait_for_workers() {
  local webui=$1 deadline=$((SECONDS + start_timeout_s)) n
  while [ $SECONDS -lt $deadline ]; do
    n=$("$python" - "$webui" <<'EOF' 2>/dev/null || echo 0
import json, sys, urllib.request
state = json.load(urllib.request.urlopen(sys.argv[1] + "/json/", timeout=5))
print(sum(w["state"] == "ALIVE" for w in state["workers"]))
EOF
)
    [ "$n" -ge "$workers" ] && return 0
    for f in "$dir"/pids/*.pid; do alive "$f" || die "$(basename "$f" .pid) exited; see $dir/logs/$(basename "$f" .pid).log"; done
    sleep 1
  done
  die "$workers workers did not register within ${start_timeout_s}s; see $dir/logs/"
}

start() {
  bash "$root/platform/setup.sh" >&2
  home=$(spark_home)
  if alive "$dir/pids/master.pid"; then
    die "a cluster already runs from $dir ($(master_url)); stop it first"
  fi
  rm -rf "$dir/pids" "$dir/logs" "$dir/work" "$dir/local"
  mkdir -p "$dir/pids" "$dir/logs" "$dir/work"
  # A failed start leaves nothing running.
  trap 'stop >/dev/null 2>&1' EXIT
  # The REST submission server would take the fixed port 6066: off (not needed).
  SPARK_MASTER_OPTS="${SPARK_MASTER_OPTS:-} -Dspark.master.rest.enabled=false" \
  launch master org.apache.spark.deploy.master.Master --host 127.0.0.1 \
    --port "${DKVSTREAM_SPARK_MASTER_PORT:-0}" --webui-port "${DKVSTREAM_SPARK_MASTER_WEBUI_PORT:-0}"
  local deadline=$((SECONDS + start_timeout_s)) url="" webui=""
  while [ -z "$url" ] || [ -z "$webui" ]; do
    alive "$dir/pids/master.pid" || die "master exited; see $dir/logs/master.log"
    [ $SECONDS -lt $deadline ] || die "master did not start; see $dir/logs/master.log"
    sleep 0.5
    url=$(master_url || true); webui=$(master_webui || true)
  done
  local i
  for i in $(seq 1 "$workers"); do
    launch "worker-$i" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port 0 --webui-port 0 \
      --cores "$cores" --memory "$memory" --work-dir "$dir/work/worker-$i" "$url"
  done
  wait_for_workers "$webui"
  trap - EXIT
  echo "$url"
}

status() {
  alive "$dir/pids/master.pid" || { echo "no cluster running from $dir" >&2; return 1; }
  echo "master $(master_url) (web UI $(master_webui))"
  local f
  for f in "$dir"/pids/*.pid; do
    if alive "$f"; then echo "$(basename "$f" .pid) pid $(cat "$f") running"
    else echo "$(basename "$f" .pid) pid $(cat "$f") exited"; fi
  done
}

stop() {
  [ -d "$dir/pids" ] || { echo "no cluster state in $dir"; return 0; }
  local pids="" f pid
  # Workers first: their executors and Python workers are collected before any dies.
  for f in $(ls "$dir"/pids/worker-*.pid 2>/dev/null) "$dir/pids/master.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null && pids="$pids $(tree "$pid" | tr '\n' ' ')"
  done
  if [ -n "${pids// /}" ]; then
    kill -TERM $pids 2>/dev/null || true
    local deadline=$((SECONDS + 15)) left
    while :; do
      left=""
      for pid in $pids; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
      [ -z "$left" ] && break
      if [ $SECONDS -ge $deadline ]; then kill -KILL $left 2>/dev/null || true; break; fi
      sleep 0.5
    done
  fi
  rm -f "$dir"/pids/*.pid
  echo "stopped the cluster of $dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 start|stop|status" ;;
esac
