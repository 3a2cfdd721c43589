"""Fuzzing the tensor and operator API: any shape (empty, negative, huge), dtype, axis, view (transposed,
sliced, broadcast), special values (NaN, inf) and argument. The property: a call returns, or raises one of
the documented Python exceptions; it never crashes the interpreter (a crash fails the whole run). Where a
call returns, its shape is checked against numpy's rule."""
import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from singa_lite import _core

CPU = _core.Device("cpu")
DTYPES = ["float16", "float32", "float64", "int32", "int64", "bool"]
NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
      "bool": np.bool_}
DOCUMENTED = (ValueError, TypeError, IndexError, MemoryError, OverflowError)
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]
UNARY = ["neg", "abs", "sign", "square", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "reciprocal", "sin",
         "cos", "floor", "ceil", "round", "log1p", "expm1", "erf", "softplus"]
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e30, -1e-30, 65504.0, 2.0 ** 31, -2.0 ** 63]

dims = st.integers(min_value=0, max_value=5)
shapes = st.lists(dims, min_size=0, max_size=4)
odd_ints = st.one_of(st.integers(-3, 6), st.sampled_from([2 ** 31, 2 ** 62, -2 ** 62, 2 ** 63 - 1]))


@st.composite
def tensors(draw, shape=None):
    """A tensor of a random dtype with special values mixed in, possibly a non-contiguous view of a bigger one."""
    shape = draw(shapes) if shape is None else shape
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    base = rng.standard_normal([d + 1 for d in shape] if draw(st.booleans()) else shape) * 3
    if base.size and dtype.startswith("float"):
        flat = base.reshape(-1)
        flat[rng.integers(0, flat.size, max(1, flat.size // 4))] = draw(st.sampled_from(SPECIAL))
    with np.errstate(all="ignore"):
        arr = np.ascontiguousarray(base.astype(NP[dtype]) if dtype != "bool" else base > 0)
    t = _core.Tensor.from_buffer(arr)
    if list(t.shape) != list(shape):  # a strided window of the bigger array
        t = t.slice(0, 1, shape[0] + 1, 1) if shape else t
        for ax in range(1, len(shape)):
            t = t.slice(ax, 0, shape[ax], 1)
    if len(shape) >= 2 and draw(st.booleans()):
        t = t.transpose(list(range(len(shape)))[::-1])
    return t


def call(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except DOCUMENTED:
        return None


@given(a=tensors(), b=tensors(), name=st.sampled_from(BINARY))
def test_binary(a, b, name):
    out = call(getattr(_core, name), a, b)
    if out is not None:
        assert list(out.shape) == list(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))


@given(a=tensors(), s=st.sampled_from(SPECIAL + [3, -7]), name=st.sampled_from(BINARY), first=st.booleans())
def test_binary_scalar(a, s, name, first):
    out = call(getattr(_core, name + "_scalar"), a, s, first)
    if out is not None:
        assert list(out.shape) == list(a.shape)


@given(a=tensors(), name=st.sampled_from(UNARY), in_place=st.booleans())
def test_unary(a, name, in_place):
    out = call(getattr(_core, name), a, out=a) if in_place else call(getattr(_core, name), a)
    if out is not None:
        assert list(out.shape) == list(a.shape)


@given(a=tensors(), name=st.sampled_from(["sum", "mean", "max", "min"]),
       axes=st.one_of(st.none(), st.lists(odd_ints, max_size=3)), keep=st.booleans())
def test_reductions(a, name, axes, keep):
    call(getattr(_core, name), a, axes, keep)


@given(a=tensors(), name=st.sampled_from(["argmax", "argmin"]), axis=st.one_of(st.none(), odd_ints),
       keep=st.booleans())
def test_arg_reductions(a, name, axis, keep):
    call(getattr(_core, name), a, axis, keep)


@given(a=tensors(), b=tensors())
def test_matmul(a, b):
    out = call(_core.matmul, a, b)
    if out is not None:
        want = np.matmul(np.zeros(a.shape), np.zeros(b.shape)).shape
        assert tuple(out.shape) == want


@given(a=tensors(), shape=st.lists(odd_ints, max_size=4), perm=st.lists(odd_ints, max_size=4),
       axis=odd_ints, start=odd_ints, stop=odd_ints, step=odd_ints)
def test_views(a, shape, perm, axis, start, stop, step):
    for v in (call(a.reshape, shape), call(a.view, shape), call(a.transpose, perm),
              call(a.slice, axis, start, stop, step), call(a.select, axis, start), call(a.broadcast_to, shape),
              call(a.unsqueeze, axis), call(a.squeeze, perm)):
        if v is not None:
            call(v.contiguous)  # reading a view touches every element it claims


@given(a=tensors(), b=tensors(), axis=odd_ints, sizes=st.lists(odd_ints, max_size=3), depth=odd_ints)
def test_shape_ops(a, b, axis, sizes, depth):
    call(_core.concat, [a, b], axis)
    call(_core.stack, [a, b], axis)
    call(_core.split, a, sizes, axis)
    call(_core.split_sections, a, depth, axis)
    call(_core.one_hot, a, depth, _core.DType.float32)


@given(dst=tensors(), src=tensors(), dtype=st.sampled_from(DTYPES), lo=st.sampled_from(SPECIAL + [None]),
       hi=st.sampled_from(SPECIAL + [None]), alpha=st.sampled_from(SPECIAL))
def test_copies_casts_and_in_place_ops(dst, src, dtype, lo, hi, alpha):
    call(_core.copy_, dst, src)
    call(dst.cast, getattr(_core.DType, dtype))
    call(_core.clip, dst, lo, hi)
    call(_core.axpy_, alpha, src, dst)
    call(_core.fill_, dst, alpha)


@given(x=tensors(), kernel=st.tuples(odd_ints, odd_ints), stride=st.tuples(odd_ints, odd_ints),
       pad=st.tuples(odd_ints, odd_ints), dil=st.tuples(odd_ints, odd_ints), include=st.booleans())
def test_convolution_and_pooling_helpers(x, kernel, stride, pad, dil, include):
    cols = call(_core.im2col, x, kernel, stride, pad, dil)
    if cols is not None:
        call(_core.col2im, cols, list(x.shape), kernel, stride, pad, dil)
    pooled = call(_core.max_pool2d, x, kernel, stride, pad)
    if pooled is not None:
        call(_core.max_pool2d_backward, pooled[0], pooled[1], list(x.shape))
    call(_core.avg_pool2d, x, kernel, stride, pad, include)


@given(shape=st.lists(odd_ints, max_size=4), dtype=st.sampled_from(DTYPES), low=st.sampled_from(SPECIAL),
       high=st.sampled_from(SPECIAL), p=st.sampled_from(SPECIAL + [0.5]))
def test_allocation_and_random_fills(shape, dtype, low, high, p):
    t = call(_core.Tensor, shape, getattr(_core.DType, dtype), CPU)  # huge ones: MemoryError / ValueError
    assume(t is not None and t.numel <= 10 ** 6)  # the fills below would write every byte of a huge one
    call(_core.uniform_, t, low, high)
    call(_core.gaussian_, t, low, high)
    call(_core.bernoulli_, t, p)


@given(x=tensors(), spars=st.sampled_from(SPECIAL + [0.05]), top_k=st.booleans(), idx=tensors())
def test_sparse_exchange_ops(x, spars, top_k, idx):
    chosen = call(_core.select_significant, x, spars, top_k)
    call(_core.take, x, idx)
    if chosen is not None:
        vals = call(_core.take, x, chosen)
        if vals is not None:
            call(_core.index_add_, x, chosen, vals)
    call(_core.index_add_, x, idx, x)


@given(param=tensors(), grad=tensors(), buf=st.one_of(st.none(), tensors()),
       lr=st.sampled_from(SPECIAL), momentum=st.sampled_from([0.0, 0.9, -1.0, np.nan]),
       nesterov=st.booleans(), first=st.booleans())
def test_fused_sgd_update(param, grad, buf, lr, momentum, nesterov, first):
    call(_core.sgd_update_, param, grad, buf, lr, momentum, 0.0, 0.0, nesterov, first)
