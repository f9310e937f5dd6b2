#!/usr/bin/env bash
# Install Debian's Chromium for the Dagster UI screenshot test when /usr/bin/chromium is
# missing; only the tests need it (platform/test.sh runs this), never a job. Playwright
# drives it through `executable_path` (tests/assets/), so no browser build is downloaded
# by playwright itself. Usage: platform/install-chromium.sh
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
bash "$(dirname "$0")/apt-install.sh" "the Dagster UI test (Chromium)" chromium fonts-dejavu-core
