"""Optimizers and learning-rate schedules, with SINGA's names (``singa.opt``).

Use, as in SINGA 3.x::

    sgd = opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5)
    sgd(loss)                        # backward, one apply() per parameter, then step()
    # or by hand, e.g. with gradients from elsewhere:
    sgd.apply("W", w, dw); sgd.step()

Where things are
----------------
This module only re-exports (SINGA's names in one place): the schedules, the :class:`Optimizer` base class
with the contract an optimizer keeps to work inside ``DistOpt``, and the optimizers are defined in
``singa_lite/optim/`` (schedules.py, optimizer.py, algorithms.py, large_batch.py; mixed precision in amp.py, clipping in
clip.py); ``DistOpt`` in ``singa_lite/parallel/dist_opt.py``.

Differences from SINGA, on purpose
----------------------------------
- ``lr_value`` (and ``mom_value``, ``decay_value``...) are :class:`HyperValue` floats rather than one-element
  tensors, and ``step_counter`` is an int: host scalars handed to the kernels. A ``HyperValue`` also has
  SINGA's ``as_type`` (a shape-(1,) tensor) and ``data``, and its arithmetic with numbers keeps it one, so
  optimizers written SINGA's way (``self.momentum(self.step_counter).as_type(self.dtype)``,
  ``singa.Axpy((0.0 - self.lr_value).data, ...)``) run unchanged; see docs/singa_compat.md.
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

from .data.partition import data_partition  # noqa: F401 - SINGA scripts partition with DistOpt's rank
from .optim.algorithms import SGD, AdaGrad, Adam, RMSProp
from .optim.clip import clip_grad_norm, grad_norm  # between DistOpt's exchange and update
from .optim.large_batch import LAMB, LARS, AdamW  # beyond SINGA: large-batch training
from .optim.optimizer import Optimizer
from .optim.schedules import (Constant, DecayScheduler, ExponentialDecay, HyperValue, LinearDecay, StepDecay,
                              WarmupCosineDecay)

__all__ = [
    "DecayScheduler", "Constant", "HyperValue", "ExponentialDecay", "StepDecay", "LinearDecay", "WarmupCosineDecay",
    "Optimizer", "SGD", "RMSProp", "AdaGrad", "Adam", "AdamW", "LAMB", "LARS", "data_partition",
    "clip_grad_norm", "grad_norm",
]


def __getattr__(name):
    # SINGA's opt.DistOpt. Imported on first use: the data-parallel layer (and the communication layer under
    # it) is loaded only by scripts that train data-parallel.
    if name == "DistOpt":
        from .parallel.dist_opt import DistOpt
        return DistOpt
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
