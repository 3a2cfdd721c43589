"""singa_lite: data-parallel distributed training in the style of Apache SINGA.

The C++ tensor core lives in ``singa_lite._core``; the SINGA-compatible API is in ``tensor`` and
``device``.
"""
from __future__ import annotations

from ._version import __version__


def _preload_openblas() -> str:
    # _core links libscipy_openblas.so from the scipy-openblas32 wheel. Loading it first, globally, lets
    # the dynamic linker resolve that dependency wherever pip put the wheel (editable installs included).
    # It loads single-threaded, and only it (singa_lite/_runtime/threads.py): GEMMs are split over singa_lite's
    # OpenMP threads, each calling OpenBLAS on one thread (csrc/cpu/matmul.cpp), so this OpenBLAS needs no
    # threads of its own; two pools taking turns on the same cores made every GEMM of a CNN step about
    # twice as slow (docs/benchmarks/training.md). The thread count is OMP_NUM_THREADS or device.set_num_threads().
    import ctypes
    import os

    import scipy_openblas32

    from ._runtime.threads import single_threaded_openblas_load

    path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(fullname=True))
    with single_threaded_openblas_load():
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return path


from . import _moved  # noqa: E402

_moved.install()  # old import paths of moved modules keep working for a release (singa_lite/_moved.py)


def __getattr__(name: str):
    return _moved.attribute(__name__, name)


from ._runtime.malloc import settle_malloc  # noqa: E402
from ._runtime.threads import preset_numpy_blas, preset_openmp_spin  # noqa: E402

_MALLOC = settle_malloc()  # freed memory is reused, not faulted in again every step (singa_lite/_runtime/malloc.py)

preset_numpy_blas()  # first: nothing below may import numpy before it
preset_openmp_spin()  # before _core loads libgomp (singa_lite/_runtime/threads.py)
_OPENBLAS = _preload_openblas()

from . import _core  # noqa: E402
from ._core import CudaError  # noqa: E402


def _cuda_wheel_dirs() -> None:
    # A CUDA build opens cuBLAS, cuDNN (and NCCL) at run time, so that it imports without them. NVIDIA's wheels
    # put the libraries under site-packages/nvidia/: cu13/lib (CUDA 13 wheels) or cublas/lib (-cu12).
    # Tell the loader where they are; without the wheels it falls back to the system's library path.
    if not _core.cuda_compiled():
        return
    from ._runtime.wheels import nvidia_lib_dir

    folder = nvidia_lib_dir(("cu13/lib", "cublas/lib"), "libcublas.so")
    if folder is not None:
        _core.set_cublas_dir(folder)
    # cuDNN (nvidia-cudnn-cu13 / -cu12) keeps its libraries in nvidia/cudnn/lib; cu13/lib is where NVIDIA's newer
    # CUDA 13 wheels put theirs, so it is looked at too.
    folder = nvidia_lib_dir(("cudnn/lib", "cu13/lib"), "libcudnn.so")
    if folder is not None:
        _core.set_cudnn_dir(folder)


_cuda_wheel_dirs()


def build_info() -> dict:
    """What this build compiled in (BLAS, CUDA, cuDNN, NCCL, with versions) and what the runtime sees."""
    info = _core.build_info()
    info["version"] = __version__
    info["malloc"] = dict(_MALLOC)
    from .comm import nccl

    ok = nccl.available()
    info["nccl"] = {"compiled": nccl.compiled(), "version": nccl.version() if ok else None,
                    "status": "loaded" if ok else _core.nccl_unavailable_reason() if nccl.compiled() else
                    "not built (CPU-only build)"}
    from ._runtime import onednn

    info["onednn"] = {"used": onednn.ready(), "version": _core.onednn_version() or None, "status": onednn.status()}
    return info


from . import device, tensor  # noqa: E402,F401
# autograd before anything that imports layer: autograd re-exports the layer classes and layer uses autograd,
# so SINGA's usual first line, `from singa import layer, model`, must find autograd already importing.
from . import autograd  # noqa: E402,F401
from . import checkpoint  # noqa: E402,F401


def _calm_numpy_blas() -> None:
    # numpy is loaded by now (tensor imports it): its OpenBLAS's idle threads stop spinning between calls,
    # so that a training loop with numpy work between steps is not slowed by them (singa_lite/_runtime/threads.py).
    from ._runtime.threads import calm_numpy_blas

    calm_numpy_blas(_OPENBLAS)


_calm_numpy_blas()


def _bound_mpi_init_at_import() -> None:
    # Under mpiexec, a script's own `from mpi4py import MPI` starts MPI at that import, outside any timeout:
    # comm.mpi_setup installs a hook that makes it the same bounded MPI_Init as dist.init()'s. It is installed
    # when singa_lite.comm is imported; a script that imports singa_lite alone gets it here (only under mpiexec,
    # so other processes pay nothing).
    import os

    if any(v in os.environ for v in _MPI_LAUNCH_VARS):
        from .comm import mpi_setup  # noqa: F401


# mpiexec's variables (comm.mpi_setup.MPI_LAUNCH_VARS, which a test keeps equal): copied here so that a process
# that is not an MPI rank does not import the communication layer at `import singa_lite`.
_MPI_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


_bound_mpi_init_at_import()

__all__ = ["build_info", "checkpoint", "CudaError", "device", "tensor", "__version__"]
