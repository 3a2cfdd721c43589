"""Export: the autograd graph recorded by a forward pass, written as an ONNX model (SINGA's ``to_onnx``).

``to_onnx(inputs, outputs)`` walks the graph that ends at the outputs (``autograd_graph.post_order``: every
operator after the ones feeding it) and writes one ONNX node (or a few) per operator through the export
table (export_ops.py). Parameters (tensors with ``stores_grad=True``) become initializers under their names;
state the operators hold (BatchNorm's running statistics) and their constant arguments (a Reshape's shape)
become initializers too. The graph is recorded only while ``autograd.training`` is true and is kept after
backward, as SINGA keeps it, until the next recorded forward pass begins: export before that.

Which tensors are the graph's inputs. Our engine records nothing for an input that is neither a parameter nor
an operator's output (a data tensor), so those inputs are matched by position: each such operator input,
in graph order, takes the next tensor of ``inputs`` (SINGA's rule; extra entries, such as SINGA's
``to_onnx([x, (2, 3)], [y])``, are ignored). A tensor of ``inputs`` that has ``stores_grad=True`` is matched
by identity instead, which is what ``export_model`` does so that an input read by several operators is one
graph input.

``export_model(model, inputs)`` exports a Layer / Model as it computes in evaluation mode: it traces one
forward pass (training mode, so that the graph is recorded) on copies of the inputs, then restores the
running statistics that pass changed. BatchNormalization and Dropout are written in their ONNX inference
meaning (running statistics; identity), which is what ``model.eval()`` computes.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import engine, tensor
from ..autograd_graph import Dummy, post_order
from ..engine import Operator
from .common import EXPORT_OPSET, SonnxError, elem_type_of
from .export_ops import EXPORTERS

__all__ = ["GraphBuilder", "SingaFrontend", "export_model", "to_onnx"]


class GraphBuilder:
    """What the exporters write into: nodes and initializers, under names unique in the graph."""

    def __init__(self, opset: int):
        self.opset, self.nodes, self.initializers, self._names = opset, [], [], set()

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def node(self, op_type: str, inputs, outputs, **attrs) -> None:
        base = outputs[0].rsplit(":", 1)[0] if outputs else op_type
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=self.unique(base), **attrs))

    def const(self, op, hint: str, value) -> str:
        name = self.unique(f"{op.name}:{hint}")
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def tmp(self, op, hint: str) -> str:
        return self.unique(f"{op.name}:{hint}")


def _value_info(name: str, t) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type_of(t.dtype), list(t.shape))


def _walk(roots: list) -> list:
    """The items of every root's post order, each once (operators by identity, parameters by tensor)."""
    order, seen = [], set()
    for root in roots:
        try:
            items = post_order(root)
        except ValueError as e:
            raise SonnxError(f"to_onnx: {e}; export after the forward pass of these outputs and before the next "
                             f"recorded forward pass, which drops their graph") from None
        for item in items:
            key = ((id(item[0]), item[1]) if isinstance(item, tuple)
                   else ("param", id(item.tensor)) if isinstance(item, Dummy) else id(item))
            if key not in seen:
                seen.add(key)
                order.append(item)
    return order


