"""Optimizers and learning-rate schedules, with SINGA's names (``singa.opt``).

Use, as in SINGA 3.x::

    sgd = opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5)
    sgd(loss)                        # backward, one apply() per parameter, then step()
    # or by hand, e.g. with gradients from elsewhere:
    sgd.apply("W", w, dw); sgd.step()

The optimizer contract
----------------------
Every optimizer here, and any optimizer written to this contract, works unchanged inside ``DistOpt``
(which calls :meth:`Optimizer.apply` with all-reduced, averaged gradients, then :meth:`Optimizer.step`
once per iteration).

A subclass of :class:`Optimizer`

- calls ``super().__init__(lr, dtype)`` and registers every other hyper-parameter with
  ``self._hyper(name, value, value_attr=None, lo=0.0, hi=inf, hi_open=True)``: the value may be a number or
  a :class:`DecayScheduler`, and must lie in ``[lo, hi)`` (``[lo, hi]`` with ``hi_open=False``); the current
  value is the float ``self.<value_attr>`` (default ``<name>_value``; ``self.lr_value`` for the learning
  rate), re-evaluated and re-validated at every :meth:`step`;
- implements ``apply(param_name, param_value, param_grad)``, which must

  1. validate first, through ``self._check(param_name, param_value, param_grad)`` (shape, dtype, device),
     and fetch its state (``self._get_state``) and allocate what it needs *before* it writes anything, so a
     call that raises leaves the parameter and the state as they were;
  2. update ``param_value`` **in place**: the same :class:`~singa_lite.tensor.Tensor`, the same ``.data``
     storage (views and aliases of the parameter see the update), with ``_core`` ops (``axpy_``,
     ``out=`` arguments) and no copy to numpy;
  3. leave ``param_grad`` unchanged and keep no reference to it (DistOpt hands out views of fusion buffers
     that are reused for the next bucket);
  4. read hyper-parameters only from the ``*_value`` attributes, which :meth:`step` refreshes;

- keeps its per-parameter state in dictionaries ``{param_name: Tensor}`` named in the class attribute
  ``_state_slots`` (tensors with the parameter's shape, dtype and device, created lazily on the first apply
  with ``self._new_state``) and per-parameter Python numbers in dictionaries named in ``_scalar_slots``;
  :meth:`Optimizer.get_states` and :meth:`Optimizer.set_states` checkpoint exactly those, plus the step counter;
- lists the parameter dtypes it supports in ``supported_dtypes``.

Differences from SINGA, on purpose
----------------------------------
- ``lr_value`` (and ``mom_value``, ``decay_value``...) and ``step_counter`` are Python numbers rather than
  one-element tensors, and schedules return floats: they are host scalars handed to the kernels.
- ``get_states`` returns numpy arrays (a plain, pickle-free checkpoint) and ``set_states`` accepts numpy
  arrays or tensors.
- SGD's momentum buffer starts as the first gradient (PyTorch's rule, and SINGA 2's) rather than as
  ``(1 - dampening) * grad``.
- Adam's bias correction counts the updates each parameter has received (as ``torch.optim.Adam``);
  SINGA uses the global step counter + 1, which is the same when every parameter is updated every step.
- Hyper-parameters are validated (a clear ``ValueError``), and a gradient whose shape, dtype or device
  differs from its parameter's is refused before anything is written (SINGA asserts on the shape only,
  and would broadcast a smaller gradient).
"""
from __future__ import annotations

import itertools
import math
import numbers
import warnings

import numpy as np

from . import _core, tensor
from .data.partition import data_partition  # noqa: F401 - SINGA scripts partition with DistOpt's rank
from .clip import clip_grad_norm, grad_norm  # noqa: F401 - between DistOpt's exchange and update
from .tensor import Tensor

__all__ = [
    "DecayScheduler", "Constant", "ExponentialDecay", "StepDecay", "LinearDecay",
    "Optimizer", "SGD", "RMSProp", "AdaGrad", "Adam", "data_partition", "clip_grad_norm", "grad_norm",
]


