"""Reductions over axes of one tensor: sum and mean, SINGA's ``reduce_sum`` / ``reduce_mean``. (Sums, means,
maxima of several tensors are element-wise: elementwise.py; softmax: activation.py; the global average pooling of
images: nn.py.)"""
from __future__ import annotations

import numbers

from .. import _core
from ..engine import Operator
from .common import norm_axis

__all__ = ['ReduceMean', 'ReduceSum', 'reduce_mean', 'reduce_sum']


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
        axes = None if self.axes is None else [norm_axis(int(a), x.ndim) for a in self.axes]
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
