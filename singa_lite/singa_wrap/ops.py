"""SINGA's C++ tensor functions (``singa_wrap.Abs``, ``singa_wrap.Mult``, ``singa_wrap.__add__`` ...), on raw tensors.

SINGA's Python layer calls its SWIG module on ``CTensor``s (what ``tensor.Tensor.data`` holds) with C++ names;
these functions take and return ``singa_lite._core.Tensor``s the same way and are re-exported by
:mod:`singa_lite.singa_wrap`. Each is written on the C++ core's kernels; where SINGA's meaning differs from
numpy's it is said in the docstring (``Sum(t, axis)`` drops the axis, ``SoftMax(t, axis)`` normalises over
*all* axes from ``axis`` on, comparisons return 0 / 1 in the input's dtype, ``L2`` is divided by the size).

The SINGA names ending in ``WithRet`` write into their last argument and return nothing, as SINGA's do.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core

CTensor = _core.Tensor
_CPU = _core.Device("cpu")


# ---------------------------------------------------------------- argument checks
def raw_arg(x, op: str, what: str = "tensor") -> CTensor:
    """x when it is a raw tensor; otherwise a TypeError that says what to pass."""
    if isinstance(x, CTensor):
        return x
    hint = "; pass its .data" if hasattr(x, "data") and isinstance(x.data, CTensor) else ""
    raise TypeError(f"{op}: {what} must be a singa_wrap.Tensor (the C++ tensor in tensor.Tensor.data), "
                    f"got {type(x).__name__}{hint}")


def _num(x, op: str, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{op}: {what} must be a number, got {type(x).__name__}")
    return float(x)


def _axis(axis, ndim: int, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor of {ndim} dimensions")
    return int(axis) % ndim


def _into(ret: CTensor, value: CTensor, op: str) -> None:
    """Writes value into SINGA's output argument `ret`, which must already have value's shape."""
    raw_arg(ret, op, "ret")
    if tuple(ret.shape) != tuple(value.shape):
        raise ValueError(f"{op}: ret has shape {tuple(ret.shape)}, the result {tuple(value.shape)}; "
                         f"allocate ret with the result's shape")
    _core.copy_(ret, value)


def _host_float(t: CTensor) -> float:
    """The value of a one-element tensor on any device."""
    return float(np.asarray(t.to(_CPU)).reshape(-1)[0])


def _product(dims) -> int:
    p = 1
    for d in dims:
        p *= int(d)
    return p


# ---------------------------------------------------------------- element-wise, one tensor
def _unary(name: str, core_fn, doc: str):
    def fn(t):
        return core_fn(raw_arg(t, name))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


Abs = _unary("Abs", _core.abs, "|t|, element-wise.")
Ceil = _unary("Ceil", _core.ceil, "Rounds up, element-wise.")
Floor = _unary("Floor", _core.floor, "Rounds down, element-wise.")
Exp = _unary("Exp", _core.exp, "e ** t, element-wise.")
Erf = _unary("Erf", _core.erf, "The error function, element-wise.")
Log = _unary("Log", _core.log, "Natural logarithm, element-wise.")
ReLU = _unary("ReLU", _core.relu, "max(t, 0), element-wise.")
Sigmoid = _unary("Sigmoid", _core.sigmoid, "1 / (1 + e ** -t), element-wise.")
Sign = _unary("Sign", _core.sign, "-1, 0 or 1, element-wise.")
Sqrt = _unary("Sqrt", _core.sqrt, "Square root, element-wise.")
Square = _unary("Square", _core.square, "t * t, element-wise.")
Sin = _unary("Sin", _core.sin, "Sine, element-wise.")
Cos = _unary("Cos", _core.cos, "Cosine, element-wise.")
Tanh = _unary("Tanh", _core.tanh, "Hyperbolic tangent, element-wise.")


def RoundE(t):  # noqa: N802 - SINGA's name
    """Rounds to the nearest integer, halves to the even one (numpy.round); integers come back as a copy."""
    t = raw_arg(t, "RoundE")
    return _core.round(t) if t.dtype.is_floating else t.clone()


def Round(t):  # noqa: N802
    """Rounds to the nearest integer, halves away from zero (C's round, SINGA's Round; RoundE and numpy round
    halves to even)."""
    t = raw_arg(t, "Round")
    if not t.dtype.is_floating:
        return t.clone()
    r = _core.round(t)  # halves to even
    d = _core.sub(t, r)  # exact, in [-0.5, 0.5]
    # a half that went toward zero (d has x's sign) goes the other way: r + 2 * d
    moved_in = _core.mul(_core.eq_scalar(_core.abs(d), 0.5).cast(t.dtype), _core.gt_scalar(_core.mul(d, t), 0.0)
                         .cast(t.dtype))
    _core.mul(moved_in, _core.mul_scalar(d, 2.0), out=moved_in)
    return _core.add(r, moved_in, out=r)


def Tan(t):  # noqa: N802
    """Tangent, element-wise (sin / cos)."""
    t = raw_arg(t, "Tan")
    return _core.div(_core.sin(t), _core.cos(t))


def Sinh(t):  # noqa: N802
    """Hyperbolic sine, element-wise ((e ** t - e ** -t) / 2)."""
    t = raw_arg(t, "Sinh")
    return _core.mul_scalar(_core.sub(_core.exp(t), _core.exp(_core.neg(t))), 0.5)


def Cosh(t):  # noqa: N802
    """Hyperbolic cosine, element-wise ((e ** t + e ** -t) / 2)."""
    t = raw_arg(t, "Cosh")
    return _core.mul_scalar(_core.add(_core.exp(t), _core.exp(_core.neg(t))), 0.5)


def Asinh(t):  # noqa: N802
    """Inverse hyperbolic sine: sign(t) * log1p(|t| + t^2 / (1 + sqrt(t^2 + 1))), exact near 0 and far from it."""
    t = raw_arg(t, "Asinh")
    a = _core.abs(t)
    sq = _core.square(a)
    root = _core.add_scalar(_core.sqrt(_core.add_scalar(sq, 1.0)), 1.0)
    return _core.mul(_core.sign(t), _core.log1p(_core.add(a, _core.div(sq, root))))


def Acosh(t):  # noqa: N802
    """Inverse hyperbolic cosine (t >= 1): log(t + sqrt(t^2 - 1)); nan below 1."""
    t = raw_arg(t, "Acosh")
    return _core.log(_core.add(t, _core.sqrt(_core.sub_scalar(_core.square(t), 1.0))))


def Atanh(t):  # noqa: N802
    """Inverse hyperbolic tangent (|t| < 1): log1p(2t / (1 - t)) / 2."""
    t = raw_arg(t, "Atanh")
    ratio = _core.div(_core.mul_scalar(t, 2.0), _core.sub_scalar(t, 1.0, True))
    return _core.mul_scalar(_core.log1p(ratio), 0.5)


def ReLUBackward(dy, x):  # noqa: N802
    """The gradient of ReLU: dy where x > 0, else 0."""
    dy, x = raw_arg(dy, "ReLUBackward", "dy"), raw_arg(x, "ReLUBackward", "x")
    return _core.mul(dy, _core.gt_scalar(x, 0.0).cast(dy.dtype))


# ---------------------------------------------------------------- element-wise, two operands (numpy broadcasting)
def _binary(name: str, core_fn, doc: str):
    def fn(lhs, rhs):
        return core_fn(raw_arg(lhs, name, "lhs"), raw_arg(rhs, name, "rhs"))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


__add__ = _binary("__add__", _core.add, "lhs + rhs, broadcasting as numpy.")
__sub__ = _binary("__sub__", _core.sub, "lhs - rhs, broadcasting as numpy.")
__mul__ = _binary("__mul__", _core.mul, "lhs * rhs (element-wise), broadcasting as numpy.")
__div__ = _binary("__div__", _core.div, "lhs / rhs, broadcasting as numpy.")
Pow = _binary("Pow", _core.pow, "base ** exp, element-wise, broadcasting as numpy.")


def _comparison(name: str, core_fn, core_scalar_fn):
    # SINGA's comparisons give 1 / 0 in the operand's dtype (tensor.Tensor's give bool tensors, as numpy).
    def tensors(lhs, rhs):
        lhs = raw_arg(lhs, name, "lhs")
        return core_fn(lhs, raw_arg(rhs, name, "rhs")).cast(lhs.dtype)

    def with_number(t, x):
        t = raw_arg(t, name)
        return core_scalar_fn(t, _num(x, name, "x")).cast(t.dtype)

    tensors.__name__ = tensors.__qualname__ = name
    tensors.__doc__ = f"1 where lhs {name[2:4]} rhs else 0, in lhs's dtype (broadcasting)."
    return tensors, with_number


__lt__, LTFloat = _comparison("__lt__", _core.lt, _core.lt_scalar)
__le__, LEFloat = _comparison("__le__", _core.le, _core.le_scalar)
__gt__, GTFloat = _comparison("__gt__", _core.gt, _core.gt_scalar)
__ge__, GEFloat = _comparison("__ge__", _core.ge, _core.ge_scalar)
__eq__, EQFloat = _comparison("__eq__", _core.eq, _core.eq_scalar)
for _fn, _name in ((LTFloat, "LTFloat"), (LEFloat, "LEFloat"), (GTFloat, "GTFloat"), (GEFloat, "GEFloat"),
                   (EQFloat, "EQFloat")):
    _fn.__name__ = _fn.__qualname__ = _name
    _fn.__doc__ = "1 where t compares true with the number x else 0, in t's dtype."


def _with_number(name: str, core_scalar_fn):
    def fn(t, x):
        return core_scalar_fn(raw_arg(t, name), _num(x, name, "x"))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "t with the number x, element-wise; a new tensor."
    return fn


AddFloat = _with_number("AddFloat", _core.add_scalar)
SubFloat = _with_number("SubFloat", _core.sub_scalar)
MultFloat = _with_number("MultFloat", _core.mul_scalar)
DivFloat = _with_number("DivFloat", _core.div_scalar)
PowFloat = _with_number("PowFloat", _core.pow_scalar)


def _with_ret(name: str, core_fn, core_scalar_fn):
    # SINGA's void Add(lhs, rhs, ret) family: rhs a tensor or a number, the result written into ret.
    def fn(lhs, rhs, ret):
        lhs = raw_arg(lhs, name, "lhs")
        value = (core_scalar_fn(lhs, _num(rhs, name, "rhs")) if isinstance(rhs, numbers.Real)
                 else core_fn(lhs, raw_arg(rhs, name, "rhs")))
        _into(ret, value, name)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "ret = lhs op rhs (rhs a tensor or a number); returns nothing, as SINGA's."
    return fn


Add = _with_ret("Add", _core.add, _core.add_scalar)
Sub = _with_ret("Sub", _core.sub, _core.sub_scalar)
EltwiseMult = _with_ret("EltwiseMult", _core.mul, _core.mul_scalar)
Div = _with_ret("Div", _core.div, _core.div_scalar)
PowWithRet = _with_ret("PowWithRet", _core.pow, _core.pow_scalar)
AddFloatWithRet = _with_ret("AddFloatWithRet", _core.add, _core.add_scalar)
SubFloatWithRet = _with_ret("SubFloatWithRet", _core.sub, _core.sub_scalar)
EltwiseMultFloatWithRet = _with_ret("EltwiseMultFloatWithRet", _core.mul, _core.mul_scalar)
DivFloatWithRet = _with_ret("DivFloatWithRet", _core.div, _core.div_scalar)
PowFloatWithRet = _with_ret("PowFloatWithRet", _core.pow, _core.pow_scalar)


# ---------------------------------------------------------------- reductions and softmax
def Sum(t, axis):  # noqa: N802
    """The sum over one axis, which is dropped (SINGA: axis 0 sums the rows of a matrix, 1 its columns)."""
    t = raw_arg(t, "Sum")
    return _core.sum(t, [_axis(axis, t.ndim, "Sum")], False)


def Average(t, axis):  # noqa: N802
    """The mean over one axis, which is dropped."""
    t = raw_arg(t, "Average")
    return _core.mean(t, [_axis(axis, t.ndim, "Average")], False)


def SumAll(t):  # noqa: N802
    """The sum of every element, as a tensor of shape (1,)."""
    return _core.sum(raw_arg(t, "SumAll"), None, False).reshape([1])


def SumAsFloat(t) -> float:  # noqa: N802
    """The sum of every element, as a Python float."""
    return _host_float(_core.sum(raw_arg(t, "SumAsFloat"), None, False))


def _rows(t: CTensor, axis: int, op: str) -> CTensor:
    """t as a matrix: the axes before `axis` make the rows, `axis` and those after it the columns."""
    a = _axis(axis, t.ndim, op)
    return t.reshape([_product(t.shape[:a]), _product(t.shape[a:])])


def SoftMax(t, axis=None):  # noqa: N802
    """Softmax over all the axes from `axis` on (SINGA's and ONNX opset < 13's meaning): t is seen as a matrix
    of prod(shape[:axis]) rows, each normalised. Without an axis: 1 (each row of a batch), 0 for a 1-D t."""
    t = raw_arg(t, "SoftMax")
    if axis is None:
        axis = 0 if t.ndim == 1 else 1
    rows = _rows(t, axis, "SoftMax")
    shifted = _core.sub(rows, _core.max(rows, [1], True))
    e = _core.exp(shifted, out=shifted)
    _core.div(e, _core.sum(e, [1], True), out=e)
    return e.reshape(list(t.shape))


def SoftMaxBackward(dy, axis, y):  # noqa: N802
    """The gradient of SoftMax(x, axis) given dy and the forward's output y: y * (dy - sum(dy * y)) per row."""
    dy, y = raw_arg(dy, "SoftMaxBackward", "dy"), raw_arg(y, "SoftMaxBackward", "y")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"SoftMaxBackward: dy {tuple(dy.shape)} and y {tuple(y.shape)} must have one shape")
    d2, y2 = _rows(dy, axis, "SoftMaxBackward"), _rows(y, axis, "SoftMaxBackward")
    dot = _core.sum(_core.mul(d2, y2), [1], True)
    return _core.mul(y2, _core.sub(d2, dot)).reshape(list(dy.shape))


