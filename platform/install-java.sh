#!/usr/bin/env bash
# Install a Java 17 runtime for Spark when no `java` is on PATH (Debian/Ubuntu apt).
set -euo pipefail
if command -v java >/dev/null 2>&1; then
  exit 0
fi
echo "java not found: installing OpenJDK 17 (headless) with apt-get" >&2
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
$sudo_cmd apt-get update -q
$sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless
