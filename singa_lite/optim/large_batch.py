"""The optimizers of large-batch training: AdamW (decoupled weight decay) and the layer-wise adaptive ones,
LAMB and LARS, each written to the contract of :class:`~singa_lite.optim.optimizer.Optimizer` (so they work
inside ``DistOpt``, ``amp.MixedPrecision``, checkpoints and the replica check unchanged).

LAMB and LARS scale each parameter's step by a *trust ratio* computed from norms of the whole parameter
tensor (one "layer" of the papers). ``DistOpt`` applies every parameter whole, with the averaged gradient,
so k ranks compute the ratios of one process on the whole batch. An optimizer that updated a slice of a
parameter (a flat shard) would need the norms of the whole tensor: :attr:`LAMB.layerwise` and
:attr:`LARS.layerwise` are True to say so.

Which parameters are *excluded* from the layer-wise adaptation (and from weight decay) is a predicate
``exclude(param_name, param) -> bool``; :func:`one_dimensional` (biases, batch-norm scales and shifts) is
LARS's default, as in the reference implementations of large-batch ResNet training.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core, tensor
from ..tensor import Tensor
from .algorithms import adam_moments, adam_ratio
from .optimizer import Optimizer

__all__ = ["AdamW", "LAMB", "LARS", "one_dimensional"]


def one_dimensional(param_name, param: Tensor) -> bool:
    """True for parameters with at most one dimension (biases, batch-norm and layer-norm scales and shifts):
    the parameters LARS leaves out of the trust ratio and of weight decay by default."""
    return len(param.shape) <= 1


def _check_exclude(owner: str, exclude):
    if exclude is not None and not callable(exclude):
        raise TypeError(f"{owner}: exclude must be None or a callable exclude(param_name, param) -> bool "
                        f"(e.g. optim.large_batch.one_dimensional), got {exclude!r} ({type(exclude).__name__})")
    return exclude


def _norm(t: _core.Tensor) -> float:
    """The L2 norm of a tensor, reduced on its device (in its dtype), as a Python float."""
    if t.numel == 0:
        return 0.0
    s = _core.sum(_core.square(t), None, False)
    return math.sqrt(float(np.asarray(s if s.device.is_cpu() else s.to(_core.Device("cpu"))).reshape(-1)[0]))


# ---------------------------------------------------------------- AdamW
class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019),
    as ``torch.optim.AdamW``.

    With ``t`` the number of updates of this parameter so far (1 on its first), per step::

        param *= 1 - lr * weight_decay                  (the decay, before and apart from the Adam step)
        m = beta_1 * m + (1 - beta_1) * grad            (m, v start at 0)
        v = beta_2 * v + (1 - beta_2) * grad * grad
        v_max = max(v_max, v); use v_max for v          (amsgrad only)
        param -= lr / (1 - beta_1**t) * m / (sqrt(v) / sqrt(1 - beta_2**t) + epsilon)

    Unlike :class:`~singa_lite.optim.algorithms.Adam`'s ``weight_decay`` (L2: added to the gradient, then
    divided by ``sqrt(v)``), the decay here shrinks every weight by the same factor. Defaults are torch's
    (``weight_decay=0.01``). Current values: ``lr_value``, ``beta_1_value``, ``beta_2_value``,
    ``epsilon_value``, ``decay_value``. State: ``m``, ``v`` (and ``v_max`` with amsgrad) tensors, ``t``.
    """

    _state_slots = ("m", "v")
    _scalar_slots = ("t",)

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.01, amsgrad=False,
                 dtype=tensor.float32):
        if not isinstance(amsgrad, bool):
            raise TypeError(f"AdamW: amsgrad must be True or False, got {amsgrad!r}")
        self.amsgrad = amsgrad
        if amsgrad:  # the slot exists (and is checkpointed) only when used
            self._state_slots = ("m", "v", "v_max")
        super().__init__(lr, dtype)
        self.beta_1 = self._hyper("beta_1", beta_1, hi=1.0)
        self.beta_2 = self._hyper("beta_2", beta_2, hi=1.0)
        self.epsilon = self._hyper("epsilon", epsilon)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        m = self._get_state("m", param_name, param_value)
        v = self._get_state("v", param_name, param_value)
        vmax = self._get_state("v_max", param_name, param_value) if self.amsgrad else None
        # plain floats for the Python arithmetic below (a HyperValue's own arithmetic is slower)
        lr, b1, b2 = float(self.lr_value), float(self.beta_1_value), float(self.beta_2_value)
        wd = float(self.decay_value)
        t = int(self.t.get(param_name, 0)) + 1
        tmp = _core.square(g)
        m = (m if m is not None else self._new_state("m", param_name, param_value)).data
        v = (v if v is not None else self._new_state("v", param_name, param_value)).data
        if self.amsgrad:
            vmax = (vmax if vmax is not None else self._new_state("v_max", param_name, param_value)).data
        if wd != 0 and lr != 0:
            _core.mul_scalar(p, 1.0 - lr * wd, out=p)
        adam_moments(g, m, v, b1, b2, tmp)
        if self.amsgrad:
            _core.maximum(vmax, v, out=vmax)
        adam_ratio(m, vmax if self.amsgrad else v, 1.0, 1.0 - b2 ** t, self.epsilon_value, tmp)
        _core.axpy_(-lr / (1.0 - b1 ** t), tmp, p)
        self.t[param_name] = t


