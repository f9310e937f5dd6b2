"""The event columns have one home, ``dkvstream.operators.api.columns``: no other module of
the package, the examples, the benchmarks or the tests defines a constant holding one of
their names, and the names beginning with ``_`` appear as literals nowhere else in the
code (read with ``ast``, docstrings aside; tests may spell them out, as the contract they
check)."""
from __future__ import annotations

import ast
from pathlib import Path

from dkvstream.operators.api import columns

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "operators" / "api" / "columns.py"
NAMES = {value for name, value in vars(columns).items() if name.endswith("_COLUMN")}
RESERVED = {n for n in NAMES if n.startswith("_")}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def offences(path: Path, literals: bool = True) -> list[str]:
    """Where ``path`` names an event column by literal: a module-level constant set to a
    column name, or (with ``literals``) any literal equal to one of the ``_`` names."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
                and node.value.value in NAMES):
            found.append(f"{where}:{node.lineno}: constant {node.value.value!r}")
    docstrings = _docstrings(tree)
    for node in ast.walk(tree) if literals else ():
        if (isinstance(node, ast.Constant) and node.value in RESERVED and id(node) not in docstrings
                and not any(node is getattr(a, "value", None) for a in tree.body)):
            found.append(f"{where}:{node.lineno}: literal {node.value!r}")
    return sorted(set(found))


def test_column_names_are_defined_only_in_columns() -> None:
    assert {"key", "timestamp", "key_group", "_kg"} <= NAMES
    paths = [p for folder in ("operators", "examples", "assets", "bench", "tests")
             for p in sorted((ROOT / folder).rglob("*.py")) if p != HOME]
    bad = [o for p in paths for o in offences(p, literals=not p.is_relative_to(ROOT / "tests"))]
    assert not bad, ("event column names belong in dkvstream.operators.api.columns; import them from "
                     "there:\n" + "\n".join(bad))


def test_the_check_sees_a_copy(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Reads _offset."""\nKEY = "key"\nX = 1\n\ndef f(t):\n    return t["_kg"]\n')
    assert [o.split(": ", 1)[1] for o in offences(module)] == ["constant 'key'", "literal '_kg'"]
    assert [o.split(": ", 1)[1] for o in offences(module, literals=False)] == ["constant 'key'"]
