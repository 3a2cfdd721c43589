"""The export table: for every singa_lite operator class that has an ONNX form, a function that writes it.

An exporter is called as ``fn(op, ins, outs, ctx)``: the recorded operator (after its forward, before
backward frees it), the value names of its inputs and outputs, and the :class:`export.GraphBuilder` that
adds nodes (``ctx.node``) and constant initializers (``ctx.const``). It reads the operator's own attributes
(stride, padding, axis, ...), the ones its constructor set or its forward computed. ``EXPORTERS`` maps the
class name to it; operators without an entry (losses, CosSim) are refused by name. Everything is written in
opset 13 (common.EXPORT_OPSET).
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .. import tensor
from .common import SonnxError, elem_type_of

__all__ = ["EXPORTERS"]

EXPORTERS: dict = {}


def exporter(*class_names):
    def register(fn):
        for n in class_names:
            EXPORTERS[n] = fn
        return fn

    return register


def _out_dtype(op, i=0):
    return tensor.numpy_dtype(op.y_meta[i][1])


# ---------------------------------------------------------------- one ONNX node, same inputs, no attributes
_SAME = {"ReLU": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
         "Abs": "Abs", "Negative": "Neg", "Reciprocal": "Reciprocal", "Sign": "Sign", "Sin": "Sin", "Cos": "Cos",
         "Tan": "Tan", "Sinh": "Sinh", "Cosh": "Cosh", "Asin": "Asin", "Acos": "Acos", "Atan": "Atan",
         "Asinh": "Asinh", "Acosh": "Acosh", "Atanh": "Atanh", "Erf": "Erf", "Ceil": "Ceil", "Floor": "Floor",
         "Rounde": "Round", "SoftPlus": "Softplus", "SoftSign": "Softsign", "Identity": "Identity", "Not": "Not",
         "Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Pow": "Pow", "Less": "Less",
         "Greater": "Greater", "Equal": "Equal", "And": "And", "Or": "Or", "Xor": "Xor", "PRelu": "PRelu",
         "Sum": "Sum", "Mean": "Mean", "Max": "Max", "Min": "Min", "Matmul": "MatMul", "NonZero": "NonZero",
         "Shape": "Shape"}

for _ours, _theirs in _SAME.items():
    exporter(_ours)(lambda op, ins, outs, ctx, t=_theirs: ctx.node(t, ins, outs))


@exporter("GlobalAveragePool")
def _global_avg_pool(op, ins, outs, ctx):
    if not op.channels_first:  # ONNX's averages every axis after the channel axis 1
        raise SonnxError(f"to_onnx: {op.name}: GlobalAveragePool has no channels_last form in ONNX; transpose to "
                         f"channels_first (N, C, H, W) first")
    ctx.node("GlobalAveragePool", ins, outs)


@exporter("LeakyRelu")
def _leakyrelu(op, ins, outs, ctx):
    ctx.node("LeakyRelu", ins, outs, alpha=op.a)


@exporter("Elu")
def _elu(op, ins, outs, ctx):
    ctx.node("Elu", ins, outs, alpha=op.alpha)


@exporter("SeLU")
def _selu(op, ins, outs, ctx):
    ctx.node("Selu", ins, outs, alpha=op.alpha, gamma=op.gamma)


@exporter("HardSigmoid")
def _hardsigmoid(op, ins, outs, ctx):
    ctx.node("HardSigmoid", ins, outs, alpha=op.alpha, beta=op.gamma)


@exporter("SoftMax", "LogSoftmax")
def _softmax(op, ins, outs, ctx):
    ctx.node("Softmax" if type(op).__name__ == "SoftMax" else "LogSoftmax", ins, outs, axis=op.axis)


@exporter("Gelu")
def _gelu(op, ins, outs, ctx):
    """x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))): ONNX has Gelu only from opset 20."""
    dt = _out_dtype(op)
    s = ctx.tmp(op, "scaled")
    ctx.node("Mul", [ins[0], ctx.const(op, "rsqrt2", np.array(1 / math.sqrt(2), dt))], [s])
    e = ctx.tmp(op, "erf")
    ctx.node("Erf", [s], [e])
    p = ctx.tmp(op, "plus1")
    ctx.node("Add", [e, ctx.const(op, "one", np.array(1, dt))], [p])
    h = ctx.tmp(op, "half_x")
    ctx.node("Mul", [ins[0], ctx.const(op, "half", np.array(0.5, dt))], [h])
    ctx.node("Mul", [h, p], outs)


@exporter("Clip")
def _clip(op, ins, outs, ctx):
    dt = _out_dtype(op)
    lo = "" if op.min is None else ctx.const(op, "min", np.array(op.min, dt))
    hi = "" if op.max is None else ctx.const(op, "max", np.array(op.max, dt))
    ctx.node("Clip", [ins[0], lo, hi] if hi else [ins[0], lo], outs)


@exporter("Cast")
def _cast(op, ins, outs, ctx):
    ctx.node("Cast", ins, outs, to=elem_type_of(op.to))


@exporter("Dropout")
def _dropout(op, ins, outs, ctx):
    ctx.node("Dropout", [ins[0], ctx.const(op, "ratio", np.array(op.ratio, np.float32))], outs)


@exporter("Where")
def _where(op, ins, outs, ctx):
    cond = op.condition
    cond = tensor.to_numpy(cond) if isinstance(cond, tensor.Tensor) else np.asarray(cond)
    ctx.node("Where", [ctx.const(op, "condition", cond != 0)] + ins, outs)


# ---------------------------------------------------------------- matrix products
@exporter("Gemm")
def _gemm(op, ins, outs, ctx):
    ctx.node("Gemm", ins, outs, alpha=op.alpha, beta=op.beta, transA=int(op.transA), transB=int(op.transB))


@exporter("AddBias")
def _add_bias(op, ins, outs, ctx):
    b = ins[1]
    if op.axis == 1:  # one value per row: b as a column
        b = ctx.tmp(op, "column")
        ctx.node("Unsqueeze", [ins[1], ctx.const(op, "axes", np.array([1], np.int64))], [b])
    ctx.node("Add", [ins[0], b], outs)


# ---------------------------------------------------------------- convolution, pooling, normalisation
def _pads(op):
    """ONNX's pads (h_begin, w_begin, h_end, w_end) from our symmetric padding and odd_padding (top,
    bottom, left, right)."""
    (ph, pw), odd = op.padding, op.odd or (0, 0, 0, 0)
    return [ph + odd[0], pw + odd[2], ph + odd[1], pw + odd[3]]


@exporter("_Conv2d")
def _conv(op, ins, outs, ctx):
    ctx.node("Conv", ins, outs, strides=list(op.stride), pads=_pads(op), dilations=list(op.dilation),
             group=op.groups)


@exporter("_MaxPool2d")
def _maxpool(op, ins, outs, ctx):
    ctx.node("MaxPool", ins, outs, kernel_shape=list(op.kernel), strides=list(op.stride), pads=_pads(op))


@exporter("_AvgPool2d")
def _avgpool(op, ins, outs, ctx):
    ctx.node("AveragePool", ins, outs, kernel_shape=list(op.kernel), strides=list(op.stride), pads=_pads(op),
             count_include_pad=int(op.count_include_pad))


@exporter("_BatchNorm2d")
def _batchnorm(op, ins, outs, ctx):
    """The running statistics (the operator's own tensors, not inputs) become initializers; ONNX's momentum
    weighs the running value, ours the batch statistic."""
    mean = ctx.const(op, "running_mean", tensor.to_numpy(tensor.from_raw_tensor(op.running_mean)))
    var = ctx.const(op, "running_var", tensor.to_numpy(tensor.from_raw_tensor(op.running_var)))
    ctx.node("BatchNormalization", ins + [mean, var], outs, epsilon=op.eps, momentum=1.0 - op.momentum)


# ---------------------------------------------------------------- shapes
def _ints(v):
    return np.array([int(i) for i in v], np.int64)


@exporter("Reshape")
def _reshape(op, ins, outs, ctx):
    ctx.node("Reshape", [ins[0], ctx.const(op, "shape", _ints(op.shape))], outs)


@exporter("Flatten")
def _flatten(op, ins, outs, ctx):
    ctx.node("Flatten", ins, outs, axis=op.axis)


@exporter("Transpose")
def _transpose(op, ins, outs, ctx):
    ctx.node("Transpose", ins, outs, perm=list(op.p))


@exporter("Squeeze")
def _squeeze(op, ins, outs, ctx):
    extra = [ctx.const(op, "axes", _ints(op.axis))] if op.axis else []
    ctx.node("Squeeze", ins + extra, outs)


@exporter("Unsqueeze")
def _unsqueeze(op, ins, outs, ctx):
    ctx.node("Unsqueeze", [ins[0], ctx.const(op, "axes", _ints(op.axis))], outs)


@exporter("ReduceSum", "ReduceMean")
def _reduce(op, ins, outs, ctx):
    onnx_type = type(op).__name__
    full = op.axes is None and not op.keepdims
    target = [ctx.tmp(op, "scalar")] if full else outs
    if onnx_type == "ReduceSum":
        extra = [] if op.axes is None else [ctx.const(op, "axes", _ints(op.axes))]
        ctx.node(onnx_type, ins + extra, target, keepdims=int(op.keepdims))
    else:
        attrs = {} if op.axes is None else {"axes": [int(a) for a in op.axes]}
        ctx.node(onnx_type, ins, target, keepdims=int(op.keepdims), **attrs)
    if full:  # ONNX's full reduction is 0-d; ours has shape (1,), as SINGA's
        ctx.node("Reshape", [target[0], ctx.const(op, "shape", _ints([1]))], outs)


@exporter("Concat")
def _concat(op, ins, outs, ctx):
    ctx.node("Concat", ins, outs, axis=op.axis)


@exporter("Split")
def _split(op, ins, outs, ctx):
    ax = op.axis
    sizes = [meta[0][ax] for meta in op.y_meta]
    ctx.node("Split", [ins[0], ctx.const(op, "split", _ints(sizes))], outs, axis=ax)


@exporter("Slice")
def _slice(op, ins, outs, ctx):
    n = len(op.starts)
    axes = list(op.axes) if op.axes is not None else list(range(n))
    steps = list(op.steps) if op.steps is not None else [1] * n
    consts = [ctx.const(op, k, _ints(v)) for k, v in (("starts", op.starts), ("ends", op.ends), ("axes", axes),
                                                       ("steps", steps))]
    ctx.node("Slice", [ins[0]] + consts, outs)


@exporter("Gather")
def _gather(op, ins, outs, ctx):
    ctx.node("Gather", [ins[0], ctx.const(op, "indices", op.indices.astype(np.int64))], outs, axis=op.axis)


@exporter("Tile")
def _tile(op, ins, outs, ctx):
    nd = len(op.xshape)
    reps, x = list(op.repeats), ins[0]
    if len(reps) > nd:  # numpy's tile adds leading axes; ONNX's wants one repeat per axis
        x = ctx.tmp(op, "widened")
        ctx.node("Reshape", [ins[0], ctx.const(op, "shape", _ints([1] * (len(reps) - nd) + list(op.xshape)))], [x])
    reps = [1] * (max(nd, len(reps)) - len(reps)) + reps
    ctx.node("Tile", [x, ctx.const(op, "repeats", _ints(reps))], outs)


@exporter("Expand")
def _expand(op, ins, outs, ctx):
    ctx.node("Expand", [ins[0], ctx.const(op, "shape", _ints(op.shape))], outs)


@exporter("Pad")
def _pad(op, ins, outs, ctx):
    fill = ctx.const(op, "value", np.array(op.fill, _out_dtype(op)))
    ctx.node("Pad", [ins[0], ctx.const(op, "pads", _ints(op.pads)), fill], outs, mode=op.mode)


@exporter("UpSample")
def _upsample(op, ins, outs, ctx):
    scales = ctx.const(op, "scales", np.array(op.scales, np.float32))
    ctx.node("Resize", [ins[0], "", scales], outs, mode="nearest", coordinate_transformation_mode="asymmetric",
             nearest_mode="floor")


@exporter("DepthToSpace")
def _depth_to_space(op, ins, outs, ctx):
    ctx.node("DepthToSpace", ins, outs, blocksize=op.bs, mode=op.mode)


@exporter("SpaceToDepth")
def _space_to_depth(op, ins, outs, ctx):
    if op.mode != "DCR":  # ONNX's SpaceToDepth (opset 13) has DCR only
        raise SonnxError(f"to_onnx: {op.name}: space_to_depth mode {op.mode!r} has no opset-13 ONNX form; use 'DCR'")
    ctx.node("SpaceToDepth", ins, outs, blocksize=op.bs)


@exporter("ScatterElements")
def _scatter(op, ins, outs, ctx):
    if op.reduction != "none":  # ScatterElements has its reduction attribute from opset 16 (max / min: 18)
        raise SonnxError(f"to_onnx: {op.name}: scatter_elements with reduction={op.reduction!r} has no opset-13 "
                         f"ONNX form; only reduction='none' is exported")
    ctx.node("ScatterElements", [ins[0], ctx.const(op, "indices", op.indices),
                                 ctx.const(op, "updates", op.updates.astype(_out_dtype(op)))], outs, axis=op.axis)


@exporter("ConstantOfShape")
def _constant_of_shape(op, ins, outs, ctx):
    value = np.array([op.value], _out_dtype(op))
    shape = ctx.tmp(op, "shape64")  # ONNX reads the shape as int64
    ctx.node("Cast", ins, [shape], to=elem_type_of(np.dtype(np.int64)))
    ctx.node("ConstantOfShape", [shape], outs, value=helper.make_tensor("value", elem_type_of(value.dtype), [1],
                                                                        value.tolist()))


@exporter("OneHot")
def _onehot(op, ins, outs, ctx):
    ids = ctx.tmp(op, "ids")  # int64 indices and depth: the typing every runtime implements
    ctx.node("Cast", [ins[0]], [ids], to=elem_type_of(np.dtype(np.int64)))
    ctx.node("OneHot", [ids, ctx.const(op, "depth", np.array([op.depth], np.int64)),
                        ctx.const(op, "values", op.values.astype(np.float32))], outs, axis=op.axis)


@exporter("Embedding")
def _embedding(op, ins, outs, ctx):
    ids = ins[0]
    if op.xmeta[1] not in (tensor.int32, tensor.int64):  # SINGA feeds ids as floats
        ids = ctx.tmp(op, "ids")
        ctx.node("Cast", [ins[0]], [ids], to=elem_type_of(np.dtype(np.int64)))
    ctx.node("Gather", [ins[1], ids], outs, axis=0)

