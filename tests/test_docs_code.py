"""Every code block of README.md and docs/*.md runs as written (the habit of doctest).

A page's ```python blocks run in order as one session (a later block may use names an earlier
one defined), in a subprocess with the repository on PYTHONPATH and a fresh temporary working
directory, so the ``.dkvstream`` paths of the docs land in a temporary store, never in the
clone. A page that reads ``DKVSTREAM_KAFKA_BOOTSTRAP`` gets the test broker's address there.
A block that cannot run here is preceded by ``<!-- no-run: <why> -->``; such blocks are
reported as skipped with their reasons. ```bash blocks are checked, not run: each
``python -m <module>`` they name answers ``--help``, each ``--job module:attr`` resolves,
and each ``platform/`` or ``bench/`` script they name exists.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_RUN = re.compile(r"<!--\s*no-run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
KAFKA_ENV = "DKVSTREAM_KAFKA_BOOTSTRAP"
# python runs, bash is checked, text is shown as is (diagrams, layouts, sample output).
LANGUAGES = {"python", "bash", "text"}


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page (relative to the repository), the 1-based line of
    its opening fence, its language tag ("" if none), its dedented source, and the reason of
    a ``<!-- no-run: ... -->`` marker on the line before the fence (None: it runs)."""
    page: str
    line: int
    lang: str
    source: str
    no_run: str | None

    @property
    def where(self) -> str:
        first = next((s for s in self.source.splitlines() if s.strip()), "")
        return f"{self.page}:{self.line} ({first.strip()[:70]!r})"