def CrossEntropyFwd(p, t):  # noqa: N802
    """-log(p[i, label_i]) per row of the probabilities p (batch, dim); t holds integer labels (batch,) or a
    one-hot / distribution (batch, dim) (then the loss is -sum(t * log p) per row). Returns (batch,)."""
    p, t = raw_arg(p, "CrossEntropyFwd", "p"), raw_arg(t, "CrossEntropyFwd", "t")
    p2 = p.reshape([1, p.numel]) if p.ndim == 1 else p
    if p2.ndim != 2:
        raise ValueError(f"CrossEntropyFwd: p must be (batch, dim), got {tuple(p.shape)}")
    target = _dense_target(p2, t, "CrossEntropyFwd")
    logp = _core.log(_core.maximum_scalar(p2, 1e-37))  # SINGA clamps p away from 0 too
    return _core.neg(_core.sum(_core.mul(target, logp), [1], False))


def SoftmaxCrossEntropyBwd(p, t):  # noqa: N802
    """The gradient of cross entropy after softmax, with respect to the logits: p - target (a new tensor)."""
    p, t = raw_arg(p, "SoftmaxCrossEntropyBwd", "p"), raw_arg(t, "SoftmaxCrossEntropyBwd", "t")
    p2 = p.reshape([1, p.numel]) if p.ndim == 1 else p
    return _core.sub(p2, _dense_target(p2, t, "SoftmaxCrossEntropyBwd")).reshape(list(p.shape))


