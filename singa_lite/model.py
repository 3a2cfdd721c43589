"""SINGA 3's ``singa.model``: a :class:`Model` is a :class:`~singa_lite.layer.Layer` with a training
step, train/eval modes and checkpoints.

Usage, as in SINGA::

    class CNN(model.Model):
        def __init__(self):
            super().__init__()
            self.conv1 = layer.Conv2d(20, 5)
            ...
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            ...

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    m = CNN()
    m.set_optimizer(opt.SGD(lr=0.05))
    m.compile([tx], is_train=True)
    out, loss = m(tx, ty)              # training mode: train_one_batch
    m.eval(); out = m(tx)              # evaluation mode: forward

Checkpoints (``save_states`` / ``load_states``) are a zip holding ``tensor_dict.npz`` (the arrays, no
pickle) and ``states_attr.json`` (shapes, dtypes, which entries are auxiliary), SINGA's layout. They are
written with ``checkpoint.atomic_write`` (temporary file, fsync, rename, owner-only permissions), so a
crash never leaves a half-written checkpoint. For the whole training state (optimizer, DistOpt, sampler,
random generators) across ranks, see :mod:`singa_lite.checkpoint`.

Graph mode. SINGA's ``use_graph`` buffers the operations of the first training step and replays the
buffer at every later step. singa_lite runs every step eagerly, in graph mode or not, with identical
results (``tests/compat/test_model_layer_compat.py`` compares them bit for bit); what graph mode does
here is what the device's graph calls do (see :mod:`singa_lite.device`): a training step in graph mode
runs with the input device's ``graph_enabled()`` true and ends with ``dev.RunGraph(sequential)``.
Differences from SINGA on purpose: a step returns new output tensors each time (SINGA returns the same
buffered tensors, updated in place), and Python code inside ``train_one_batch`` (prints, branches on
values) runs every step, not only while buffering. ``bench/bench_graph.py`` measures the cost.

Every training step (``train_one_batch`` called in training mode, directly or through ``model(...)``)
is one iteration for the device's time profiler (``dev.SetVerbosity``, ``dev.PrintTimeProfiling``).
"""
from __future__ import annotations

import functools

from . import engine, model_states, timeline
from .layer.base import Layer
from .model_states import (  # noqa: F401
    AUX_STATE_TYPE,
    MODEL_STATE_TYPE,
    STATES_ATTR_FILENAME,
    TENSOR_DICT_FILENAME,
)
from .tensor import Tensor


def _input_device(args):
    """The device of the first Tensor in args (or in a list given as the first argument), else None."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    return first.device if isinstance(first, Tensor) else None


def _training_step(fn):
    """Wraps a subclass's train_one_batch: in training mode, one call is one iteration of the input
    device (profiling), run with the device's graph flag on in graph mode and ended by RunGraph."""

    @functools.wraps(fn)
    def train_one_batch(self, *args, **kwargs):
        if not self.training or self.__dict__.get("_in_step"):  # evaluation, or super().train_one_batch
            return fn(self, *args, **kwargs)
        dev = _input_device(args)
        if dev is None:
            if self.graph_mode:
                raise ValueError(f"{type(self).__name__}.train_one_batch in graph mode expects a Tensor (or a "
                                 f"list of Tensors) as its first argument, got "
                                 f"{type(args[0]).__name__ if args else 'no arguments'}")
            return fn(self, *args, **kwargs)
        graph_was = dev.graph_enabled()
        object.__setattr__(self, "_in_step", True)
        dev._start_iteration()
        try:
            if self.graph_mode:
                dev.EnableGraph(True)
            out = fn(self, *args, **kwargs)
        finally:
            object.__setattr__(self, "_in_step", False)
            dev.EnableGraph(graph_was)
        if self.graph_mode:
            dev.RunGraph(self.sequential)
        else:
            dev._end_iteration()
        timeline.step_end()  # a no-op when DistOpt ended the step already
        return out

    train_one_batch.__singa_lite_step__ = True
    return train_one_batch


