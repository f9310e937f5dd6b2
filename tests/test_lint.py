"""The whole checkout passes ruff with the rules of ``[tool.ruff.lint]`` in pyproject.toml
(pycodestyle, pyflakes, bugbear, import order, pyupgrade)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_env import in_ci

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean() -> None:
    if importlib.util.find_spec("ruff") is None:
        message = ("ruff is not installed: install the test extra (pip install -e '.[test]', "
                   "or platform/setup.sh) to run the lint")
        if in_ci():
            pytest.fail(message)  # CI installs the test extra: a missing ruff is a broken set-up
        pytest.skip(message)
    # --no-cache: no .ruff_cache written into the checkout.
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, (
        "ruff check found problems (fix them; `python -m ruff check --fix .` mends the safe ones):\n"
        + done.stdout + done.stderr)