def _dense_target(p2: CTensor, t: CTensor, op: str) -> CTensor:
    batch, dim = p2.shape
    if t.numel == batch:  # integer labels, SINGA's test: one value per row
        labels = t.reshape([batch])
        if labels.dtype.is_floating:
            labels = labels.cast(_core.DType.int32)
        return _core.one_hot(labels, dim, p2.dtype)
    if t.numel != batch * dim:
        raise ValueError(f"{op}: t must hold one label per row ({batch}) or one value per element of p "
                         f"{tuple(p2.shape)}, got shape {tuple(t.shape)}")
    return t.reshape([batch, dim]).cast(p2.dtype)


# ---------------------------------------------------------------- BLAS and matrix-vector ops
def Axpy(alpha, x, y) -> None:  # noqa: N802
    """y += alpha * x, in place; alpha a number or a one-element tensor."""
    x, y = raw_arg(x, "Axpy", "x"), raw_arg(y, "Axpy", "y")
    if isinstance(alpha, CTensor):
        if alpha.numel != 1:
            raise ValueError(f"Axpy: a tensor alpha must have one element, got shape {tuple(alpha.shape)}")
        alpha = _host_float(alpha)
    _core.axpy_(_num(alpha, "Axpy", "alpha"), x, y)


def Mult(A, B):  # noqa: N802
    """The matrix product A @ B (matrix-vector and batched too), a new tensor."""
    return _core.matmul(raw_arg(A, "Mult", "A"), raw_arg(B, "Mult", "B"))