class SingaFrontend:
    """SINGA's exporter class: ``singa_to_onnx_model(inputs, y)`` (``to_onnx``) and
    ``singa_to_onnx_graph``. ``_target_opset_version`` is the opset written."""

    _target_opset_version = EXPORT_OPSET

    @classmethod
    def singa_to_onnx_graph(cls, inputs, y, model_name="sonnx"):
        outputs = list(y) if isinstance(y, (list, tuple)) else [y]
        if not outputs:
            raise SonnxError("to_onnx: give at least one output tensor")
        for out in outputs:
            if not isinstance(out, tensor.Tensor):
                raise TypeError(f"to_onnx: outputs must be tensor.Tensor, got {type(out).__name__}")
            if out.creator is None:
                raise SonnxError("to_onnx: an output has no recorded graph; set autograd.training = True before "
                                 "the forward pass (and give its inputs requires_grad=True, the default)")
        given = [x for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])
                 if isinstance(x, tensor.Tensor)]
        by_identity = {id(x): x for x in given if x.stores_grad}
        positional = [x for x in given if not x.stores_grad]
        b = GraphBuilder(cls._target_opset_version)
        graph_inputs, names = [], {}  # names: id(op) or ("param", id(tensor)) or (id(op), i) -> value name

        order = {id(x): k for k, x in enumerate(given)}

        def input_name(x) -> str:
            name = b.unique(x.name if isinstance(x.name, str) and x.name else f"input{order[id(x)]}")
            graph_inputs.append((order[id(x)], _value_info(name, x)))
            return name

        items = _walk([out.creator for out in outputs])
        for item in items:
            if isinstance(item, tuple):  # an unrecorded input: the next positional input tensor
                op, i = item
                if not positional:
                    raise SonnxError(
                        f"to_onnx: the graph reads more data inputs than the {len(given)} tensors given (the "
                        f"operator {op.name} reads one at position {i}). Pass every input tensor, in the order "
                        f"the forward pass uses them; an input read by several operators must be marked "
                        f"x.stores_grad = True before the forward pass (or use sonnx.export_model)")
                names[(id(op), i)] = input_name(positional.pop(0))
            elif isinstance(item, Dummy):
                t = item.tensor
                if id(t) in by_identity:
                    names[("param", id(t))] = input_name(t)
                else:
                    name = b.unique(t.name if isinstance(t.name, str) and t.name else "param")
                    b.initializers.append(numpy_helper.from_array(tensor.to_numpy(t), name))
                    names[("param", id(t))] = name
            else:
                for i in range(len(item.y_meta)):
                    names[(id(item), "out", i)] = b.unique(f"{item.name}:{i}")
        for item in items:
            if isinstance(item, (tuple, Dummy)):
                continue
            cls._export_op(item, names, b)
        graph_outputs = []
        for out in outputs:
            name = names[(id(out.creator), "out", out.creator.y_id2idx[id(out)])]
            graph_outputs.append(_value_info(name, out))
        graph_inputs = [info for _, info in sorted(graph_inputs, key=lambda p: p[0])]  # in the order given
        return helper.make_graph(b.nodes, model_name, graph_inputs, graph_outputs, b.initializers)

    @classmethod
    def _export_op(cls, op: Operator, names: dict, b: GraphBuilder) -> None:
        kind = type(op).__name__
        fn = EXPORTERS.get(kind)
        if fn is None:
            raise SonnxError(f"to_onnx: operator {op.name} ({kind}) has no ONNX form in sonnx (losses are not "
                             f"part of a model: export the model's output, not the loss); exportable: "
                             f"{', '.join(sorted(EXPORTERS))}")
        ins = []
        for i, e in enumerate(op.src):
            if e is None:
                ins.append(names[(id(op), i)])
            elif isinstance(e[0], tensor.Tensor):
                ins.append(names[("param", id(e[0]))])
            else:
                ins.append(names[(id(e[0]), "out", e[1])])
        outs = [names[(id(op), "out", i)] for i in range(len(op.y_meta))]
        fn(op, ins, outs, b)

    @classmethod
    def singa_to_onnx_model(cls, inputs, y, model_name="sonnx"):
        """The ONNX ModelProto of the graph from `inputs` to `y` (a tensor or a list), checked by
        ``onnx.checker``."""
        graph = cls.singa_to_onnx_graph(inputs, y, model_name)
        model = helper.make_model(graph, producer_name="singa_lite.sonnx",
                                  opset_imports=[helper.make_opsetid("", cls._target_opset_version)])
        # IR 7 is what opset 13 came with: every onnxruntime since 1.7 loads it.
        model.ir_version = 7
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            raise SonnxError(f"to_onnx: the exported model does not pass onnx.checker: {e}") from None
        return model


to_onnx = SingaFrontend.singa_to_onnx_model


def export_model(model, inputs, model_name=None):
    """The ONNX model of `model` (a Layer or Model) on `inputs` (a Tensor or a list of them, with the input
    shapes) as it computes in evaluation mode; see the module docstring. The model's states are unchanged."""
    from ..layer.base import Layer

    if not isinstance(model, Layer):
        raise TypeError(f"export_model: expected a singa_lite Layer or Model, got {type(model).__name__}")
    xs = [inputs] if isinstance(inputs, tensor.Tensor) else list(inputs)
    if not xs or not all(isinstance(x, tensor.Tensor) for x in xs):
        raise TypeError("export_model: inputs must be a Tensor or a non-empty list of Tensors")
    copies = []
    for i, x in enumerate(xs):
        c = tensor.Tensor(data=x.data.clone(), requires_grad=True, stores_grad=True, name=f"input{i}")
        copies.append(c)
    was = engine.training
    engine.training = False
    try:
        model.forward(*copies)  # creates lazily shaped parameters, changes no state
    finally:
        engine.training = was
    saved = {k: tensor.to_numpy(v) for k, v in model.get_states().items()}
    engine.training = True
    try:
        outs = model.forward(*copies)
    finally:
        engine.training = was
        model.set_states(saved)  # the traced pass updated running statistics
    return to_onnx(copies, list(outs) if isinstance(outs, (list, tuple)) else [outs],
                   model_name or type(model).__name__)
