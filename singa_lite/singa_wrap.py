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

__all__ = ["NcclIdHolder", "USE_CUDA", "USE_DIST", "USE_NCCL"]