def _real(what: str, value) -> float:
    """value as a float; a TypeError for anything that is not a real number (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


# ---------------------------------------------------------------- schedules
class DecayScheduler:
    """A value that changes with the optimizer's step: ``scheduler(step) -> float``.

    Used for the learning rate, and for any other hyper-parameter (momentum, weight decay...). ``step`` is the
    optimizer's step counter: 0 before the first :meth:`Optimizer.step`. It may be given as an int, a float
    or a one-element tensor (SINGA passes its step-counter tensor). Subclasses implement ``call(step)``,
    receiving the step as a float; what ``call`` returns is converted with ``float()``.
    """

    def __init__(self, init_value):
        self.init_value = _real(f"{type(self).__name__}: init_value", init_value)

    def __call__(self, step) -> float:
        s = float(step)
        if not s >= 0:
            raise ValueError(f"{type(self).__name__}: the step must be >= 0, got {step!r}")
        return float(self.call(s))

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


# ---------------------------------------------------------------- hyper-parameter domains
class _Domain:
    """An interval of allowed values, e.g. ``[0, 1)``; also rejects nan and infinities."""

    def __init__(self, lo=0.0, hi=math.inf, hi_open=True):
        self.lo, self.hi, self.hi_open = lo, hi, hi_open

    def __contains__(self, v: float) -> bool:
        return math.isfinite(v) and self.lo <= v and (v < self.hi if self.hi_open else v <= self.hi)

    def __str__(self):
        if self.hi == math.inf:
            return f">= {self.lo:g}"
        return f"in [{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"



# ---------------------------------------------------------------- the base class
class Optimizer:
    """Base optimizer: learning rate (a number or a :class:`DecayScheduler`), step counter, per-parameter
    state and checkpoints. See the module docstring for what a subclass implements.

    Args:
        lr: the learning rate, a number >= 0 or a :class:`DecayScheduler`.
        dtype: SINGA's dtype for its hyper-parameter tensors; kept for compatibility (``dtype=`` appears in
            SINGA's mixed-precision examples). Hyper-parameters here are Python floats that every kernel
            applies in the parameter's own dtype.
    """

    _state_slots: tuple = ()   # names of dict attributes {param_name: Tensor}, checkpointed
    _scalar_slots: tuple = ()  # names of dict attributes {param_name: number}, checkpointed
    supported_dtypes: tuple = (tensor.float32, tensor.float64)

    def __init__(self, lr, dtype=tensor.float32):
        self.dtype = tensor.to_dtype(dtype)
        self.step_counter = 0
        self._hypers = {}  # name -> (scheduler, domain, value_attr)
        self._unnamed = itertools.count()
        for slot in self._state_slots + self._scalar_slots:
            setattr(self, slot, {})
        self.lr = self._hyper("lr", lr)

    # ----- hyper-parameters
    def _hyper(self, name: str, value, value_attr: str | None = None, lo: float = 0.0, hi: float = math.inf,
               hi_open: bool = True) -> DecayScheduler:
        """Registers a hyper-parameter whose values must lie in [lo, hi) ([lo, hi] when not hi_open); sets
        ``self.<value_attr>`` (default ``<name>_value``) to its value at the current step and returns its
        scheduler (which the caller usually keeps as ``self.<name>``)."""
        domain = _Domain(lo, hi, hi_open)
        value_attr = value_attr or f"{name}_value"
        owner = type(self).__name__
        if isinstance(value, DecayScheduler):
            sched = value
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            sched = Constant(value)
        else:
            raise TypeError(f"{owner}: {name} must be a number or a DecayScheduler, got {value!r} "
                            f"({type(value).__name__})")
        self._hypers[name] = (sched, domain, value_attr)
        setattr(self, value_attr, self._evaluate(name, self.step_counter))
        return sched

    def _evaluate(self, name: str, step: int) -> float:
        sched, domain, _ = self._hypers[name]
        v = sched(step)
        if v not in domain:
            where = "" if isinstance(sched, Constant) else f" ({sched!r} at step {step})"
            raise ValueError(f"{type(self).__name__}: {name} must be {domain}, got {v!r}{where}")
        return v

    def _refresh(self, step: int) -> None:
        """Evaluates every hyper-parameter at `step`, validates all, then assigns all."""
        values = {attr: self._evaluate(name, step) for name, (_, _, attr) in self._hypers.items()}
        for attr, v in values.items():
            setattr(self, attr, v)

    # ----- the training loop
    def __call__(self, loss) -> None:
        """Backward from `loss`, one :meth:`apply` per parameter as its gradient is ready, then :meth:`step`."""
        self.call(loss)
        self.step()

    def call(self, loss) -> None:
        """Backward from `loss` and :meth:`apply` each (parameter, gradient) pair, without :meth:`step`."""
        from . import autograd  # imported on use: opt works without autograd, and no import cycle forms

        for p, g in autograd.backward(loss):
            self.apply(self._name_of(p), p, g)

    def backward_and_update(self, loss) -> None:
        """SINGA's deprecated spelling of ``opt(loss)``."""
        self(loss)

    def step(self) -> None:
        """Advances the step counter and re-evaluates the scheduled hyper-parameters (``lr_value``...)."""
        self._refresh(self.step_counter + 1)
        self.step_counter += 1

    def apply(self, param_name, param_value: Tensor, param_grad: Tensor) -> None:
        """Updates `param_value` in place from `param_grad`; per-parameter state is keyed by `param_name`."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply(param_name, param_value, "
                                  f"param_grad)")

    def update(self, param: Tensor, grad: Tensor) -> None:
        """SINGA's deprecated ``update(param, grad)``: :meth:`apply` under the parameter's name (one is given
        to an unnamed parameter)."""
        warnings.warn("Optimizer.update(param, grad) is deprecated; use apply(name, param, grad) or opt(loss)",
                      DeprecationWarning, stacklevel=2)
        self.apply(self._name_of(param), param, grad)

    def device_check(self, *inputs: Tensor) -> None:
        """Moves every tensor to the first one's device, in place (SINGA's helper for optimizer states)."""
        if not inputs or not all(isinstance(t, Tensor) for t in inputs):
            raise TypeError(f"{type(self).__name__}.device_check: expected Tensors, got "
                            f"{[type(t).__name__ for t in inputs]}")
        dev = inputs[0].device
        for t in inputs[1:]:
            if t.device != dev:
                t.to_device(dev)

    def _name_of(self, param: Tensor):
        """The parameter's name; an unnamed parameter is named (for good) ``param<k>``, k counting up in the
        order this optimizer meets them, so the names, and checkpoints, repeat from one run to the next."""
        if param.name is None:
            used = self._known_names()
            name = f"param{next(self._unnamed)}"
            while name in used:
                name = f"param{next(self._unnamed)}"
            param.name = name
        return param.name

    def _known_names(self) -> set:
        names = set()
        for slot in self._state_slots + self._scalar_slots:
            names.update(getattr(self, slot))
        return names

    # ----- helpers for apply()
    def _check(self, param_name, param_value, param_grad) -> _core.Tensor:
        """Validates a (parameter, gradient) pair; returns the gradient's C++ tensor."""
        who = f"{type(self).__name__}.apply({param_name!r})"
        if not isinstance(param_value, Tensor):
            raise TypeError(f"{who}: the parameter must be a tensor.Tensor, got {type(param_value).__name__}")
        if isinstance(param_grad, Tensor):
            g = param_grad.data
        elif isinstance(param_grad, _core.Tensor):
            g = param_grad
        else:
            raise TypeError(f"{who}: the gradient must be a tensor.Tensor, got {type(param_grad).__name__}")
        p = param_value.data
        if p.dtype not in self.supported_dtypes:
            names = ", ".join(d.name for d in self.supported_dtypes)
            hint = ("; keep float32 master weights (param.as_type(tensor.float32)) and cast for the forward pass"
                    if p.dtype == tensor.float16 else "")
            raise TypeError(f"{who}: {type(self).__name__} updates {names} parameters, got {p.dtype.name}{hint}")
        if g.dtype != p.dtype:
            raise TypeError(f"{who}: the gradient is {g.dtype.name} but the parameter is {p.dtype.name}; "
                            f"cast the gradient with as_type()")
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(f"{who}: the gradient has shape {tuple(g.shape)} but the parameter has shape "
                             f"{tuple(p.shape)}")
        if g.device != p.device:
            raise ValueError(f"{who}: the gradient is on {g.device} but the parameter is on {p.device}; "
                             f"move one with to_device()")
        return g

    def _get_state(self, slot: str, param_name, param_value: Tensor) -> Tensor | None:
        """The state tensor `slot` of a parameter, or None before its first update. A tensor restored by
        :meth:`set_states` is moved to the parameter's device and dtype here; a shape mismatch raises."""
        t = getattr(self, slot).get(param_name)
        if t is None:
            return None
        p = param_value.data
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{type(self).__name__}.apply({param_name!r}): the state {slot!r} has shape "
                             f"{tuple(t.shape)} but the parameter has shape {tuple(p.shape)}; the states "
                             f"loaded with set_states() belong to another model, or two parameters share "
                             f"this name")
        if t.data.device != p.device or t.dtype != p.dtype:
            raw = t.data.to(p.device) if t.data.device != p.device else t.data
            t = Tensor(data=raw.cast(p.dtype) if raw.dtype != p.dtype else raw, requires_grad=False)
            getattr(self, slot)[param_name] = t
        return t

    def _new_state(self, slot: str, param_name, param_value: Tensor) -> Tensor:
        """A zero tensor like the parameter (shape, dtype, device), stored as the parameter's state `slot`."""
        p = param_value.data
        t = Tensor(data=_core.Tensor(p.shape, p.dtype, p.device), requires_grad=False)
        _core.fill_(t.data, 0)
        getattr(self, slot)[param_name] = t
        return t

    # ----- checkpoints
    def get_states(self) -> dict:
        """The optimizer's state as plain data: ``{"step_counter": int, <slot>: {param_name: numpy array or
        number}, ...}``. Hyper-parameters and schedules are configuration, not state, and are not included."""
        states = {"step_counter": int(self.step_counter)}
        for slot in self._state_slots:
            states[slot] = {name: tensor.to_numpy(t) for name, t in getattr(self, slot).items()}
        for slot in self._scalar_slots:
            states[slot] = dict(getattr(self, slot))
        return states

    def set_states(self, states: dict) -> None:
        """Restores what :meth:`get_states` returned (numpy arrays or tensors are accepted); replaces all
        current state. Everything is checked before anything is changed."""
        owner = type(self).__name__
        if not isinstance(states, dict) or "step_counter" not in states:
            raise ValueError(f"{owner}.set_states: expected a dict with a 'step_counter' (from get_states()), "
                             f"got {type(states).__name__}")
        known = {"step_counter", *self._state_slots, *self._scalar_slots}
        unknown = sorted(set(states) - known)
        if unknown:
            raise ValueError(f"{owner}.set_states: unknown entries {unknown}; {owner} keeps {sorted(known)} "
                             f"(are these another optimizer's states?)")
        raw = np.asarray(states["step_counter"])  # an int here; SINGA saved a float32
        step = float(raw.reshape(-1)[0]) if raw.size == 1 and raw.dtype.kind in "iuf" else -1.0
        if not (step >= 0 and step.is_integer()):
            raise ValueError(f"{owner}.set_states: step_counter must be an int >= 0, got "
                             f"{states['step_counter']!r}")
        step = int(step)
        new = {}
        for slot in self._state_slots:
            entries = states.get(slot, {})
            if not isinstance(entries, dict):
                raise ValueError(f"{owner}.set_states: {slot!r} must be a dict {{param_name: array}}, "
                                 f"got {type(entries).__name__}")
            new[slot] = {name: _state_tensor(owner, slot, name, v) for name, v in entries.items()}
        for slot in self._scalar_slots:
            entries = states.get(slot, {})
            if not isinstance(entries, dict):
                raise ValueError(f"{owner}.set_states: {slot!r} must be a dict {{param_name: number}}, "
                                 f"got {type(entries).__name__}")
            new[slot] = {name: _state_scalar(owner, slot, name, v) for name, v in entries.items()}
        self._refresh(step)  # raises, changing nothing, if a schedule is invalid at that step
        self.step_counter = step
        for slot, d in new.items():
            setattr(self, slot, d)

    state_dict = get_states
    load_state_dict = set_states

    def __repr__(self):
        hp = ", ".join(f"{n}={s.init_value if isinstance(s, Constant) else s!r}" for n, (s, _, _) in
                       self._hypers.items())
        return f"{type(self).__name__}({hp})"


