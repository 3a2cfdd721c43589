"""Tensors, with SINGA's names (``singa.tensor``).

:class:`Tensor` is a thin Python handle over the C++ tensor in ``Tensor.data`` (SINGA's ``CTensor``).
Views (``reshape`` of contiguous data, ``transpose``, slicing with ``[]``) share memory; everything
else allocates. CPU tensors expose their memory to numpy and mpi4py without copies (buffer protocol,
``__array__``, DLPack); ``to_numpy`` returns an independent copy, as in SINGA.

As in SINGA, an integer tensor combined with a Python float (``t + 0.5``, ``t < 2.5``) is computed in
float32, and so is an integer tensor combined with a floating one.

Where things are: ``core.py`` the Tensor class, dtypes and conversions; ``functions.py`` SINGA's module
functions (``add``, ``mult``, ``zeros``, ``einsum`` ...); ``compat.py`` SINGA's remaining Tensor methods
(``copy``, ``copy_from``, ``is_transpose``, ``add_column``... ), a base class of Tensor.

Differences from SINGA, on purpose:
- comparisons (``<``, ``lt``...) return ``bool`` tensors, as numpy; ``bool`` tensors combine with
  numeric ones by promotion to the numeric dtype;
- ``Tensor(shape)`` is zero-filled rather than uninitialised;
- ``t[i]`` keeps the axis as SINGA's, but is a view (SINGA's is a copy: ``t[i].clone()``); steps, ``None``
  and ``...`` are accepted too;
- ``t == x`` with a number or an array is element-wise (a bool tensor), as in SINGA, but between two
  tensors it keeps Python's identity meaning (``t in some_list`` and dictionary keys work); use
  :func:`eq` to compare two tensors element-wise.
"""
from .compat import SingaTensorMethods  # noqa: F401
from .core import (  # noqa: F401
    as_raw, bfloat16, binary, bool_, CTensor, DType, float16, float32, float64, from_numpy, from_raw_tensor,
    from_raw_tensors, HookHandle, int32, int64, matmul, numpy_dtype, PlaceHolder, promoted, repeat, scalar_value,
    Tensor, to_dtype, to_host, to_numpy, wrap,
)
from .functions import (  # noqa: F401
    _call_singa_func, add, add_column, add_row, arange, argmax, argmin, average, axpy, bernoulli, cast, clip, concat,
    concatenate, contiguous, copy_data_to_from, copy_from_numpy, div, einsum, eltwise_mult, eq, full, gaussian, ge,
    gt, le, lt, max, maximum, mean, min, minimum, mul, mult, ne, one_hot, ones, ones_like, pow, product, random,
    reshape, sizeof, softmax, split, stack, sub, sum, sum_columns, sum_rows, tensordot, transpose, uniform, zeros,
    zeros_like,
)

from .. import _core
from . import functions as _functions

# The element-wise unary functions (exp, log, relu, ...): functions.py makes one per op of the core's list.
globals().update({_name: getattr(_functions, _name) for _name, _domain in _core.unary_ops()})
