"""singa_lite: data-parallel distributed training in the style of Apache SINGA.

The C++ tensor core lives in ``singa_lite._core``; the SINGA-compatible API is in ``tensor`` and
``device``.
"""
from __future__ import annotations

__version__ = "0.1.0"


def _thread_defaults() -> None:
    # Our OpenMP kernels and OpenBLAS's own threads take turns on the same cores (a GEMM, then
    # element-wise work, then a GEMM...). By default both keep idle workers spinning for a long while, so
    # each slows the other down: measured 8.9 ms instead of 1.4 ms for a 512 GEMM plus a 1e6 add on 2 cores
    # (docs/benchmarks.md). Short spins hand the cores over quickly: OpenBLAS workers spin 2^16 cycles
    # (~25 us: long enough to stay hot across back-to-back GEMMs, 2^4 made a 256 GEMM 5-10% slower), OpenMP
    # workers 10k rounds. Set before libgomp and OpenBLAS load, since both read them once; a user's own
    # settings win.
    import os

    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")


_thread_defaults()


def _preload_openblas() -> None:
    # _core links libscipy_openblas.so from the scipy-openblas32 wheel. Loading it first, globally, lets
    # the dynamic linker resolve that dependency wherever pip put the wheel (editable installs included).
    import ctypes
    import os

    import scipy_openblas32

    lib_dir = scipy_openblas32.get_lib_dir()
    name = scipy_openblas32.get_library(fullname=True)
    ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)


_preload_openblas()

from . import _core  # noqa: E402
from ._core import CudaError  # noqa: E402


def build_info() -> dict:
    """What this build compiled in (BLAS, CUDA, cuDNN, NCCL, with versions) and what the runtime sees."""
    info = _core.build_info()
    info["version"] = __version__
    return info


from . import device, tensor  # noqa: E402,F401

__all__ = ["build_info", "CudaError", "device", "tensor", "__version__"]
