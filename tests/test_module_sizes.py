"""Rooms a reader can take in: no module of the four packages over 600 lines, no class over
400, no function over 80 (docs/architecture.md). A function made only of data literals, such
as the OpenAPI document, is exempt: it is read as data, not followed as logic."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("client", "server", "shared", "simulations")
LIMITS = {"module": 600, "class": 400, "function": 80}


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


LITERALS = (ast.Dict, ast.List, ast.Tuple, ast.Constant)


def is_data_literal(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function, past its docstring, only names literals and returns one."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    for statement in body:
        value = getattr(statement, "value", None)
        if not (isinstance(statement, ast.Assign | ast.AnnAssign | ast.Return)
                and isinstance(value, LITERALS)):
            return False
    return bool(body) and isinstance(body[-1], ast.Return)


def oversized(path: Path) -> Iterator[str]:
    source = path.read_text(encoding="utf-8")
    if source.count("\n") > LIMITS["module"]:
        yield f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            kind = "class"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if is_data_literal(node):
                continue
            kind = "function"
        else:
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > LIMITS[kind]:
            yield f"{path.relative_to(ROOT)}: {kind} {node.name} has {length} lines"


def test_the_packages_are_found() -> None:
    assert len(list(sources())) > 100


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_classes_and_functions_keep_to_their_sizes(package: str) -> None:
    found = [problem for path in sorted((ROOT / package).rglob("*.py"))
             for problem in oversized(path)]
    assert found == [], "over the limits " + str(LIMITS) + ":\n" + "\n".join(found)


def test_a_data_literal_is_exempt_and_logic_is_not() -> None:
    literal = ast.parse('def f():\n    """doc"""\n    return {"a": 1}\n').body[0]
    logic = ast.parse("def f():\n    x = g()\n    return {'a': x}\n").body[0]
    assert isinstance(literal, ast.FunctionDef) and isinstance(logic, ast.FunctionDef)
    assert is_data_literal(literal) and not is_data_literal(logic)
