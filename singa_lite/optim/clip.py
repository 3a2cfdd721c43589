"""Clipping gradients by their global norm (PyTorch's ``clip_grad_norm_``, Horovod users' step between the
exchange and the update), as ``opt.clip_grad_norm``.

In data-parallel training it is applied to the *averaged* gradients, which are the same on every rank, so
every rank computes the same norm and the same factor, and the replicas stay identical without any
communication of their own. Where the averaged gradients are:

    pending = dist_opt.backward(loss)                       # DistOpt, two phases
    norm = opt.clip_grad_norm(pending.synchronize(), 1.0)   # or pending.clip_grad_norm(1.0)
    pending.finish()

    dist_opt.backward(loss); dist_opt.clip_grad_norm(1.0); dist_opt.step()   # the same on the open step

    ddp_opt.backward(loss); ddp_opt.clip_grad_norm(1.0); ddp_opt.step()      # ddp.DistributedOptimizer

    model = parallel.DataParallel(model)                    # hooks: backward yields averaged gradients
    pairs = list(autograd.backward(loss))
    opt.clip_grad_norm(pairs, 1.0)
    for p, g in pairs:
        sgd.apply(p.name, p, g)
    sgd.step()

With gradient accumulation, clip after the exchanging pass: the pairs of an accumulating pass are empty
(their norm is 0 and nothing changes), so clipping applies to the averaged sum, not to micro-batches.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core, tensor
from ..tensor import Tensor

__all__ = ["clip_grad_norm", "grad_norm"]


def _grads(grads, who: str) -> list:
    """The gradients' C++ tensors, from (param, grad) pairs or gradient tensors."""
    if isinstance(grads, (Tensor, _core.Tensor)):
        grads = [grads]
    out = []
    for item in grads:
        g = item[1] if isinstance(item, tuple) and len(item) == 2 else item
        if isinstance(g, Tensor):
            g = g.data
        if not isinstance(g, _core.Tensor):
            raise TypeError(f"{who}: expected (param, grad) pairs or gradient tensors, got "
                            f"{type(item).__name__}")
        out.append(g)
    return out


def _norm_type(norm_type, who: str) -> float:
    if isinstance(norm_type, str) and norm_type.lower() == "inf":
        return math.inf
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or not norm_type > 0:
        raise ValueError(f"{who}: norm_type must be a number > 0 or 'inf' (2: the Euclidean norm), got "
                         f"{norm_type!r}")
    return float(norm_type)


def _scalar(t: _core.Tensor) -> float:
    return float(np.asarray(t if t.device.is_cpu() else t.to(_core.Device("cpu"))))


def _norm_of(grads: list, p: float) -> float:
    """The norm of all the gradients as one vector: per-tensor reductions on their device, combined in
    float64 on the host in the order given (so identical gradients give identical bits on every rank)."""
    total = 0.0
    for g in grads:
        if g.numel == 0:
            continue
        if g.dtype not in (tensor.float32, tensor.float64):
            g = g.cast(tensor.float32)
        if p == math.inf:
            total = max(total, _scalar(_core.max(_core.abs(g))))
        elif p == 2.0:
            total += _scalar(_core.sum(_core.square(g)))
        elif p == 1.0:
            total += _scalar(_core.sum(_core.abs(g)))
        else:
            total += _scalar(_core.sum(_core.pow_scalar(_core.abs(g), p)))
    if p in (math.inf, 1.0):
        return total
    return total ** (1.0 / p) if math.isfinite(total) else total


def grad_norm(grads, norm_type=2.0) -> float:
    """The norm of the gradients taken together ((param, grad) pairs or gradient tensors)."""
    return _norm_of(_grads(grads, "grad_norm"), _norm_type(norm_type, "grad_norm"))


def clip_grad_norm(grads, max_norm, norm_type=2.0, error_if_nonfinite: bool = False) -> float:
    """Scales the gradients in place so that their global norm is at most `max_norm`; returns the norm
    before clipping.

    grads: (param, grad) pairs (what ``PendingStep.synchronize()`` or ``autograd.backward`` give) or gradient
    tensors. norm_type: 2 (default), any p > 0, or ``math.inf`` / ``'inf'`` (the largest magnitude). The factor
    is ``max_norm / (norm + 1e-6)``, applied only when it is below 1 (as PyTorch). A non-finite norm
    changes nothing (DistOpt skips or refuses such a step by itself) unless error_if_nonfinite, which
    raises FloatingPointError.

        norm = opt.clip_grad_norm(dist_opt.synchronize(), max_norm=1.0)
    """
    who = "clip_grad_norm"
    gs = _grads(grads, who)
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm > 0:
        raise ValueError(f"{who}: max_norm must be a number > 0, got {max_norm!r}")
    norm = _norm_of(gs, _norm_type(norm_type, who))
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise FloatingPointError(f"{who}: the gradients' norm is {norm}; nothing was scaled")
        return norm
    factor = float(max_norm) / (norm + 1e-6)
    if factor < 1.0:
        for g in gs:
            _core.mul_scalar(g, factor, out=g)
    return norm
