"""Reading the recorded autograd graph, with SINGA's names: ``autograd.Dummy`` and ``autograd.infer_dependency``.

How our graph differs from SINGA's, and what these functions make of it
-------------------------------------------------------------------------
An operator called while ``autograd.training`` is true records one edge per input in ``op.src``:

- ``(creator_op, output_index)`` for an input made by a recorded operator,
- ``(param, 0)`` for a leaf with ``stores_grad=True`` (a parameter),
- ``None`` for anything else (data, labels, constants): the engine never needs it, so it keeps nothing.

SINGA instead gives every leaf tensor a placeholder operator, ``Dummy``, as its creator, and its edges are
``(src_op, id(x), x or None, x.stores_grad)``. Here a :class:`Dummy` is made on demand for a parameter edge;
two Dummies of the same tensor compare equal (and hash alike), so they work as the dictionary / Counter keys
SINGA's code uses. Inputs without an edge (``None``) cannot be named after their tensor, since the engine
never kept it: :func:`post_order` reports them as ``(op, input_index)`` instead.

``autograd`` re-exports :class:`Dummy` and :func:`infer_dependency` (built on the engine, like the
operators). ``utils.post_order_recursive`` is built on :func:`post_order`.
"""
from __future__ import annotations

from collections import Counter

from .engine import Operator
from .tensor import Tensor

__all__ = ["Dummy", "infer_dependency", "post_order"]


class Dummy(Operator):
    """SINGA's placeholder operator for a leaf tensor (``Dummy(tensor, name=None)``): no inputs, one output
    (the tensor), no gradient of its own. Attributes it lacks are read from the tensor (``dummy.shape``,
    ``dummy.stores_grad``), as in SINGA. It computes nothing: calling it raises ``TypeError``."""

    def __init__(self, tensor, name=None):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"Dummy: expected a tensor.Tensor, got {type(tensor).__name__}")
        super().__init__(name if name is not None else tensor.name)
        self.tensor = tensor
        self.src = []
        self.y_id2idx = {id(tensor): 0}
        self.requires_grad = False

    def output_name(self, idx=0):
        return self.name

    def grad_name(self, idx=0):
        return f"{self.name}_g"

    def __call__(self, *xs):
        raise TypeError(f"Dummy {self.name!r} is a placeholder for a leaf tensor in the graph; it computes nothing")

    def __getattr__(self, name):
        # Only reached for names the Dummy itself lacks; "tensor" is guarded so that a half-built object
        # (copy, pickle) does not recurse forever.
        if name == "tensor":
            raise AttributeError(name)
        return getattr(self.tensor, name)

    # One tensor, one placeholder: Dummies made at different times for the same parameter are the same key.
    def __eq__(self, other):
        return isinstance(other, Dummy) and other.tensor is self.tensor

    def __hash__(self):
        return hash(("Dummy", id(self.tensor)))

    def __repr__(self):
        return f"Dummy({self.name!r})"


def _edges(op):
    """op's recorded input edges, or a ValueError saying why there are none."""
    if isinstance(op, Dummy):
        return []
    if not isinstance(op, Operator):
        raise TypeError(f"expected an autograd operator (e.g. loss.creator), got {type(op).__name__}")
    if getattr(op, "released", False):
        raise ValueError(f"the graph through {op.name} was freed: a new forward pass began recording after its "
                         f"backward; run its forward pass again")
    if not hasattr(op, "src"):
        raise ValueError(f"{op.name} recorded no graph: set autograd.training = True before the forward pass "
                         f"and give some input requires_grad=True")
    return op.src


def _node_and_tensor_id(edge):
    """(source node, id of the tensor carried by the edge) for a recorded edge."""
    node, idx = edge
    if isinstance(node, Tensor):
        return Dummy(node), id(node)
    for yid, i in node.y_id2idx.items():
        if i == idx:
            return node, yid
    raise ValueError(f"{node.name} has no output {idx}")


def infer_dependency(op):
    """SINGA's ``infer_dependency(op)``: walks the graph ending at ``op`` (e.g. ``loss.creator``) and returns
    ``(op_count, tensor_count)``, two Counters: for every operator reached (parameters as :class:`Dummy`), how
    many edges of the graph read its outputs; for every tensor reached (keyed by ``id(tensor)``), how many
    operators read it. ``op`` itself is not counted. Inputs the engine does not record (``None`` edges: data,
    labels) are absent, where SINGA counts their Dummies too."""
    op_count, tensor_count = Counter(), Counter()
    stack = [op]
    while stack:
        for edge in _edges(stack.pop()):
            if edge is None:
                continue
            node, tid = _node_and_tensor_id(edge)
            if node not in op_count:
                stack.append(node)
            op_count[node] += 1
            tensor_count[tid] += 1
    return op_count, tensor_count


def post_order(root):
    """Everything the graph ending at ``root`` reaches, each once, every node after its inputs (the
    post-order of a depth-first walk over ``src`` in input order, as SINGA's ``post_order_recursive``; no
    recursion, so deep graphs are fine). Items are operators, :class:`Dummy` for parameters, and
    ``(op, input_index)`` for an input the engine did not record."""
    order, seen = [], {root}
    stack = [(root, iter(enumerate(_edges(root))))]
    while stack:
        op, edges = stack[-1]
        for i, edge in edges:
            if edge is None:
                order.append((op, i))
                continue
            node = _node_and_tensor_id(edge)[0]
            if node not in seen:
                seen.add(node)
                stack.append((node, iter(enumerate(_edges(node)))))
                break
        else:
            stack.pop()
            order.append(op)
    return order
