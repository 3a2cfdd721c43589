"""Shared helpers of tests/unit: building _core tensors from numpy arrays in every memory layout, exact and close
comparisons, finite-difference gradients and numpy references of the NCHW kernels.

Test modules import it by name (``from core_testutil import make, to_np``): tests/unit is on sys.path through
pytest's ``pythonpath`` setting in pyproject.toml, so the import works in a full run, for one file run alone and
under any import mode. Fixtures live in conftest.py, not here.
"""
from __future__ import annotations

import numpy as np

from singa_lite import _core

DT = _core.DType
CPU = _core.Device("cpu")

NP_TO_DT = {
    np.dtype(np.float16): DT.float16,
    np.dtype(np.float32): DT.float32,
    np.dtype(np.float64): DT.float64,
    np.dtype(np.int32): DT.int32,
    np.dtype(np.int64): DT.int64,
    np.dtype(np.bool_): DT.bool,
}
DT_TO_NP = {v: k for k, v in NP_TO_DT.items()}

FLOATS = (np.float16, np.float32, np.float64)
INTS = (np.int32, np.int64)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (np.bool_,)

# Layouts an input can be given in; every one holds the same values (see `make`).
LAYOUTS = ("contiguous", "transposed", "strided", "reversed")

_BIG = 1 << 62  # a slice bound far outside any axis: Tensor.slice clamps it like Python does


def ids(dtypes):
    return [np.dtype(d).name for d in dtypes]


def tensor(a) -> _core.Tensor:
    """A _core tensor sharing the memory of a (copied first to a fresh contiguous array)."""
    return _core.Tensor.from_buffer(np.array(a, copy=True, order="C"))


def to_np(t: _core.Tensor) -> np.ndarray:
    """A copy of a CPU tensor's values, with the tensor's shape and dtype."""
    view = np.asarray(t)
    assert view.shape == tuple(t.shape)
    assert view.dtype == DT_TO_NP[t.dtype]
    return np.array(view, copy=True)


def _sentinel(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.nan  # a kernel reading outside the view would produce nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def make(a, layout: str = "contiguous") -> _core.Tensor:
    """A _core tensor with the values of a, laid out as `layout` says:

    contiguous: packed row-major;
    transposed: a packed copy of a.T viewed back through Tensor.transpose (strides reversed);
    strided:    every axis is a step-2 Tensor.slice of a bigger buffer filled with a sentinel;
    reversed:   the first and last axes are step -1 Tensor.slice views of a reversed copy.
    """
    a = np.asarray(a)
    if layout == "contiguous" or a.ndim == 0:
        return tensor(a)
    if layout == "transposed":
        return tensor(a.T).transpose([])
    if layout == "strided":
        base = np.full(tuple(2 * d + 1 for d in a.shape), _sentinel(a.dtype), dtype=a.dtype)
        base[tuple(slice(1, None, 2) for _ in a.shape)] = a
        t = tensor(base)
        for ax, d in enumerate(a.shape):
            t = t.slice(ax, 1, 2 * d + 1, 2)
        return t
    if layout == "reversed":
        axes = sorted({0, a.ndim - 1})
        t = tensor(np.flip(a, axis=axes))
        for ax in axes:
            t = t.slice(ax, -1, -_BIG, -1)
        return t
    raise ValueError(layout)


def rand(rng: np.random.Generator, shape, dtype, low=-4.0, high=4.0) -> np.ndarray:
    """Random values of dtype; integers in [low, high), bools half true."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.kind == "f":
        return rng.uniform(low, high, shape).astype(dtype)
    if dtype.kind == "i":
        return rng.integers(int(low), int(high), shape, dtype=dtype)
    return rng.random(shape) < 0.5


def with_specials(rng, a: np.ndarray) -> np.ndarray:
    """a (floating) with some elements replaced by 0, -0, inf, -inf and nan."""
    a = np.array(a, copy=True)
    if a.dtype.kind != "f" or a.size == 0:
        return a
    flat = a.reshape(-1)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=a.dtype)
    k = min(flat.size, max(1, flat.size // 5))
    pos = rng.choice(flat.size, size=k, replace=False)
    flat[pos] = specials[rng.integers(0, len(specials), k)]
    return a


def assert_same(got, expected) -> None:
    """Exact equality of values (nan == nan, 0 == -0), shape and dtype."""
    got = to_np(got) if isinstance(got, _core.Tensor) else np.asarray(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    np.testing.assert_array_equal(got, expected)


def assert_close(got, expected, rtol, atol=0.0) -> None:
    """Closeness in float64 with nan == nan and matching infinities; shape and dtype must match."""
    got = to_np(got) if isinstance(got, _core.Tensor) else np.asarray(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                               equal_nan=True)


def half_ulp_distance(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance in float16 units in the last place between two float16 arrays (nan-free)."""

    def ordered(h):
        b = h.view(np.uint16).astype(np.int32)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)

    return np.abs(ordered(np.asarray(x, np.float16)) - ordered(np.asarray(y, np.float16)))


# ---------------------------------------------------------------- finite differences (autograd tests)
GRAD_EPS = 1e-6


def numeric_grads(fn, arrays, R, eps=GRAD_EPS):
    """Central differences of sum(fn(*arrays) * R) with respect to every element of every array; fn takes
    singa_lite Tensors (built from float64 copies, no gradient) and returns one Tensor."""
    from singa_lite import tensor as sl_tensor

    def value(args):
        y = fn(*[sl_tensor.Tensor(data=a.copy(), requires_grad=False) for a in args])
        return float((np.asarray(sl_tensor.to_numpy(y), np.float64) * R).sum())

    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [b.copy() for b in arrays]
            minus = [b.copy() for b in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (value(plus) - value(minus)) / (2 * eps)
        grads.append(g)
    return grads


# ---------------------------------------------------------------- numpy references for NCHW kernels
def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def out_size(n, k, s, p, d=1):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def np_pool(x, kernel, stride=None, padding=0, mode="max", count_include_pad=True):
    k = pair(kernel)
    s = k if stride is None else pair(stride)
    p = pair(padding)
    N, C, H, W = x.shape
    oh, ow = out_size(H, k[0], s[0], p[0]), out_size(W, k[1], s[1], p[1])
    y = np.zeros((N, C, oh, ow))
    for a in range(oh):
        for b in range(ow):
            h0, w0 = a * s[0] - p[0], b * s[1] - p[1]
            win = x[:, :, max(h0, 0):min(h0 + k[0], H), max(w0, 0):min(w0 + k[1], W)]
            if mode == "max":
                y[:, :, a, b] = win.max(axis=(2, 3))
            else:
                div = k[0] * k[1] if count_include_pad else win.shape[2] * win.shape[3]
                y[:, :, a, b] = win.sum(axis=(2, 3)) / div
    return y