# ---------------------------------------------------------------- LAMB
class LAMB(Optimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020,
    Algorithm 2): Adam's direction plus decoupled weight decay, scaled per parameter by a trust ratio.

    With ``t`` the number of updates of this parameter so far (1 on its first), per step::

        m = beta_1 * m + (1 - beta_1) * grad            (m, v start at 0)
        v = beta_2 * v + (1 - beta_2) * grad * grad
        r = m / (1 - beta_1**t) / (sqrt(v / (1 - beta_2**t)) + epsilon) + weight_decay * param
        ratio = ||param|| / ||r||                       (1 when either norm is 0; at most max_trust_ratio)
        param -= lr * ratio * r

    The paper's scaling function phi is the identity, as in NVIDIA's implementation (apex FusedLAMB) and
    its BERT recipe; ``max_trust_ratio`` (default None: no bound) clips the ratio from above as some
    implementations do. ``bias_correction=False`` drops the ``1 - beta**t`` factors (the option of the same
    name in NVIDIA's implementation; both default to keeping them, as Algorithm 2 does). Parameters for
    which ``exclude(name, param)`` is true get neither weight decay nor the trust ratio (a plain Adam step);
    default None excludes nothing (BERT recipes exclude biases and layer-norm parameters: pass
    :func:`one_dimensional` or a name predicate).
    Global gradient-norm clipping, which NVIDIA's optimizer also does, is :func:`opt.clip_grad_norm`'s job.

    Current values: ``lr_value``, ``beta_1_value``, ``beta_2_value``, ``epsilon_value``, ``decay_value``.
    State: ``m``, ``v`` (tensors), ``t``. ``last_trust_ratio`` ({name: ratio} of the latest update of each
    parameter) is for logging, not state.
    """

    _state_slots = ("m", "v")
    _scalar_slots = ("t",)
    layerwise = True  # the trust ratio needs norms of whole parameter tensors

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.01,
                 bias_correction=True, max_trust_ratio=None, exclude=None, dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.beta_1 = self._hyper("beta_1", beta_1, hi=1.0)
        self.beta_2 = self._hyper("beta_2", beta_2, hi=1.0)
        self.epsilon = self._hyper("epsilon", epsilon)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")
        if not isinstance(bias_correction, bool):
            raise TypeError(f"LAMB: bias_correction must be True or False, got {bias_correction!r}")
        self.bias_correction = bias_correction
        if max_trust_ratio is not None:
            ok = isinstance(max_trust_ratio, numbers.Real) and not isinstance(max_trust_ratio, bool)
            if not ok or not (math.isfinite(max_trust_ratio) and max_trust_ratio > 0):
                raise ValueError(f"LAMB: max_trust_ratio must be None or a finite number > 0, got "
                                 f"{max_trust_ratio!r}")
            max_trust_ratio = float(max_trust_ratio)
        self.max_trust_ratio = max_trust_ratio
        self.exclude = _check_exclude("LAMB", exclude)
        self.last_trust_ratio = {}

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        excluded = bool(self.exclude(param_name, param_value)) if self.exclude is not None else False
        m = self._get_state("m", param_name, param_value)
        v = self._get_state("v", param_name, param_value)
        b1, b2 = float(self.beta_1_value), float(self.beta_2_value)
        wd = 0.0 if excluded else float(self.decay_value)
        t = int(self.t.get(param_name, 0)) + 1
        tmp = _core.square(g)
        m = (m if m is not None else self._new_state("m", param_name, param_value)).data
        v = (v if v is not None else self._new_state("v", param_name, param_value)).data
        adam_moments(g, m, v, b1, b2, tmp)
        bc1, bc2 = (1.0 - b1 ** t, 1.0 - b2 ** t) if self.bias_correction else (1.0, 1.0)
        adam_ratio(m, v, bc1, bc2, self.epsilon_value, tmp)  # tmp = r
        if wd != 0:
            _core.axpy_(wd, p, tmp)
        ratio = 1.0
        if not excluded:
            p_norm, r_norm = _norm(p), _norm(tmp)
            if p_norm > 0 and r_norm > 0:
                ratio = p_norm / r_norm
            if self.max_trust_ratio is not None:
                ratio = min(ratio, self.max_trust_ratio)
        _core.axpy_(-float(self.lr_value) * ratio, tmp, p)
        self.t[param_name] = t
        self.last_trust_ratio[param_name] = ratio


# ---------------------------------------------------------------- LARS
class LARS(Optimizer):
    """LARS (You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks", 2017, Algorithm 1):
    momentum SGD with a local learning rate per parameter.

    Per step, for a parameter that is not excluded::

        local_lr = eta * ||param|| / (||grad|| + weight_decay * ||param|| + epsilon)
                   (1 when ||param|| or ||grad|| is 0)
        buf = momentum * buf + lr * local_lr * (grad + weight_decay * param)     (buf starts at 0)
        param -= buf

    and for an excluded one (``exclude(name, param)`` true; default :func:`one_dimensional`: biases and
    batch-norm parameters) ``buf = momentum * buf + lr * grad``: no local rate, no weight decay, as in the
    reference implementations of large-batch ResNet training (TensorFlow's LARS optimizer with its skip list,
    MLPerf). ``exclude=None`` adapts every parameter, as the paper's Algorithm 1 does.

    The learning rate sits inside the momentum buffer, as in the paper (``torch.optim.SGD`` and NVIDIA's LARC
    keep it outside; the two differ only while the learning rate changes). The paper's polynomial decay of
    the global rate is a schedule: pass ``lr=opt.WarmupCosineDecay(...)`` or any other. Defaults: eta
    0.001 and epsilon 0, as the paper and TensorFlow's LARS. With ``momentum=0`` no buffer is kept.

    Current values: ``lr_value``, ``mom_value``, ``decay_value``, ``eta_value``, ``epsilon_value``. State:
    ``moments`` (the buffers). ``last_trust_ratio`` ({name: local_lr} of the latest update of each
    parameter) is for logging, not state.
    """

    _state_slots = ("moments",)
    layerwise = True  # the local learning rate needs norms of whole parameter tensors

    def __init__(self, lr=0.1, momentum=0.9, weight_decay=0.0001, eta=0.001, epsilon=0.0, exclude=one_dimensional,
                 dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.momentum = self._hyper("momentum", momentum, "mom_value", hi=1.0)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")
        self.eta = self._hyper("eta", eta)
        self.epsilon = self._hyper("epsilon", epsilon)
        self.exclude = _check_exclude("LARS", exclude)
        self.last_trust_ratio = {}

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        excluded = bool(self.exclude(param_name, param_value)) if self.exclude is not None else False
        buf = self._get_state("moments", param_name, param_value)
        lr, mom = float(self.lr_value), float(self.mom_value)
        wd = 0.0 if excluded else float(self.decay_value)
        local = 1.0
        if not excluded:
            p_norm, g_norm = _norm(p), _norm(g)
            if p_norm > 0 and g_norm > 0:
                local = float(self.eta_value) * p_norm / (g_norm + wd * p_norm + float(self.epsilon_value))
        d = g.clone()  # grad + weight_decay * param, a new tensor (the gradient is not written)
        if wd != 0:
            _core.axpy_(wd, p, d)
        if mom == 0:
            _core.axpy_(-lr * local, d, p)
        else:
            buf = (buf if buf is not None else self._new_state("moments", param_name, param_value)).data
            _core.mul_scalar(buf, mom, out=buf)
            _core.axpy_(lr * local, d, buf)
            _core.axpy_(-1.0, buf, p)
        self.last_trust_ratio[param_name] = local
