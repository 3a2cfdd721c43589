"""SINGA's ``SONNXModel``: an imported ONNX model as a :class:`~singa_lite.model.Model`, to fine-tune or to
extend (a new head on a cut graph) like any model written here.

The ONNX graph runs through a :class:`~singa_lite.sonnx.importer.SingaRep` whose weights become this model's
parameters (attributes named after the initializers, ``.`` and other characters that cannot be in a Python
name written ``_``), so ``get_params``, ``save_states`` / ``load_states``, optimizers and ``DistOpt`` see
them. They are created by the first forward pass (``compile`` runs one), because only then is it known which
initializers the nodes read as tensors; a graph cut with ``last_layers`` never creates the weights of the
nodes it drops. BatchNormalization's running statistics are auxiliary states, as in our ``BatchNorm2d``.

Usage, as in SINGA's examples/onnx/training::

    class MyModel(sonnx.SONNXModel):
        def __init__(self, onnx_model):
            super().__init__(onnx_model)
            self.linear = layer.Linear(10)

        def forward(self, *x):
            y = super().forward(*x, last_layers=-3)[0]   # all but the last node (the classifier)
            return self.linear(y)

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = autograd.softmax_cross_entropy(out, y)
            self.optimizer(loss)
            return out, loss
"""
from __future__ import annotations

import re

from ..model import Model
from .importer import prepare

__all__ = ["SONNXModel"]


class SONNXModel(Model):
    """``SONNXModel(onnx_model, device="CPU")``: ``forward(*inputs, aux_output=(), last_layers=None)``
    returns the list of output Tensors (see :meth:`SingaRep.run`). ``sg_ir`` is the SingaRep."""

    def __init__(self, onnx_model, device="CPU"):
        super().__init__()
        rep = prepare(onnx_model, device)
        rep.is_graph = True
        object.__setattr__(self, "sg_ir", rep)
        object.__setattr__(self, "weight_attrs", {})  # initializer name -> attribute name
        rep.on_new_tensor = self._adopt

    def _adopt(self, name: str, t, trainable: bool) -> None:
        base = re.sub(r"\W", "_", name)
        base = base if base and not base[0].isdigit() else f"w_{base}"
        attr, k = base, 1
        while attr in self.__dict__ or hasattr(type(self), attr):
            attr, k = f"{base}_{k}", k + 1
        if not trainable:
            object.__setattr__(self, "aux_states", tuple(self.aux_states) + (attr,))
        self.weight_attrs[name] = attr
        setattr(self, attr, t)

    def forward(self, *inputs, aux_output=(), **kwargs):
        return self.sg_ir.run(list(inputs), aux_output=aux_output, **kwargs)
