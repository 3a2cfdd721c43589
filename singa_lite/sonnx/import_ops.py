"""The import table: for every ONNX operator sonnx reads, a function that runs it with singa_lite's operators.

A converter takes a :class:`NodeContext` (the node's attributes, its inputs as tensors or as host values,
the model's opset) and returns the node's outputs: Tensors made by our autograd operators, so an imported
model trains like one written here, or numpy arrays for values that depend on shapes only (``Shape``,
``Constant``, ``ConstantOfShape``), which later nodes read as attributes (a Reshape's shape, a Slice's
bounds). ``IMPORTERS`` maps the ONNX type to its converter, ``SINGA_NAMES`` to the name of the singa_lite
operator or layer it uses (SINGA's ``SingaBackend._rename_operators``).

Opsets: where ONNX moved an attribute to an input (Squeeze / Unsqueeze / ReduceSum axes at 13, ReduceMean
at 18, Split's sizes at 13, Pad / Clip at 11, Slice at 10, Dropout's ratio at 12) or changed a meaning
(Softmax / LogSoftmax before 13 flatten the trailing axes), the converter reads the form of the model's
opset.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, numpy_helper

from .. import engine, ops as F, tensor
from .common import SonnxError, elem_type_of

__all__ = ["IMPORTERS", "SINGA_NAMES", "NodeContext"]

IMPORTERS: dict = {}
SINGA_NAMES: dict = {}


def importer(onnx_types, singa_name):
    """Registers the decorated converter for each ONNX type in `onnx_types` (a name or a list)."""
    names = [onnx_types] if isinstance(onnx_types, str) else list(onnx_types)

    def register(fn):
        for n in names:
            IMPORTERS[n] = fn
            SINGA_NAMES[n] = singa_name
        return fn

    return register


class NodeContext:
    """One node being run: ``x(i)`` its i-th input as a Tensor, ``value(i)`` as a numpy array (for inputs
    that are really attributes), ``raw(i)`` as held (a Tensor, a numpy array, a list for a sequence, None for
    an empty optional), ``elem_type(i)`` its ONNX element type, ``has(i)``, ``attr(name, default)``,
    ``opset``, ``node``."""

    def __init__(self, node, fetch, opset: int, dev, types=None):
        self.node, self._fetch, self.opset, self.dev = node, fetch, opset, dev
        self.types = {} if types is None else types

    def raw(self, i: int):
        if not self.has(i):
            self.fail(f"input {i} is missing")
        return self._fetch(self.node.inputs[i], as_tensor=False)

    def elem_type(self, i: int) -> int:
        """The ONNX element type of input i: the declared or inferred one (a float8 held in float32 is
        FLOAT8...), else that of the value as held."""
        known = self.types.get(self.node.inputs[i], (None, 0))[1]
        if known:
            return known
        v = self.raw(i)
        v = v[0] if isinstance(v, list) and v else v
        if isinstance(v, tensor.Tensor):
            return elem_type_of(v.dtype)
        v = np.asarray(v)
        return TensorProto.STRING if v.dtype.kind in "OUS" else elem_type_of(v.dtype)

    def has(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != ""

    def x(self, i: int):
        v = self._fetch(self.node.inputs[i], as_tensor=True) if self.has(i) else None
        if v is None:
            self.fail(f"input {i} is missing")
        return v

    def aux(self, i: int):
        """Input i as a state tensor: an initializer becomes a Tensor without gradient (running statistics)."""
        if not self.has(i):
            self.fail(f"input {i} is missing")
        return self._fetch(self.node.inputs[i], as_tensor="aux")

    def xs(self):
        return [self.x(i) for i in range(len(self.node.inputs)) if self.has(i)]

    def value(self, i: int, default=None):
        if not self.has(i):
            return default
        v = self._fetch(self.node.inputs[i], as_tensor=False)
        return tensor.to_numpy(v) if isinstance(v, tensor.Tensor) else np.asarray(v)

    def ints(self, i: int, default=None):
        v = self.value(i)
        return default if v is None else [int(a) for a in v.reshape(-1)]

    def attr(self, name, default=None):
        return self.node.attrs.get(name, default)

    def fail(self, what: str):
        raise SonnxError(f"{self.node.op_type} node {self.node.name!r}: {what}")


# ---------------------------------------------------------------- element-wise
_UNARY = {"Relu": ("ReLU", F.relu), "Sigmoid": ("Sigmoid", F.sigmoid), "Tanh": ("Tanh", F.tanh),
          "Exp": ("Exp", F.exp), "Log": ("Log", F.log), "Sqrt": ("Sqrt", F.sqrt), "Abs": ("Abs", F.abs),
          "Neg": ("Negative", F.negative), "Reciprocal": ("Reciprocal", F.reciprocal), "Sign": ("Sign", F.sign),
          "Sin": ("Sin", F.sin), "Cos": ("Cos", F.cos), "Tan": ("Tan", F.tan), "Sinh": ("Sinh", F.sinh),
          "Cosh": ("Cosh", F.cosh), "Asin": ("Asin", F.asin), "Acos": ("Acos", F.acos), "Atan": ("Atan", F.atan),
          "Asinh": ("Asinh", F.asinh), "Acosh": ("Acosh", F.acosh), "Atanh": ("Atanh", F.atanh),
          "Erf": ("Erf", F.erf), "Ceil": ("Ceil", F.ceil), "Floor": ("Floor", F.floor),
          "Round": ("Rounde", F.rounde), "Softplus": ("SoftPlus", F.softplus),
          "Softsign": ("SoftSign", F.softsign),
          "NonZero": ("NonZero", F.nonzero)}
_BINARY = {"Add": ("Add", F.add), "Sub": ("Sub", F.sub), "Mul": ("Mul", F.mul), "Less": ("Less", F.less),
           "Greater": ("Greater", F.greater),
           "PRelu": ("PRelu", F.prelu)}
_LOGIC = {"And": ("And", F.And.apply), "Or": ("Or", F.Or.apply), "Xor": ("Xor", F.Xor.apply)}
_VARIADIC = {"Sum": ("Sum", F.sum), "Mean": ("Mean", F.mean), "Max": ("Max", F.max), "Min": ("Min", F.min)}


def _table(entries, run):
    for onnx_type, (singa_name, fn) in entries.items():
        importer(onnx_type, singa_name)(lambda ctx, fn=fn: run(ctx, fn))


_table(_UNARY, lambda ctx, fn: fn(ctx.x(0)))
_table(_BINARY, lambda ctx, fn: fn(ctx.x(0), ctx.x(1)))


def _logic(ctx, fn):
    """ONNX's And / Or / Xor take bool tensors; ours compute on numbers (non-zero is true), in float32."""
    a, b = (F.cast(v, tensor.float32) for v in (ctx.x(0), ctx.x(1)))
    return F.cast(fn(a, b), tensor.bool_)


