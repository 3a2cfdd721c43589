"""Activations: ReLU and its relatives (leaky, ELU, SeLU, PReLU), sigmoid, tanh, softplus, softsign, hard
sigmoid, GELU, and softmax / log-softmax along an axis (the losses built on them are in loss.py)."""
from __future__ import annotations

import math

import numpy as np

from .. import _core
from ..engine import Operator
from ..raw import grad_like, mask
from .common import Unary, raw_log_softmax, raw_softmax, reduce_to

__all__ = [
    'Elu', 'Gelu', 'HardSigmoid', 'LeakyRelu', 'LogSoftmax', 'PRelu', 'ReLU', 'SeLU', 'Sigmoid', 'SoftMax',
    'SoftPlus', 'SoftSign', 'Tanh', 'elu', 'gelu', 'hardsigmoid', 'leakyrelu', 'log_softmax', 'prelu', 'relu',
    'selu', 'sigmoid', 'softmax', 'softplus', 'softsign', 'tanh',
]


# ---------------------------------------------------------------- the ReLU family
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


class SeLU(Unary):
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
        dx = reduce_to(_core.mul(g, dy), self.x.shape)
        dslope = reduce_to(_core.mul(dy, _core.mul(self.neg, self.x)), self.slope.shape)
        return dx, dslope


prelu = PRelu.apply


# ---------------------------------------------------------------- smooth and saturating
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


class SoftSign(Unary):
    """x / (1 + |x|)."""

    def f(self, x):
        self.den = _core.add_scalar(_core.abs(x), 1.0)
        return _core.div(x, self.den)

    def grad(self, dy):
        return _core.div(dy, _core.square(self.den))


softsign = SoftSign.apply


class HardSigmoid(Unary):
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


def hardsigmoid(x, alpha=0.2, gamma=0.5):
    return HardSigmoid(alpha, gamma)(x)[0]


# ---------------------------------------------------------------- softmax along an axis
class SoftMax(Operator):
    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.y = raw_softmax(x, self.axis)
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
        self.y = raw_log_softmax(x, self.axis)
        return self.y

    def backward(self, dy):
        g = _core.exp(self.y)  # dy - softmax * sum(dy)
        _core.mul(g, _core.sum(dy, [self.axis], True), out=g)
        return _core.sub(dy, g, out=g)


def log_softmax(x, axis=1):
    return LogSoftmax(axis)(x)[0]
