"""The optimizers: SGD (momentum, Nesterov, weight decay), RMSProp, AdaGrad and Adam, each written to the
contract of :class:`~singa_lite.optim.optimizer.Optimizer`."""
from __future__ import annotations

import math

from .. import _core, tensor
from .optimizer import Optimizer

__all__ = ["SGD", "RMSProp", "AdaGrad", "Adam"]


def _plus_decay(g: _core.Tensor, p: _core.Tensor, weight_decay: float) -> _core.Tensor:
    """g + weight_decay * p: g itself when there is no decay, otherwise a new tensor (g is never written)."""
    if weight_decay == 0:
        return g
    gw = g.clone()
    _core.axpy_(weight_decay, p, gw)
    return gw


def _step_by_root(p, g, acc, epsilon: float, lr: float, tmp) -> None:
    """p -= lr * g / sqrt(acc + epsilon), SINGA's RMSProp / AdaGrad step; tmp (shaped like p) is scratch."""
    _core.add_scalar(acc, epsilon, out=tmp)
    _core.sqrt(tmp, out=tmp)
    _core.div(g, tmp, out=tmp)
    _core.axpy_(-lr, tmp, p)


# ---------------------------------------------------------------- optimizers
class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (L2).

    With ``g = grad + weight_decay * param`` (the decay is added to the gradient), per step::

        buf = g                                      first step with momentum
        buf = momentum * buf + (1 - dampening) * g   later steps
        d   = g + momentum * buf   if nesterov,  buf  if momentum != 0,  g  otherwise
        param -= lr * d

    as ``torch.optim.SGD``. Every hyper-parameter may be a number or a :class:`DecayScheduler`; their current
    values are ``lr_value``, ``mom_value``, ``dam_value`` and ``decay_value``. Nesterov needs momentum > 0 and
    zero dampening. Updates float16 parameters as well (computing in float32); no temporary tensors are made.
    State: ``moments`` (the momentum buffers).
    """

    _state_slots = ("moments",)
    supported_dtypes = (tensor.float16, tensor.float32, tensor.float64)

    def __init__(self, lr=0.1, momentum=0, dampening=0, weight_decay=0, nesterov=False, dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.momentum = self._hyper("momentum", momentum, "mom_value", hi=1.0)
        self.dampening = self._hyper("dampening", dampening, "dam_value", hi=1.0, hi_open=False)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum.init_value <= 0 or self.dampening.init_value != 0):
            raise ValueError(f"SGD: Nesterov momentum requires momentum > 0 and dampening == 0, got "
                             f"momentum={self.momentum.init_value}, dampening={self.dampening.init_value}")

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        lr, mom, damp, wd = self.lr_value, self.mom_value, self.dam_value, self.decay_value
        # One fused pass per parameter (_core.sgd_update_), not one op per term of the formula.
        if mom == 0:
            _core.sgd_update_(p, g, None, lr, 0.0, damp, wd)
            return
        buf = self._get_state("moments", param_name, param_value)
        first = buf is None  # the buffer starts as the (decayed) gradient
        buf = self._new_state("moments", param_name, param_value) if first else buf
        try:
            _core.sgd_update_(p, g, buf.data, lr, mom, damp, wd, self.nesterov, first)
        except Exception:
            if first:  # nothing was written: the next step is still this parameter's first
                del self.moments[param_name]
            raise


class RMSProp(Optimizer):
    """RMSProp (SINGA's formula: epsilon inside the square root).

    With ``g = grad + weight_decay * param``, per step::

        running_average = rho * running_average + (1 - rho) * g * g     (starts at 0)
        param -= lr * g / sqrt(running_average + epsilon)

    ``torch.optim.RMSprop(alpha=rho)`` divides by ``sqrt(running_average) + eps`` instead; the two agree
    closely for small epsilon and exactly for epsilon = 0. Current values: ``lr_value``, ``rho_value``,
    ``epsilon_value``, ``decay_value``. State: ``running_average``.
    """

    _state_slots = ("running_average",)

    def __init__(self, lr=0.1, rho=0.9, epsilon=1e-8, weight_decay=0, dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.rho = self._hyper("rho", rho, hi=1.0)
        self.epsilon = self._hyper("epsilon", epsilon)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        avg = self._get_state("running_average", param_name, param_value)
        g = _plus_decay(g, p, self.decay_value)
        tmp = _core.square(g)
        avg = (avg if avg is not None else self._new_state("running_average", param_name, param_value)).data
        _core.mul_scalar(avg, self.rho_value, out=avg)
        _core.axpy_(1.0 - float(self.rho_value), tmp, avg)
        _step_by_root(p, g, avg, self.epsilon_value, self.lr_value, tmp)


class AdaGrad(Optimizer):
    """AdaGrad (SINGA's formula: epsilon inside the square root).

    With ``g = grad + weight_decay * param``, per step::

        history += g * g                                (starts at 0)
        param -= lr * g / sqrt(history + epsilon)

    ``torch.optim.Adagrad`` (lr_decay=0, initial_accumulator_value=0) divides by ``sqrt(history) + eps``;
    the two agree closely for small epsilon and exactly for epsilon = 0. Current values: ``lr_value``,
    ``epsilon_value``, ``decay_value``. State: ``history``.
    """

    _state_slots = ("history",)

    def __init__(self, lr=0.1, epsilon=1e-8, weight_decay=0, dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.epsilon = self._hyper("epsilon", epsilon)
        self.weight_decay = self._hyper("weight_decay", weight_decay, "decay_value")

    def apply(self, param_name, param_value, param_grad) -> None:
        g = self._check(param_name, param_value, param_grad)
        p = param_value.data
        hist = self._get_state("history", param_name, param_value)
        g = _plus_decay(g, p, self.decay_value)
        tmp = _core.square(g)
        hist = (hist if hist is not None else self._new_state("history", param_name, param_value)).data
        _core.axpy_(1.0, tmp, hist)
        _step_by_root(p, g, hist, self.epsilon_value, self.lr_value, tmp)


def adam_moments(g: _core.Tensor, m: _core.Tensor, v: _core.Tensor, b1: float, b2: float,
                  tmp: _core.Tensor) -> None:
    """m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g (tmp holds g * g on entry)."""
    _core.mul_scalar(m, b1, out=m)
    _core.axpy_(1.0 - b1, g, m)
    _core.mul_scalar(v, b2, out=v)
    _core.axpy_(1.0 - b2, tmp, v)


def adam_ratio(m: _core.Tensor, v: _core.Tensor, bc1: float, bc2: float, eps: float,
                out: _core.Tensor) -> None:
    """out = (m / bc1) / (sqrt(v / bc2) + eps), the bias-corrected Adam direction (in the order of
    torch.optim.AdamW: sqrt(v) / sqrt(bc2) + eps, then m / that, then / bc1)."""
    _core.sqrt(v, out=out)
    _core.mul_scalar(out, 1.0 / math.sqrt(bc2), out=out)
    _core.add_scalar(out, eps, out=out)
    _core.div(m, out, out=out)
    if bc1 != 1.0:
        _core.mul_scalar(out, 1.0 / bc1, out=out)


class Adam(Optimizer):
    """Adam with bias correction, as ``torch.optim.Adam`` (L2 weight decay added to the gradient, not AdamW).

    With ``g = grad + weight_decay * param`` and ``t`` the number of updates of this parameter so far
    (1 on its first update), per step::

        m = beta_1 * m + (1 - beta_1) * g               (m, v start at 0)
        v = beta_2 * v + (1 - beta_2) * g * g
        param -= lr / (1 - beta_1**t) * m / (sqrt(v) / sqrt(1 - beta_2**t) + epsilon)

    Current values: ``lr_value``, ``beta_1_value``, ``beta_2_value``, ``epsilon_value``, ``decay_value``.
    State: ``m``, ``v`` (tensors) and ``t`` (per-parameter update counts).
    """

    _state_slots = ("m", "v")
    _scalar_slots = ("t",)

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0, dtype=tensor.float32):
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
        b1, b2 = float(self.beta_1_value), float(self.beta_2_value)  # plain floats: arithmetic below
        t = int(self.t.get(param_name, 0)) + 1
        g = _plus_decay(g, p, self.decay_value)
        tmp = _core.square(g)
        m = (m if m is not None else self._new_state("m", param_name, param_value)).data
        v = (v if v is not None else self._new_state("v", param_name, param_value)).data
        adam_moments(g, m, v, b1, b2, tmp)
        # denominator sqrt(v) / sqrt(1 - b2^t) + eps, then param -= lr / (1 - b1^t) * m / denominator
        adam_ratio(m, v, 1.0, 1.0 - b2 ** t, self.epsilon_value, tmp)
        _core.axpy_(-float(self.lr_value) / (1.0 - b1 ** t), tmp, p)
        self.t[param_name] = t

