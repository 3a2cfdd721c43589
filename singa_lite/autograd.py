"""Automatic differentiation, with SINGA's names (``singa.autograd``): a façade over three layers.

- the engine (:mod:`singa_lite.engine`): :class:`Operator`, :func:`backward`, :func:`gradients`, gradient
  hooks and the ``training`` flag;
- the operators and their function forms (the package :mod:`singa_lite.ops`);
- the layer classes, under SINGA's autograd spellings (``autograd.Conv2d(1, 20, 5)``,
  ``autograd.Linear(800, 500)``, ...), defined once in the layer package.

Nothing is defined here: this module only re-exports, and library code imports the layers it re-exports
from, never this module. ``autograd.training = True`` sets the engine's flag (reading it reads the
engine's), as SINGA scripts expect. ``autograd.backward`` is the engine's too, read and written through
here: the optimizers, ``MixedPrecision`` and ``DistOpt`` call ``engine.backward`` looked up at each call, so
a script that replaces ``autograd.backward`` (to watch the gradients as they come, say) replaces it for them.

Choices (differences from SINGA 3 noted; the engine's own are in engine.py):
- ``mse_loss`` is SINGA's mean of squared errors over every element; the target gets no gradient.
- ``slice`` follows SINGA/ONNX's ``slice(x, starts, ends, axes=None, steps=None)`` with Python's rules
  for negative and out-of-range bounds.
- ``Linear``'s W is drawn from N(0, 2 / (in + out)) as SINGA does; b starts at zero.
"""
from __future__ import annotations

import sys
import types

from . import engine, tensor  # noqa: F401 - tensor: SINGA's autograd exports it
from .engine import CTensor, Gradients, Operation, Operator, backward, gradients  # noqa: F401
from .autograd_graph import Dummy, infer_dependency  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops.common import (norm_axis as _axis, operand as _const, raw_log_softmax as _log_softmax,  # noqa: F401
                         raw_softmax as _softmax, reduce_to as _reduce_to, swap_last as _swap_last)
from .tensor import Tensor  # noqa: F401 - SINGA's autograd exports it
from .layer import AvgPool2d, BatchNorm2d, Conv2d, GlobalAvgPool2d, Layer, Linear, MaxPool2d  # noqa: F401


class _Autograd(types.ModuleType):
    """The module's type: ``training``, ``backward`` and the profiler hook ``_timer`` are the engine's, read
    and written through here, so that ``autograd.training = True`` sets the flag the engine reads."""

    @property
    def training(self):
        return engine.training

    @training.setter
    def training(self, value):
        engine.training = value

    @property
    def backward(self):
        return engine.backward

    @backward.setter
    def backward(self, value):
        engine.backward = value

    @property
    def _timer(self):
        # read-only: the hook is decided in device.py (device.on_op_hook), from the profiler and the timeline
        return engine.op_hook()


sys.modules[__name__].__class__ = _Autograd
