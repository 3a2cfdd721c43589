"""What the extension module shares with the rest of the process. Nothing from a static archive linked into it (our
core, the static CUDA runtime, and libstdc++ where the compiler links it statically) may be exported: the first GPU
machine's GCC links libstdc++ statically, and its exported process-wide symbols bound to numpy's libstdc++ when
numpy was imported first, so `import singa_lite` crashed in `ostream << int` (docs/gpu.md, "Results")."""
import shutil
import subprocess
import sys

import pytest

from singa_lite import _core


def _exported(path: str) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if len(line.split()) == 3]


def test_the_extension_exports_its_entry_point_only():
    # csrc/bindings/exports.map; before it, ~2000 symbols of a static libstdc++ on such a toolchain, and here
    # our core's functions, std:: template instances and CUB's process-wide (STB_GNU_UNIQUE) guard variables
    names = _exported(_core.__file__)
    assert names == ["PyInit__core"], f"{len(names)} symbols exported, e.g. {names[:5]}"


def test_import_after_numpy_and_messages_with_numbers():
    # The crash's path: numpy's libstdc++ loaded first, then singa_lite's import sets the CUDA library folders
    # (strings built with numbers), then an error message with numbers.
    code = """
import numpy
import singa_lite
from singa_lite import _core, tensor
if _core.cuda_compiled():
    _core.set_cublas_dir("/nonexistent")
    _core.set_cudnn_dir("/nonexistent")
    print(_core.cublas_status()[:20])
try:
    tensor.from_numpy(numpy.ones((2, 3), numpy.float32)) + tensor.from_numpy(numpy.ones((4, 5), numpy.float32))
except ValueError as e:
    print("error message:", e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "error message:" in p.stdout and "3" in p.stdout.split("error message:")[1], p.stdout
