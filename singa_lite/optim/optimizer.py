"""The optimizer base class (``opt.Optimizer``) and the contract every optimizer keeps.

Every optimizer here, and any optimizer written to this contract, works unchanged inside ``DistOpt``
(which calls :meth:`Optimizer.apply` with all-reduced, averaged gradients, then :meth:`Optimizer.step`
once per iteration).

A subclass of :class:`Optimizer`

- calls ``super().__init__(lr, dtype)`` and registers every other hyper-parameter with
  ``self._hyper(name, value, value_attr=None, lo=0.0, hi=inf, hi_open=True)``: the value may be a number or
  a :class:`DecayScheduler`, and must lie in ``[lo, hi)`` (``[lo, hi]`` with ``hi_open=False``); the current
  value is the float (a :class:`~singa_lite.optim.schedules.HyperValue`) ``self.<value_attr>`` (default
  ``<name>_value``; ``self.lr_value`` for the learning rate), re-evaluated and re-validated at every :meth:`step`;
- implements ``apply(param_name, param_value, param_grad)``, which must

  1. validate first, through ``self._check(param_name, param_value, param_grad)`` (shape, dtype, device),
     and fetch its state (``self._get_state``) and allocate what it needs *before* it writes anything, so a
     call that raises leaves the parameter and the state as they were;
  2. update ``param_value`` **in place**: the same :class:`~singa_lite.tensor.Tensor`, the same ``.data``
     storage (views and aliases of the parameter see the update), with ``_core`` ops (``axpy_``,
     ``out=`` arguments) and no copy to numpy;
  3. leave ``param_grad`` unchanged and keep no reference to it (DistOpt hands out views of fusion buffers
     that are reused for the next bucket);
  4. read hyper-parameters only from the ``*_value`` attributes, which :meth:`step` refreshes (floats that
     kernels take as they are; arithmetic in Python is faster on ``float(self.lr_value)``, a plain float,
     than on the :class:`~singa_lite.optim.schedules.HyperValue` itself, whose results stay HyperValues);

- keeps its per-parameter state in dictionaries ``{param_name: Tensor}`` named in the class attribute
  ``_state_slots`` (tensors with the parameter's shape, dtype and device, created lazily on the first apply
  with ``self._new_state``) and per-parameter Python numbers in dictionaries named in ``_scalar_slots``;
  :meth:`Optimizer.get_states` and :meth:`Optimizer.set_states` checkpoint exactly those, plus the step counter;
- lists the parameter dtypes it supports in ``supported_dtypes``.

Code outside an optimizer names parameters with :meth:`Optimizer.name_of` and reads the live state with
:meth:`Optimizer.state_tensors` / :meth:`Optimizer.state_scalars`.
"""
from __future__ import annotations

import itertools
import math
import numbers
import warnings

import numpy as np

from .. import _core, engine, tensor
from ..tensor import Tensor
from .schedules import Constant, DecayScheduler

__all__ = ["Optimizer"]


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
            SINGA's mixed-precision examples). Hyper-parameters here are Python floats
            (:class:`~singa_lite.optim.schedules.HyperValue`, which also has SINGA's ``as_type`` and ``data``)
            that every kernel applies in the parameter's own dtype.
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
        # engine.backward is looked up at each call (not bound at import): a script that replaces
        # autograd.backward (the façade forwards it to the engine) sees every optimizer's backward pass.
        for p, g in engine.backward(loss):
            self.apply(self.name_of(p), p, g)

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
        self.apply(self.name_of(param), param, grad)

    def device_check(self, *inputs) -> None:
        """Moves every tensor to the first one's device, in place (SINGA's helper for optimizer states).
        Python numbers among them (the step counter, a :class:`HyperValue` such as ``lr_value``: SINGA keeps
        these as tensors, here they are host scalars) have no device and are passed over."""
        def host_scalar(x):
            return isinstance(x, numbers.Real) and not isinstance(x, bool)
        if not inputs or not isinstance(inputs[0], Tensor) or not all(
                isinstance(t, Tensor) or host_scalar(t) for t in inputs):
            raise TypeError(f"{type(self).__name__}.device_check: expected Tensors (the first one a Tensor; "
                            f"numbers are passed over), got {[type(t).__name__ for t in inputs]}")
        dev = inputs[0].device
        for t in inputs[1:]:
            if isinstance(t, Tensor) and t.device != dev:
                t.to_device(dev)

    def name_of(self, param: Tensor):
        """The parameter's name; an unnamed parameter is named (for good) ``param<k>``, k counting up in the
        order this optimizer meets them, so the names, and checkpoints, repeat from one run to the next."""
        if param.name is None:
            used = self._known_names()
            name = f"param{next(self._unnamed)}"
            while name in used:
                name = f"param{next(self._unnamed)}"
            param.name = name
        return param.name

    def state_tensors(self) -> dict:
        """The live per-parameter state tensors, ``{slot: {param_name: Tensor}}`` (the slots of
        ``_state_slots``): the optimizer's own dictionaries, not copies (:meth:`get_states` copies)."""
        return {slot: getattr(self, slot) for slot in self._state_slots}

    def state_scalars(self) -> dict:
        """The live per-parameter numbers, ``{slot: {param_name: number}}`` (the slots of ``_scalar_slots``)."""
        return {slot: getattr(self, slot) for slot in self._scalar_slots}

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
        # A subclass written SINGA's way keeps state of its own (e.g. ``self.moments`` without
        # ``_state_slots``) and restores it in its own set_states, after super().set_states(states).
        if unknown and type(self).set_states is Optimizer.set_states:
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

