"""SINGA's element-wise math operators beyond the basics in ``operators.py`` (re-exported by ``autograd``).

Trigonometric and hyperbolic functions and their inverses, sign / rounding, the activations SeLU,
HardSigmoid, SoftSign and PRelu, erf and reciprocal, comparisons and logical operators, and the n-ary
``max`` / ``min``, ``where`` and ``cossim``. Every ``backward`` also accepts ``dy`` of None or a number
(SINGA scripts call ``op.backward()`` themselves). Comparisons, logical operators and rounding have a zero
gradient; their outputs are 0 / 1 (or the rounded values) in the first input's dtype, as in SINGA.
"""
from __future__ import annotations

import math

import numpy as np

from . import _core
from .engine import CTensor, Operator, _const, _reduce_to
from .operators import Sum
from .raw import from_host, grad_like, mask, to_host, zeros
from .tensor import Tensor

__all__ = [
    'Acos', 'Acosh', 'And', 'Asin', 'Asinh', 'Atan', 'Atanh', 'Ceil', 'Cos', 'CosSim', 'Cosh', 'Equal', 'Erf',
    'Floor', 'Greater', 'HardSigmoid', 'Less', 'add_all', 'Max', 'Min', 'Not', 'Or', 'PRelu', 'Reciprocal',
    'Round', 'Rounde', 'SeLU', 'Sign', 'Sin', 'Sinh', 'SoftSign', 'Tan', 'Where', 'Xor', '_and', '_not',
    '_or', '_xor', 'acos', 'acosh', 'asin', 'asinh', 'atan', 'atanh', 'ceil', 'cos', 'cosh', 'cossim',
    'equal', 'erf', 'floor', 'greater', 'hardsigmoid', 'less', 'max', 'min', 'prelu', 'reciprocal', 'round',
    'rounde', 'selu', 'sign', 'sin', 'sinh', 'softsign', 'tan', 'where',
]


class _Unary(Operator):
    """One input, one output; subclasses give forward and ``grad(dy)`` (dy already a matching tensor)."""

    def forward(self, x):
        self.x = x
        self.y = self.f(x)
        return self.y

    def backward(self, dy=None):
        return self.grad(grad_like(dy, self.y.shape, self.y.dtype, self.y.device))


def _sq(x):
    return _core.square(x)


class Sin(_Unary):
    def f(self, x):
        return _core.sin(x)

    def grad(self, dy):
        return _core.mul(_core.cos(self.x), dy)


class Cos(_Unary):
    def f(self, x):
        return _core.cos(x)

    def grad(self, dy):
        return _core.neg(_core.mul(_core.sin(self.x), dy))


class Tan(_Unary):
    def f(self, x):
        return _core.div(_core.sin(x), _core.cos(x))

    def grad(self, dy):  # (1 + tan^2) * dy
        return _core.mul(_core.add_scalar(_sq(self.y), 1.0), dy)


class Sinh(_Unary):
    def f(self, x):  # (e^x - e^-x) / 2
        return _core.mul_scalar(_core.sub(_core.exp(x), _core.exp(_core.neg(x))), 0.5)

    def grad(self, dy):
        cosh = _core.mul_scalar(_core.add(_core.exp(self.x), _core.exp(_core.neg(self.x))), 0.5)
        return _core.mul(cosh, dy)


class Cosh(_Unary):
    def f(self, x):
        return _core.mul_scalar(_core.add(_core.exp(x), _core.exp(_core.neg(x))), 0.5)

    def grad(self, dy):
        sinh = _core.mul_scalar(_core.sub(_core.exp(self.x), _core.exp(_core.neg(self.x))), 0.5)
        return _core.mul(sinh, dy)


class Asinh(_Unary):
    def f(self, x):  # log(x + sqrt(x^2 + 1))
        return _core.log(_core.add(x, _core.sqrt(_core.add_scalar(_sq(x), 1.0))))

    def grad(self, dy):
        return _core.div(dy, _core.sqrt(_core.add_scalar(_sq(self.x), 1.0)))


class Acosh(_Unary):
    def f(self, x):  # log(x + sqrt(x^2 - 1)), for x >= 1
        return _core.log(_core.add(x, _core.sqrt(_core.sub_scalar(_sq(x), 1.0))))

    def grad(self, dy):
        return _core.div(dy, _core.sqrt(_core.sub_scalar(_sq(self.x), 1.0)))