_table(_LOGIC, _logic)
_table(_VARIADIC, lambda ctx, fn: fn(*ctx.xs()))


@importer("Div", "Div")
def _div(ctx):
    """ONNX's integer division truncates toward zero where ours floors (numpy's rule): integers are divided in
    float64 (exact for |values| < 2^53) and truncated."""
    a, b = ctx.x(0), ctx.x(1)
    if a.dtype not in (tensor.int32, tensor.int64):
        return F.div(a, b)
    q = F.div(F.cast(a, tensor.float64), F.cast(b, tensor.float64))
    return F.cast(F.mul(F.sign(q), F.floor(F.abs(q))), a.dtype)


@importer("Pow", "Pow")
def _pow(ctx):
    """ONNX's Pow may mix types; the result has the base's. Ours wants one dtype: a float exponent of an
    integer base is applied in float64, then cast back."""
    a, b = ctx.x(0), ctx.x(1)
    if a.dtype == b.dtype:
        return F.pow(a, b)
    if a.dtype in (tensor.int32, tensor.int64):
        return F.cast(F.pow(F.cast(a, tensor.float64), F.cast(b, tensor.float64)), a.dtype)
    return F.pow(a, F.cast(b, a.dtype))


@importer("LeakyRelu", "LeakyRelu")
def _leakyrelu(ctx):
    return F.leakyrelu(ctx.x(0), ctx.attr("alpha", 0.01))


