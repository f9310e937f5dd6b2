#!/usr/bin/env bash
# Run the test suite (sets the machine up first). Extra arguments go to pytest.
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure too.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash platform/setup.sh || exit 1
# Chromium is for the Dagster UI test only; without it that test skips and says how to
# install it.
bash platform/install-chromium.sh || echo "test.sh: no Chromium; the Dagster UI test will be skipped" >&2
export SPARK_CONF_DIR="$root/platform/conf" PYSPARK_PYTHON="$root/.venv/bin/python"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "platform/test.sh: no tests ran" >&2
  exit 1
fi
exit "$rc"
