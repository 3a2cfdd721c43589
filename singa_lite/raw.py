"""Helpers on raw tensors (``_core.Tensor``), one home for each: zero-filled tensors, host copies both ways,
gradients handed to ``backward`` directly, masks; used by the engine, the operator modules and DistOpt.

SINGA's tests and scripts call ``op.backward(dy)`` themselves, with dy possibly a Python float (SINGA's
default ``dy=1.0``), None, or a tensor in another float dtype; :func:`grad_like` turns any of these into a
raw tensor matching the forward output. A few rarely used operators (index gathering, padding modes,
inverse trigonometry) compute through numpy on the host: on a CUDA tensor that is a copy each way, which
is acceptable for them and keeps one implementation.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import _core

CTensor = _core.Tensor
_CPU = _core.Device("cpu")


def grad_like(dy, shape, dtype, device) -> CTensor:
    """dy as a raw tensor of `dtype` on `device`: None or a number fills `shape` with it (None = 1)."""
    if dy is None or isinstance(dy, numbers.Number):
        g = CTensor(list(shape), dtype, device)
        _core.fill_(g, 1.0 if dy is None else float(dy))
        return g
    if not isinstance(dy, CTensor):
        dy = getattr(dy, "data", dy)  # a tensor.Tensor
        if not isinstance(dy, CTensor):
            raise TypeError(f"backward: dy must be None, a number or a tensor, got {type(dy).__name__}")
    return dy if dy.dtype == dtype else dy.cast(dtype)


def pair(v, what: str, minimum: int = 0) -> tuple:
    """An int or a pair of ints as (h, w), each >= minimum: kernel sizes, strides, paddings of the operators,
    layers and handles. `what` names the argument (with its op) in the error: TypeError for something that is
    not an int or a sequence of ints, ValueError for a sequence of another length or a value below minimum."""
    def is_int(e):
        return isinstance(e, numbers.Integral) and not isinstance(e, bool)

    if is_int(v):
        v = (v, v)
    if not (isinstance(v, (tuple, list)) and all(is_int(e) for e in v)):
        raise TypeError(f"{what} must be an int or a pair of ints (height, width), got {v!r}")
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair of ints (height, width), got {len(v)} values: {v!r}")
    h, w = int(v[0]), int(v[1])
    if h < minimum or w < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {(h, w)}")
    return h, w


def mask(t: CTensor, dtype) -> CTensor:
    """A bool tensor as 0 / 1 in `dtype`."""
    return t if t.dtype == dtype else t.cast(dtype)


def zeros(shape, dtype, device) -> CTensor:
    """A zero-filled raw tensor (the raw constructor leaves memory uninitialised)."""
    t = CTensor(list(shape), dtype, device)
    _core.fill_(t, 0.0)
    return t


def to_host(x: CTensor, dtype=None) -> np.ndarray:
    """x's values as a numpy array (a view of CPU memory unless a copy is needed: do not write to it), in
    numpy `dtype` if given. A GPU tensor is copied; bfloat16, which numpy lacks, comes as float32 (exact)."""
    x = x if x.device.is_cpu() else x.to(_CPU)
    return np.asarray(x.cast(_core.DType.float32) if x.dtype == _core.DType.bfloat16 else x, dtype)


def from_host(arr, device, dtype=None) -> CTensor:
    """A new raw tensor on `device` holding a copy of the numpy array `arr` (cast to `dtype` if given)."""
    arr = np.array(arr, copy=True, order="C")
    if dtype == _core.DType.bfloat16:  # numpy has no bfloat16: the core rounds the values once
        t = CTensor.from_buffer(arr.astype(np.float64)).cast(dtype)
        return t if device.is_cpu() else t.to(device)
    if dtype is not None and arr.dtype != _NUMPY[dtype]:
        arr = arr.astype(_NUMPY[dtype])
    elif arr.dtype not in _NUMPY.values():  # e.g. numpy's float16 stays, uint8 -> int32
        arr = arr.astype(np.float32 if arr.dtype.kind == "f" else np.int64 if arr.dtype.kind in "iu" else
                         np.bool_)
    t = CTensor.from_buffer(arr)
    return t if device.is_cpu() else t.to(device)


_NUMPY = {_core.DType.float16: np.dtype(np.float16), _core.DType.float32: np.dtype(np.float32),
          _core.DType.float64: np.dtype(np.float64), _core.DType.int32: np.dtype(np.int32),
          _core.DType.int64: np.dtype(np.int64), _core.DType.bool: np.dtype(np.bool_)}


class CompatError(ValueError, AssertionError):
    """Bad arguments to an operator. A ValueError, and an AssertionError too because SINGA checks its
    arguments with ``assert`` and its scripts and tests expect that type."""
