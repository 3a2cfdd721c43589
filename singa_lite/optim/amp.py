"""Mixed precision training: float16 / bfloat16 parameters and activations, float32 master weights, and a
dynamic loss scaler.

    sgd = amp.MixedPrecision(opt.SGD(lr=0.05, momentum=0.9))     # LossScaler() by default
    x = tensor.from_numpy(images).as_type(tensor.float16)         # layers cast their parameters to x's dtype
    out = model.forward(x)
    loss = autograd.softmax_cross_entropy(autograd.cast(out, tensor.float32), y)   # the loss in float32
    sgd(loss)                     # scales the loss, backward, unscales, skips the step on inf / nan
    # data parallel: the same object inside DistOpt, which scales the loss and skips on every rank alike
    dist = opt.DistOpt(amp.MixedPrecision(opt.SGD(lr=0.05)))
    dist.backward_and_update(loss)

How it works
------------
- The forward and backward passes run in the parameters' dtype (float16 or bfloat16; every kernel computes
  in float32 and rounds once per result). Compute the loss in float32 (``autograd.cast``), as is usual.
- :meth:`MixedPrecision.scale_loss` multiplies the loss by the scaler's ``scale`` (an autograd op), so
  small gradients do not flush to zero in float16. ``MixedPrecision(loss)`` and ``DistOpt`` call it for you.
- :meth:`MixedPrecision.apply` copies each gradient to float32 and divides it by the scale; the update
  waits for :meth:`step`, which first checks every gradient: if one is inf or nan (the scale was too large),
  nothing is updated, the scale is halved and the step counter stays (the step is skipped). Otherwise the
  wrapped optimizer updates the float32 master copy of each parameter (its state stays float32 too), and the
  result is rounded into the half parameter in place.
- :class:`LossScaler`: DeepSpeed's dynamic loss scaling (``init_scale`` 2**16, halved on overflow, doubled
  after ``growth_interval`` steps without one).
- Under ``DistOpt`` the averaged gradients are tested by DistOpt itself (``on_nonfinite="skip"``, the
  default): an overflow on any rank skips the step on every rank, and DistOpt tells this optimizer
  (:meth:`MixedPrecision.step_skipped`) so that every rank's scaler backs off alike. With
  ``on_nonfinite="raise"`` an overflow raises instead and the scale is not changed.
- Checkpoints: :meth:`MixedPrecision.get_states` holds the wrapped optimizer's states, the float32 master
  weights (slot ``masters``) and the scaler's state (``loss_scale``, ``loss_scale_good_steps``,
  ``loss_scale_overflows``), so a resumed run continues with the same scale (``singa_lite.checkpoint.save /
  load`` store them).

float32 parameters (e.g. batch norm's, or a model left in float32) work too: they are their own master and
only get the unscaling and the overflow check. A half parameter changed by other means (loaded without
these states, averaged by DistOpt's partial update, assigned by hand) is noticed at the next step (it is
no longer its master rounded) and its master weight is taken from it again.
``backward_and_sparse_update`` keeps its error-feedback residuals in loss-scaled units: for the step after
the scale changes they count double (or half), a small bias; prefer a static scale (``dynamic=False``)
there. numpy has no bfloat16: bfloat16 tensors read out as float32.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core, engine, tensor
from .. import ops as F
from ..tensor import Tensor
from .optimizer import Optimizer

__all__ = ["LossScaler", "MixedPrecision"]

_HALF = (tensor.float16, tensor.bfloat16)


def _number(owner: str, what: str, value, lo: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
            (value <= lo if lo_open else value < lo):
        raise ValueError(f"{owner}: {what} must be a finite number {'>' if lo_open else '>='} {lo:g}, got {value!r}")
    return float(value)


class LossScaler:
    """Dynamic loss scaling: the loss is multiplied by ``scale`` before backward and the gradients divided by
    it before the update. ``update(overflow)`` after every step: an overflow multiplies the scale by
    ``backoff_factor`` (at least ``min_scale``) and restarts the count; ``growth_interval`` steps in a row
    without one multiply it by ``growth_factor`` (at most ``max_scale``). ``dynamic=False`` keeps
    ``init_scale`` (overflowing steps are still skipped)."""

    def __init__(self, init_scale=2.0 ** 16, growth_interval=2000, growth_factor=2.0, backoff_factor=0.5,
                 min_scale=1.0, max_scale=2.0 ** 24, dynamic=True):
        who = "LossScaler"
        self.scale = _number(who, "init_scale", init_scale, 0.0, lo_open=True)
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral) or \
                growth_interval < 1:
            raise ValueError(f"{who}: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.growth_interval = int(growth_interval)
        self.growth_factor = _number(who, "growth_factor", growth_factor, 1.0)
        self.backoff_factor = _number(who, "backoff_factor", backoff_factor, 0.0, lo_open=True)
        if self.backoff_factor >= 1:
            raise ValueError(f"{who}: backoff_factor must be < 1, got {backoff_factor!r}")
        self.min_scale = _number(who, "min_scale", min_scale, 0.0, lo_open=True)
        self.max_scale = _number(who, "max_scale", max_scale, self.min_scale)
        self.dynamic = bool(dynamic)
        self.good_steps = 0  # steps since the last overflow or growth
        self.overflows = 0   # steps skipped for an overflow, in all

    def update(self, overflow: bool) -> None:
        """After a step: back off on an overflow, grow after growth_interval good steps."""
        if overflow:
            self.overflows += 1
            self.good_steps = 0
            if self.dynamic:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return
        self.good_steps += 1
        if self.dynamic and self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0

    def get_states(self) -> dict:
        return {"scale": float(self.scale), "good_steps": int(self.good_steps), "overflows": int(self.overflows)}

    def set_states(self, states: dict) -> None:
        if not isinstance(states, dict) or set(states) != {"scale", "good_steps", "overflows"}:
            raise ValueError(f"LossScaler.set_states: expected {{'scale', 'good_steps', 'overflows'}} (from "
                             f"get_states()), got {states!r}")
        scale = _number("LossScaler.set_states", "scale", _py(states["scale"]), 0.0, lo_open=True)
        counts = [_py(states[k]) for k in ("good_steps", "overflows")]
        if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0 for c in counts):
            raise ValueError(f"LossScaler.set_states: good_steps and overflows must be ints >= 0, got {counts}")
        self.scale, self.good_steps, self.overflows = scale, int(counts[0]), int(counts[1])

    def __repr__(self):
        return (f"LossScaler(scale={self.scale:g}, good_steps={self.good_steps}, overflows={self.overflows}, "
                f"growth_interval={self.growth_interval})")


def _py(v):
    """A numpy scalar or 0-d array (as checkpoints give back) as a Python number."""
    return np.asarray(v).item() if isinstance(v, (np.generic, np.ndarray)) else v


def _finite(t: _core.Tensor) -> bool:
    """Whether every element is finite: sum(x * 0) is 0 for finite x and nan otherwise (and cannot overflow)."""
    if t.numel == 0:
        return True
    s = _core.sum(_core.mul_scalar(t, 0.0), None, False)
    return math.isfinite(float(np.asarray(s if s.device.is_cpu() else s.to(_core.Device("cpu"))).reshape(-1)[0]))


def _changed_outside(master: _core.Tensor, p: _core.Tensor) -> bool:
    """Whether the half parameter is no longer its master weight rounded: it was set by other means (loaded
    without these states, averaged by DistOpt's partial update, assigned by hand)."""
    if p.numel == 0:
        return False
    differ = _core.ne(master.cast(p.dtype), p).cast(tensor.int32)
    n = _core.sum(differ, None, False)
    return int(np.asarray(n if n.device.is_cpu() else n.to(_core.Device("cpu"))).reshape(-1)[0]) != 0


class MixedPrecision(Optimizer):
    """Wraps an optimizer (any of algorithms.py's, or one written to the contract of optimizer.py) for mixed
    precision training: float32 master weights for float16 / bfloat16 parameters, and loss scaling (see the
    module docstring).

    Args:
        optimizer: the optimizer that updates the float32 master weights.
        scaler: a :class:`LossScaler` (default ``LossScaler()``).
        master_dtype: the dtype of the master weights and of the wrapped optimizer's state: float32
            (default) or float64.

    ``apply(name, param, grad)`` validates and unscales the gradient into a float32 copy; ``step()`` checks
    all of them and then updates (or skips): the update happens in ``step()``, once per iteration, as
    ``opt(loss)`` and DistOpt call it. ``step_counter`` and the learning rate are the wrapped optimizer's.
    """

    def __init__(self, optimizer, scaler: LossScaler | None = None, master_dtype=tensor.float32):
        if not isinstance(optimizer, Optimizer) or isinstance(optimizer, MixedPrecision):
            raise TypeError(f"MixedPrecision: optimizer must be an opt.Optimizer (not another MixedPrecision), "
                            f"got {type(optimizer).__name__}")
        if scaler is None:
            scaler = LossScaler()
        if not isinstance(scaler, LossScaler):
            raise TypeError(f"MixedPrecision: scaler must be an amp.LossScaler, got {type(scaler).__name__}")
        master_dtype = tensor.to_dtype(master_dtype)
        if master_dtype not in (tensor.float32, tensor.float64) or master_dtype not in optimizer.supported_dtypes:
            raise TypeError(f"MixedPrecision: master_dtype must be float32 or float64 and one that "
                            f"{type(optimizer).__name__} updates, got {master_dtype.name}")
        # Not Optimizer.__init__: the hyper-parameters, step counter and parameter names are the wrapped one's.
        self.opt = optimizer
        self.scaler = scaler
        self.master_dtype = master_dtype
        self.dtype = optimizer.dtype
        self.masters = {}    # param name -> master Tensor (master_dtype), for half parameters
        self._pending = []   # (name, param, unscaled gradient) of the current step, applied by step()
        self._overflow = False
        self.supported_dtypes = (*_HALF, tensor.float32, master_dtype)

    # ----- what the wrapped optimizer owns
    @property
    def step_counter(self) -> int:
        return self.opt.step_counter

    @property
    def lr(self):
        return self.opt.lr

    @property
    def lr_value(self) -> float:
        return self.opt.lr_value

    def name_of(self, param: Tensor):
        return self.opt.name_of(param)

    # ----- loss scaling
    def scale_loss(self, loss: Tensor) -> Tensor:
        """loss * scale, recorded by autograd (a loss already scaled by this call is returned as it is)."""
        if not isinstance(loss, Tensor):
            raise TypeError(f"MixedPrecision.scale_loss: expected the loss tensor, got {type(loss).__name__}")
        if getattr(loss, "_amp_scaled", False):
            return loss
        scaled = F.mul(loss, self.scaler.scale)
        scaled._amp_scaled = True
        return scaled

    def call(self, loss) -> None:
        """Backward from the scaled loss and apply() every gradient (step() then updates or skips)."""
        for p, g in engine.backward(self.scale_loss(loss)):  # looked up at each call, as Optimizer.call
            self.apply(self.name_of(p), p, g)

    # ----- the update
    def apply(self, param_name, param_value: Tensor, param_grad: Tensor) -> None:
        """Keeps gradient / scale as a master_dtype copy (the gradient itself is not kept); step() updates."""
        g = self._check(param_name, param_value, param_grad)
        g32 = g.cast(self.master_dtype)  # a new tensor, even for master_dtype gradients (cast copies)
        if g32.shares_storage(g):
            g32 = g32.clone()
        _core.mul_scalar(g32, 1.0 / self.scaler.scale, out=g32)
        if not self._overflow and not _finite(g32):
            self._overflow = True
        self._pending.append((param_name, param_value, Tensor(data=g32, requires_grad=False)))

    def step(self) -> None:
        """Updates the master weights with the unscaled gradients and rounds them into the parameters, then
        advances the wrapped optimizer's step; or, when a gradient overflowed, skips all of it and backs the
        scale off. Either way the scaler is updated and the step's gradients dropped."""
        pending, overflow = self._pending, self._overflow
        self._pending, self._overflow = [], False
        if overflow:
            self.scaler.update(overflow=True)
            return
        for name, p, g in pending:
            if p.dtype == self.master_dtype:
                self.opt.apply(name, p, g)
                continue
            master = self._master(name, p)
            self.opt.apply(name, master, g)
            _core.copy_(p.data, master.data)  # rounded once into the parameter's dtype, in place
        self.opt.step()
        self.scaler.update(overflow=False)

    def step_skipped(self) -> None:
        """Called by DistOpt when it skips a step for non-finite gradients (on every rank alike): the scale
        backs off and what apply() gathered for this step, if anything, is dropped."""
        self._pending, self._overflow = [], False
        self.scaler.update(overflow=True)

    def _master(self, name, p: Tensor) -> Tensor:
        m = self.masters.get(name)
        if m is not None and tuple(m.shape) != tuple(p.shape):
            raise ValueError(f"MixedPrecision: the master weight of {name!r} has shape {tuple(m.shape)} but the "
                             f"parameter has {tuple(p.shape)}; the states loaded belong to another model, or "
                             f"two parameters share this name")
        if m is not None and m.data.device != p.data.device:
            m = Tensor(data=m.data.to(p.data.device), requires_grad=False, name=name)
            self.masters[name] = m
        if m is None or _changed_outside(m.data, p.data):  # the parameter's current (half) values, exactly
            m = Tensor(data=p.data.cast(self.master_dtype), requires_grad=False, name=name)
            self.masters[name] = m
        return m

    # ----- checkpoints
    # The wrapped optimizer's states stay flat, {slot: {param_name: array}} (what checkpoint.load checks
    # against the model), with the master weights as one more such slot and the scaler as plain numbers.
    _SCALER_KEYS = {"loss_scale": "scale", "loss_scale_good_steps": "good_steps",
                    "loss_scale_overflows": "overflows"}

    def get_states(self) -> dict:
        """The wrapped optimizer's get_states(), plus ``masters`` ({param_name: master weight array}) and the
        scaler's ``loss_scale``, ``loss_scale_good_steps`` and ``loss_scale_overflows``. Taken between steps
        (after apply() and before step() it raises)."""
        if self._pending:
            raise RuntimeError("MixedPrecision.get_states: a step is half done (apply() without step()); call "
                               "step() first")
        states = self.opt.get_states()
        clash = {"masters", *self._SCALER_KEYS} & set(states)
        if clash:
            raise RuntimeError(f"MixedPrecision.get_states: {type(self.opt).__name__} has states named "
                               f"{sorted(clash)} as well")
        states["masters"] = {name: tensor.to_numpy(m) for name, m in self.masters.items()}
        scaler = self.scaler.get_states()
        states.update({key: scaler[field] for key, field in self._SCALER_KEYS.items()})
        return states

    def set_states(self, states: dict) -> None:
        """Restores what get_states() returned; everything is checked before anything changes."""
        if not isinstance(states, dict) or not {"masters", *self._SCALER_KEYS} <= set(states):
            raise ValueError(f"MixedPrecision.set_states: expected the dict of MixedPrecision.get_states() "
                             f"(with 'masters' and {sorted(self._SCALER_KEYS)})")
        inner = {k: v for k, v in states.items() if k != "masters" and k not in self._SCALER_KEYS}
        masters = states["masters"]
        if not isinstance(masters, dict):
            raise ValueError(f"MixedPrecision.set_states: masters must be a dict {{name: array}}, got "
                             f"{type(masters).__name__}")
        new = {}
        for name, v in masters.items():
            arr = np.asarray(tensor.to_numpy(v) if isinstance(v, Tensor) else v)
            if arr.dtype.kind != "f":
                raise ValueError(f"MixedPrecision.set_states: masters[{name!r}] must be a float array, got "
                                 f"{arr.dtype}")
            new[name] = Tensor(data=arr, dtype=self.master_dtype, requires_grad=False, name=name)
        scaler = LossScaler()
        scaler.set_states({field: states[key] for key, field in self._SCALER_KEYS.items()})  # checks them
        self.opt.set_states(inner)  # checks its own states and changes nothing when it raises
        self.scaler.scale, self.scaler.good_steps, self.scaler.overflows = \
            scaler.scale, scaler.good_steps, scaler.overflows
        self.masters, self._pending, self._overflow = new, [], False

    state_dict = get_states
    load_state_dict = set_states

    def __repr__(self):
        return f"MixedPrecision({self.opt!r}, {self.scaler!r}, master_dtype={self.master_dtype.name})"
