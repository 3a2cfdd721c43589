"""Element-wise math: arithmetic with numpy broadcasting, sums / means / max / min of several tensors, ``where``,
exp / log / powers, trigonometric and hyperbolic functions and their inverses, sign and rounding, clip and cast,
comparisons and logical operators. The activations are in activation.py.

Every binary operator broadcasts like numpy; its backward sums the gradient back to each input's shape
(``common.reduce_to``). A number as the second operand becomes a 0-d tensor of the first one's dtype
(``common.operand``). Comparisons, logical operators and rounding have a zero gradient; their outputs are 0 / 1
(or the rounded values) in the first input's dtype, as in SINGA. The operators written on :class:`common.Unary`
(and the comparisons) also take ``dy`` None or a number in ``backward``, as SINGA scripts pass.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _core, tensor
from ..engine import CTensor, Operator
from ..raw import from_host, grad_like, mask, to_host, zeros
from ..tensor import Tensor
from .common import Unary, operand, reduce_to

__all__ = [
    'Abs', 'Acos', 'Acosh', 'Add', 'And', 'Asin', 'Asinh', 'Atan', 'Atanh', 'Cast', 'Ceil', 'Clip', 'Cos', 'Cosh',
    'Div', 'Equal', 'Erf', 'Exp', 'Floor', 'Greater', 'Identity', 'Less', 'Log', 'Max', 'Mean', 'Min', 'Mul',
    'Negative', 'Not', 'Or', 'Pow', 'Reciprocal', 'Round', 'Rounde', 'Sign', 'Sin', 'Sinh', 'Sqrt', 'Sub', 'Sum',
    'Tan', 'Where', 'Xor', '_and', '_not', '_or', '_xor', 'abs', 'acos', 'acosh', 'add', 'add_all', 'asin',
    'asinh', 'atan', 'atanh', 'cast', 'ceil', 'clip', 'cos', 'cosh', 'div', 'equal', 'erf', 'exp', 'floor',
    'greater', 'identity', 'less', 'log', 'max', 'mean', 'min', 'mul', 'negative', 'pow', 'reciprocal', 'round',
    'rounde', 'sign', 'sin', 'sinh', 'sqrt', 'sub', 'sum', 'tan', 'where',
]


# ---------------------------------------------------------------- binary arithmetic (numpy broadcasting)
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
        return reduce_to(dy, self.shapes[0]), reduce_to(dy, self.shapes[1])


class Sub(Operator):
    aliased_grads = True

    def forward(self, a, b):
        self.shapes, self.dtype = (a.shape, b.shape), a.dtype
        return _core.sub(a, b)

    def backward(self, dy):
        dy = _as(dy, self.dtype)
        return reduce_to(dy, self.shapes[0]), _core.neg(reduce_to(dy, self.shapes[1]))


class Mul(Operator):
    def forward(self, a, b):
        self.a, self.b = a, b
        return _core.mul(a, b)

    def backward(self, dy):
        dy = _as(dy, self.a.dtype)
        da = reduce_to(_core.mul(dy, self.b), self.a.shape) if self.needs_grad[0] else None
        db = reduce_to(_core.mul(dy, self.a), self.b.shape) if self.needs_grad[1] else None
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
            db = reduce_to(_core.neg(db, out=db), self.b.shape)
        return reduce_to(q, self.ashape), db


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
            da = reduce_to(_core.mul(da, dy, out=da), self.a.shape)
        if self.needs_grad[1]:  # a^b * log(a) * dy
            db = _core.mul(self.y, _core.log(self.a))
            db = reduce_to(_core.mul(db, dy, out=db), self.b.shape)
        return da, db


def add(a, b):
    return Add()(a, operand(b, a))[0]


def sub(a, b):
    return Sub()(a, operand(b, a))[0]


def mul(x, y):
    return Mul()(x, operand(y, x))[0]


def div(a, b):
    return Div()(a, operand(b, a))[0]


def pow(a, b):  # noqa: A001 - SINGA's name
    """a ** b, element-wise; b a Tensor (broadcast) or a number."""
    return Pow()(a, operand(b, a))[0]


# ---------------------------------------------------------------- several tensors: sum, mean, max, min; where
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
        return tuple(reduce_to(dy, s) for s in self.shapes)


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
        return tuple(reduce_to(g, s) for s in self.shapes)


mean = Mean.apply


def add_all(*xs):
    """a + b + ... of two or more tensors (broadcasting), as one recorded n-ary sum."""
    if len(xs) < 2:
        raise ValueError(f"add_all: needs at least two tensors, got {len(xs)}")
    return Sum()(*xs)[0]


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
            grads[i] = reduce_to(_core.mul(g, mask(_core.eq_scalar(keep, 0.0), dtype)), self.metas[i][0])
            g = _core.mul(g, mask(keep, dtype))
        grads[0] = reduce_to(g, self.metas[0][0])
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
        dx = reduce_to(_core.mul(dy, self.c), self.shapes[0])
        dyy = reduce_to(_core.mul(dy, _core.sub_scalar(self.c, 1.0, True)), self.shapes[1])
        return dx, dyy


def where(x, y, condition):
    return Where(condition)(x, operand(y, x))[0]


# ---------------------------------------------------------------- one tensor: exp, log, powers, clip, cast, erf
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


class Reciprocal(Unary):
    def f(self, x):
        return _core.reciprocal(x)

    def grad(self, dy):  # -dy / x^2 = -dy * y^2
        return _core.neg(_core.mul(_core.square(self.y), dy))


class Erf(Unary):
    def f(self, x):
        return _core.erf(x)

    def grad(self, dy):  # 2 / sqrt(pi) * exp(-x^2)
        g = _core.exp(_core.neg(_core.square(self.x)))
        return _core.mul(_core.mul_scalar(g, 2.0 / math.sqrt(math.pi), out=g), dy)


class Sign(Unary):
    def f(self, x):
        return _core.sign(x)

    def grad(self, dy):
        return zeros(self.x.shape, dy.dtype, dy.device)


reciprocal, erf, sign = Reciprocal.apply, Erf.apply, Sign.apply


# ---------------------------------------------------------------- trigonometric and hyperbolic functions
class Sin(Unary):
    def f(self, x):
        return _core.sin(x)

    def grad(self, dy):
        return _core.mul(_core.cos(self.x), dy)


class Cos(Unary):
    def f(self, x):
        return _core.cos(x)

    def grad(self, dy):
        return _core.neg(_core.mul(_core.sin(self.x), dy))


class Tan(Unary):
    def f(self, x):
        return _core.div(_core.sin(x), _core.cos(x))

    def grad(self, dy):  # (1 + tan^2) * dy
        return _core.mul(_core.add_scalar(_core.square(self.y), 1.0), dy)


class Sinh(Unary):
    def f(self, x):  # (e^x - e^-x) / 2
        return _core.mul_scalar(_core.sub(_core.exp(x), _core.exp(_core.neg(x))), 0.5)

    def grad(self, dy):
        cosh = _core.mul_scalar(_core.add(_core.exp(self.x), _core.exp(_core.neg(self.x))), 0.5)
        return _core.mul(cosh, dy)


class Cosh(Unary):
    def f(self, x):
        return _core.mul_scalar(_core.add(_core.exp(x), _core.exp(_core.neg(x))), 0.5)

    def grad(self, dy):
        sinh = _core.mul_scalar(_core.sub(_core.exp(self.x), _core.exp(_core.neg(self.x))), 0.5)
        return _core.mul(sinh, dy)


class Asinh(Unary):
    def f(self, x):  # log(x + sqrt(x^2 + 1))
        return _core.log(_core.add(x, _core.sqrt(_core.add_scalar(_core.square(x), 1.0))))

    def grad(self, dy):
        return _core.div(dy, _core.sqrt(_core.add_scalar(_core.square(self.x), 1.0)))


class Acosh(Unary):
    def f(self, x):  # log(x + sqrt(x^2 - 1)), for x >= 1
        return _core.log(_core.add(x, _core.sqrt(_core.sub_scalar(_core.square(x), 1.0))))

    def grad(self, dy):
        return _core.div(dy, _core.sqrt(_core.sub_scalar(_core.square(self.x), 1.0)))


class Atanh(Unary):
    def f(self, x):  # log((1 + x) / (1 - x)) / 2, for |x| < 1
        return _core.mul_scalar(_core.log(_core.div(_core.add_scalar(x, 1.0), _core.sub_scalar(x, 1.0, True))),
                                0.5)

    def grad(self, dy):
        return _core.div(dy, _core.sub_scalar(_core.square(self.x), 1.0, True))


class _HostUnary(Unary):
    """Inverse trigonometric functions, which the C++ core lacks: computed by numpy on the host."""
    np_f = None

    def f(self, x):
        with np.errstate(invalid="ignore"):  # nan outside the domain, like numpy
            return from_host(type(self).np_f(to_host(x)), x.device, x.dtype)


class Asin(_HostUnary):
    np_f = np.arcsin

    def grad(self, dy):  # dy / sqrt(1 - x^2)
        return _core.div(dy, _core.sqrt(_core.sub_scalar(_core.square(self.x), 1.0, True)))


class Acos(_HostUnary):
    np_f = np.arccos

    def grad(self, dy):
        return _core.neg(_core.div(dy, _core.sqrt(_core.sub_scalar(_core.square(self.x), 1.0, True))))


class Atan(_HostUnary):
    np_f = np.arctan

    def grad(self, dy):
        return _core.div(dy, _core.add_scalar(_core.square(self.x), 1.0))


sin, cos, tan, sinh, cosh = Sin.apply, Cos.apply, Tan.apply, Sinh.apply, Cosh.apply
asin, acos, atan, asinh, acosh, atanh = Asin.apply, Acos.apply, Atan.apply, Asinh.apply, Acosh.apply, Atanh.apply


# ---------------------------------------------------------------- rounding (no gradient)
class _Flat(Unary):
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


ceil, floor, round, rounde = Ceil.apply, Floor.apply, Round.apply, Rounde.apply


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


def less(a, b):
    return Less()(a, operand(b, a))[0]


def greater(a, b):
    return Greater()(a, operand(b, a))[0]


def equal(a, b):
    return Equal()(a, operand(b, a))[0]


def _and(a, b):
    return And()(a, operand(b, a))[0]


def _or(a, b):
    return Or()(a, operand(b, a))[0]


def _xor(a, b):
    return Xor()(a, operand(b, a))[0]


_not = Not.apply
