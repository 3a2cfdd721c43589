"""numpy views of contiguous CPU tensors, and bfloat16 (which numpy lacks) as its uint16 bits: what the Python
backends (mpi, tcp) and comm/averaging.py compute on."""
from __future__ import annotations

import ctypes

import numpy as np

from .. import tensor


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> their float32 values, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 bit patterns, rounded to nearest even (nan stays a quiet nan), as the core."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    out = ((b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = ((b[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return out


def array(t) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory; bfloat16, which numpy lacks, as its uint16 bits."""
    if t.dtype != tensor.bfloat16:
        return np.asarray(t)
    if t.numel == 0:
        return np.zeros(list(t.shape), np.uint16)
    buf = (ctypes.c_uint16 * t.numel).from_address(t.data_ptr)
    return np.frombuffer(buf, np.uint16).reshape(list(t.shape))