@importer("Elu", "Elu")
def _elu(ctx):
    return F.elu(ctx.x(0), ctx.attr("alpha", 1.0))


@importer("Selu", "SeLU")
def _selu(ctx):
    return F.selu(ctx.x(0), ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875))


@importer("HardSigmoid", "HardSigmoid")
def _hardsigmoid(ctx):
    return F.hardsigmoid(ctx.x(0), ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))


@importer("Gelu", "Gelu")
def _gelu(ctx):
    x = ctx.x(0)
    if ctx.attr("approximate", "none") == "none":
        return F.gelu(x)
    # tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), from our differentiable operators
    inner = F.mul(F.add(x, F.mul(F.mul(F.mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
    return F.mul(F.mul(x, 0.5), F.add(F.tanh(inner), 1.0))


def _coerced(ctx, fn):
    """Softmax / LogSoftmax: from opset 13 along one axis (default -1); before, over all axes from `axis`
    (default 1) of the input flattened to 2-D there."""
    x = ctx.x(0)
    if ctx.opset >= 13:
        return fn(x, ctx.attr("axis", -1))
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim() if axis < 0 else axis
    if axis == x.ndim() - 1:
        return fn(x, axis)
    return F.reshape(fn(F.flatten(x, axis), 1), list(x.shape))


importer("Softmax", "SoftMax")(lambda ctx: _coerced(ctx, F.softmax))
importer("LogSoftmax", "LogSoftmax")(lambda ctx: _coerced(ctx, F.log_softmax))


@importer("Clip", "Clip")
def _clip(ctx):
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo, hi = ctx.value(1), ctx.value(2)
    lo = None if lo is None or np.size(lo) == 0 else float(np.asarray(lo).reshape(-1)[0])
    hi = None if hi is None or np.size(hi) == 0 else float(np.asarray(hi).reshape(-1)[0])
    if lo is not None and hi is not None and lo > hi:  # ONNX: every value becomes max
        lo = hi
    return F.clip(ctx.x(0), lo, hi)


@importer("Not", "Not")
def _not(ctx):
    return F.cast(F.Not.apply(F.cast(ctx.x(0), tensor.float32)), tensor.bool_)


@importer("Where", "Where")
def _where(ctx):
    return F.where(ctx.x(1), ctx.x(2), ctx.x(0))


# ---------------------------------------------------------------- matrix products
@importer("MatMul", "Matmul")
def _matmul(ctx):
    return F.matmul(ctx.x(0), ctx.x(1))


@importer("Gemm", "layer.Gemm")
def _gemm(ctx):
    c = ctx.x(2) if ctx.has(2) else None
    return F.gemm(ctx.x(0), ctx.x(1), c, ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0), ctx.attr("transA", 0),
                  ctx.attr("transB", 0))


# ---------------------------------------------------------------- convolution, pooling, normalisation
def _geometry(ctx, x_shape, kernel, dilation=None):
    """(stride, symmetric padding (h, w), odd_padding (top, bottom, left, right), extra end padding for
    ceil_mode) of a 2-D conv / pool node from strides, pads, auto_pad and ceil_mode."""
    strides = list(ctx.attr("strides", [1, 1]))
    dil = list(dilation or [1, 1])
    auto = ctx.attr("auto_pad", "NOTSET")
    spatial = list(x_shape[2:])
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(spatial, kernel, strides, dil):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small, large = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else large)
            end.append(large if auto == "SAME_UPPER" else small)
    elif auto == "VALID":
        begin, end = [0, 0], [0, 0]
    elif auto == "NOTSET":
        pads = list(ctx.attr("pads", [0, 0, 0, 0]))
        begin, end = pads[:2], pads[2:]
    else:
        ctx.fail(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto!r}")
    if ctx.attr("ceil_mode", 0):  # the last, partial window: extra padding at the end
        for i, (n, k, s) in enumerate(zip(spatial, kernel, strides)):
            span = n + begin[i] + end[i] - k
            if span % s:
                end[i] += s - span % s
    sym = [min(b, e) for b, e in zip(begin, end)]
    odd = (begin[0] - sym[0], end[0] - sym[0], begin[1] - sym[1], end[1] - sym[1])
    return strides, sym, odd


def _as_2d(ctx, x, what):
    """A 1-D (N, C, L) input as (N, C, 1, L); 2-D inputs unchanged; others refused."""
    if x.ndim() == 3:
        return F.unsqueeze(x, [2]), True
    if x.ndim() != 4:
        ctx.fail(f"{what} supports 1-D and 2-D inputs ((N, C, L) or (N, C, H, W)), got shape {x.shape}")
    return x, False


def _widen(attr, one_d, fill):
    """A 1-D attribute ([k], or pads [b, e]) in the 2-D form of _as_2d."""
    if attr is None or not one_d:
        return attr
    attr = list(attr)
    return [fill, attr[0], fill, attr[1]] if len(attr) == 2 and fill == 0 else [fill] + attr


@importer("Conv", "layer.Conv2d")
def _conv(ctx):
    x, one_d = _as_2d(ctx, ctx.x(0), "Conv")
    w = ctx.x(1)
    if one_d:
        w = F.unsqueeze(w, [2])
        ctx.node.attrs.update({k: _widen(ctx.attr(k), True, f) for k, f in
                               (("strides", 1), ("pads", 0), ("dilations", 1), ("kernel_shape", 1))
                               if ctx.attr(k) is not None})
    dil = list(ctx.attr("dilations", [1, 1]))
    kernel = list(w.shape[2:])
    stride, sym, odd = _geometry(ctx, x.shape, kernel, dil)
    b = ctx.x(2) if ctx.has(2) else None
    y = F.conv2d(x, w, b, stride, sym, dil, ctx.attr("group", 1), odd_padding=odd)
    return F.squeeze(y, [2]) if one_d else y


def _pool(ctx, is_max):
    x, one_d = _as_2d(ctx, ctx.x(0), ctx.node.op_type)
    if one_d:
        ctx.node.attrs.update({k: _widen(ctx.attr(k), True, f) for k, f in
                               (("strides", 1), ("pads", 0), ("kernel_shape", 1)) if ctx.attr(k) is not None})
    if any(d != 1 for d in ctx.attr("dilations", [1, 1])):
        ctx.fail("dilated pooling is not supported")
    if len(ctx.node.outputs) > 1:
        ctx.fail("the Indices output of MaxPool is not supported")
    kernel = list(ctx.attr("kernel_shape"))
    stride, sym, odd = _geometry(ctx, x.shape, kernel)
    if is_max:
        y = F.max_pool2d(x, kernel, stride, sym, odd_padding=odd)
    else:
        include = bool(ctx.attr("count_include_pad", 0))
        if ctx.attr("ceil_mode", 0) and any(odd) and include:
            ctx.fail("ceil_mode with count_include_pad=1 is not supported")
        y = F.avg_pool2d(x, kernel, stride, sym, include, odd_padding=odd)
    return F.squeeze(y, [2]) if one_d else y


importer("MaxPool", "layer.Pooling2d")(lambda ctx: _pool(ctx, True))
importer("AveragePool", "layer.Pooling2d")(lambda ctx: _pool(ctx, False))


@importer("GlobalAveragePool", "GlobalAveragePool")
def _gap(ctx):
    return F.global_avg_pool2d(ctx.x(0))


@importer("BatchNormalization", "layer.BatchNorm2d")
def _batchnorm(ctx):
    """ONNX's momentum weighs the running value (running = m * running + (1 - m) * batch), SINGA's the
    batch statistic: ours is 1 - m. Under autograd.training the running statistics are updated in place by
    our operator (the batch variance unbiased, as SINGA and PyTorch); a node that outputs them (the
    training-mode form) gets ONNX's values instead (the batch variance biased), in those outputs and in the
    state. training_mode=1 outside autograd.training normalises by the batch statistics."""
    training_form = len(ctx.node.outputs) > 1 and any(ctx.node.outputs[1:])
    training = engine.training or bool(ctx.attr("training_mode", 0)) or (training_form and ctx.opset < 14)
    if training_form and not training:
        ctx.fail("the running-statistics outputs exist in training mode only: set the node's training_mode=1 or "
                 "autograd.training = True")
    x = ctx.x(0)
    squeezed = x.ndim() == 3
    if squeezed:
        x = F.unsqueeze(x, [2])
    mean, var = ctx.aux(3), ctx.aux(4)
    m, eps = ctx.attr("momentum", 0.9), ctx.attr("epsilon", 1e-5)
    if not training:
        y = F.batchnorm_2d(x, ctx.x(1), ctx.x(2), mean, var, 1.0 - m, eps)
        return F.squeeze(y, [2]) if squeezed else y
    if engine.training and not training_form:  # our operator: batch statistics, their gradient, the state
        y = F.batchnorm_2d(x, ctx.x(1), ctx.x(2), mean, var, 1.0 - m, eps)
        return F.squeeze(y, [2]) if squeezed else y
    old_stats = [tensor.to_numpy(t).astype(np.float64) for t in (mean, var)]
    host = tensor.to_numpy(x).astype(np.float64)
    axes = tuple(i for i in range(host.ndim) if i != 1)
    batch = (host.mean(axes), host.var(axes))
    if engine.training:
        y = F.batchnorm_2d(x, ctx.x(1), ctx.x(2), mean, var, 1.0 - m, eps)
    else:  # training_mode=1 outside training: the same normalisation, no gradient to give
        stats = [tensor.from_numpy(b.astype(tensor.numpy_dtype(x.dtype)), ctx.dev) for b in batch]
        y = F.batchnorm_2d(x, ctx.x(1), ctx.x(2), *stats, 1.0 - m, eps)
    y = F.squeeze(y, [2]) if squeezed else y
    if not training_form:
        return y
    for t, b, old in zip((mean, var), batch, old_stats):
        t.copy_from_numpy((m * old + (1 - m) * b).astype(tensor.numpy_dtype(t.dtype)))
    return (y, mean, var)[:len(ctx.node.outputs)]


@importer("Dropout", "Dropout")
def _dropout(ctx):
    ratio = ctx.attr("ratio", 0.5) if ctx.opset < 12 else float(ctx.value(1, np.array(0.5)).reshape(-1)[0])
    x = ctx.x(0)
    y = F.dropout(x, ratio)
    if len(ctx.node.outputs) > 1:
        if engine.training:
            ctx.fail("the mask output of Dropout is only available in evaluation mode")
        return y, np.ones(x.shape, dtype=np.bool_)
    return y


# ---------------------------------------------------------------- shapes
@importer("Reshape", "Reshape")
def _reshape(ctx):
    shape = ctx.attr("shape") if ctx.opset < 5 else ctx.ints(1)
    x = ctx.x(0)
    if ctx.attr("allowzero", 0) and 0 in shape:
        # a literal 0 (an empty result; x is empty too): ours reads 0 as "keep that axis", which from the
        # flat (0,) keeps 0 at axis 0 and finds no axis to keep after it, so every 0 stays 0
        return F.reshape(F.reshape(x, [-1]), shape)
    return F.reshape(x, shape)


@importer("Flatten", "Flatten")
def _flatten(ctx):
    return F.flatten(ctx.x(0), ctx.attr("axis", 1))


@importer("Transpose", "Transpose")
def _transpose(ctx):
    return F.transpose(ctx.x(0), ctx.attr("perm"))


def _axes(ctx, since):
    """An axes list given as an attribute before opset `since` and as input 1 from it on."""
    return ctx.attr("axes") if ctx.opset < since else ctx.ints(1)


importer("Squeeze", "Squeeze")(lambda ctx: F.squeeze(ctx.x(0), _axes(ctx, 13) or []))
importer("Unsqueeze", "Unsqueeze")(lambda ctx: F.unsqueeze(ctx.x(0), _axes(ctx, 13)))


def _reduce(ctx, fn, since):
    axes = _axes(ctx, since)
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return F.identity(ctx.x(0))
        axes = None
    return fn(ctx.x(0), axes, ctx.attr("keepdims", 1))


def _extreme(x, axes, keepdims, fn):
    """ReduceMax / ReduceMin as the element-wise Max / Min of the slices along each axis: our differentiable
    operators (the gradient goes to the extreme element), no new kernel."""
    axes = range(x.ndim()) if axes is None else [a + x.ndim() if a < 0 else a for a in axes]
    for a in sorted(set(axes)):
        if x.shape[a] > 1:
            x = fn(*F.split(x, a, [1] * x.shape[a]))
    if not keepdims:
        keep = [s for i, s in enumerate(x.shape) if i not in set(axes)]
        x = F.reshape(x, keep or [1])
    return x


importer("ReduceMax", "Max")(lambda ctx: _reduce(ctx, lambda x, axes, k: _extreme(x, axes, k, F.max), 18))
importer("ReduceMin", "Min")(lambda ctx: _reduce(ctx, lambda x, axes, k: _extreme(x, axes, k, F.min), 18))
importer("ReduceSum", "ReduceSum")(lambda ctx: _reduce(ctx, F.reduce_sum, 13))
importer("ReduceMean", "ReduceMean")(lambda ctx: _reduce(ctx, F.reduce_mean, 18))


@importer("Concat", "Concat")
def _concat(ctx):
    return F.cat(ctx.xs(), ctx.attr("axis"))


@importer("Split", "Split")
def _split(ctx):
    parts = ctx.attr("split") if ctx.opset < 13 else ctx.ints(1)
    n = len(ctx.node.outputs)
    if parts is None and ctx.attr("num_outputs") is not None:
        x = ctx.x(0)
        size = x.shape[ctx.attr("axis", 0)]
        step = -(-size // n)
        parts = [min(step, size - i * step) for i in range(n)]
    ys = F.split(ctx.x(0), ctx.attr("axis", 0), parts, None if parts else n)
    return tuple(ys)


@importer("Slice", "Slice")
def _slice(ctx):
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends, axes, steps = ctx.ints(1), ctx.ints(2), ctx.ints(3), ctx.ints(4)
    x = ctx.x(0)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    lows, highs = [], []
    for a, s, e, st in zip(axes, starts, ends, steps):
        n = x.shape[a]
        lo, hi = (0, n) if st > 0 else (-1, n - 1)  # ONNX clamps to these, after adding n to negatives
        s, e = min(max(s + n if s < 0 else s, lo), hi), min(max(e + n if e < 0 else e, lo), hi)
        # an end clamped to -1 (stepping backwards past the first element) is -n - 1 in Python's rules
        lows.append(s)
        highs.append(-n - 1 if e < 0 else e)
    return F.slice(x, lows, highs, axes, steps)


@importer("Gather", "Gather")
def _gather(ctx):
    return F.gather(ctx.x(0), ctx.attr("axis", 0), ctx.value(1))


@importer("Tile", "Tile")
def _tile(ctx):
    return F.tile(ctx.x(0), ctx.ints(1))


@importer("Expand", "Expand")
def _expand(ctx):
    return F.expand(ctx.x(0), ctx.ints(1))


@importer("Pad", "Pad")
def _pad(ctx):
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads, value = ctx.attr("pads"), ctx.attr("value", 0.0)
    else:
        pads, value = ctx.ints(1), ctx.value(2)
        value = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    x = ctx.x(0)
    if ctx.has(3):  # opset 18: pads for the listed axes only
        full = [0] * (2 * x.ndim())
        axes = [a + x.ndim() if a < 0 else a for a in ctx.ints(3)]
        for j, a in enumerate(axes):
            full[a], full[a + x.ndim()] = pads[j], pads[j + len(axes)]
        pads = full
    return F.pad(x, mode, pads, value)


@importer("Upsample", "UpSample")
def _upsample(ctx):
    scales = ctx.attr("scales") if ctx.opset < 9 else ctx.value(1)
    return F.upsample(ctx.x(0), ctx.attr("mode", "nearest"), scales)


_RESIZE_ATTRS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
                 "extrapolation_value", "antialias")


def _resize_matrix(ctx, n: int, scale, size, roi, aspect=None):
    """(A, b) with resize(v) = v @ A + b for a 1-D signal v of length n: Resize is separable and affine in its
    input along each axis, so onnx's reference evaluator, run once on the identity and once on zeros, gives
    the exact matrix of any mode (nearest, linear, cubic, antialias, every coordinate transformation).

    aspect (p, q): keep_aspect_ratio_policy, whose one scale p / q (a ratio of the node's sizes) every
    resized axis shares: the reference runs on a second axis of length q asked for size p next to this one,
    so that its policy picks that same scale (a float64 division of the same rational) and this axis' length
    (round half up), and the matrix is read from the first slice of that axis."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    attrs = {k: ctx.attr(k) for k in _RESIZE_ATTRS + ("keep_aspect_ratio_policy",) if ctx.attr(k) is not None}
    if aspect is not None:
        attrs["axes"] = [1, 2]
    inputs = ["X", "roi" if roi is not None else "", "scales" if size is None else "", "sizes" if size else ""]
    node = helper.make_node("Resize", inputs, ["Y"], **attrs)
    graph = helper.make_graph([node], "axis", [helper.make_tensor_value_info(v, TensorProto.FLOAT, None)
                                               for v in ("X", "roi", "scales", "sizes")],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    ref = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(ctx.opset, 11))]))
    if aspect is None:
        feeds = {"roi": np.array([0, roi[0], 1, roi[1]], np.float32) if roi is not None else None,
                 "scales": np.array([1, scale], np.float32) if size is None else None,
                 "sizes": np.array([n, size], np.int64) if size else None}
        shape = (n, n)
    else:
        feeds = {"roi": np.array([roi[0], 0, roi[1], 1], np.float32) if roi is not None else None,
                 "sizes": np.array([size, aspect[0]], np.int64)}
        shape = (n, n, aspect[1])
    feeds = {k: v for k, v in feeds.items() if v is not None}
    eye = np.eye(n, dtype=np.float32)
    if aspect is not None:
        eye = np.repeat(eye[:, :, None], aspect[1], axis=2)
    eye = ref.run(None, dict(feeds, X=eye))[0]
    zero = ref.run(None, dict(feeds, X=np.zeros(shape, np.float32)))[0]
    if aspect is not None:
        eye, zero = eye[..., 0], zero[..., 0]
    return eye - zero, zero[0]


@importer("Resize", "Resize")
def _resize(ctx):
    """Every axis that changes size is resized by a matrix product with its interpolation matrix
    (_resize_matrix): our differentiable operators, exact to ONNX's reference."""
    x = ctx.x(0)
    nd = x.ndim()
    if ctx.opset < 11:
        scales, sizes, roi = ctx.value(1), None, None
    else:
        roi, scales, sizes = ctx.value(1), ctx.value(2), ctx.value(3)
    axes = ctx.attr("axes") or list(range(nd))
    axes = [a + nd if a < 0 else a for a in axes]
    use_sizes = sizes is not None and sizes.size > 0
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        ctx.fail(f"keep_aspect_ratio_policy must be 'stretch', 'not_larger' or 'not_smaller', got {policy!r}")
    aspect = None
    if use_sizes and policy != "stretch":  # one scale for every axis: the smallest / largest size ratio
        ratios = [(int(sizes.reshape(-1)[j]), x.shape[a]) for j, a in enumerate(axes)]
        p, q = (min if policy == "not_larger" else max)(ratios, key=lambda r: r[0] / r[1])
        g = math.gcd(p, q) or 1
        aspect = (p // g, q // g)
    per = {}
    for j, a in enumerate(axes):
        sc = None if use_sizes else float(scales.reshape(-1)[j])
        sz = int(sizes.reshape(-1)[j]) if use_sizes else None
        r = None
        if roi is not None and roi.size and ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
            r = (float(roi.reshape(-1)[j]), float(roi.reshape(-1)[j + len(axes)]))
        if aspect is not None or (sz != x.shape[a] if use_sizes else sc != 1.0) or r is not None:
            per[a] = (sc, sz, r)
    if aspect is not None and aspect[0] == aspect[1] and not any(r for _, _, r in per.values()):
        per = {}  # the shared scale is 1: nothing moves
    cache = ctx.node.__dict__.setdefault("resize_cache", {})
    dtype = x.dtype
    for a, (sc, sz, r) in per.items():
        key = (a, x.shape[a], sc, sz, r, aspect)
        if key not in cache:
            cache[key] = _resize_matrix(ctx, x.shape[a], sc, sz, r, aspect)
        A, b = cache[key]
        perm = [i for i in range(nd) if i != a] + [a]
        back = [perm.index(i) for i in range(nd)]
        moved = F.matmul(F.transpose(x, perm), tensor.from_numpy(A.astype(tensor.numpy_dtype(dtype)), ctx.dev))
        if np.any(b):
            moved = F.add(moved, tensor.from_numpy(b.astype(tensor.numpy_dtype(dtype)), ctx.dev))
        x = F.transpose(moved, back)
    return x if per else F.identity(x)


importer("DepthToSpace", "DepthToSpace")(
    lambda ctx: F.depth_to_space(ctx.x(0), ctx.attr("blocksize"), ctx.attr("mode", "DCR")))
importer("SpaceToDepth", "SpaceToDepth")(
    lambda ctx: F.space_to_depth(ctx.x(0), ctx.attr("blocksize"), ctx.attr("mode", "DCR")))


@importer("ScatterElements", "ScatterElements")
def _scatter(ctx):
    return F.scatter_elements(ctx.x(0), ctx.value(1), ctx.value(2), ctx.attr("axis", 0),
                              ctx.attr("reduction", "none"))


@importer("OneHot", "OneHot")
def _onehot(ctx):
    """ONNX gives an all-off row for an index outside [-depth, depth - 1], ours wraps it: such indices point to
    one extra class, cut off afterwards."""
    values = ctx.value(2)
    depth = int(np.asarray(ctx.value(1)).reshape(-1)[0])
    ind = ctx.value(0).astype(np.int64)
    axis = ctx.attr("axis", -1)
    if ((ind < -depth) | (ind >= depth)).any():
        ind = np.where((ind < -depth) | (ind >= depth), depth, np.where(ind < 0, ind + depth, ind))
        y = F.onehot(axis, tensor.from_numpy(ind, ctx.dev), depth + 1, values)
        ax = axis + ind.ndim + 1 if axis < 0 else axis
        y = F.slice(y, [0], [depth], [ax], [1])
    else:
        y = F.onehot(axis, ctx.x(0), ctx.value(1), values)
    return F.cast(y, tensor.to_dtype(values.dtype)) if values.dtype != np.float32 else y


# ---------------------------------------------------------------- values known from shapes alone
@importer("Shape", "Shape")
def _shape(ctx):
    shape = list(ctx.x(0).shape)
    start, end = ctx.attr("start", 0), ctx.attr("end")
    return np.array(shape[start:end], dtype=np.int64)


@importer("Size", "Shape")
def _size(ctx):
    return np.array(math.prod(ctx.x(0).shape), dtype=np.int64)


@importer("Constant", "Constant")
def _constant(ctx):
    for key, conv in (("value", numpy_helper.to_array), ("value_float", np.float32), ("value_int", np.int64),
                      ("value_floats", lambda v: np.array(v, np.float32)),
                      ("value_ints", lambda v: np.array(v, np.int64))):
        if key in ctx.node.attrs:
            return np.asarray(conv(ctx.node.attrs[key]))
    ctx.fail(f"no supported value attribute (has {sorted(ctx.node.attrs)})")


@importer("ConstantOfShape", "ConstantOfShape")
def _constant_of_shape(ctx):
    value = ctx.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return np.full(ctx.ints(0), fill[0], dtype=fill.dtype)