class Model(Layer):
    """Base class of models: override ``forward`` and ``train_one_batch``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("train_one_batch")
        if fn is not None and not getattr(fn, "__singa_lite_step__", False):
            cls.train_one_batch = _training_step(fn)

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self.training = True
        self.graph_mode = False  # SINGA's default is True, but compile() sets it before any step runs
        self.sequential = False

    def _prefix(self) -> str:
        # A model is the root of its parameters' names: "conv1.W", never "CNN#0.conv1.W".
        return "" if self._parent is None else super()._prefix()

    def set_optimizer(self, optimizer) -> None:
        """The optimizer ``train_one_batch`` uses (``self.optimizer``), as SINGA's examples do. A DistOpt
        gets rank 0's parameter values on every rank as soon as the parameters exist (here, or in compile); one
        with find_unused_parameters=True and no parameters= takes this model's get_params() as its set."""
        self.optimizer = optimizer
        used_mask = getattr(getattr(optimizer, "reducer", None), "unused", None)  # parallel/unused.py
        if used_mask is not None:
            used_mask.adopt(self.get_params)
        if self._initialized:
            self._sync_replicas()

    def _sync_replicas(self) -> None:
        sync = getattr(getattr(self, "optimizer", None), "broadcast_parameters", None)
        if sync is not None:
            sync(self.get_params())

    def compile(self, inputs, is_train: bool = True, use_graph: bool = False, sequential: bool = False):
        """Creates lazily shaped parameters by running ``forward`` once on `inputs` (placeholders or tensors
        with the input shapes; nothing is recorded for backward and the values are not used), then sets the
        mode: ``is_train`` (train / eval), ``use_graph`` and ``sequential`` (see the module docstring).
        The input device's graph is reset afterwards, as SINGA does: its profile starts from here."""
        if isinstance(inputs, Tensor):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)) or not inputs or not all(isinstance(x, Tensor) for x in inputs):
            raise TypeError("compile: expected a non-empty list of input Tensors (placeholders with the input "
                            f"shapes), e.g. model.compile([tx], is_train=True); got {inputs!r}")
        dev = inputs[0].device
        was_training, graph_was = engine.training, dev.graph_enabled()
        engine.training = False
        dev.EnableGraph(True)
        try:
            self.forward(*inputs)
        finally:
            engine.training = was_training
            dev.EnableGraph(graph_was)
        dev.ResetGraph()
        object.__setattr__(self, "_initialized", True)
        self.train(bool(is_train))
        self.graph(use_graph, sequential)
        self._sync_replicas()

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def train_one_batch(self, *xs, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement train_one_batch()")

    def __call__(self, *args, **kwargs):
        """Training mode: ``train_one_batch(*args, **kwargs)``; evaluation mode: ``forward(*args, **kwargs)``
        (extra arguments such as SINGA's examples' ``dist_option, spars`` are passed on)."""
        if self.training:
            out = self.train_one_batch(*args, **kwargs)  # its self.forward(x) runs initialize(x) first
        else:
            out = self.forward(*args, **kwargs)
        object.__setattr__(self, "_initialized", True)
        return out

    def train(self, mode: bool = True) -> None:
        """Training mode (``mode=True``): calls run ``train_one_batch`` and operators record the graph for
        backward; ``train(False)`` is :meth:`eval`. Sets ``autograd.training``, as SINGA does."""
        self.training = bool(mode)
        engine.training = bool(mode)

    def eval(self) -> None:
        """Evaluation mode: calls run ``forward``, nothing is recorded, BatchNorm uses running statistics.
        With a DistOpt as optimizer, its ``sync_buffers(self)`` first gives every rank the same running
        statistics (broadcast_buffers): then every rank calls eval()."""
        sync = getattr(getattr(self, "optimizer", None), "sync_buffers", None)
        if sync is not None:
            sync(self)
        self.train(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Turns graph mode on or off for the training steps (see the module docstring); `sequential` is
        passed to ``RunGraph`` at the end of each step."""
        self.graph_mode, self.sequential = bool(mode), bool(sequential)

    def __get_name__(self) -> str:  # SINGA's spelling
        return type(self).__name__

    # ----- checkpoints
    def save_states(self, fpath: str, aux_states: dict | None = None) -> None:
        """Writes parameters, auxiliary states and `aux_states` (epoch, optimizer states... as Tensors,
        numpy arrays or numbers) to the zip file `fpath`, atomically. Refuses to overwrite an existing file.
        The format is described in :mod:`singa_lite.model_states`."""
        model_states.save_states(self, fpath, aux_states)

    def load_states(self, fpath: str) -> dict:
        """Restores the model's states from `fpath` (all names and shapes are checked before anything is
        written) and returns the auxiliary states as a dict of Tensors."""
        return model_states.load_states(self, fpath)
