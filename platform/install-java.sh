#!/usr/bin/env bash
# Install a Java 17 runtime for Spark when no `java` is on PATH (Debian/Ubuntu apt).
set -euo pipefail
if command -v java >/dev/null 2>&1; then
  echo "setup: Java found ($(command -v java))" >&2
  exit 0
fi
bash "$(dirname "$0")/apt-install.sh" "Spark (Java 17)" openjdk-17-jre-headless