def MultWithRet(A, B, C) -> None:  # noqa: N802
    """C = A @ B."""
    _into(C, Mult(A, B), "MultWithRet")


def MultWithScale(alpha, A, B, beta, C) -> None:  # noqa: N802
    """C = alpha * A @ B + beta * C (GEMM), in place."""
    prod = Mult(A, B)
    C = raw_arg(C, "MultWithScale", "C")
    if tuple(C.shape) != tuple(prod.shape):
        raise ValueError(f"MultWithScale: C has shape {tuple(C.shape)}, A @ B {tuple(prod.shape)}")
    _core.mul_scalar(C, _num(beta, "MultWithScale", "beta"), out=C)
    _core.axpy_(_num(alpha, "MultWithScale", "alpha"), prod, C)


def _vector(v, M, axis: int, op: str) -> CTensor:
    """v as a column (axis 0: one value per row of M) or a row (axis 1) that broadcasts against matrix M."""
    v, M = raw_arg(v, op, "v"), raw_arg(M, op, "M")
    if M.ndim != 2:
        raise ValueError(f"{op}: M must be a matrix, got shape {tuple(M.shape)}")
    n = M.shape[axis]
    if v.numel != n:
        what = "rows" if axis == 0 else "columns"
        raise ValueError(f"{op}: v has {v.numel} elements, M {tuple(M.shape)} has {n} {what}")
    return v.reshape([n, 1] if axis == 0 else [1, n])


