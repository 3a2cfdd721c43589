"""op="avg": the one rule for where the division by the number of ranks goes, and its one implementation.

An average is the sum over the P ranks divided by P. Where is the division?

* Where the sum is accumulated in a wider type than the data and rounded once (shm's C++ kernel,
  csrc/comm/shm_reduce.cpp; the small all-reduces that mpi and tcp reduce from every rank's rows; mpi's float16
  all-reduce by gather; all of them float16 and bfloat16 in float32), it is divided once, at the end: the wide
  sum cannot overflow where the mean does not. Those kernels do that themselves; nothing here is involved.

* Where the sum is rounded to the data's dtype at every step (MPI's reduction operations, tcp's ring, the parts
  of a hierarchical all-reduce), the sum of P float16 values overflows above 65504 where their mean need not
  (40000 on every rank: the sum is inf from two ranks on, the mean 40000). So the dtypes in
  DIVIDED_BEFORE_SUMMING, the 2-byte floats, are divided by P *before* summing (:func:`before_sum`, each value
  in float32 and rounded once), and every other floating dtype *after* (:func:`after_sum`), which is exact
  where dividing first would round twice.

The backends call ``before_sum`` and ``after_sum`` around such a sum for every "avg"; each does nothing for the
dtypes that the other one divides. The results are the same bits as before the rule had one place.
"""
from __future__ import annotations

import numpy as np

from .. import _core, tensor
from ._arrays import array, bf16_to_f32, f32_to_bf16

# 2-byte floats: their sum of P values may overflow (float16) or lose the small values (both) where the mean
# would not, so an average whose sum rounds to the dtype at every step divides them first.
DIVIDED_BEFORE_SUMMING = (tensor.float16, tensor.bfloat16)


def divides_before_summing(dtype) -> bool:
    """Whether an "avg" of `dtype` whose sum rounds to the dtype at every step divides before summing."""
    return dtype in DIVIDED_BEFORE_SUMMING


def before_sum(x, n: int, dtype=None) -> None:
    """The division before a sum that rounds at every step: x /= n in place, each value in float32 rounded once,
    for the dtypes of DIVIDED_BEFORE_SUMMING; nothing for the others. x: a contiguous CPU tensor (raw), or a
    numpy view of one (bfloat16 as its uint16 bits) with its `dtype`."""
    x, dtype = _view(x, dtype)
    if dtype not in DIVIDED_BEFORE_SUMMING or n == 1:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == tensor.bfloat16:
            x[...] = f32_to_bf16(bf16_to_f32(x) / np.float32(n))
        else:
            x[...] = (x.astype(np.float32) / np.float32(n)).astype(x.dtype)


def after_sum(x, n: int, dtype=None) -> None:
    """The division after such a sum: x /= n in place for the floating dtypes that are not divided before
    summing; nothing for the others (see before_sum for x)."""
    x, dtype = _view(x, dtype)
    if dtype in DIVIDED_BEFORE_SUMMING or dtype not in (tensor.float32, tensor.float64):
        return
    x /= x.dtype.type(n)


def _view(x, dtype):
    if isinstance(x, _core.Tensor):
        return array(x), x.dtype
    if dtype is None:
        raise TypeError("averaging: a numpy array needs its dtype= (bfloat16 travels as uint16 bits)")
    return x, dtype


__all__ = ["DIVIDED_BEFORE_SUMMING", "divides_before_summing", "before_sum", "after_sum"]
