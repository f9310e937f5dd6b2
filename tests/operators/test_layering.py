"""The packages' layering, read from the imports of every module (``ast``, so imports
inside functions and under ``TYPE_CHECKING`` count too):

* ``dkvstream.operators.api`` (what a job is written against) imports nothing from
  ``dkvstream.operators.runtime`` or ``dkvstream.operators.spark``, nor pyspark;
* ``dkvstream.operators.runtime`` reaches Spark only through its exchange: it imports no pyspark,
  and from ``dkvstream.operators.spark`` only its exchanges (``SparkExchange``, and the
  long-lived tasks' ``Coordinator``, ``TaskConfig`` and ``LongLivedExchange``);
* event time (``dkvstream.operators.runtime.event_time``), which bounded and live jobs share,
  imports nothing of the live loop (``dkvstream.operators.runtime.live``), and neither do the
  read and exchange stages every job runs.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The exchange, and the Spark form of the driver's publish tasks beside it in its module.
RUNTIME_TO_SPARK = {("dkvstream.operators.spark.stage", "SparkExchange"),
                    ("dkvstream.operators.spark.stage", "map_in_tasks"),
                    ("dkvstream.operators.spark.long_lived", "Coordinator"),
                    ("dkvstream.operators.spark.long_lived", "TaskConfig"),
                    ("dkvstream.operators.spark.long_lived", "task_slots"),
                    ("dkvstream.operators.spark.long_lived", "LongLivedExchange"),
                    ("dkvstream.operators.spark.long_lived", "retryable")}


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """Every import of a module, as ``(line, module, name)``: ``name`` is None for
    ``import module``, else the name of ``from module import name``."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; the project imports absolutely"
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def offending(path: Path, packages: tuple[str, ...], allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """The imports of ``path`` that reach into ``packages`` (``from package import
    module`` included), but for the ``(module, name)`` pairs in ``allowed``."""
    def within(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{where}:{line}: " + (f"from {module} import {name}" if name else f"import {module}")
            for line, module, name in imports(path)
            if (module, name) not in allowed and (within(module) or (name and within(f"{module}.{name}")))]


def modules(package: str) -> list[Path]:
    """The modules of ``package`` (``dkvstream.<folder>...``: the checkout's ``<folder>/...``)."""
    found = sorted((ROOT / package.removeprefix("dkvstream.").replace(".", "/")).rglob("*.py"))
    assert found, package
    return found


@pytest.mark.parametrize("path", modules("dkvstream.operators.api"), ids=lambda p: p.name)
def test_api_imports_neither_runtime_nor_spark(path: Path) -> None:
    bad = offending(path, ("dkvstream.operators.runtime", "dkvstream.operators.spark", "pyspark"))
    assert not bad, "dkvstream.operators.api must not depend on the runtime or Spark:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", modules("dkvstream.operators.runtime"), ids=lambda p: p.name)
def test_runtime_reaches_spark_only_through_its_exchange(path: Path) -> None:
    bad = offending(path, ("dkvstream.operators.spark", "pyspark"), RUNTIME_TO_SPARK)
    assert not bad, ("dkvstream.operators.runtime reaches Spark only through "
                     "dkvstream.operators.spark.stage.SparkExchange:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("name", ["event_time", "splits", "exchange"])
def test_event_time_stands_apart_from_the_live_loop(name: str) -> None:
    bad = offending(ROOT / "operators" / "runtime" / f"{name}.py", ("dkvstream.operators.runtime.live",))
    assert not bad, ("event time and the stages every job runs must not depend on the live loop "
                     "(dkvstream.operators.runtime.live):\n" + "\n".join(bad))


def test_the_rules_see_a_forbidden_import(tmp_path: Path) -> None:
    """The parser finds imports at any depth, both forms."""
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from dkvstream.operators.runtime import timers\n"
                      "def f():\n    import pyspark.sql\n")
    bad = offending(module, ("dkvstream.operators.runtime", "pyspark"))
    assert [b.split(": ", 1)[1] for b in bad] == ["from dkvstream.operators.runtime import timers",
                                                  "import pyspark.sql"]
    assert offending(module, ("dkvstream.operators.runtime.timers",)) == bad[:1]  # from package import module
    assert offending(module, ("pyspark",), {("dkvstream.operators.runtime", "timers")}) == bad[1:]
