"""Old import paths of public modules and names that moved, kept working for one release.

An old path still imports (or an old attribute still resolves) and gives the object at its new place, with a
DeprecationWarning that names the new place. This table is the one record of what moved: add a line when
something public moves, and remove it the release after (CHANGELOG.md says which release that is).

The old paths are resolved by name (importlib), not by import statements, so that a module which used to hold a
name does not have to import the layer that holds it now: the layering test (tests/unit/test_import_graph.py)
stays free of circles.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

# Old module path -> new module path. One block per area, so that moves in different areas do not touch the
# same lines.
MODULES: dict[str, str] = {
    # data-parallel wrappers (moved into singa_lite.parallel)
    "singa_lite.ddp": "singa_lite.parallel.ddp",

    # operators (moved into singa_lite.ops)
    # (an old module whose names went to several of ops' modules gives the package, which has them all)
    "singa_lite.functional": "singa_lite.ops",
    "singa_lite.operators": "singa_lite.ops",
    "singa_lite.ops_math": "singa_lite.ops",
    "singa_lite.ops_shape": "singa_lite.ops",
    "singa_lite.nn_ops": "singa_lite.ops.nn",
    "singa_lite.ops_loss": "singa_lite.ops.loss",

    # tensors, the engine, the runtime, SINGA's C++-level API, checkpoints
    "singa_lite.tensor_compat": "singa_lite.tensor.compat",

    # optimizers and layers
    "singa_lite.amp": "singa_lite.optim.amp",
    "singa_lite.clip": "singa_lite.optim.clip",
    "singa_lite.layer_extra": "singa_lite.layer",
    "singa_lite.sync_batchnorm": "singa_lite.parallel.sync_batchnorm",
}

# (module, old attribute) -> "new.module:attribute", for names that left a module which still exists.
NAMES: dict[tuple[str, str], str] = {
    # operators

    # tensors, the engine, the runtime, SINGA's C++-level API, checkpoints

    # optimizers and layers
    ("singa_lite.layer", "SyncBatchNorm2d"): "singa_lite.parallel.sync_batchnorm:SyncBatchNorm2d",
}

RELEASE = "0.2.0"  # the release that drops the old paths


def _caller_stacklevel() -> int:
    # The first frame outside the import machinery and this module is the user's import or attribute access:
    # the warning points at it. warnings.warn itself does not count importlib's bootstrap frames.
    here = os.path.normcase(__file__)
    machinery = os.path.normcase(os.path.dirname(importlib.__file__))
    frame, level = sys._getframe(2), 2  # warnings.warn counts _warn as level 1
    while frame is not None:
        name = os.path.normcase(frame.f_code.co_filename)
        bootstrap = "importlib" in name and "_bootstrap" in name
        if not (bootstrap or name == here or name.startswith(machinery + os.sep)
                or frame.f_code.co_name == "__getattr__"):
            return level
        frame, level = frame.f_back, level + (0 if bootstrap else 1)
    return 1


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} has moved to {new}: import it from there. The old path keeps working until singa_lite "
                  f"{RELEASE}.", DeprecationWarning, stacklevel=_caller_stacklevel())


def attribute(module: str, name: str):
    """A moved name looked up at its old module (that module's ``__getattr__`` calls this)."""
    target = NAMES.get((module, name))
    if target is None:
        full = f"{module}.{name}"
        if full in MODULES:  # a moved submodule read as an attribute: singa_lite.ddp
            _warn(full, MODULES[full])
            return importlib.import_module(MODULES[full])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new_module, _, new_name = target.partition(":")
    _warn(f"{module}.{name}", f"{new_module}.{new_name}")
    return getattr(importlib.import_module(new_module), new_name)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module at its new path (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module):
        old = module.__spec__.name
        new = MODULES[old]
        _warn(old, new)
        # The import system returns what sys.modules holds after exec_module, so the old name gives the new
        # module itself: classes, state and isinstance checks are shared, not copied.
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Put the finder first, before the editable install's, which would otherwise claim files that moved."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
