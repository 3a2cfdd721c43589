"""Helpers the operators share, on raw ``_core.Tensor``s: broadcasting's gradient, axis normalising, softmax, a
scalar operand as a tensor, and :class:`Unary`, the declarative base of the element-wise operators of one input.

SINGA's public helpers ``axis_helper``, ``back_broadcast`` and ``ctensor2numpy`` are here too (``__all__``: what
``singa_lite.ops`` and ``autograd`` export); the rest is for the operator modules of this package.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core
from ..engine import CTensor, Operator
from ..raw import grad_like, to_host
from ..tensor import Tensor

__all__ = ["axis_helper", "back_broadcast", "ctensor2numpy"]


# ---------------------------------------------------------------- broadcasting, axes, operands
def reduce_to(dx: CTensor, shape) -> CTensor:
    """Sums dx over the axes along which a tensor of `shape` was broadcast to dx's shape: the gradient of numpy
    broadcasting (the leading axes it lacks and the axes where it has size 1)."""
    shape = tuple(shape)
    if dx.shape == shape:
        return dx
    lead = dx.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and dx.shape[lead + i] != 1]
    return _core.sum(dx, axes, True).reshape(list(shape))


def norm_axis(axis: int, ndim: int) -> int:
    """A negative axis counted from the end, as numpy does (no range check: callers say what is out of range)."""
    return axis + ndim if axis < 0 else axis


def swap_last(t: CTensor) -> CTensor:
    """A view of t with its last two axes swapped (a batch of transposed matrices)."""
    perm = list(range(t.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return t.transpose(perm)


def operand(v, like: Tensor) -> Tensor:
    """A Tensor as it is; a scalar operand as a 0-d tensor in like's dtype and device (it gets no gradient)."""
    if isinstance(v, Tensor):
        return v
    if not isinstance(v, (numbers.Number, np.number)):
        raise TypeError(f"expected a Tensor or a number, got {type(v).__name__}")
    t = CTensor([], like.dtype, like.data.device)
    _core.fill_(t, float(v))
    return Tensor(data=t, requires_grad=False)


# ---------------------------------------------------------------- softmax on raw tensors (operators and losses)
def raw_softmax(x: CTensor, axis: int) -> CTensor:
    e = _core.sub(x, _core.max(x, [axis], True))
    _core.exp(e, out=e)
    return _core.div(e, _core.sum(e, [axis], True), out=e)


def raw_log_softmax(x: CTensor, axis: int) -> CTensor:
    shifted = _core.sub(x, _core.max(x, [axis], True))
    lse = _core.log(_core.sum(_core.exp(shifted), [axis], True))
    return _core.sub(shifted, lse, out=shifted)


# ---------------------------------------------------------------- the declarative base of element-wise ops
class Unary(Operator):
    """An element-wise operator of one input, written as two formulas: ``f(x)`` computes the output and
    ``grad(dy)`` the input's gradient, with ``self.x`` / ``self.y`` holding the input and output and ``dy``
    already a tensor of the output's shape (``backward`` also takes None or a number, as SINGA scripts that
    call ``op.backward()`` themselves pass)."""

    def forward(self, x):
        self.x = x
        self.y = self.f(x)
        return self.y

    def backward(self, dy=None):
        return self.grad(grad_like(dy, self.y.shape, self.y.dtype, self.y.device))

    def f(self, x):
        raise NotImplementedError

    def grad(self, dy):
        raise NotImplementedError


# ---------------------------------------------------------------- SINGA's broadcasting helpers
def axis_helper(y_shape, x_shape):
    """The axes of y_shape along which a tensor of x_shape was broadcast (x aligned to the right)."""
    y_shape, x_shape = tuple(y_shape), tuple(x_shape)
    lead = len(y_shape) - len(x_shape)
    return tuple(i for i in range(len(y_shape)) if i < lead or x_shape[i - lead] != y_shape[i])


def back_broadcast(y_shape, x_shape, x):
    """A raw tensor x of y_shape summed back to x_shape (the gradient of broadcasting x_shape to y_shape)."""
    if tuple(y_shape) == tuple(x_shape):
        return x
    if tuple(x.shape) != tuple(y_shape):
        raise ValueError(f"back_broadcast: x has shape {tuple(x.shape)}, expected y_shape {tuple(y_shape)}")
    return _core.sum(x, list(axis_helper(y_shape, x_shape))).reshape(list(x_shape))


def ctensor2numpy(x):
    """A numpy copy of a raw tensor's values."""
    return np.array(to_host(x), copy=True)