def AddColumnWithScale(alpha, beta, v, M) -> None:  # noqa: N802
    """M = beta * M + alpha * v, v added to every column (one value per row), in place."""
    col = _vector(v, M, 0, "AddColumnWithScale")
    _core.mul_scalar(M, _num(beta, "AddColumnWithScale", "beta"), out=M)
    _core.axpy_(_num(alpha, "AddColumnWithScale", "alpha"), col, M)


def AddRowWithScale(alpha, beta, v, M) -> None:  # noqa: N802
    """M = beta * M + alpha * v, v added to every row (one value per column), in place."""
    row = _vector(v, M, 1, "AddRowWithScale")
    _core.mul_scalar(M, _num(beta, "AddRowWithScale", "beta"), out=M)
    _core.axpy_(_num(alpha, "AddRowWithScale", "alpha"), row, M)


def AddColumn(v, M) -> None:  # noqa: N802
    """M += v to every column (v has one value per row), in place."""
    _core.add(M, _vector(v, M, 0, "AddColumn"), out=M)


def AddRow(v, M) -> None:  # noqa: N802
    """M += v to every row (v has one value per column), in place."""
    _core.add(M, _vector(v, M, 1, "AddRow"), out=M)


def SubColumn(v, M) -> None:  # noqa: N802
    _core.sub(M, _vector(v, M, 0, "SubColumn"), out=M)


def SubRow(v, M) -> None:  # noqa: N802
    _core.sub(M, _vector(v, M, 1, "SubRow"), out=M)


def MultColumn(v, M) -> None:  # noqa: N802
    _core.mul(M, _vector(v, M, 0, "MultColumn"), out=M)


def MultRow(v, M) -> None:  # noqa: N802
    _core.mul(M, _vector(v, M, 1, "MultRow"), out=M)


def DivColumn(v, M) -> None:  # noqa: N802
    _core.div(M, _vector(v, M, 0, "DivColumn"), out=M)


def DivRow(v, M) -> None:  # noqa: N802
    _core.div(M, _vector(v, M, 1, "DivRow"), out=M)


def _reduce_into(M, v, axis: int, op: str) -> None:
    M, v = raw_arg(M, op, "M"), raw_arg(v, op, "v")
    if M.ndim != 2:
        raise ValueError(f"{op}: M must be a matrix, got shape {tuple(M.shape)}")
    total = _core.sum(M, [1 - axis], False)
    if v.numel != total.numel:
        raise ValueError(f"{op}: v has {v.numel} elements, the result {total.numel} (M is {tuple(M.shape)})")
    _core.copy_(v, total.reshape(list(v.shape)))


