"""The analysis package's rooms: one job per module, imports that flow one way.

Read from the source, so that an import inside a function or under ``TYPE_CHECKING``
counts as much as one at the top: no circle among the analysis modules, the collector
and storage never name the analysis, and settings come from ``veil.server.settings``,
not from the command line. (Sizes: tests/test_module_sizes.py.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import veil.server
import veil.server.analysis
import veil.simulations

SERVER = Path(veil.server.__file__).parent
ANALYSIS = Path(veil.server.analysis.__file__).parent
PACKAGE = "veil.server.analysis"


def imported(path: Path) -> Iterator[tuple[str, str | None]]:
    """Every ``(module, name)`` the file imports, wherever the import statement stands
    (``name`` is None for ``import module``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, alias.name) for alias in node.names)


def analysis_edges() -> dict[str, set[str]]:
    """Each analysis module's analysis imports (a lazy name of the package counts as an
    import of the module that defines it)."""
    modules = {path.stem for path in ANALYSIS.glob("*.py") if path.stem != "__init__"}
    exports = veil.server.analysis._EXPORTS
    edges: dict[str, set[str]] = {}
    for stem in modules:
        targets = edges.setdefault(stem, set())
        for module, name in imported(ANALYSIS / f"{stem}.py"):
            if module.startswith(PACKAGE + "."):
                targets.add(module.removeprefix(PACKAGE + ".").split(".")[0])
            elif module == PACKAGE and name in modules:
                targets.add(name)
            elif module == PACKAGE and name in exports:
                targets.add(exports[name].removeprefix(PACKAGE + "."))
    return edges


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports as a path that returns to its first module, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target] if target in path else [node, target]
            if target not in state and (circle := visit(target, [*path, target])):
                return circle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (circle := visit(start, [start])):
            return circle
    return None


def test_the_analysis_modules_import_one_another_without_a_circle() -> None:
    edges = analysis_edges()
    assert find_circle(edges) is None, " -> ".join(find_circle(edges) or [])
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_charts_know_no_result_class_and_the_decoders_no_output() -> None:
    edges = analysis_edges()
    assert {"api", "tables", "charts", "files", "results", "sources"} <= set(edges)
    assert edges["charts"] <= {"cost", "tables"}
    assert edges["tables"] <= {"cost", "stats"}
    outputs = {"charts", "files", "api", "sources", "cli", "daily"}
    for decoder in ("strings", "string_summary", "closed_form", "oracles", "discovery"):
        assert not edges[decoder] & (outputs - {"charts"}), decoder


def test_collector_and_storage_never_import_the_analysis_nor_settings_from_the_cli() -> None:
    for part in ("collector", "storage"):
        for path in (SERVER / part).rglob("*.py"):
            names = {module for module, _ in imported(path)}
            assert not {name for name in names if name.startswith(PACKAGE)}, path
    for path in ANALYSIS.glob("*.py"):
        if path.stem != "cli":
            assert not {module for module, _ in imported(path)
                        if module.startswith("veil.server.cli")}, path
    for module, name in imported(SERVER / "collector" / "cli.py"):
        assert (module, name) != ("veil.server.cli.options", "ENVIRONMENT")
