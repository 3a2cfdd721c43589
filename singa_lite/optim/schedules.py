"""Schedules for hyper-parameters (the learning rate, momentum, weight decay...): a value as a function of
the optimizer's step counter, ``scheduler(step) -> HyperValue`` (a float). Any :class:`DecayScheduler` may be
given where an optimizer takes a number."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import tensor

__all__ = ["HyperValue", "DecayScheduler", "Constant", "ExponentialDecay", "StepDecay", "LinearDecay",
           "WarmupCosineDecay"]


def _real(what: str, value) -> float:
    """value as a float; a TypeError for anything that is not a real number (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def _arith(op):
    def method(self, other):
        r = op(self, other)
        # NotImplemented (a Tensor operand) lets Python call the Tensor's reflected operator: a Tensor result.
        return r if r is NotImplemented else HyperValue(r)
    method.__name__ = op.__name__
    return method


# ---------------------------------------------------------------- the value of a schedule
class HyperValue(float):
    """A hyper-parameter's value: a Python float that also does what SINGA's one-element value tensors do.

    The optimizers here hand it to their kernels as the float it is (no tensor, no device transfer). Code
    written for SINGA, whose schedules return a shape-(1,) tensor, keeps working:

    - ``v.as_type(dtype)`` is a new shape-(1,) :class:`~singa_lite.tensor.Tensor` holding the value
      (``self.momentum(self.step_counter).as_type(self.dtype)`` in a SINGA-style optimizer);
    - ``v.data`` is a shape-(1,) float32 ``_core.Tensor`` (``singa.Axpy(v.data, x, y)`` accepts it);
    - arithmetic with a number gives a ``HyperValue`` (so ``(0.0 - opt.lr_value).data`` works), arithmetic
      with a tensor gives a tensor, comparisons give bools.

    It is immutable, as floats are. SINGA's ``value.copy_from(new)`` writes into a value tensor; here it
    accepts a ``new`` equal to this value (a constant schedule re-evaluated at each step, which optimizers
    written against SINGA's API copy into the value they kept from the schedule) and refuses any other with
    a ValueError: an optimizer whose kept values change keeps the tensor ``as_type`` returned instead.
    """

    __slots__ = ()

    shape = (1,)

    def as_type(self, dtype) -> tensor.Tensor:
        """A new shape-(1,) tensor of `dtype` holding this value (SINGA's ``Tensor.as_type``)."""
        return tensor.from_numpy(np.array([float(self)], dtype=np.float32)).as_type(dtype)

    @property
    def data(self):
        """A new shape-(1,) float32 ``_core.Tensor`` holding this value (SINGA's ``Tensor.data``)."""
        return tensor.from_numpy(np.array([float(self)], dtype=np.float32)).data

    def item(self) -> float:
        return float(self)

    def copy_from(self, other, offset=0) -> None:
        """SINGA's ``value.copy_from(new)`` where a float can honour it: ``new`` (a number, a HyperValue or a
        one-element tensor) equal to this value leaves it as it is; another value raises ValueError."""
        if offset != 0:
            raise ValueError(f"HyperValue.copy_from: a value has one element, so offset must be 0, got {offset!r}")
        if isinstance(other, tensor.Tensor):
            if other.size() != 1:
                raise ValueError(f"HyperValue.copy_from: expected a one-element tensor, got shape {other.shape}")
            new = float(tensor.to_numpy(other).reshape(-1)[0])
        else:
            new = _real("HyperValue.copy_from: the new value", other)
        mine = float(self)
        # compared at float32, the precision of SINGA's value tensors (and of as_type's tensors here)
        if np.float32(new) == np.float32(mine) or (math.isnan(new) and math.isnan(mine)):
            return
        raise ValueError(
            f"HyperValue.copy_from: this value is an immutable float ({mine!r}) and cannot take {new!r} in "
            "place. Keep the tensor that value.as_type(dtype) returns and copy_from into that (SINGA's "
            "examples/cnn_ms does), or assign the new value: self.mom_value = self.momentum(self.step_counter)")

    __add__, __radd__ = _arith(float.__add__), _arith(float.__radd__)
    __sub__, __rsub__ = _arith(float.__sub__), _arith(float.__rsub__)
    __mul__, __rmul__ = _arith(float.__mul__), _arith(float.__rmul__)
    __truediv__, __rtruediv__ = _arith(float.__truediv__), _arith(float.__rtruediv__)
    __pow__, __rpow__ = _arith(float.__pow__), _arith(float.__rpow__)

    def __neg__(self):
        return HyperValue(-float(self))

    def __repr__(self):
        return float.__repr__(self)

    def __reduce__(self):
        # pickled (a checkpoint, a DistOpt message) as the plain float it is
        return (float, (float(self),))


# ---------------------------------------------------------------- schedules
class DecayScheduler:
    """A value that changes with the optimizer's step: ``scheduler(step) -> HyperValue`` (a float).

    Used for the learning rate, and for any other hyper-parameter (momentum, weight decay...). ``step`` is the
    optimizer's step counter: 0 before the first :meth:`Optimizer.step`. It may be given as an int, a float
    or a one-element tensor (SINGA passes its step-counter tensor). Subclasses implement ``call(step)``,
    receiving the step as a float; what ``call`` returns is converted with ``float()`` and returned as a
    :class:`HyperValue`: a float that also has SINGA's tensor methods (``as_type``, ``data``), so optimizers
    written for SINGA (``self.momentum(self.step_counter).as_type(self.dtype)``) run unchanged.
    """

    def __init__(self, init_value):
        self.init_value = _real(f"{type(self).__name__}: init_value", init_value)

    def __call__(self, step) -> HyperValue:
        s = float(step)
        if not s >= 0:
            raise ValueError(f"{type(self).__name__}: the step must be >= 0, got {step!r}")
        return HyperValue(self.call(s))

    def call(self, step: float) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement call(step)")

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(DecayScheduler):
    """``value(step) = init_value``."""

    def call(self, step: float) -> float:
        return self.init_value


class ExponentialDecay(DecayScheduler):
    """``value(step) = init_value * decay_rate ** (step / decay_steps)``.

    With ``staircase=True`` the exponent is ``floor(step / decay_steps)``: the value drops by a factor
    ``decay_rate`` every ``decay_steps`` steps.
    """

    def __init__(self, init_value, decay_steps, decay_rate, staircase=False):
        super().__init__(init_value)
        self.decay_steps = _real("ExponentialDecay: decay_steps", decay_steps)
        self.decay_rate = _real("ExponentialDecay: decay_rate", decay_rate)
        self.staircase = bool(staircase)
        if not self.decay_steps > 0:
            raise ValueError(f"ExponentialDecay: decay_steps must be > 0, got {decay_steps!r}")
        if not (math.isfinite(self.decay_rate) and self.decay_rate >= 0):
            raise ValueError(f"ExponentialDecay: decay_rate must be >= 0, got {decay_rate!r}")

    def call(self, step: float) -> float:
        e = step / self.decay_steps
        return self.init_value * self.decay_rate ** (math.floor(e) if self.staircase else e)


class StepDecay(DecayScheduler):
    """``value(step) = init_value * gamma ** floor(step / step_size)`` (``torch.optim.lr_scheduler.StepLR``)."""

    def __init__(self, init_value, step_size, gamma=0.1):
        super().__init__(init_value)
        if isinstance(step_size, bool) or not isinstance(step_size, numbers.Integral) or step_size <= 0:
            raise ValueError(f"StepDecay: step_size must be an int > 0, got {step_size!r}")
        self.step_size = int(step_size)
        self.gamma = _real("StepDecay: gamma", gamma)
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"StepDecay: gamma must be >= 0, got {gamma!r}")

    def call(self, step: float) -> float:
        return self.init_value * self.gamma ** math.floor(step / self.step_size)


