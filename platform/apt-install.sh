#!/usr/bin/env bash
# Install Debian/Ubuntu packages with apt-get, as root or through sudo, waiting (with a
# message every 30 s) while another apt or dpkg process holds apt's lock instead of
# failing on it. Usage: platform/apt-install.sh <why> <package>...
# Environment: DKVSTREAM_APT_WAIT_S, the longest wait for the lock (default 1800 s).
# Exit status: apt-get's; 1 with a message saying what to do when there is no apt-get,
# no root and no sudo, or the lock stays held.
set -uo pipefail
why=$1; shift
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-install.sh: $why needs the packages $*, and this machine has no apt-get;" \
       "install them with your package manager and run again" >&2
  exit 1
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "apt-install.sh: $why needs the packages $*; run as root, or install them yourself:" \
         "apt-get install $*" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi
max_wait=${DKVSTREAM_APT_WAIT_S:-1800}
waited=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# Runs apt-get "$@"; while it fails only because apt's lock is held, waits and retries.
apt_get() {
  while true; do
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>"$err"
    local rc=$?
    [ "$rc" -eq 0 ] && return 0
    if ! grep -qiE 'could not get lock|unable to acquire the dpkg frontend lock|unable to lock' "$err"; then
      cat "$err" >&2
      return "$rc"
    fi
    if [ "$waited" -ge "$max_wait" ]; then
      cat "$err" >&2
      echo "apt-install.sh: apt's lock is still held after ${waited} s; wait for the other apt or dpkg" \
           "process (ps -C apt-get,apt,dpkg,unattended-upgr) to finish, then run again" >&2
      return 1
    fi
    if [ $((waited % 30)) -eq 0 ]; then
      echo "apt-install.sh: apt is busy (another process holds its lock: $(grep -im1 lock "$err"));" \
           "waiting for it (${waited} s of at most ${max_wait} s)" >&2
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

echo "apt-install.sh: installing $* with apt-get ($why)" >&2
apt_get update -q >/dev/null && apt_get install -y -q --no-install-recommends "$@"
