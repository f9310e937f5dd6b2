#!/usr/bin/env bash
# Makes .venv-flink at the repository root with PyFlink (bench/flink/requirements.txt) for the
# flink-sql engine of bench/flights_throughput.py. PyFlink pins its own pyarrow, pandas and
# numpy and ships Flink's jars (RocksDB state backend included), so it has a venv of its own
# rather than sharing the project's .venv. Needs Java 11+ on PATH (platform/install-java.sh).
# Usage: bash bench/flink/setup.sh    (PYTHON=python3.11 by default; PyFlink 2.3 has wheels
# for CPython 3.9-3.12)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="$ROOT/.venv-flink"
PYTHON="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r "$ROOT/bench/flink/requirements.txt"
"$VENV/bin/python" -c "import pyflink.version; print('PyFlink', pyflink.version.__version__, 'in', '$VENV')"