class Atanh(_Unary):
    def f(self, x):  # log((1 + x) / (1 - x)) / 2, for |x| < 1
        return _core.mul_scalar(_core.log(_core.div(_core.add_scalar(x, 1.0), _core.sub_scalar(x, 1.0, True))),
                                0.5)

    def grad(self, dy):
        return _core.div(dy, _core.sub_scalar(_sq(self.x), 1.0, True))


class _HostUnary(_Unary):
    """Inverse trigonometric functions, which the C++ core lacks: computed by numpy on the host."""
    np_f = None

    def f(self, x):
        with np.errstate(invalid="ignore"):  # nan outside the domain, like numpy
            return from_host(type(self).np_f(to_host(x)), x.device, x.dtype)


class Asin(_HostUnary):
    np_f = np.arcsin

    def grad(self, dy):  # dy / sqrt(1 - x^2)
        return _core.div(dy, _core.sqrt(_core.sub_scalar(_sq(self.x), 1.0, True)))


class Acos(_HostUnary):
    np_f = np.arccos

    def grad(self, dy):
        return _core.neg(_core.div(dy, _core.sqrt(_core.sub_scalar(_sq(self.x), 1.0, True))))


class Atan(_HostUnary):
    np_f = np.arctan

    def grad(self, dy):
        return _core.div(dy, _core.add_scalar(_sq(self.x), 1.0))


class Sign(_Unary):
    def f(self, x):
        return _core.sign(x)

    def grad(self, dy):
        return zeros(self.x.shape, dy.dtype, dy.device)


class SoftSign(_Unary):
    """x / (1 + |x|)."""

    def f(self, x):
        self.den = _core.add_scalar(_core.abs(x), 1.0)
        return _core.div(x, self.den)

    def grad(self, dy):
        return _core.div(dy, _sq(self.den))


class HardSigmoid(_Unary):
    """max(0, min(1, alpha * x + gamma))."""

    def __init__(self, alpha=0.2, gamma=0.5):
        super().__init__()
        self.alpha, self.gamma = float(alpha), float(gamma)

    def f(self, x):
        self.lin = _core.add_scalar(_core.mul_scalar(x, self.alpha), self.gamma)
        return _core.clip(self.lin, 0.0, 1.0)

    def grad(self, dy):  # alpha where 0 < alpha * x + gamma < 1
        inside = _core.mul(mask(_core.gt_scalar(self.lin, 0.0), dy.dtype),
                           mask(_core.lt_scalar(self.lin, 1.0), dy.dtype))
        return _core.mul(_core.mul_scalar(inside, self.alpha), dy)


class SeLU(_Unary):
    """gamma * x for x > 0, gamma * alpha * (exp(x) - 1) otherwise."""

    def __init__(self, alpha=1.67326, gamma=1.0507):
        super().__init__()
        self.alpha, self.gamma = float(alpha), float(gamma)

    def f(self, x):
        y = _core.mul_scalar(_core.expm1(_core.clip(x, None, 0.0)), self.alpha)
        _core.add(y, _core.relu(x), out=y)
        return _core.mul_scalar(y, self.gamma, out=y)

    def grad(self, dy):
        pos = mask(_core.gt_scalar(self.x, 0.0), dy.dtype)
        g = _core.mul_scalar(_core.exp(_core.clip(self.x, None, 0.0)), self.alpha)
        _core.mul(g, _core.sub_scalar(pos, 1.0, True), out=g)  # alpha * exp(x) where x <= 0
        _core.add(g, pos, out=g)
        return _core.mul(_core.mul_scalar(g, self.gamma, out=g), dy)


class Reciprocal(_Unary):
    def f(self, x):
        return _core.reciprocal(x)

    def grad(self, dy):  # -dy / x^2 = -dy * y^2
        return _core.neg(_core.mul(_sq(self.y), dy))


class Erf(_Unary):
    def f(self, x):
        return _core.erf(x)

    def grad(self, dy):  # 2 / sqrt(pi) * exp(-x^2)
        g = _core.exp(_core.neg(_sq(self.x)))
        return _core.mul(_core.mul_scalar(g, 2.0 / math.sqrt(math.pi), out=g), dy)


class _Flat(_Unary):
    """Step functions (rounding): the gradient is zero."""

    def grad(self, dy):
        return zeros(self.x.shape, dy.dtype, dy.device)


class Ceil(_Flat):
    def f(self, x):
        return _core.ceil(x)


class Floor(_Flat):
    def f(self, x):
        return _core.floor(x)