class LinearDecay(DecayScheduler):
    """``value(step) = init_value + (final_value - init_value) * min(step, decay_steps) / decay_steps``.

    Goes in a straight line from ``init_value`` at step 0 to ``final_value`` at ``decay_steps``, then stays.
    """

    def __init__(self, init_value, final_value, decay_steps):
        super().__init__(init_value)
        self.final_value = _real("LinearDecay: final_value", final_value)
        self.decay_steps = _real("LinearDecay: decay_steps", decay_steps)
        if not self.decay_steps > 0:
            raise ValueError(f"LinearDecay: decay_steps must be > 0, got {decay_steps!r}")

    def call(self, step: float) -> float:
        frac = min(step, self.decay_steps) / self.decay_steps
        return self.init_value + (self.final_value - self.init_value) * frac



class WarmupCosineDecay(DecayScheduler):
    """Linear warmup, then cosine decay: the learning-rate schedule of large-batch training (Goyal et al. 2017's
    warmup; Loshchilov & Hutter's cosine annealing without restarts)::

        value(step) = start_value + (init_value - start_value) * step / warmup_steps     step < warmup_steps
        value(step) = final_value + (init_value - final_value) * (1 + cos(pi * s / n)) / 2
                      with s = step - warmup_steps, n = total_steps - warmup_steps      up to total_steps
        value(step) = final_value                                                        after total_steps

    ``init_value`` is the peak (the base learning rate), reached at ``warmup_steps``; ``total_steps`` counts
    the warmup. The same as torch's ``SequentialLR([LinearLR(start_value / init_value, 1, warmup_steps),
    CosineAnnealingLR(total_steps - warmup_steps, final_value)], [warmup_steps])`` up to ``total_steps``
    (torch's cosine turns back up after it; this one stays at ``final_value``).
    """

    def __init__(self, init_value, total_steps, warmup_steps=0, start_value=0.0, final_value=0.0):
        super().__init__(init_value)
        for what, v in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"WarmupCosineDecay: {what} must be an int >= 0, got {v!r}")
        if not total_steps > warmup_steps:
            raise ValueError(f"WarmupCosineDecay: total_steps (the whole schedule, warmup included) must be "
                             f"greater than warmup_steps, got total_steps={total_steps}, "
                             f"warmup_steps={warmup_steps}")
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.start_value = _real("WarmupCosineDecay: start_value", start_value)
        self.final_value = _real("WarmupCosineDecay: final_value", final_value)
        for what, v in (("init_value", self.init_value), ("start_value", self.start_value),
                        ("final_value", self.final_value)):
            if not math.isfinite(v):
                raise ValueError(f"WarmupCosineDecay: {what} must be finite, got {v!r}")

    def call(self, step: float) -> float:
        if step < self.warmup_steps:
            return self.start_value + (self.init_value - self.start_value) * step / self.warmup_steps
        if step >= self.total_steps:
            return self.final_value
        frac = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.final_value + (self.init_value - self.final_value) * (1.0 + math.cos(math.pi * frac)) / 2.0
