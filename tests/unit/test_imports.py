"""Every public module imports first thing in a fresh interpreter, as SINGA scripts do
(``from singa import layer, model`` was a circular-import error when layer came first)."""
import subprocess
import sys

import pytest

MODULES = ["layer", "model", "autograd", "opt", "tensor", "device", "ops", "ops.nn", "data", "parallel.ddp",
           "parallel", "checkpoint", "dist", "comm", "parallel.multi_device", "singa_wrap"]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_first(module):
    package, _, name = f"singa_lite.{module}".rpartition(".")
    r = subprocess.run([sys.executable, "-c", f"from {package} import {name}"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_seed_first_line():
    r = subprocess.run([sys.executable, "-c", "from singa_lite import layer, model, opt, tensor, device, autograd"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