class Round(_Flat):
    """Rounds halves away from zero (2.5 -> 3, -2.5 -> -3)."""

    def f(self, x):
        return _core.mul(_core.sign(x), _core.floor(_core.add_scalar(_core.abs(x), 0.5)))


class Rounde(_Flat):
    """Rounds halves to the nearest even integer (2.5 -> 2, 3.5 -> 4)."""

    def f(self, x):
        return _core.round(x)


def _unary_fn(cls):
    def fn(x):
        return cls()(x)[0]
    fn.__name__ = cls.__name__.lower()
    fn.__doc__ = cls.__doc__
    return fn


sin, cos, tan, asin, acos, atan = (_unary_fn(c) for c in (Sin, Cos, Tan, Asin, Acos, Atan))
sinh, cosh, asinh, acosh, atanh = (_unary_fn(c) for c in (Sinh, Cosh, Asinh, Acosh, Atanh))
sign, softsign, reciprocal, erf = (_unary_fn(c) for c in (Sign, SoftSign, Reciprocal, Erf))
ceil, floor, round, rounde = (_unary_fn(c) for c in (Ceil, Floor, Round, Rounde))


def hardsigmoid(x, alpha=0.2, gamma=0.5):
    return HardSigmoid(alpha, gamma)(x)[0]


def selu(x, alpha=1.67326, gamma=1.0507):
    return SeLU(alpha, gamma)(x)[0]


class PRelu(Operator):
    """x for x >= 0, slope * x otherwise; slope broadcasts to x and is learnt (it gets a gradient)."""

    def forward(self, x, slope):
        self.x, self.slope = x, slope
        self.neg = mask(_core.lt_scalar(x, 0.0), x.dtype)
        return _core.add(_core.relu(x), _core.mul(_core.mul(x, self.neg), slope))

    def backward(self, dy=None):
        y_shape = np.broadcast_shapes(tuple(self.x.shape), tuple(self.slope.shape))
        dy = grad_like(dy, y_shape, self.x.dtype, self.x.device)
        g = _core.add(_core.sub_scalar(self.neg, 1.0, True), _core.mul(self.neg, self.slope))
        dx = _reduce_to(_core.mul(g, dy), self.x.shape)
        dslope = _reduce_to(_core.mul(dy, _core.mul(self.neg, self.x)), self.slope.shape)
        return dx, dslope


prelu = PRelu.apply


# ---------------------------------------------------------------- comparisons and logic (no gradient)
class _NoGrad(Operator):
    """Outputs 0 / 1 in the first input's dtype; the gradients are zero."""

    def forward(self, *xs):
        self.metas = [(x.shape, x.dtype, x.device) for x in xs]
        out = self.f(*xs)
        return out.cast(xs[0].dtype) if out.dtype != xs[0].dtype else out

    def backward(self, dy=None):
        gs = tuple(zeros(*m) for m in self.metas)
        return gs if len(gs) > 1 else gs[0]


def _bool(x):
    return _core.ne_scalar(x, 0.0)


class Less(_NoGrad):
    def f(self, a, b):
        return _core.lt(a, b)


class Greater(_NoGrad):
    def f(self, a, b):
        return _core.gt(a, b)


class Equal(_NoGrad):
    def f(self, a, b):
        return _core.eq(a, b)


class And(_NoGrad):
    def f(self, a, b):
        return _core.mul(_bool(a).cast(a.dtype), _bool(b).cast(a.dtype))


class Or(_NoGrad):
    def f(self, a, b):
        return _bool(_core.add(_bool(a).cast(a.dtype), _bool(b).cast(a.dtype)))


class Xor(_NoGrad):
    def f(self, a, b):
        return _core.ne(_bool(a), _bool(b))


class Not(_NoGrad):
    def f(self, x):
        return _core.eq_scalar(x, 0.0)


def _binary_fn(cls, name):
    def fn(a, b):
        return cls()(a, _const(b, a))[0]
    fn.__name__ = name
    return fn


less, greater, equal = _binary_fn(Less, "less"), _binary_fn(Greater, "greater"), _binary_fn(Equal, "equal")
_and, _or, _xor = _binary_fn(And, "_and"), _binary_fn(Or, "_or"), _binary_fn(Xor, "_xor")


_not = Not.apply


