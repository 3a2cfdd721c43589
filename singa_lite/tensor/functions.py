"""SINGA's module functions on tensors (``tensor.add``, ``tensor.mult``, ``tensor.zeros`` ...), re-exported by
``singa_lite.tensor``."""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core
from ..device import as_device
from .core import Tensor, as_raw, binary, float32, matmul, promoted, repeat, scalar_value, to_dtype, wrap  # noqa: F401

def zeros_like(t: Tensor) -> Tensor:
    return Tensor(t.shape, t.device, t.dtype)


def ones_like(t: Tensor) -> Tensor:
    return Tensor(t.shape, t.device, t.dtype).set_value(1)


# SINGA's order: the device comes second (``tensor.zeros(shape, dev)``); the dtype is a keyword extension.
def zeros(shape, device=None, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype)


def ones(shape, device=None, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype).set_value(1)


def full(shape, value, dtype=float32, device=None) -> Tensor:
    return Tensor(shape, device, dtype).set_value(value)


def arange(start, stop=None, step=1, dtype=float32, device=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    return wrap(_core.arange(float(start), float(stop), float(step), to_dtype(dtype), as_device(device).core))


def random(shape, device=None) -> Tensor:
    """Uniform [0, 1) float32 values."""
    return Tensor(shape, device).uniform(0.0, 1.0)


def product(shape) -> int:
    p = 1
    for d in shape:
        p *= d
    return p


def sizeof(dtype) -> int:
    return to_dtype(dtype).itemsize


def reshape(tensor: Tensor, shape) -> Tensor:  # SINGA's parameter names
    return tensor.reshape(shape)


def transpose(t: Tensor, axes=None) -> Tensor:
    return t.transpose(axes)


def contiguous(tensor: Tensor) -> Tensor:
    return tensor.contiguous()


def copy_data_to_from(dst: Tensor, src: Tensor, size: int, dst_offset: int = 0, src_offset: int = 0) -> None:
    """Copies `size` elements from src[src_offset:] to dst[dst_offset:] (flat, contiguous tensors)."""
    for name, t, off in (("dst", dst, dst_offset), ("src", src, src_offset)):
        if not t.is_contiguous():
            raise ValueError(f"copy_data_to_from: {name} must be contiguous")
        if off < 0 or off + size > t.size():
            raise IndexError(f"copy_data_to_from: {name}[{off}:{off + size}] is outside its {t.size()} elements")
    d = dst.data.reshape([-1]).slice(0, dst_offset, dst_offset + size)
    s = src.data.reshape([-1]).slice(0, src_offset, src_offset + size)
    _core.copy_(d, s)


def _axes(axis):
    if axis is None:
        return None
    return [int(axis)] if isinstance(axis, numbers.Integral) else [int(a) for a in axis]


def sum(t: Tensor, axis=None, out=None, keepdims=False) -> Tensor:  # noqa: A001 - SINGA's name
    r = wrap(_core.sum(t.data, _axes(axis), keepdims))
    if out is not None:
        out.copy_data(r)
        return out
    return r


def average(t: Tensor, axis=None, keepdims=False):
    """The mean over `axis`: a tensor, or with no axis (SINGA) a float, ``numpy.float64``, so that both
    ``average(t) == 2.0`` and ``average(t).item()`` work."""
    r = mean(t, axis, keepdims)
    return r if axis is not None or keepdims else np.float64(scalar_value(r.data))


def mean(t: Tensor, axis=None, keepdims=False) -> Tensor:
    """The mean over `axis` (all elements by default), always a tensor (numpy's ``mean``; not in SINGA)."""
    return wrap(_core.mean(t.data, _axes(axis), keepdims))


def max(t: Tensor, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    return wrap(_core.max(t.data, _axes(axis), keepdims))


def min(t: Tensor, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    return wrap(_core.min(t.data, _axes(axis), keepdims))


def argmax(t: Tensor, axis=None, keepdims=False) -> Tensor:
    return wrap(_core.argmax(t.data, axis, keepdims))


def argmin(t: Tensor, axis=None, keepdims=False) -> Tensor:
    return wrap(_core.argmin(t.data, axis, keepdims))


def softmax(t: Tensor, axis: int = -1, out=None) -> Tensor:
    """exp(t - max) / sum(exp(t - max)) along `axis` (the last by default; SINGA's is row-wise)."""
    shifted = _core.sub(t.data, _core.max(t.data, [axis], True))
    e = _core.exp(shifted, out=shifted)
    r = _core.div(e, _core.sum(e, [axis], True), out=out.data if out is not None else None)
    return out if out is not None else wrap(r)


def _unary(name):
    fn = getattr(_core, name)

    def op(t: Tensor, out: Tensor | None = None) -> Tensor:
        r = fn(t.data, out.data if out is not None else None)
        return out if out is not None else t._derive(r)

    op.__name__ = name
    op.__doc__ = f"Element-wise {name}."
    return op


# One function per element-wise unary op of the core's list (csrc/ops/elementwise_ops.h): exp, log, sigmoid,
# sign, sqrt, square, tanh, relu, abs, neg, reciprocal, sin, cos, floor, ceil, round, log1p, expm1, erf,
# softplus, ... A new op there appears here without an edit.
for _name, _domain in _core.unary_ops():
    globals()[_name] = _unary(_name)
del _name, _domain


def clip(t: Tensor, min=None, max=None, out=None) -> Tensor:  # noqa: A002
    r = _core.clip(t.data, min, max, out.data if out is not None else None)
    return out if out is not None else t._derive(r)


def _ret(name):
    def op(lhs: Tensor, rhs, ret: Tensor | None = None) -> Tensor:
        return binary(name, lhs, rhs, out=ret)

    op.__name__ = name
    return op


add = _ret("add")
sub = _ret("sub")
eltwise_mult = _ret("mul")
mul = eltwise_mult
div = _ret("div")
maximum = _ret("maximum")
minimum = _ret("minimum")


def pow(t: Tensor, x, out=None) -> Tensor:  # noqa: A001
    return binary("pow", t, x, out=out)


def lt(t: Tensor, x) -> Tensor: return binary("lt", t, x)
def le(t: Tensor, x) -> Tensor: return binary("le", t, x)
def gt(t: Tensor, x) -> Tensor: return binary("gt", t, x)
def ge(t: Tensor, x) -> Tensor: return binary("ge", t, x)
def eq(t: Tensor, x) -> Tensor: return binary("eq", t, x)
def ne(t: Tensor, x) -> Tensor: return binary("ne", t, x)


def mult(A: Tensor, B: Tensor, C: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:
    """SINGA's GEMM: C = alpha * A @ B + beta * C (a new tensor when C is None). Operands are promoted as
    in :func:`matmul`: SINGA's RBM example multiplies the bool sample of ``gt`` by float weights."""
    prod = _core.matmul(*promoted(A.data, B.data))
    if alpha != 1.0:
        _core.mul_scalar(prod, float(alpha), out=prod)
    if C is None:
        return wrap(prod)
    if beta == 0.0:
        _core.copy_(C.data, prod)
    else:
        _core.mul_scalar(C.data, float(beta), out=C.data)
        _core.add(C.data, prod, out=C.data)
    return C


def axpy(alpha: float, x: Tensor, y: Tensor) -> Tensor:
    """y += alpha * x, in place; returns y."""
    _core.axpy_(float(alpha), x.data, y.data)
    return y


def bernoulli(p: float, t: Tensor) -> Tensor:
    return t.bernoulli(p)


def gaussian(mean: float, std: float, t: Tensor) -> Tensor:
    return t.gaussian(mean, std)


def uniform(low: float, high: float, t: Tensor) -> Tensor:
    return t.uniform(low, high)


def add_column(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """M = beta * M + alpha * v[:, None], in place."""
    _core.mul_scalar(M.data, float(beta), out=M.data)
    _core.axpy_(float(alpha), v.data.reshape([v.size(), 1]), M.data)
    return M


def add_row(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """M = beta * M + alpha * v[None, :], in place."""
    _core.mul_scalar(M.data, float(beta), out=M.data)
    _core.axpy_(float(alpha), v.data.reshape([1, v.size()]), M.data)
    return M


def sum_columns(M: Tensor) -> Tensor:
    """Sum over the columns of a matrix: one value per row."""
    return wrap(_core.sum(M.data, [1]))


def sum_rows(M: Tensor) -> Tensor:
    """Sum over the rows of a matrix: one value per column."""
    return wrap(_core.sum(M.data, [0]))


def concatenate(tensors, axis: int = 0) -> Tensor:
    return wrap(_core.concat([t.data for t in tensors], axis))


concat = concatenate


def stack(tensors, axis: int = 0) -> Tensor:
    return wrap(_core.stack([t.data for t in tensors], axis))


def split(t: Tensor, sizes_or_sections, axis: int = 0) -> list:
    """Views of t: equal `sections` (an int) or pieces of the given sizes (a list)."""
    if isinstance(sizes_or_sections, numbers.Integral):
        parts = _core.split_sections(t.data, int(sizes_or_sections), axis)
    else:
        parts = _core.split(t.data, [int(s) for s in sizes_or_sections], axis)
    return [t._derive(p) for p in parts]


def one_hot(indices: Tensor, depth: int, dtype=float32) -> Tensor:
    return wrap(_core.one_hot(indices.data, int(depth), to_dtype(dtype)))


def tensordot(A: Tensor, B: Tensor, axes=2) -> Tensor:
    """numpy.tensordot: contracts the last `axes` axes of A with the first of B (or explicit lists)."""
    if isinstance(axes, numbers.Integral):
        a_axes = list(range(A.ndim() - axes, A.ndim()))
        b_axes = list(range(axes))
    else:
        a_axes, b_axes = [list(x) if not isinstance(x, numbers.Integral) else [x] for x in axes]
    a_axes = [a % A.ndim() for a in a_axes]
    b_axes = [b % B.ndim() for b in b_axes]
    if len(a_axes) != len(b_axes) or any(A.shape[i] != B.shape[j] for i, j in zip(a_axes, b_axes)):
        raise ValueError(f"tensordot: axes {a_axes} of {A.shape} do not match axes {b_axes} of {B.shape}")
    a_free = [i for i in range(A.ndim()) if i not in a_axes]
    b_free = [i for i in range(B.ndim()) if i not in b_axes]
    k = product(A.shape[i] for i in a_axes)
    a2 = A.data.transpose(a_free + a_axes).reshape([product(A.shape[i] for i in a_free), k])
    b2 = B.data.transpose(b_axes + b_free).reshape([k, product(B.shape[i] for i in b_free)])
    out_shape = [A.shape[i] for i in a_free] + [B.shape[i] for i in b_free]
    return wrap(_core.matmul(a2, b2).reshape(out_shape))


def einsum(ops: str, *args: Tensor) -> Tensor:
    """Einstein summation for two operands, by tensordot after moving the summed axes (no repeated labels)."""
    if len(args) != 2:
        raise ValueError(f"einsum: supports exactly two operands, got {len(args)}")
    lhs, _, out = ops.replace(" ", "").partition("->")
    a_lab, b_lab = lhs.split(",")
    if len(set(a_lab)) != len(a_lab) or len(set(b_lab)) != len(b_lab):
        raise ValueError(f"einsum: repeated labels within one operand are not supported ('{ops}')")
    A, B = args
    if len(a_lab) != A.ndim() or len(b_lab) != B.ndim():
        raise ValueError(f"einsum: '{ops}' does not match operand dimensions {A.shape} and {B.shape}")
    if not _:
        out = "".join(sorted(c for c in a_lab + b_lab if (a_lab + b_lab).count(c) == 1))
    shared = [c for c in a_lab if c in b_lab]
    batch = [c for c in shared if c in out]
    summed = [c for c in shared if c not in out]
    a_only = [c for c in a_lab if c not in b_lab]
    b_only = [c for c in b_lab if c not in a_lab]
    # A -> [batch, a_only, summed], B -> [batch, summed, b_only], then a batched matmul.
    Ap = A.data.transpose([a_lab.index(c) for c in batch + a_only + summed])
    Bp = B.data.transpose([b_lab.index(c) for c in batch + summed + b_only])
    dims = {c: A.shape[a_lab.index(c)] for c in a_lab}
    dims.update({c: B.shape[b_lab.index(c)] for c in b_lab})
    nb = [dims[c] for c in batch]
    m, k, n = product(dims[c] for c in a_only), product(dims[c] for c in summed), product(dims[c] for c in b_only)
    r = _core.matmul(Ap.reshape(nb + [m, k]), Bp.reshape(nb + [k, n]))
    r = r.reshape(nb + [dims[c] for c in a_only] + [dims[c] for c in b_only])
    order = batch + a_only + b_only
    for c in out:
        if c not in order:
            raise ValueError(f"einsum: output label '{c}' is not an input label or is summed ('{ops}')")
    return wrap(r.transpose([order.index(c) for c in out]).contiguous())


def cast(t: Tensor, dtype) -> Tensor:
    return t.as_type(dtype)


def _call_singa_func(fn, *args):
    """Calls fn(*args), a function returning a C++ tensor, and wraps the result in a Tensor (SINGA's helper,
    which SINGA's tests use with ``singa_wrap`` functions)."""
    r = fn(*args)
    if not isinstance(r, _core.Tensor):
        raise TypeError(f"_call_singa_func: {getattr(fn, '__name__', fn)!r} returned {type(r).__name__}, "
                        f"expected a C++ tensor (singa_wrap.Tensor)")
    return Tensor(data=r)


def copy_from_numpy(data, np_array) -> None:
    """Copies a numpy array's values into the C++ tensor `data` (same number of elements; the function form
    of ``Tensor.copy_from_numpy``)."""
    Tensor(data=data).copy_from_numpy(np_array)
