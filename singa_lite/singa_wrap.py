"""What SINGA scripts import as ``from singa import singa_wrap as singa``: build flags and NcclIdHolder.

    from singa_lite import singa_wrap as singa
    nccl_id = singa.NcclIdHolder()      # in the parent, before starting the processes
"""
from __future__ import annotations

from . import _core
from .dist import nccl as _nccl
from .dist.holder import NcclIdHolder

USE_CUDA = bool(_core.cuda_compiled())
USE_DIST = True  # the mpi and shm backends are always built; nccl needs a CUDA build with NCCL
USE_NCCL = _nccl.available()  # a CUDA build whose NCCL library loads (it is opened at run time)

# SINGA's C++ tensor (``Tensor.data``) and its in-place random fillers, as SINGA's tests call them.
Tensor = _core.Tensor


def Gaussian(mean, std, t):  # noqa: N802 - SINGA's name
    """Fills ``t`` (a ``singa_wrap.Tensor``) in place with N(mean, std) samples."""
    _core.gaussian_(t, mean, std)


def Uniform(low, high, t):  # noqa: N802 - SINGA's name
    """Fills ``t`` in place with U(low, high) samples."""
    _core.uniform_(t, low, high)


__all__ = ["Gaussian", "NcclIdHolder", "Tensor", "Uniform", "USE_CUDA", "USE_DIST", "USE_NCCL"]
