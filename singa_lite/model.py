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

SINGA's ``use_graph`` buffers the operations of a step and replays them on CUDA. singa_lite runs every
step eagerly; ``compile(use_graph=...)`` and ``graph()`` are accepted so SINGA scripts run, and the
flag is kept in ``graph_mode``, but it changes nothing.
"""
from __future__ import annotations

from . import autograd, model_states
from .layer import Layer
from .model_states import (  # noqa: F401
    AUX_STATE_TYPE,
    MODEL_STATE_TYPE,
    STATES_ATTR_FILENAME,
    TENSOR_DICT_FILENAME,
)
from .tensor import Tensor


class Model(Layer):
    """Base class of models: override ``forward`` and ``train_one_batch``."""

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self.training = True
        self.graph_mode = False
        self.sequential = False

    def _prefix(self) -> str:
        # A model is the root of its parameters' names: "conv1.W", never "CNN#0.conv1.W".
        return "" if self._parent is None else super()._prefix()

    def set_optimizer(self, optimizer) -> None:
        """The optimizer ``train_one_batch`` uses (``self.optimizer``), as SINGA's examples do. A DistOpt
        gets rank 0's parameter values on every rank as soon as the parameters exist (here, or in compile)."""
        self.optimizer = optimizer
        if self._initialized:
            self._sync_replicas()

    def _sync_replicas(self) -> None:
        sync = getattr(getattr(self, "optimizer", None), "broadcast_parameters", None)
        if sync is not None:
            sync(self.get_params())

    def compile(self, inputs, is_train: bool = True, use_graph: bool = False, sequential: bool = False):
        """Creates lazily shaped parameters by running ``forward`` once on `inputs` (nothing is recorded for
        backward), then sets the mode."""
        if not inputs or not all(isinstance(x, Tensor) for x in inputs):
            raise TypeError("compile: expected a non-empty list of input Tensors (placeholders with the input "
                            "shapes), e.g. model.compile([tx], is_train=True)")
        was_training = autograd.training
        autograd.training = False
        try:
            self.forward(*inputs)
        finally:
            autograd.training = was_training
        self.train(is_train)
        self.graph(use_graph, sequential)
        self._sync_replicas()

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def train_one_batch(self, *xs, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement train_one_batch()")

    def __call__(self, *xs, **kwargs):
        if not self._initialized:
            object.__setattr__(self, "_initialized", True)
        if self.training:
            return self.train_one_batch(*xs, **kwargs)
        return self.forward(*xs, **kwargs)

    def train(self, mode: bool = True) -> None:
        """Training mode: calls run ``train_one_batch`` and operators record the graph."""
        self.training = bool(mode)
        autograd.training = bool(mode)

    def eval(self) -> None:
        self.train(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Accepted for SINGA compatibility; steps always run eagerly (see the module docstring)."""
        self.graph_mode, self.sequential = bool(mode), bool(sequential)

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
