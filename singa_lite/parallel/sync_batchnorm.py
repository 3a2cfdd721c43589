"""Synchronised batch normalisation: ``SyncBatchNorm2d`` normalises with the statistics of the whole
global batch (every rank's share), as PyTorch's SyncBatchNorm, instead of each rank's own.

    sgd = opt.DistOpt(opt.SGD(lr=0.1))
    bn = SyncBatchNorm2d(16, communicator=sgd.communicator)   # or ddp.init()'s, found by itself

In training, each rank sums x and x * x per channel (in float64) with its count of values, one all-reduce
gives the global mean and (biased) variance, and the running statistics are updated with those (the
variance made unbiased with the global count), so every rank's running statistics are the same. Backward
all-reduces the per-channel sums of dy and dy * xhat, so dx is the gradient through the global statistics;
scale and bias get this rank's own gradients, which the data-parallel exchange then averages. P ranks x n
examples train as one process x P*n examples with BatchNorm2d (tests/multiproc/test_training_features.py).

Evaluation mode uses the running statistics, with no communication. Every rank must run the same forward and
backward passes (each training forward and backward of the layer is a collective).
"""
from __future__ import annotations

import numpy as np

from .. import _core, engine, ops, tensor
from ..engine import Operator
from ..layer.basic import BatchNorm2d
from . import ddp

__all__ = ["SyncBatchNorm2d", "sync_batchnorm_2d"]


class _SyncBatchNorm2d(Operator):
    """Inputs (x (N, C, H, W) or (N, C), scale (C,), bias (C,)); training mode only (see the module)."""

    def __init__(self, comm, running_mean, running_var, momentum=0.9, eps=1e-5, name=None):
        super().__init__(name)
        self.comm = comm
        self.running_mean, self.running_var = running_mean, running_var
        self.momentum, self.eps = float(momentum), float(eps)

    def forward(self, x, scale, bias):
        if x.ndim not in (2, 4):
            raise ValueError(f"SyncBatchNorm2d: expected x of shape (N, C, H, W) or (N, C), got {tuple(x.shape)}")
        C = x.shape[1]
        for what, t in (("scale", scale), ("bias", bias), ("running_mean", self.running_mean),
                        ("running_var", self.running_var)):
            if tuple(t.shape) != (C,):
                raise ValueError(f"SyncBatchNorm2d: {what} must have shape ({C},) for x {tuple(x.shape)}, got "
                                 f"{tuple(t.shape)}")
        pshape = [1, C] + [1] * (x.ndim - 2)
        axes = [0] + list(range(2, x.ndim))
        self.axes, self.pshape = axes, pshape
        # One all-reduce of [sum x (C), sum x*x (C), count]: float64, so E[x^2] - E[x]^2 keeps its digits.
        x64 = x.cast(tensor.float64)
        count = _core.Tensor.from_buffer(np.array([x.numel // C], np.float64))
        stats = _core.concat([_core.sum(x64, axes, False), _core.sum(_core.square(x64), axes, False),
                              count if x.device.is_cpu() else count.to(x.device)], 0)
        self.comm.all_reduce(stats, "sum")
        host = np.asarray(stats if stats.device.is_cpu() else stats.to(_core.Device("cpu")), np.float64)
        M = float(host[2 * C])
        if M < 2:
            raise ValueError(f"SyncBatchNorm2d: training needs more than one value per channel over all ranks, "
                             f"got {int(M)}")
        mean = host[:C] / M
        var = np.maximum(host[C:2 * C] / M - mean * mean, 0.0)  # biased, for normalising
        dev, dt = x.device, x.dtype

        def on_device(a):  # float64 host values -> x's dtype (float16, bfloat16 too) on x's device
            t = _core.Tensor.from_buffer(np.ascontiguousarray(a, np.float64)).cast(dt)
            return t if dev.is_cpu() else t.to(dev)

        inv_std = on_device(1.0 / np.sqrt(var + self.eps)).reshape(pshape)
        xhat = _core.sub(x, on_device(mean).reshape(pshape))
        _core.mul(xhat, inv_std, out=xhat)
        y = _core.mul(xhat, scale.reshape(pshape))
        _core.add(y, bias.reshape(pshape), out=y)
        m = self.momentum  # running = (1 - m) * running + m * batch statistic, as batchnorm_2d
        rm, rv = self.running_mean, self.running_var
        _core.mul_scalar(rm, 1.0 - m, out=rm)
        _core.axpy_(m, on_device(mean), rm)
        _core.mul_scalar(rv, 1.0 - m, out=rv)
        _core.axpy_(m, on_device(var * M / (M - 1)), rv)
        self.xhat, self.inv_std, self.M, self.scale_b = xhat, inv_std, M, scale.reshape(pshape)
        return y

    def backward(self, dy):
        axes, C = self.axes, self.pshape[1]
        dbias = _core.sum(dy, axes, False)
        dscale = _core.sum(_core.mul(dy, self.xhat), axes, False)
        # dx through the global statistics: the sums of dy and dy * xhat over every rank's values
        sums = _core.concat([dbias, dscale], 0)
        self.comm.all_reduce(sums, "sum")
        sum_dy = sums.slice(0, 0, C, 1).reshape(self.pshape)
        sum_dy_xhat = sums.slice(0, C, 2 * C, 1).reshape(self.pshape)
        dx = _core.mul(self.xhat, sum_dy_xhat)  # scale * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy xhat))
        _core.add(dx, sum_dy, out=dx)
        _core.sub(_core.mul_scalar(dy, self.M), dx, out=dx)
        k = _core.mul(self.scale_b, self.inv_std)
        _core.mul_scalar(k, 1.0 / self.M, out=k)
        _core.mul(dx, k, out=dx)
        self.xhat = None
        return dx, dscale, dbias


def sync_batchnorm_2d(comm, x, scale, bias, running_mean, running_var, momentum=0.9, eps=1e-5):
    """Batch normalisation with the statistics of every rank's x (training mode; in evaluation mode the
    running statistics, as autograd.batchnorm_2d). comm: the Communicator of the ranks."""
    if not engine.training:
        return ops.batchnorm_2d(x, scale, bias, running_mean, running_var, momentum, eps)
    op = _SyncBatchNorm2d(comm, running_mean.data, running_var.data, momentum, eps)
    return op(x, scale, bias)[0]


class SyncBatchNorm2d(BatchNorm2d):
    """BatchNorm2d whose training statistics are those of the global batch (every rank's share); see the
    module. communicator: the ranks' Communicator (e.g. ``dist_opt.communicator``); None: the one of
    ``ddp.init()`` when it has been called, else the first training call raises. Same arguments, parameters,
    running statistics and checkpoint names as BatchNorm2d, so a model can swap one for the other."""

    def __init__(self, *args, momentum: float = 0.9, eps: float = 1e-5, communicator=None,
                 name: str | None = None):
        super().__init__(*args, momentum=momentum, eps=eps, name=name)
        self.communicator = communicator

    def _comm(self):
        if self.communicator is not None:
            return self.communicator
        comm = ddp.current_communicator()
        if comm is not None:
            return comm
        raise RuntimeError(f"{self.name}: SyncBatchNorm2d needs the ranks' communicator for training: pass "
                           f"communicator=dist_opt.communicator (or call ddp.init() first); in one process "
                           f"use BatchNorm2d")

    def forward(self, x):
        if not engine.training:
            return super().forward(x)
        return sync_batchnorm_2d(self._comm(), x, self.scale, self.bias, self.running_mean, self.running_var,
                                 self.momentum, self.eps)
