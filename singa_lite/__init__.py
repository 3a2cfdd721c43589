"""singa_lite: data-parallel distributed training in the style of Apache SINGA.

The C++ tensor core lives in ``singa_lite._core``; the SINGA-compatible API is in ``tensor`` and
``device``.
"""
from __future__ import annotations

__version__ = "0.1.0"


def _thread_defaults() -> None:
    # One thread pool: GEMMs are split over singa_lite's OpenMP threads, each calling OpenBLAS on a single
    # thread (csrc/cpu/matmul.cpp), so OpenBLAS needs no threads of its own. With two pools taking turns
    # on the same cores, each pool's idle workers spun while the other worked, and every GEMM of a CNN
    # training step ran about twice as slow as alone (docs/benchmarks.md). Set before OpenBLAS loads, since
    # it reads the variable once; the thread count is OMP_NUM_THREADS or device.set_num_threads().
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
