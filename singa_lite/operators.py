"""SINGA's differentiable operators (re-exported by ``singa_lite.autograd``, where users find them).

Each operator follows the contract in ``autograd.Operator``: ``forward`` / ``backward`` on raw C++
tensors, a function wrapper taking and returning ``tensor.Tensor``. Convolution, pooling and batch
normalisation are in ``nn_ops``; losses in ``ops_loss``; further element-wise math in ``ops_math``; shape
and indexing operators in ``ops_shape``.
"""
from __future__ import annotations

import math
import numbers

from . import _core, tensor
from . import engine
from .engine import CTensor, Operator, _axis, _const, _log_softmax, _reduce_to, _softmax, _swap_last
from .raw import CompatError, zeros

__all__ = [  # everything below: autograd re-exports it
    'Add', 'Sub', 'Mul', 'Div', 'Pow', 'add', 'sub', 'mul', 'div', 'pow', 'Matmul', 'matmul', 'AddBias',
    'add_bias', 'Reshape', 'reshape', 'Flatten', 'flatten', 'Transpose', 'transpose', 'Concat', 'cat',
    'concat', 'Split', 'split', 'Slice', 'slice', '_slice', 'Sum', 'sum', 'Mean', 'mean', 'ReduceSum',
    'ReduceMean', 'reduce_sum', 'reduce_mean', 'ReLU', 'relu', 'LeakyRelu', 'leakyrelu', 'Elu', 'elu',
    'Sigmoid', 'sigmoid', 'Tanh', 'tanh', 'SoftPlus', 'softplus', 'Gelu', 'gelu', 'Exp', 'exp', 'Log',
    'log', 'Sqrt', 'sqrt', 'Abs', 'abs', 'Negative', 'negative', 'Identity', 'identity', 'Clip', 'clip',
    'Cast', 'cast', 'Dropout', 'dropout', 'SoftMax', 'softmax', 'LogSoftmax', 'log_softmax',
]

# ---------------------------------------------------------------- element-wise binary (numpy broadcasting)
def _as(dy: CTensor, dtype) -> CTensor:
    """dy in the forward's dtype: SINGA scripts call op.backward(dy) themselves, e.g. with float64 dy."""
    return dy if dy.dtype == dtype else dy.cast(dtype)


class Add(Operator):
    aliased_grads = True

    def forward(self, a, b):
        self.shapes, self.dtype = (a.shape, b.shape), a.dtype
        return _core.add(a, b)

    def backward(self, dy):
        dy = _as(dy, self.dtype)
        return _reduce_to(dy, self.shapes[0]), _reduce_to(dy, self.shapes[1])


class Sub(Operator):
    aliased_grads = True

    def forward(self, a, b):
        self.shapes, self.dtype = (a.shape, b.shape), a.dtype
        return _core.sub(a, b)

    def backward(self, dy):
        dy = _as(dy, self.dtype)
        return _reduce_to(dy, self.shapes[0]), _core.neg(_reduce_to(dy, self.shapes[1]))


class Mul(Operator):
    def forward(self, a, b):
        self.a, self.b = a, b
        return _core.mul(a, b)

    def backward(self, dy):
        dy = _as(dy, self.a.dtype)
        da = _reduce_to(_core.mul(dy, self.b), self.a.shape) if self.needs_grad[0] else None
        db = _reduce_to(_core.mul(dy, self.a), self.b.shape) if self.needs_grad[1] else None
        return da, db


class Div(Operator):
    def forward(self, a, b):
        self.ashape, self.b = a.shape, b
        self.y = _core.div(a, b)
        return self.y

    def backward(self, dy):
        q = _core.div(_as(dy, self.b.dtype), self.b)  # dL/da = dy / b;  dL/db = -dy * a / b^2 = -q * y
        db = None
        if self.needs_grad[1]:
            db = _core.mul(q, self.y)
            db = _reduce_to(_core.neg(db, out=db), self.b.shape)
        return _reduce_to(q, self.ashape), db


class Pow(Operator):
    def forward(self, a, b):
        self.a, self.b = a, b
        self.y = _core.pow(a, b)
        return self.y

    def backward(self, dy):
        da = db = None
        if self.needs_grad[0]:  # b * a^(b-1) * dy
            da = _core.pow(self.a, _core.sub_scalar(self.b, 1.0))
            _core.mul(da, self.b, out=da)
            da = _reduce_to(_core.mul(da, dy, out=da), self.a.shape)
        if self.needs_grad[1]:  # a^b * log(a) * dy
            db = _core.mul(self.y, _core.log(self.a))
            db = _reduce_to(_core.mul(db, dy, out=db), self.b.shape)
        return da, db