def _state_tensor(owner, slot, name, v) -> Tensor:
    if isinstance(v, Tensor):
        return Tensor(data=v.data.clone(), requires_grad=False)
    arr = np.asarray(v)
    if arr.dtype.kind != "f":
        raise ValueError(f"{owner}.set_states: {slot}[{name!r}] must be a floating-point array, got {arr.dtype}")
    return Tensor(data=arr, requires_grad=False)


def _state_scalar(owner, slot, name, v):
    arr = np.asarray(v)
    if arr.size != 1 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{owner}.set_states: {slot}[{name!r}] must be a number, got {v!r}")
    return arr.reshape(-1)[0].item()


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
        _core.axpy_(1.0 - self.rho_value, tmp, avg)
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
        b1, b2 = self.beta_1_value, self.beta_2_value
        t = int(self.t.get(param_name, 0)) + 1
        g = _plus_decay(g, p, self.decay_value)
        tmp = _core.square(g)
        m = (m if m is not None else self._new_state("m", param_name, param_value)).data
        v = (v if v is not None else self._new_state("v", param_name, param_value)).data
        _core.mul_scalar(m, b1, out=m)
        _core.axpy_(1.0 - b1, g, m)
        _core.mul_scalar(v, b2, out=v)
        _core.axpy_(1.0 - b2, tmp, v)
        # denominator sqrt(v) / sqrt(1 - b2^t) + eps, then param -= lr / (1 - b1^t) * m / denominator
        _core.sqrt(v, out=tmp)
        _core.mul_scalar(tmp, 1.0 / math.sqrt(1.0 - b2 ** t), out=tmp)
        _core.add_scalar(tmp, self.epsilon_value, out=tmp)
        _core.div(m, tmp, out=tmp)
        _core.axpy_(-self.lr_value / (1.0 - b1 ** t), tmp, p)
        self.t[param_name] = t


def __getattr__(name):
    # DistOpt lives with the data-parallel wrappers (singa_lite/parallel/dist_opt.py), which imports this module;
    # it is loaded on first use so that `opt.DistOpt` works as in SINGA without an import cycle.
    if name == "DistOpt":
        from .parallel.dist_opt import DistOpt
        return DistOpt
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