def code_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, in page order.

    Raises:
        AssertionError: a fence is never closed (the page renders wrongly too)."""
    lines, blocks, i = page.read_text().splitlines(), [], 0
    rel = str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{rel}:{i + 1}: code fence never closed"
        marker = NO_RUN.search(lines[i - 1]) if i else None
        blocks.append(Block(rel, i + 1, m.group(2), textwrap.dedent("\n".join(lines[i + 1:end])) + "\n",
                            marker.group(1) if marker else None))
        i = end + 1
    return blocks


# Runs in the subprocess: exec each block in one namespace, named "<page>:<line>" in
# tracebacks; on the first failure say which block and stop.
RUNNER = """
import json, sys, traceback
ns = {"__name__": "__main__"}
for b in json.load(open(sys.argv[1])):
    try:
        exec(compile(b["source"], b["where"], "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print("BLOCK FAILED: " + b["where"], file=sys.stderr)
        sys.exit(1)
"""


def _python_blocks(page: Path) -> list[Block]:
    return [b for b in code_blocks(page) if b.lang == "python"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               SPARK_CONF_DIR=str(ROOT / "platform" / "conf"), PYSPARK_PYTHON=sys.executable,
               DKVSTREAM_SPARK_MASTER="local[2]")
    env.pop(KAFKA_ENV, None)  # only a page that needs the broker gets the test's one
    return {**env, **extra}


def run_session(blocks: list[Block], tmp_path: Path, **env: str) -> str | None:
    """Runs ``blocks`` in order as one session in a subprocess whose working directory is a
    new directory under ``tmp_path``; ``env`` is added to its environment. Returns None if
    all ran, else the failing block's ``where`` and the end of its traceback."""
    (tmp_path / "blocks.json").write_text(json.dumps([{"where": b.where, "source": b.source} for b in blocks]))
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json")], cwd=work,
                          env=_env(**env), capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    failed = re.search(r"BLOCK FAILED: (.*)", done.stderr)
    return f"{failed.group(1) if failed else '(no block named)'}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run_as_written(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blocks = [b for b in _python_blocks(page) if b.no_run is None]
    extra = {}
    if any(KAFKA_ENV in b.source for b in blocks):
        extra[KAFKA_ENV] = request.getfixturevalue("kafka_broker").bootstrap
    failed = run_session(blocks, tmp_path, **extra)
    assert failed is None, f"a code block of {page.name} fails as written: {failed}"


def test_every_block_names_a_known_language_and_no_run_markers_sit_on_python_blocks() -> None:
    """An unlabelled block (or ```py, ```sh) would escape both the run and the check."""
    problems = []
    for page in PAGES:
        blocks = code_blocks(page)
        problems += [f"{b.where}: language {b.lang!r}, not one of {sorted(LANGUAGES)}"
                     for b in blocks if b.lang not in LANGUAGES]
        problems += [f"{b.where}: a no-run marker on a ```{b.lang} block" for b in blocks
                     if b.no_run is not None and b.lang != "python"]
        marked = {b.line - 1 for b in blocks if b.no_run is not None}
        problems += [f"{page.relative_to(ROOT)}:{i}: a no-run marker not on the line before a fence"
                     for i, line in enumerate(page.read_text().splitlines(), 1)
                     if NO_RUN.search(line) and i not in marked]
    assert not problems, "\n".join(problems)


NOT_RUN = [b for p in PAGES for b in code_blocks(p) if b.no_run is not None]


@pytest.mark.parametrize("block", NOT_RUN, ids=lambda b: f"{b.page}:{b.line}")
def test_blocks_marked_no_run_are_listed(block: Block) -> None:
    """One skip per block the docs mark no-run, so ``-ra`` lists them with their reasons."""
    pytest.skip(f"no-run: {block.where}: {block.no_run}")


def bash_problems(pages: list[Path]) -> list[str]:
    """What the ```bash blocks of ``pages`` name that does not exist: a ``platform/`` or
    ``bench/`` script that is not a file, a ``python -m <module>`` whose ``--help`` exits
    non-zero, a ``--job module:attr`` of a repository module that does not resolve. One
    message per problem, naming the page and block."""
    modules, jobs, problems = {}, {}, []
    for block in (b for p in pages for b in code_blocks(p) if b.lang == "bash"):
        for line in block.source.replace("\\\n", " ").splitlines():  # continuation lines joined
            for script in re.findall(r"(?<![\w/.])((?:platform|bench)/[\w/.-]+\.(?:sh|py))", line):
                if not (ROOT / script).is_file():
                    problems.append(f"{block.where}: {script} does not exist")
            for module in re.findall(r"python -m ([\w.]+)", line):
                modules.setdefault(module, block)
            for module, attr in re.findall(r"--job ([\w.]+):(\w+)", line):
                jobs.setdefault((module, attr), block)
    # Started together, waited for together: each --help is mostly the imports.
    helps = {module: subprocess.Popen([sys.executable, "-m", module, "--help"], cwd=ROOT, env=_env(),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for module in modules}
    for module, proc in helps.items():
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            problems.append(f"{modules[module].where}: python -m {module} --help exits {proc.returncode}: {err[-500:]}")
    # A placeholder (mymodule:my_job) is not a repository module: only ours are resolved.
    ours = [(m, a) for m, a in jobs if (ROOT / m.split(".")[0]).is_dir()]
    check = (f"import importlib\nfor m, a in {ours!r}:\n    try:\n        getattr(importlib.import_module(m), a)\n"
             "    except Exception as e:\n        print(m, a, repr(e)[:300])\n")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    for line in done.stdout.splitlines():
        module, attr, error = line.split(" ", 2)
        problems.append(f"{jobs[module, attr].where}: --job {module}:{attr} does not resolve: {error}")
    if done.returncode != 0:
        problems.append(f"resolving --job targets failed: {done.stderr[-500:]}")
    return problems


def test_bash_blocks_name_real_scripts_modules_and_jobs() -> None:
    problems = bash_problems(PAGES)
    assert not problems, "\n".join(problems)


def test_extractor_and_checks_on_a_made_up_page(tmp_path: Path) -> None:
    """The extractor dedents a block in a list item and reads its no-run marker; the bash
    check reports a missing script, a module that does not exist and a job that does not."""
    page = tmp_path / "page.md"
    page.write_text("- item:\n  <!-- no-run: needs a cluster -->\n  ```python\n  x = 1\n  ```\n\n"
                    "```bash\nbash platform/no-such.sh\n.venv/bin/python -m operators.no_such --help\n"
                    ".venv/bin/python -m dkvstream.operators.tools.run_job "
                    "--job dkvstream.examples.flights:no_such_job \\\n"
                    "    --in-process\n```\n")
    python, bash = code_blocks(page)
    assert (python.lang, python.line, python.source, python.no_run) == ("python", 3, "x = 1\n", "needs a cluster")
    session = [python, Block("p.md", 9, "python", "y = x + 1\n", None), Block("p.md", 12, "python", "print(z)\n", None)]
    failed = run_session(session, tmp_path)  # names of earlier blocks are there; z is not
    assert failed.startswith("p.md:12 ('print(z)')") and "NameError: name 'z'" in failed, failed
    problems = bash_problems([page])
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == [
        "platform/no-such.sh", "python", "--job"], problems
    assert "operators.no_such" in problems[1] and "dkvstream.examples.flights:no_such_job" in problems[2]
