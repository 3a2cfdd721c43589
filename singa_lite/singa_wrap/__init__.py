"""SINGA's low-level module, as SINGA scripts and tests import it: ``from singa import singa_wrap as singa``.

    from singa_lite import singa_wrap as singa
    nccl_id = singa.NcclIdHolder()      # in the parent, before starting the processes
    y = singa.SoftMax(x.data, 1)        # x a tensor.Tensor: .data is the C++ tensor, singa.Tensor

What is here:

- build flags ``USE_CUDA``, ``USE_DIST``, ``USE_NCCL`` and ``NcclIdHolder``;
- ``Tensor``: SINGA's C++ tensor is ours, ``singa_lite._core.Tensor`` (what ``tensor.Tensor.data`` holds). Besides
  our own names it has SINGA's C++ ones (``Size()``, ``nDim()``, ``data_type()``, ``AsType``, ``ToDevice``,
  ``GetFloatValue(n)``, ``CopyFloatDataFromHostPtr`` ...; csrc/bindings/bind_tensor.cpp). ``t.shape`` is a tuple
  that may also be called, ``t.shape()``, and ``t.device`` a Device that returns itself when called, so SINGA's
  ``t.shape()`` / ``t.device()`` and our ``t.shape`` / ``t.device`` are the same values;
- the dtype constants ``kFloat32``, ``kFloat16``, ``kInt``, ``kDouble`` (our ``DType`` values, so they can be
  passed wherever a dtype is taken) and ``VecTensor``, a list of raw tensors;
- SINGA's free functions on raw tensors (:mod:`singa_lite.singa_wrap.ops`) and its operation handles
  (:mod:`singa_lite.singa_wrap.handles`; the cuDNN-named ones in CUDA builds only, as in SINGA).

Not provided: SINGA's 8-bit dtypes ``kChar`` / ``kUChar`` (singa_lite has no 8-bit integer type; asking for
them says so), ``Tensor.RepeatData``, ``Acos`` / ``Asin`` / ``Atan`` (the core has no arctangent kernel),
and the cuDNN RNN (``CudnnRNNHandle``, ``GpuRNN*``).
"""
from __future__ import annotations

from .. import _core
from . import handles as _handles, ops as _ops
from .handles import (BatchNormHandle, ConvHandle, CpuBatchNormBackwardx, CpuBatchNormForwardInference,
                            CpuBatchNormForwardTraining, CpuConvBackwardb, CpuConvBackwardW, CpuConvBackwardx,
                            CpuConvForward, CpuPoolingBackward, CpuPoolingForward, PoolingHandle)
from .ops import *  # noqa: F401,F403 - SINGA's function names, listed in ops.__all__
from .ops import __all__ as _OPS
from ..comm import nccl as _nccl
from ..comm.holder import NcclIdHolder

USE_CUDA = bool(_core.cuda_compiled())
USE_DIST = True  # the mpi and shm backends are always built; nccl needs a CUDA build with NCCL
USE_NCCL = _nccl.available()  # a CUDA build whose NCCL library loads (it is opened at run time)

Tensor = _core.Tensor

# SINGA's DataType names as our dtypes (SINGA numbers them 0, 1, 2, 4; scripts compare and pass them by name).
kFloat32 = _core.DType.float32
kFloat16 = _core.DType.float16
kInt = _core.DType.int32
kDouble = _core.DType.float64

if USE_CUDA:
    for _name in _handles.GPU_NAMES:
        globals()[_name] = getattr(_handles, _name)


class VecTensor(list):
    """SWIG's ``std::vector<Tensor>``: a list that holds raw tensors only (``append``, indexing, ``len``)."""

    def __init__(self, tensors=()):
        super().__init__()
        for t in tensors:
            self.append(t)

    def append(self, t) -> None:
        super().append(_ops.raw_arg(t, "VecTensor.append"))

    def push_back(self, t) -> None:  # std::vector's name, which SWIG also exposes
        self.append(t)


def SizeOf(dtype) -> int:  # noqa: N802 - SINGA's name
    """Bytes per element of a dtype constant."""
    if not isinstance(dtype, _core.DType):
        raise TypeError(f"SizeOf: expected a dtype constant such as singa_wrap.kFloat32, got {dtype!r}")
    return dtype.itemsize


def Product(shape, start: int = 0, len: int = 0) -> int:  # noqa: N802,A002 - SINGA's names
    """The product of shape[start : start + len] (all of it from `start` when len is 0)."""
    dims = list(shape)[start:] if len == 0 else list(shape)[start:start + len]
    p = 1
    for d in dims:
        p *= int(d)
    return p


_UNSUPPORTED_DTYPES = {"kChar": "int8", "kUChar": "uint8"}


def __getattr__(name):
    if name in _UNSUPPORTED_DTYPES:
        raise AttributeError(f"singa_wrap.{name}: singa_lite has no {_UNSUPPORTED_DTYPES[name]} dtype (it stores "
                             f"float16/32/64, int32, int64 and bool); use kInt for integers")
    raise AttributeError(f"module 'singa_wrap' has no attribute {name!r}")


__all__ = (["BatchNormHandle", "ConvHandle", "CpuBatchNormBackwardx", "CpuBatchNormForwardInference",
            "CpuBatchNormForwardTraining", "CpuConvBackwardb", "CpuConvBackwardW", "CpuConvBackwardx",
            "CpuConvForward", "CpuPoolingBackward", "CpuPoolingForward", "NcclIdHolder", "PoolingHandle",
            "Product", "SizeOf", "Tensor", "USE_CUDA", "USE_DIST", "USE_NCCL", "VecTensor", "kDouble",
            "kFloat16", "kFloat32", "kInt"] + list(_OPS) + (list(_handles.GPU_NAMES) if USE_CUDA else []))