# ---------------------------------------------------------------- n-ary max / min, where, cossim
class Max(Operator):
    """Element-wise maximum of one or more tensors (numpy broadcasting). The gradient goes to the input
    holding the maximum; on a tie, to the earliest such input."""
    aliased_grads = True
    _keep_first = staticmethod(_core.ge)  # a wins against b where keep_first(a, b)

    def forward(self, *xs):
        if not xs:
            raise ValueError(f"{type(self).__name__.lower()}: needs at least one tensor")
        self.metas = [(x.shape, x.dtype, x.device) for x in xs]
        self.winners = []  # per step i >= 1: where the running result (not x[i]) wins
        y = xs[0]
        for x in xs[1:]:
            keep = self._keep_first(y, x)
            self.winners.append(keep)
            y = _core.add(_core.mul(mask(keep, y.dtype), y), _core.mul(mask(_core.eq_scalar(keep, 0.0), y.dtype), x))
        self.yshape = y.shape
        return y

    def backward(self, dy=None):
        dtype = self.metas[0][1]
        g = grad_like(dy, self.yshape, dtype, self.metas[0][2])
        if len(self.metas) == 1:
            return g
        grads = [None] * len(self.metas)
        for i in range(len(self.metas) - 1, 0, -1):  # walk back: x[i] won where keep is false
            keep = self.winners[i - 1]
            grads[i] = _reduce_to(_core.mul(g, mask(_core.eq_scalar(keep, 0.0), dtype)), self.metas[i][0])
            g = _core.mul(g, mask(keep, dtype))
        grads[0] = _reduce_to(g, self.metas[0][0])
        return tuple(grads)


class Min(Max):
    """Element-wise minimum of one or more tensors; the gradient goes as for Max."""
    _keep_first = staticmethod(_core.le)


max = Max.apply


min = Min.apply


class Where(Operator):
    """condition ? x : y element-wise (numpy broadcasting); condition is fixed at construction (a list,
    numpy array or Tensor; non-zero is true) and gets no gradient."""

    def __init__(self, condition):
        super().__init__()
        self.condition = condition

    def forward(self, x, y):
        cond = self.condition
        if isinstance(cond, Tensor):
            cond = cond.data
        if not isinstance(cond, CTensor):
            cond = from_host(np.asarray(cond) != 0, x.device)
        self.c = mask(_core.ne_scalar(cond, 0.0) if cond.dtype != _core.DType.bool else cond, x.dtype)
        self.shapes = x.shape, y.shape
        self.out_shape = np.broadcast_shapes(tuple(self.c.shape), tuple(x.shape), tuple(y.shape))
        notc = _core.sub_scalar(self.c, 1.0, True)
        return _core.add(_core.mul(self.c, x), _core.mul(notc, y))

    def backward(self, dy=None):
        dy = grad_like(dy, self.out_shape, self.c.dtype, self.c.device)
        dx = _reduce_to(_core.mul(dy, self.c), self.shapes[0])
        dyy = _reduce_to(_core.mul(dy, _core.sub_scalar(self.c, 1.0, True)), self.shapes[1])
        return dx, dyy


def where(x, y, condition):
    return Where(condition)(x, _const(y, x))[0]


class CosSim(Operator):
    """Cosine similarity of matching rows of two (N, D) tensors: a tensor of shape (N,)."""

    def forward(self, a, b):
        if a.ndim != 2 or a.shape != b.shape:
            raise ValueError(f"cossim: expected two (N, D) tensors of the same shape, got {a.shape} and {b.shape}")
        self.a, self.b = a, b
        self.na = _core.sqrt(_core.sum(_sq(a), [1], True))  # (N, 1)
        self.nb = _core.sqrt(_core.sum(_sq(b), [1], True))
        self.y = _core.div(_core.sum(_core.mul(a, b), [1], True), _core.mul(self.na, self.nb))
        return self.y.reshape([a.shape[0]])

    def backward(self, dy=None):
        dy = grad_like(dy, (self.a.shape[0],), self.a.dtype, self.a.device).reshape([-1, 1])
        nab = _core.mul(self.na, self.nb)  # d cos / da = b / (|a||b|) - cos * a / |a|^2
        da = _core.sub(_core.div(self.b, nab), _core.div(_core.mul(self.y, self.a), _sq(self.na)))
        db = _core.sub(_core.div(self.a, nab), _core.div(_core.mul(self.y, self.b), _sq(self.nb)))
        return _core.mul(da, dy), _core.mul(db, dy)


cossim = CosSim.apply


def add_all(*xs):
    """a + b + ... of two or more tensors (broadcasting), as one recorded n-ary sum."""
    if len(xs) < 2:
        raise ValueError(f"add_all: needs at least two tensors, got {len(xs)}")
    return Sum()(*xs)[0]
