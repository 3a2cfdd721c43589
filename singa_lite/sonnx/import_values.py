"""Import of the values that are not plain float / int tensors: the narrow element types (float8, float4, int4,
int2, held in float32 / int32, see common.py), strings (host numpy object arrays), sequences (Python lists of
Tensors) and optionals (None or the value). The operators that create or read them register in the same
import table as the rest (import_ops.IMPORTERS).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .. import ops as F, tensor
from ..engine import Operator
from ..raw import from_host, to_host
from .common import is_narrow, narrow_cast, np_dtype_of, onnx_type_to_singa_type
from .import_ops import importer

__all__ = ["NarrowCast"]


class NarrowCast(Operator):
    """ONNX's Cast to an element type singa_lite holds in a wider dtype (float8, float4, int4 ...): the values
    are rounded on the host to that type's (``narrow_cast``: ONNX's saturate and round_mode) and kept in the
    holder dtype. The gradient is a Cast's: dy cast back to x's dtype (straight through the rounding)."""
    aliased_grads = True

    def __init__(self, elem_type: int, saturate: bool = True, round_mode: str = "up"):
        super().__init__()
        self.elem_type, self.saturate, self.round_mode = elem_type, bool(saturate), round_mode

    def forward(self, x):
        self.src_dtype = x.dtype
        return from_host(narrow_cast(to_host(x), self.elem_type, self.saturate, self.round_mode), x.device)

    def backward(self, dy):
        return dy if dy.dtype == self.src_dtype else dy.cast(self.src_dtype)


def _cast_to(ctx, to: int):
    if ctx.elem_type(0) == TensorProto.STRING or to == TensorProto.STRING:
        ctx.fail("casts from and to strings are not supported")
    x = ctx.x(0)
    if to == TensorProto.BFLOAT16:
        return F.cast(x, tensor.bfloat16)
    held = onnx_type_to_singa_type(to)
    if held is None:
        ctx.fail(f"singa_lite has no tensor type for ONNX element type {TensorProto.DataType.Name(to)}")
    if is_narrow(np_dtype_of(to)):
        return NarrowCast(to, ctx.attr("saturate", 1), ctx.attr("round_mode", "up"))(x)[0]
    return F.cast(x, tensor.to_dtype(held))


importer("Cast", "Cast")(lambda ctx: _cast_to(ctx, ctx.attr("to")))
importer("CastLike", "Cast")(lambda ctx: _cast_to(ctx, ctx.elem_type(1)))


@importer("Equal", "Equal")
def _equal(ctx):
    """Numbers on the device; strings (host values) compared on the host."""
    if TensorProto.STRING in (ctx.elem_type(0), ctx.elem_type(1)):
        return np.equal(np.asarray(ctx.raw(0), object), np.asarray(ctx.raw(1), object)).astype(np.bool_)
    return F.equal(ctx.x(0), ctx.x(1))


@importer("Identity", "Identity")
def _identity(ctx):
    """A tensor through our Identity operator (it stays in the recorded graph); a sequence, an optional or a
    string array as it is (ONNX values are immutable, so sharing them is safe)."""
    v = ctx.raw(0)
    if isinstance(v, tensor.Tensor):
        return F.identity(v)
    if v is None or isinstance(v, list) or np.asarray(v).dtype == object:
        return [v]  # one output (a list returned bare would read as one output per element)
    return F.identity(ctx.x(0))


# ---------------------------------------------------------------- sequences: Python lists of Tensors
def _sequence(ctx, i: int) -> list:
    v = ctx.raw(i)
    if not isinstance(v, list):
        ctx.fail(f"input {i} must be a sequence, got {type(v).__name__}")
    return v


@importer("SplitToSequence", "Split")
def _split_to_sequence(ctx):
    """Pieces of the given sizes (a 1-D split), of one size (a scalar split, the last piece shorter) or of size 1
    without the axis when keepdims=0 (no split)."""
    x = ctx.x(0)
    axis = ctx.attr("axis", 0)
    axis = axis + x.ndim() if axis < 0 else axis
    n = x.shape[axis]
    split = ctx.value(1)
    if split is None:
        parts = F.split(x, axis, [1] * n)
        return [list(parts) if ctx.attr("keepdims", 1) else [F.squeeze(p, [axis]) for p in parts]]
    if split.ndim == 0:
        step = int(split)
        if step <= 0:
            ctx.fail(f"a scalar split must be > 0, got {step}")
        sizes = [min(step, n - i) for i in range(0, n, step)]
    else:
        sizes = [int(s) for s in split]
    if sum(sizes) != n:
        ctx.fail(f"split sizes {sizes} do not add up to the axis' length {n}")
    return [list(F.split(x, axis, sizes))]


@importer("SequenceConstruct", "Identity")
def _sequence_construct(ctx):
    return [ctx.xs()]


@importer("SequenceEmpty", "Identity")
def _sequence_empty(ctx):
    return [[]]


@importer("SequenceLength", "Shape")
def _sequence_length(ctx):
    return np.array(len(_sequence(ctx, 0)), np.int64)


@importer("SequenceAt", "Identity")
def _sequence_at(ctx):
    seq = _sequence(ctx, 0)
    i = int(ctx.value(1))
    if not -len(seq) <= i < len(seq):
        ctx.fail(f"position {i} is out of range for a sequence of {len(seq)} tensors")
    return F.identity(seq[i])


@importer("ConcatFromSequence", "Concat")
def _concat_from_sequence(ctx):
    seq = _sequence(ctx, 0)
    if not seq:
        ctx.fail("the sequence is empty")
    axis = ctx.attr("axis")
    if ctx.attr("new_axis", 0):
        axis = axis + seq[0].ndim() + 1 if axis < 0 else axis
        seq = [F.unsqueeze(t, [axis]) for t in seq]
    return F.cat(seq, axis)