def SumColumns(M, v) -> None:  # noqa: N802
    """v = the sum of M's columns: one value per row, written into v."""
    _reduce_into(M, v, 0, "SumColumns")


def SumRows(M, v) -> None:  # noqa: N802
    """v = the sum of M's rows: one value per column, written into v."""
    _reduce_into(M, v, 1, "SumRows")


# ---------------------------------------------------------------- shapes and copies
def Reshape(t, shape):  # noqa: N802
    """t with a new shape: a view when the memory allows, otherwise a copy."""
    return raw_arg(t, "Reshape").reshape([int(d) for d in shape])


def Contiguous(t):  # noqa: N802
    """t in row-major order: t itself when it already is, else a copy."""
    return raw_arg(t, "Contiguous").contiguous()


def Transpose(t, axes):  # noqa: N802
    """A view of t with its axes permuted."""
    return raw_arg(t, "Transpose").transpose([int(a) for a in axes])


def DefaultTranspose(t):  # noqa: N802
    """A view of t with its axes reversed."""
    return raw_arg(t, "DefaultTranspose").transpose([])


def ConcatOn(tensors, axis):  # noqa: N802
    """The tensors (a VecTensor or any sequence of raw tensors) joined along `axis`."""
    parts = [raw_arg(x, "ConcatOn", f"tensors[{i}]") for i, x in enumerate(tensors)]
    if not parts:
        raise ValueError("ConcatOn: needs at least one tensor")
    return _core.concat(parts, _axis(axis, parts[0].ndim, "ConcatOn"))


def SliceOn(t, start, end, axis):  # noqa: N802
    """A copy of t[start:end] along `axis` (SINGA copies; use t.slice for a view)."""
    t = raw_arg(t, "SliceOn")
    a = _axis(axis, t.ndim, "SliceOn")
    if not 0 <= start <= end <= t.shape[a]:
        raise IndexError(f"SliceOn: [{start}, {end}) is not inside axis {a} of size {t.shape[a]}")
    return t.slice(a, int(start), int(end), 1).clone()


def CopyDataToFrom(dst, src, num, src_offset=0, dst_offset=0) -> None:  # noqa: N802
    """dst[dst_offset : dst_offset + num] = src[src_offset : src_offset + num], on the flattened tensors
    (SINGA's argument order: the source offset comes first)."""
    for what, x, off in (("dst", dst, dst_offset), ("src", src, src_offset)):
        x = raw_arg(x, "CopyDataToFrom", what)
        if not x.is_contiguous():
            raise ValueError(f"CopyDataToFrom: {what} must be contiguous; use Contiguous() first")
        if off < 0 or num < 0 or off + num > x.numel:
            raise IndexError(f"CopyDataToFrom: {what}[{off}:{off + num}] is outside its {x.numel} elements")
    _core.copy_(dst.reshape([-1]).slice(0, dst_offset, dst_offset + num, 1),
                src.reshape([-1]).slice(0, src_offset, src_offset + num, 1))


# ---------------------------------------------------------------- random fills (in place)
def Gaussian(mean, std, t) -> None:  # noqa: N802
    """Fills t in place with N(mean, std) samples."""
    _core.gaussian_(raw_arg(t, "Gaussian"), _num(mean, "Gaussian", "mean"), _num(std, "Gaussian", "std"))


def Uniform(low, high, t) -> None:  # noqa: N802
    """Fills t in place with U(low, high) samples."""
    _core.uniform_(raw_arg(t, "Uniform"), _num(low, "Uniform", "low"), _num(high, "Uniform", "high"))


def Bernoulli(p, t) -> None:  # noqa: N802
    """Fills t in place with 1 (probability p) or 0."""
    _core.bernoulli_(raw_arg(t, "Bernoulli"), _num(p, "Bernoulli", "p"))


# SINGA's names: the public functions and the operator names (__add__ ...) that SINGA exports as functions.
__all__ = sorted(name for name, value in globals().items()
                 if callable(value) and getattr(value, "__module__", None) == __name__
                 and (not name.startswith("_") or (name.startswith("__") and name.endswith("__"))))
