#!/usr/bin/env bash
# Install Debian's Chromium for the Dagster UI screenshot test when /usr/bin/chromium is
# missing. Playwright drives it through `executable_path` (tests/assets/), so no browser
# build is downloaded by playwright itself. Usage: platform/install-chromium.sh
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium.sh: no apt-get; install Chromium at /usr/bin/chromium by hand" >&2
  exit 0
fi
echo "chromium not found: installing Debian's chromium (headless use) with apt-get" >&2
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
$sudo_cmd apt-get update -q
$sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
