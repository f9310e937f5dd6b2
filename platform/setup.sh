#!/usr/bin/env bash
# Set up a fresh machine for dkvstream: Java 17 for Spark (only when `java` is missing)
# and a virtual environment at .venv with the project and its test and bench extras.
# Idempotent: a second run only re-checks. Prints a line per step on stderr.
# Usage: platform/setup.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

bash "$root/platform/install-java.sh"

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating the virtual environment .venv with $py" >&2
  "$py" -m venv .venv
fi
stamp=.venv/.dkvstream-installed
# Reinstall when the dependencies or DKV's C module (built in place by setup.py) changed.
# Not through a .venv that is a symlink to another checkout's venv (a git worktree sharing
# it): the editable install would then point that venv, and everyone using it, here.
if [ -L .venv ]; then
  echo "setup.sh: .venv links to $(readlink -f .venv); not reinstalling into another checkout's venv" >&2
elif [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
    || [ storage/dkv/_native.c -nt "$stamp" ]; then
  echo "setup: installing dkvstream and its dependencies into .venv (pyproject.toml; a few minutes the first time)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[examples,test,bench]"  # examples: the flights data; bench: baselines of bench/ and their smoke tests
  touch "$stamp"
  echo "setup: done" >&2
else
  echo "setup: .venv is up to date" >&2
fi
