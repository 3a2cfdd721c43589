"""Every module of singa_lite imports alone, first thing in a fresh interpreter, and no two modules import
each other at import time.

A cycle among modules makes the result of ``import singa_lite.X`` depend on which module of the cycle was
imported first (the other one sees a half-initialised module), so it is a bug even where it happens to work.
The static check reads the imports that run when a module is imported (module level, class bodies, ``if`` /
``try`` blocks; not function bodies, which run later, nor ``if TYPE_CHECKING:`` blocks) and looks for
strongly connected components of that graph. ``from pkg import sub`` counts as an import of pkg.sub only;
the implicit import of a submodule's parent packages is not counted (a package's ``__init__`` importing its
own submodules is how packages are built, not a cycle).
"""
from __future__ import annotations

import ast
import concurrent.futures
import importlib.util
import os
import pathlib
import subprocess
import sys


import singa_lite

PACKAGE_DIR = pathlib.Path(singa_lite.__file__).parent


# ---------------------------------------------------------------- the graph
def package_modules(package_dir: pathlib.Path, package: str) -> dict:
    """{dotted module name: path} of every .py file under package_dir (a package's name for __init__.py)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package] + list(path.relative_to(package_dir).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _import_time_statements(body) -> list:
    """The import statements among `body` that run when the module is imported."""
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue  # runs when called, after every module was imported
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found += _import_time_statements(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody"):
            found += _import_time_statements(getattr(node, field, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            found += _import_time_statements(handler.body)
    return found


def import_graph(modules: dict, is_other_module=None) -> dict:
    """{module: set of the modules (of `modules`) it imports at import time}. is_other_module(name) says
    whether a dotted name that is not in `modules` is a module all the same (a compiled extension such as
    singa_lite._core): an edge to nothing, rather than to its package."""
    is_other_module = is_other_module or (lambda name: False)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _import_time_statements(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    edges.add(sub)
                elif target in modules and not (modules[target].name == "__init__.py" and is_other_module(sub)):
                    edges.add(target)  # a name defined in that module (or package)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each a sorted list."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def describe(component, graph) -> str:
    members = set(component)
    return "; ".join(f"{m} imports {', '.join(sorted(graph[m] & members))}" for m in component)


def _is_compiled_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def singa_lite_graph() -> dict:
    return import_graph(package_modules(PACKAGE_DIR, "singa_lite"), _is_compiled_module)


# Packages that need an optional extra: (the module they need, the extra that installs it).
OPTIONAL_PACKAGES = {"singa_lite.sonnx": ("onnx", "onnx")}


# ---------------------------------------------------------------- the checks
def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(package_modules(PACKAGE_DIR, "singa_lite"))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")

    def run(name):
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120,
                           env=env)
        return name, r.returncode, r.stderr.strip().splitlines()[-3:]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, names))
    # a package on an optional extra: without the extra it must refuse to import, naming the extra to install
    missing = {pkg: extra for pkg, (dep, extra) in OPTIONAL_PACKAGES.items() if importlib.util.find_spec(dep) is None}

    def needs(name):
        return next((extra for pkg, extra in missing.items() if name == pkg or name.startswith(pkg + ".")), None)

    failed = [f"{name}: exit {rc}: {' | '.join(tail)}" for name, rc, tail in results if rc != 0 and not needs(name)]
    unexplained = [f"{name}: exit {rc}: {' | '.join(tail)}" for name, rc, tail in results
                   if needs(name) and (rc == 0 or f"singa_lite[{needs(name)}]" not in " ".join(tail))]
    assert len(results) > 20  # the walk found the package
    assert not failed, "modules that do not import alone:\n" + "\n".join(failed)
    assert not unexplained, "modules of an optional extra that import without it, or fail without naming it:\n" + \
        "\n".join(unexplained)


def test_no_import_cycle():
    graph = singa_lite_graph()
    found = cycles(graph)
    assert not found, "import cycles among singa_lite's modules (at import time):\n" + "\n".join(
        describe(c, graph) for c in found)


def test_autograd_is_a_facade_over_the_layers():
    # engine <- operators <- layer <- autograd: the engine imports no operator, the operators no layer, and
    # nothing imports autograd back (it only re-exports); autograd <-> operators <-> layer was a cycle
    graph = singa_lite_graph()
    ops = {m for m in graph if m == "singa_lite.ops" or m.startswith("singa_lite.ops.")}
    assert len(ops) > 5  # the package and its modules
    assert not graph["singa_lite.engine"] & (ops | {"singa_lite.layer", "singa_lite.autograd"})
    for m in ops:
        assert not graph[m] & {"singa_lite.layer", "singa_lite.autograd"}, m
    assert "singa_lite.autograd" not in graph["singa_lite.layer"]
    assert {"singa_lite.engine", "singa_lite.ops", "singa_lite.layer"} <= graph["singa_lite.autograd"]


def test_the_former_cycles_are_one_way():
    # DistOpt builds on the optimizers (optim/), and opt (SINGA's façade) resolves opt.DistOpt through the
    # module's __getattr__; holder imports nccl, not the other way
    graph = singa_lite_graph()
    assert "singa_lite.optim.optimizer" in graph["singa_lite.parallel.dist_opt"]
    assert "singa_lite.opt" not in graph["singa_lite.parallel.dist_opt"]
    assert "singa_lite.parallel.dist_opt" not in graph["singa_lite.opt"]
    assert "singa_lite.comm.nccl" in graph["singa_lite.comm.holder"]
    assert "singa_lite.comm.holder" not in graph["singa_lite.comm.nccl"]
    tree = ast.parse((PACKAGE_DIR / "comm" / "nccl.py").read_text())
    lazy = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "holder"]
    assert not lazy, f"comm/nccl.py imports holder again (line {lazy}); holder imports nccl"


def _every_import(path: pathlib.Path) -> list:
    """(line, module text) of every import statement in the file, function bodies included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")
                          + ":" + ",".join(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def test_the_communication_layer_sits_below_the_data_parallel_wrappers():
    # comm/ (communicators, backends, bootstraps, launcher) knows nothing of parallel/ (DistOpt, ddp, the
    # wrappers), not even inside a function; parallel/ uses comm; dist is only comm's façade
    for path in sorted((PACKAGE_DIR / "comm").glob("*.py")):
        bad = [(line, text) for line, text in _every_import(path) if "parallel" in text or "dist_opt" in text]
        assert not bad, f"comm/{path.name} imports the data-parallel layer: {bad}"
    graph = singa_lite_graph()
    assert "singa_lite.comm" in graph["singa_lite.dist"]
    assert not {m for m in graph["singa_lite.dist"] if m.startswith("singa_lite.parallel")}
    assert "singa_lite.comm.communicator" in graph["singa_lite.parallel.lowlevel"]  # DistOpt's SINGA calls
    assert not (PACKAGE_DIR / "dist").exists(), "a folder named dist is where packaging tools write wheels"


def _names_autograd(text: str) -> bool:
    """Whether an import as _every_import writes it ("module" or "module:name,name") imports singa_lite.autograd."""
    module, _, names = text.partition(":")
    if module.split(".")[-1] == "autograd" and module.strip(".") in ("autograd", "singa_lite.autograd"):
        return True
    return module.strip(".") in ("", "singa_lite") and "autograd" in names.split(",")


def test_the_optimizers_and_layers_sit_below_the_data_parallel_wrappers():
    # optim/ and layer/ know nothing of parallel/ (DistOpt, ddp, SyncBatchNorm2d), not even inside a function,
    # and library code does not import the autograd façade (which re-exports the engine, operators and layers)
    for folder in ("optim", "layer"):
        for path in sorted((PACKAGE_DIR / folder).glob("*.py")):
            bad = [(line, text) for line, text in _every_import(path) if "parallel" in text]
            assert not bad, f"{folder}/{path.name} imports the data-parallel layer: {bad}"
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE_DIR:
            continue  # the package imports autograd for SINGA's `from singa import layer` order
        bad = [(line, text) for line, text in _every_import(path) if _names_autograd(text)]
        assert not bad, f"{path.relative_to(PACKAGE_DIR)} imports the autograd façade: {bad}"


def test_the_cycle_finder_on_a_small_package(tmp_path):
    # a <-> b at module level (through a class body and a try block), c imports a only inside a function,
    # d imports a under TYPE_CHECKING, e imports the package's compiled module `_ext`, and pkg/__init__
    # imports its submodules (not a cycle: parents are not counted)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {
        "__init__.py": "from . import a, c\nVERSION = 1\n",
        "a.py": "class A:\n    from . import b\n",
        "b.py": "try:\n    from .a import A\nexcept ImportError:\n    pass\n",
        "c.py": "def f():\n    from . import a\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
        "e.py": "from . import _ext\nfrom . import VERSION\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = package_modules(pkg, "pkg")
    graph = import_graph(modules, lambda name: name == "pkg._ext")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.c"] == set() and graph["pkg.d"] == set()
    assert graph["pkg.e"] == {"pkg"}  # VERSION is the package's own name; _ext a module outside the graph
    assert graph["pkg"] == {"pkg.a", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert describe(["pkg.a", "pkg.b"], graph) == "pkg.a imports pkg.b; pkg.b imports pkg.a"
