"""Optimizers, learning-rate schedules, mixed precision and gradient clipping: what updates the parameters.

- schedules.py: :class:`DecayScheduler` and the schedules (``Constant``, ``ExponentialDecay``, ...);
- optimizer.py: the :class:`Optimizer` base class and the contract an optimizer keeps (so that it works
  inside ``DistOpt``);
- algorithms.py: ``SGD``, ``RMSProp``, ``AdaGrad``, ``Adam``;
- large_batch.py: ``AdamW``, ``LAMB``, ``LARS`` (the optimizers of large-batch training);
- amp.py: mixed precision (``MixedPrecision``, ``LossScaler``);
- clip.py: clipping by the global norm (``clip_grad_norm``, ``grad_norm``).

Users reach these through ``singa_lite.opt`` (SINGA's names, with ``DistOpt``). This package imports
nothing of the data-parallel layer (``singa_lite.parallel``), which builds on it.
"""
from __future__ import annotations

from .algorithms import SGD, AdaGrad, Adam, RMSProp
from .clip import clip_grad_norm, grad_norm
from .large_batch import LAMB, LARS, AdamW, one_dimensional
from .optimizer import Optimizer
from .schedules import Constant, DecayScheduler, ExponentialDecay, LinearDecay, StepDecay, WarmupCosineDecay

__all__ = ["DecayScheduler", "Constant", "ExponentialDecay", "StepDecay", "LinearDecay", "WarmupCosineDecay",
           "Optimizer", "SGD", "RMSProp", "AdaGrad", "Adam", "AdamW", "LAMB", "LARS", "one_dimensional",
           "clip_grad_norm", "grad_norm"]