def add(a, b):
    return Add()(a, _const(b, a))[0]


def sub(a, b):
    return Sub()(a, _const(b, a))[0]


def mul(x, y):
    return Mul()(x, _const(y, x))[0]


def div(a, b):
    return Div()(a, _const(b, a))[0]


def pow(a, b):  # noqa: A001 - SINGA's name
    """a ** b, element-wise; b a Tensor (broadcast) or a number."""
    return Pow()(a, _const(b, a))[0]


# ---------------------------------------------------------------- linear algebra
class Matmul(Operator):
    """numpy.matmul: 2-D, batched with broadcast batch axes, and 1-D operands."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return _core.matmul(a, b)

    def backward(self, dy):
        a, b = self.a, self.b
        a2 = a.unsqueeze(0) if a.ndim == 1 else a  # the 1-D cases as matrices, as numpy does
        b2 = b.unsqueeze(1) if b.ndim == 1 else b
        if b.ndim == 1:
            dy = dy.unsqueeze(dy.ndim)
        if a.ndim == 1:
            dy = dy.unsqueeze(dy.ndim - 1)
        da = db = None
        if self.needs_grad[0]:
            da = _reduce_to(_core.matmul(dy, _swap_last(b2)), a2.shape).reshape(list(a.shape))
        if self.needs_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:  # one GEMM over the folded batch instead of a batch then a sum
                k, n = b2.shape
                db = _core.matmul(a2.reshape([-1, k]).transpose([1, 0]), dy.reshape([-1, n]))
            else:
                db = _reduce_to(_core.matmul(_swap_last(a2), dy), b2.shape)
            db = db.reshape(list(b.shape))
        return da, db


matmul = Matmul.apply


class AddBias(Operator):
    """x (2-D) + b: axis=0 adds b to every row (b has one value per column), axis=1 to every column."""
    aliased_grads = True

    def __init__(self, axis=0):
        super().__init__()
        if axis not in (0, 1):
            raise CompatError(f"add_bias: axis must be 0 (rows) or 1 (columns), got {axis}")
        self.axis = axis

    def forward(self, x, b):
        if x.ndim != 2 or b.ndim != 1 or b.shape[0] != x.shape[1 - self.axis]:
            raise CompatError(f"add_bias: expected a matrix and a vector of its {('columns', 'rows')[self.axis]} "
                              f"count, got shapes {x.shape} and {b.shape} (axis={self.axis})")
        return _core.add(x, b.reshape([1, -1] if self.axis == 0 else [-1, 1]))

    def backward(self, dy):
        return dy, _core.sum(dy, [self.axis])


def add_bias(x, b, axis=0):
    return AddBias(axis)(x, b)[0]


# ---------------------------------------------------------------- shapes
class Reshape(Operator):
    """numpy.reshape, plus SINGA/ONNX's 0 = keep that dimension."""
    aliased_grads = True

    def __init__(self, shape):
        super().__init__()
        self.shape = list(shape)

    def forward(self, x):
        self.xshape = x.shape
        return x.reshape([x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(self.shape)])

    def backward(self, dy):
        return dy.reshape(list(self.xshape))


def reshape(x, shape):
    return Reshape(shape)(x)[0]


class Flatten(Operator):
    """(d0, ..., dn) -> (d0 * ... * d(axis-1), d(axis) * ... * dn)."""
    aliased_grads = True

    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.xshape = x.shape
        ax = _axis(self.axis, x.ndim)
        if not 0 <= ax <= x.ndim:
            raise IndexError(f"flatten: axis {self.axis} is out of range for {x.ndim} dimensions")
        return x.reshape([math.prod(x.shape[:ax]), math.prod(x.shape[ax:])])

    def backward(self, dy):
        return dy.reshape(list(self.xshape))


def flatten(x, axis=1):
    return Flatten(axis)(x)[0]


class Transpose(Operator):
    """numpy.transpose (a view); perm None reverses the axes."""
    aliased_grads = True

    def __init__(self, perm=None):
        super().__init__()
        self.perm = None if perm is None else list(perm)

    def forward(self, x):
        self.p = self.perm if self.perm is not None else list(reversed(range(x.ndim)))
        return x.transpose(self.p)

    def backward(self, dy):
        return dy.transpose([self.p.index(i) for i in range(len(self.p))])


