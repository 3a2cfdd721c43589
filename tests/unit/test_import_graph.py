"""The shape of the Python package, checked from the source (issue 35): no import circle between singa_lite's
modules, counting every import statement (inside functions too) and the packages an import runs; no private
name of one module used by another; at most 20 modules directly in singa_lite/; no module over 800 lines.

Old import paths kept for a release (singa_lite/_moved.py) are resolved by name, not by import statements, so
they are not edges here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_import_alone import cycles as circles  # Tarjan's strongly connected components, shared

PACKAGE = Path(__file__).resolve().parents[2] / "singa_lite"
ROOT = "singa_lite"
MAX_TOP_MODULES = 20
MAX_LINES = 800
# SINGA's own names that begin with an underscore, which scripts use through the package that re-exports them
SINGA_PRIVATE_NAMES = {"_call_singa_func"}
EXTENSION = "_core"  # the C++ extension module: private to the package, imported by its modules


def _modules() -> dict:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def _resolve(module: str, path: Path, level: int, target: str | None) -> str:
    if not level:
        return target or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _with_parents(name: str) -> list:
    # importing a.b.c runs a.b's __init__ too; the root package is left out: it is the façade that imports
    # the public modules, and every module is inside it
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(2, len(parts) + 1)]


def imports(module: str) -> dict:
    """{imported singa_lite module: [line numbers]} for every import statement of `module`."""
    path = MODULES[module]
    found: dict = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node.level, node.module)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            if not name.startswith(ROOT):
                continue
            for target in _with_parents(name):
                if target in MODULES and target != module and not module.startswith(target + "."):
                    found.setdefault(target, []).append(node.lineno)
    return found


def test_no_import_circle_counting_imports_inside_functions():
    graph = {m: imports(m) for m in MODULES if m != ROOT}
    graph = {m: {t: lines for t, lines in edges.items() if t != ROOT} for m, edges in graph.items()}
    found = circles(graph)
    report = []
    for comp in found:
        members = set(comp)
        report.append("circle: " + ", ".join(comp))
        for m in comp:
            for t, lines in sorted(graph[m].items()):
                if t in members:
                    report.append(f"  {MODULES[m].relative_to(PACKAGE.parent)}:{lines[0]} imports {t}")
    assert not found, "\n".join(report)


def test_the_checker_finds_a_circle_hidden_in_a_function():
    assert circles({"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [9]}, "d": {"a": [1]}}) == [["a", "b", "c"]]
    assert circles({"a": {"b": [1]}, "b": {}}) == []


def _private_uses(module: str) -> list:
    """(line, 'alias._name') where `module` reads a private name of another singa_lite module."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases, uses = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node.level, node.module)
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif base in MODULES and a.name.startswith("_") and not a.name.startswith("__") \
                        and base != module and a.name not in SINGA_PRIVATE_NAMES | {EXTENSION}:
                    uses.append((node.lineno, f"from {base} import {a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            target = aliases[node.value.id]
            if node.attr.startswith("_") and not node.attr.startswith("__") and target != module:
                uses.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return uses


def test_no_module_uses_a_private_name_of_another():
    found = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line}: {what}"
             for m in sorted(MODULES) for line, what in _private_uses(m)]
    assert not found, "private names used across modules (give what is shared a public name):\n" + "\n".join(found)


def test_at_most_20_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules directly in singa_lite/ (at most {MAX_TOP_MODULES}): {top}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_800_lines(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]}: {lines} lines (at most {MAX_LINES}): split it by responsibility"
