"""Create a Dagster project with one dkvstream job, a source, a sink and a test::

    python -m dkvstream.operators.tools.new_project my_streams

makes ``my_streams/`` (the package name is the folder's name, ``-`` and spaces become
``_``)::

    my_streams/
      pyproject.toml          depends on dkvstream; [tool.dagster] names the definitions
      README.md               the commands below
      my_streams/jobs.py      the source (orders in memory), the operator (a running total
                              per customer), the sink (Parquet) and the job
      my_streams/definitions.py   defs = dkvstream_definitions(orders_job())
      tests/test_jobs.py      runs the job in process and checks its output against pandas

In the project: ``python -m pytest`` runs the test (seconds, no Spark), ``dagster dev``
shows the job as assets, ``python -m dkvstream.operators.tools.run_job --job
my_streams.jobs:orders_job`` runs it from the shell. Exit status 2 with a message when
the folder exists and is not empty, or its name is no Python package name.
"""
from __future__ import annotations

import argparse
import keyword
import os
import re
import sys

PYPROJECT = '''[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["dkvstream"]

[project.optional-dependencies]
test = ["pytest>=8"]

[tool.setuptools]
packages = ["{package}"]

[tool.dagster]
module_name = "{package}.definitions"

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
'''

README = '''# {name}

A Dagster project with one dkvstream job (`{package}/jobs.py`), made by
`python -m dkvstream.operators.tools.new_project`.

```bash
python -m pytest                 # runs the job in process, checks its output (no Spark)
dagster dev                      # the job as assets: materialize `{package}_totals`
python -m dkvstream.operators.tools.run_job --job {package}.jobs:orders_job --in-process
```

State, checkpoints and output go to `.dkvstream/` (or `$DKVSTREAM_STORE`, e.g.
`s3://bucket/prefix`). Replace `OrdersSource` with a `FileSource` or a Kafka source and
add operators; see the dkvstream documentation, "Using dkvstream in your own Dagster
project" and "Writing jobs".
'''

JOBS = '''"""The stream job of {name}: a running total of order amounts per customer.

The source is a bounded table in memory; the operator keeps one total per customer in
keyed state and emits it on every order; the sink writes Parquet files per epoch.
"""
import pyarrow as pa

from dkvstream import IntCodec, Job, Operator, ParquetSink, Source, ValueSpec

# ms since 1970, UTC
ORDERS = pa.table({{"key": [b"ada", b"bob", b"ada", b"cyd", b"bob", b"ada"],
                   "amount": [5, 7, 2, 9, 1, 4],
                   "timestamp": [1_000, 2_000, 3_000, 4_000, 5_000, 6_000]}})


class OrdersSource(Source):
    """One partition, ``p0``, holding the rows of ``ORDERS`` (offset = row number)."""

    value_schema = pa.schema([("amount", pa.int64())])

    def partitions(self):
        return ["p0"]

    def end_offsets(self):
        return {{"p0": ORDERS.num_rows}}

    def read(self, partition, start, end):
        return ORDERS.slice(start, end - start)


class RunningTotal(Operator):
    """Per customer: the total amount so far, emitted with every order."""

    name = "running_total"
    outputs = {{"main": pa.schema([("customer", pa.string()), ("total", pa.int64())])}}
    total = ValueSpec(IntCodec())  # keyed state: one int per customer

    def on_event(self, subject, event):
        total = self.total.state_for(subject)
        new = total.get(default=0) + event.value["amount"]
        total.set(new)
        subject.emit({{"customer": subject.key.decode(), "total": new}})


def orders_job() -> Job:
    """The job: ``OrdersSource`` -> ``RunningTotal`` -> Parquet sink ``{package}_totals``."""
    return Job(name="{package}", source=OrdersSource(), operators=[RunningTotal()],
               sinks={{"main": ParquetSink("{package}_totals")}}, events_per_epoch=2)
'''

DEFINITIONS = '''"""The Dagster definitions of {name} (``dagster dev`` loads them: pyproject.toml)."""
from dkvstream import dkvstream_definitions

from {package}.jobs import orders_job

defs = dkvstream_definitions(orders_job())
'''

TEST = '''"""The job's output against a pandas oracle, and the Dagster definitions load."""
from dagster import Definitions

from dkvstream import JobRunner
from {package}.definitions import defs
from {package}.jobs import ORDERS, orders_job


def test_running_totals_match_pandas(tmp_path) -> None:
    runner = JobRunner(orders_job(), spark=None, store=str(tmp_path / "store"))  # in process
    assert [r.epoch for r in runner.run()] == [1, 2, 3]  # 6 orders, 2 an epoch
    got = runner.job.sinks["main"].read(runner.store, runner.job.prefix).to_pandas()
    orders = ORDERS.to_pandas()
    want = sorted(zip(orders["key"].str.decode("utf-8"), orders.groupby("key")["amount"].cumsum()))
    assert sorted(zip(got["customer"], got["total"])) == want


def test_definitions_load() -> None:
    Definitions.validate_loadable(defs)
    assert "{package}" in {{job.name for job in defs.jobs}}
'''


def package_name(folder: str) -> str:
    """The Python package name of project folder ``folder``: its base name, lowercased,
    ``-``, ``.`` and spaces as ``_``.

    Raises:
        ValueError: the result is no identifier, a keyword, or ``dkvstream``.
    """
    name = re.sub(r"[-. ]", "_", os.path.basename(os.path.normpath(folder)).lower())
    if not name.isidentifier() or keyword.iskeyword(name) or name == "dkvstream":
        raise ValueError(f"{folder}: {name!r} is no usable Python package name; name the folder with "
                         f"letters, digits and _ (not starting with a digit), e.g. my_streams")
    return name


def create_project(folder: str) -> list[str]:
    """Write the project (module docstring) into ``folder``, created if missing.

    Returns:
        The paths written, relative to ``folder``.

    Raises:
        ValueError: ``folder`` exists and is not empty, or ``package_name`` refuses it.
    """
    package = package_name(folder)
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise ValueError(f"{folder}: exists and is not an empty folder; give a new folder")
    name = package.replace("_", "-")
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{package}/__init__.py": '"""{name}: a Dagster project with dkvstream jobs."""\n',
        f"{package}/jobs.py": JOBS,
        f"{package}/definitions.py": DEFINITIONS,
        "tests/test_jobs.py": TEST,
    }
    for rel, template in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(template.format(name=name, package=package))
    return list(files)


def main(argv: list[str] | None = None) -> int:
    """Create the project; 0 on success, 2 (with a message on stderr) on a refused folder."""
    p = argparse.ArgumentParser(prog="python -m dkvstream.operators.tools.new_project",
                                description="Create a Dagster project with one dkvstream job and its test.")
    p.add_argument("folder", help="the project folder to create (its name is the package name)")
    args = p.parse_args(argv)
    try:
        written = create_project(args.folder)
    except ValueError as e:
        print(f"new_project: {e}", file=sys.stderr)
        return 2
    for rel in written:
        print(os.path.join(args.folder, rel))
    print(f"next: cd {args.folder} && python -m pytest", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