def transpose(x, shape=None):
    """SINGA's name for the permutation argument is `shape`."""
    return Transpose(shape)(x)[0]


class Concat(Operator):
    aliased_grads = True

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def forward(self, *xs):
        if not xs:
            raise ValueError("concat: needs at least one tensor")
        self.ax = _axis(self.axis, xs[0].ndim)
        self.sizes = [x.shape[self.ax] if 0 <= self.ax < x.ndim else 0 for x in xs]
        return _core.concat(list(xs), self.axis)

    def backward(self, dy):
        return tuple(_core.split(dy, self.sizes, self.ax))


def cat(xs, axis=0):
    return Concat(axis)(*xs)[0]


concat = cat


class Split(Operator):
    """Views of x along `axis`: pieces of sizes `parts`, or `num_output` equal pieces when parts is None."""

    def __init__(self, axis, parts, num_output=None):
        super().__init__()
        if parts is None and num_output is None:
            raise ValueError("split: give parts (a list of sizes) or num_output")
        self.axis, self.parts, self.num_output = axis, parts, num_output

    def forward(self, x):
        if self.parts is None:
            return tuple(_core.split_sections(x, int(self.num_output), self.axis))
        return tuple(_core.split(x, [int(p) for p in self.parts], self.axis))

    def backward(self, *dys):
        return _core.concat(list(dys), self.axis)


def split(x, axis, parts, num_output=None):
    """A tuple of tensors (SINGA's signature)."""
    return Split(axis, parts, num_output)(x)


class Slice(Operator):
    """x[starts[i]:ends[i]:steps[i]] along axes[i] (default axes 0, 1, ...); Python's bound rules."""

    def __init__(self, starts, ends, axes=None, steps=None):
        super().__init__()
        if len(starts) != len(ends) or (axes is not None and len(axes) != len(starts)) or \
                (steps is not None and len(steps) != len(starts)):
            raise ValueError("slice: starts, ends, axes and steps must have the same length")
        self.starts, self.ends, self.axes, self.steps = list(starts), list(ends), axes, steps

    def _view(self, t):
        axes = self.axes if self.axes is not None else range(len(self.starts))
        steps = self.steps if self.steps is not None else [1] * len(self.starts)
        for ax, st, en, sp in zip(axes, self.starts, self.ends, steps):
            t = t.slice(_axis(int(ax), t.ndim), int(st), int(en), int(sp))
        return t

    def forward(self, x):
        self.xmeta = x.shape, x.dtype, x.device
        return self._view(x)

    def backward(self, dy):
        dx = zeros(*self.xmeta)
        _core.copy_(self._view(dx), dy)
        return dx


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - SINGA's name
    return Slice(starts, ends, axes, steps)(x)[0]


_slice = slice


# ---------------------------------------------------------------- sums and means
class Sum(Operator):
    """Element-wise sum of several tensors (SINGA's autograd.sum); broadcasting like add."""
    aliased_grads = True

    def forward(self, *xs):
        self.shapes = [x.shape for x in xs]
        y = xs[0]
        for x in xs[1:]:
            y = _core.add(y, x)
        return y

    def backward(self, dy):
        return tuple(_reduce_to(dy, s) for s in self.shapes)


sum = Sum.apply


class Mean(Operator):
    """Element-wise mean of several tensors (SINGA's autograd.mean)."""
    aliased_grads = True

    def forward(self, *xs):
        self.shapes = [x.shape for x in xs]
        y = xs[0]
        for x in xs[1:]:
            y = _core.add(y, x)
        return _core.mul_scalar(y, 1.0 / len(xs))

    def backward(self, dy):
        g = _core.mul_scalar(dy, 1.0 / len(self.shapes))
        return tuple(_reduce_to(g, s) for s in self.shapes)


mean = Mean.apply


class ReduceSum(Operator):
    """Sum over `axes` (all when None); keepdims=1 keeps them with size 1 (SINGA's default); reducing every
    axis with keepdims=0 gives shape (1,), as in SINGA."""
    aliased_grads = True  # the gradient is a broadcast view of dy

    def __init__(self, axes=None, keepdims=1):
        super().__init__()
        self.axes = [axes] if isinstance(axes, numbers.Integral) else axes
        self.keepdims = bool(keepdims)
        self.scale = False

    def forward(self, x):
        self.xshape = x.shape
        axes = None if self.axes is None else [_axis(int(a), x.ndim) for a in self.axes]
        self.kshape = [1 if axes is None or i in axes else s for i, s in enumerate(x.shape)]
        y = _core.sum(x, axes, self.keepdims)
        if y.ndim == 0:  # a full reduction without keepdims: shape (1,), as SINGA's (it has no 0-d results)
            y = y.reshape([1])
        self.n = max(x.numel // max(y.numel, 1), 1)
        return _core.mul_scalar(y, 1.0 / self.n, out=y) if self.scale else y

    def backward(self, dy):
        if self.scale:
            dy = _core.mul_scalar(dy, 1.0 / self.n)
        return dy.reshape(self.kshape).broadcast_to(list(self.xshape))


class ReduceMean(ReduceSum):
    def __init__(self, axes=None, keepdims=1):
        super().__init__(axes, keepdims)
        self.scale = True


def reduce_sum(x, axes=None, keepdims=1):
    return ReduceSum(axes, keepdims)(x)[0]


def reduce_mean(x, axes=None, keepdims=1):
    return ReduceMean(axes, keepdims)(x)[0]


# ---------------------------------------------------------------- element-wise unary
class ReLU(Operator):
    def forward(self, x):
        self.y = _core.relu(x)
        return self.y

    def backward(self, dy):
        return _core.relu_grad(self.y, dy)  # sign(y) * dy: dy where x > 0, else 0; one pass


relu = ReLU.apply


class LeakyRelu(Operator):
    """x for x >= 0, a * x otherwise."""

    def __init__(self, a=0.01):
        super().__init__()
        self.a = float(a)

    def forward(self, x):
        self.x = x
        y = _core.mul_scalar(x, self.a)
        _core.axpy_(1.0 - self.a, _core.relu(x), y)  # a*x + (1-a)*relu(x)
        return y

    def backward(self, dy):
        g = _core.sign(_core.relu(self.x))
        _core.mul_scalar(g, 1.0 - self.a, out=g)
        _core.add_scalar(g, self.a, out=g)
        return _core.mul(g, dy, out=g)


def leakyrelu(x, a=0.01):
    return LeakyRelu(a)(x)[0]


class Elu(Operator):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        self.x = x
        y = _core.relu(x)
        _core.axpy_(self.alpha, _core.expm1(_core.clip(x, None, 0.0)), y)
        return y

    def backward(self, dy):
        pos = _core.sign(_core.relu(self.x))  # 1 where x > 0
        g = _core.mul_scalar(_core.exp(_core.clip(self.x, None, 0.0)), self.alpha)
        _core.mul(g, _core.sub_scalar(pos, 1.0, True), out=g)  # alpha * exp(x) where x <= 0
        _core.add(g, pos, out=g)
        return _core.mul(g, dy, out=g)


def elu(x, alpha=1.0):
    return Elu(alpha)(x)[0]


class Sigmoid(Operator):
    def forward(self, x):
        self.y = _core.sigmoid(x)
        return self.y

    def backward(self, dy):
        g = _core.sub_scalar(self.y, 1.0, True)  # y * (1 - y) * dy
        _core.mul(g, self.y, out=g)
        return _core.mul(g, dy, out=g)


sigmoid = Sigmoid.apply


class Tanh(Operator):
    def forward(self, x):
        self.y = _core.tanh(x)
        return self.y

    def backward(self, dy):
        g = _core.square(self.y)  # (1 - y^2) * dy
        _core.sub_scalar(g, 1.0, True, out=g)
        return _core.mul(g, dy, out=g)


tanh = Tanh.apply


class SoftPlus(Operator):
    """log(1 + exp(x)), computed stably."""

    def forward(self, x):
        self.x = x
        return _core.softplus(x)

    def backward(self, dy):
        g = _core.sigmoid(self.x)
        return _core.mul(g, dy, out=g)


softplus = SoftPlus.apply


class Gelu(Operator):
    """x * Phi(x) with the exact normal CDF Phi(x) = (1 + erf(x / sqrt(2))) / 2."""

    def forward(self, x):
        self.x = x
        self.cdf = _core.mul_scalar(x, 1.0 / math.sqrt(2.0))
        _core.erf(self.cdf, out=self.cdf)
        _core.add_scalar(self.cdf, 1.0, out=self.cdf)
        _core.mul_scalar(self.cdf, 0.5, out=self.cdf)
        return _core.mul(x, self.cdf)

    def backward(self, dy):
        g = _core.square(self.x)  # (Phi(x) + x * pdf(x)) * dy
        _core.mul_scalar(g, -0.5, out=g)
        _core.exp(g, out=g)
        _core.mul_scalar(g, 1.0 / math.sqrt(2.0 * math.pi), out=g)
        _core.mul(g, self.x, out=g)
        _core.add(g, self.cdf, out=g)
        return _core.mul(g, dy, out=g)


gelu = Gelu.apply


class Exp(Operator):
    def forward(self, x):
        self.y = _core.exp(x)
        return self.y

    def backward(self, dy):
        return _core.mul(dy, self.y)


exp = Exp.apply


class Log(Operator):
    def forward(self, x):
        self.x = x
        return _core.log(x)

    def backward(self, dy):
        return _core.div(dy, self.x)


log = Log.apply


class Sqrt(Operator):
    def forward(self, x):
        self.y = _core.sqrt(x)
        return self.y

    def backward(self, dy):
        g = _core.div(dy, self.y)
        return _core.mul_scalar(g, 0.5, out=g)


sqrt = Sqrt.apply


class Abs(Operator):
    def forward(self, x):
        self.x = x
        return _core.abs(x)

    def backward(self, dy):
        g = _core.sign(self.x)
        return _core.mul(g, dy, out=g)


abs = Abs.apply


class Negative(Operator):
    def forward(self, x):
        return _core.neg(x)

    def backward(self, dy):
        return _core.neg(dy)


negative = Negative.apply


class Identity(Operator):
    aliased_grads = True

    def forward(self, x):
        return x

    def backward(self, dy):
        return dy


identity = Identity.apply


class Clip(Operator):
    """Limits x to [min, max] (either may be None); the gradient passes where x is inside."""

    def __init__(self, min=None, max=None):  # noqa: A002 - SINGA's names
        super().__init__()
        self.min = None if min is None else float(min)
        self.max = None if max is None else float(max)

    def forward(self, x):
        self.x = x
        self.y = _core.clip(x, self.min, self.max)
        return self.y

    def backward(self, dy):
        g = _core.eq(self.x, self.y).cast(dy.dtype)
        return _core.mul(g, dy, out=g)


def clip(x, min=None, max=None):  # noqa: A002
    return Clip(min, max)(x)[0]


class Cast(Operator):
    """A copy in dtype `to` (x itself when it already has it); the gradient is cast back."""
    aliased_grads = True

    def __init__(self, to):
        super().__init__()
        self.to = tensor.to_dtype(to)

    def forward(self, x):
        self.src_dtype = x.dtype
        return x if x.dtype == self.to else x.cast(self.to)

    def backward(self, dy):
        return dy if dy.dtype == self.src_dtype else dy.cast(self.src_dtype)


def cast(x, to):
    return Cast(to)(x)[0]


class Dropout(Operator):
    """Inverted dropout: zeroes each element with probability `ratio` and scales the rest by
    1 / (1 - ratio) while autograd.training is true; the identity otherwise."""
    aliased_grads = True  # the identity case hands dy through

    def __init__(self, ratio=0.5):
        super().__init__()
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def forward(self, x):
        self.mask = None
        if not engine.training or self.ratio == 0.0:
            return x
        self.mask = CTensor(list(x.shape), x.dtype, x.device)
        _core.bernoulli_(self.mask, 1.0 - self.ratio)
        _core.mul_scalar(self.mask, 1.0 / (1.0 - self.ratio), out=self.mask)
        return _core.mul(x, self.mask)

    def backward(self, dy):
        return dy if self.mask is None else _core.mul(dy, self.mask)


def dropout(x, ratio=0.5):
    return Dropout(ratio)(x)[0]


# ---------------------------------------------------------------- softmax (the losses are in ops_loss.py)
class SoftMax(Operator):
    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.y = _softmax(x, self.axis)
        return self.y

    def backward(self, dy):
        g = _core.mul(dy, self.y)  # y * (dy - sum(dy * y))
        s = _core.sum(g, [self.axis], True)
        _core.sub(dy, s, out=g)
        return _core.mul(g, self.y, out=g)


def softmax(x, axis=1):
    return SoftMax(axis)(x)[0]


class LogSoftmax(Operator):
    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.y = _log_softmax(x, self.axis)
        return self.y

    def backward(self, dy):
        g = _core.exp(self.y)  # dy - softmax * sum(dy)
        _core.mul(g, _core.sum(dy, [self.axis], True), out=g)
        return _core.sub(dy, g, out=g)


def log_softmax(x, axis=1):
    return LogSoftmax(axis)(x)[0]
