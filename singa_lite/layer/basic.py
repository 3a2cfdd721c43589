"""SINGA's layers: ``Linear``, ``Conv2d``, ``SeparableConv2d``, ``BatchNorm2d``, pooling, activations,
losses and the small structural layers (``Add``, ``Cat``, ``Reshape``), built on the operators' function
forms and :class:`~singa_lite.layer.base.Layer`.

A :class:`Layer` is called like a function. Parameters (tensors with ``stores_grad=True``) are created in
the constructor when all shapes are known, otherwise lazily on the first call from the input's shape, as
SINGA does: ``Linear(500)`` and ``Linear(800, 500)`` are both valid, and so are ``Conv2d(20, 5)`` and
``Conv2d(1, 20, 5)``.
"""
from __future__ import annotations

import math

from .. import ops as F
from ..raw import pair
from .base import Layer

__all__ = ["Linear", "Conv2d", "SeparableConv2d", "Pooling2d", "MaxPool2d", "AvgPool2d", "MaxPool1d",
           "AvgPool1d", "GlobalAvgPool2d", "BatchNorm2d", "ReLU", "Sigmoid", "Tanh", "Gelu", "Flatten", "Dropout",
           "SoftMax", "SoftMaxCrossEntropy", "MeanSquareError", "CrossEntropy", "BinaryCrossEntropy", "Add", "Cat",
           "Reshape", "Gemm", "Embedding"]

# SINGA's padding modes: explicit padding, or "same" output size with an odd pixel after / before.
PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
ACTIVATIONS = ("NOTSET", "RELU")


def _padding(v, layer: str) -> tuple:
    """SINGA's padding: an int, (h, w), or ONNX's (top, bottom, left, right). Returns ((h, w), extra): the
    kernels pad both sides of an axis alike by (h, w); `extra` = (top, bottom, left, right) is what an
    uneven 4-tuple adds on one side (SINGA's "odd padding", which the operators take as ``odd_padding``)."""
    if isinstance(v, (tuple, list)) and len(v) == 4 and all(isinstance(i, int) and i >= 0 for i in v):
        top, bottom, left, right = v
        h, w = min(top, bottom), min(left, right)
        return (h, w), (top - h, bottom - h, left - w, right - w)
    return pair(v, f"{layer}: padding"), NO_EXTRA


NO_EXTRA = (0, 0, 0, 0)


def _choice(v, allowed: tuple, what: str) -> str:
    if not isinstance(v, str) or v.upper() not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {v!r}")
    return v.upper()


def _same_padding(pad_mode: str, size, kernel, stride, dilation=(1, 1)) -> tuple:
    """SINGA's SAME_UPPER / SAME_LOWER: the padding giving output size ceil(size / stride), as
    ((h, w), extra) like :func:`_padding`; an odd total puts the extra pixel at the end (UPPER) or the
    beginning (LOWER) of the axis."""
    sym, extra = [], [0, 0, 0, 0]
    for axis, (n, k, st, d) in enumerate(zip(size, kernel, stride, dilation)):
        out = -(-n // st)
        total = max((out - 1) * st + (k - 1) * d + 1 - n, 0)
        sym.append(total // 2)
        if total % 2:
            extra[2 * axis + (1 if pad_mode == "SAME_UPPER" else 0)] = 1
    return tuple(sym), tuple(extra)


def _no_extra_kwargs(layer: str, kwargs: dict, accepted: dict) -> None:
    """SINGA layer keywords singa_lite accepts only at their default (e.g. cuDNN tuning); others are refused."""
    for k, v in kwargs.items():
        if k not in accepted:
            raise TypeError(f"{layer}: unexpected keyword argument {k!r}")
        if v != accepted[k]:
            raise NotImplementedError(f"{layer}: {k}={v!r} is not supported by singa_lite (only the default "
                                      f"{accepted[k]!r}); remove the argument")


# ---------------------------------------------------------------- layers with parameters
class Linear(Layer):
    """y = x W + b, W of shape (in_features, out_features) ~ N(0, 2 / (in + out)), b = 0.

    ``Linear(out_features)`` infers in_features from the first input; ``Linear(in_features, out_features)``
    creates the parameters at once (SINGA's autograd spelling)."""

    def __init__(self, out_features: int, *args, bias: bool = True, name: str | None = None):
        super().__init__(name)
        in_features = None
        if len(args) > 2:
            raise TypeError(f"Linear takes (out_features) or (in_features, out_features[, bias]), got "
                            f"{(out_features,) + args}")
        if args:
            in_features, out_features = out_features, args[0]
        if len(args) > 1:
            bias = args[1]
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        if in_features is not None:
            self._create(in_features)
            object.__setattr__(self, "_initialized", True)

    def initialize(self, x):
        self._create(x.shape[-1])

    def _create(self, in_features: int):
        self.in_features = in_features
        self._param((in_features, self.out_features), "W").gaussian(
            0.0, math.sqrt(2.0 / (in_features + self.out_features)))
        if self.bias:
            self._param((self.out_features,), "b")

    def forward(self, x):
        y = F.matmul(x, self.W)
        if not self.bias:
            return y
        return F.add_bias(y, self.b, axis=0) if y.ndim() == 2 else F.add(y, self.b)


class Conv2d(Layer):
    """2-D convolution on NCHW input, SINGA's constructor:
    ``Conv2d(nb_kernels, kernel_size, stride=1, padding=0, dilation=1, group=1, bias=True, pad_mode="NOTSET",
    activation="NOTSET")`` infers in_channels from the first input; ``Conv2d(in_channels, nb_kernels,
    kernel_size[, stride[, padding]], ...)`` creates the parameters at once.

    padding: an int, (h, w), or ONNX's (top, bottom, left, right); an uneven part is padded with zeros on
    its side (the operator's ``odd_padding``), as SINGA does. pad_mode ``SAME_UPPER`` / ``SAME_LOWER``
    computes the padding from the first input so the output is ceil(input / stride), an odd pixel going
    after / before; ``VALID`` means none. activation ``RELU`` applies a ReLU to the output. cuDNN tuning
    keywords (``cudnn_prefer``, ``workspace_MB_limit``) are accepted at SINGA's defaults only.
    W ~ N(0, 2 / (fan_in + fan_out)), b = 0."""

    def __init__(self, nb_kernels: int, kernel_size, *args, stride=1, padding=0, dilation=1, group: int = 1,
                 bias: bool = True, pad_mode: str = "NOTSET", activation: str = "NOTSET", name: str | None = None,
                 **kwargs):
        super().__init__(name)
        _no_extra_kwargs("Conv2d", kwargs, {"cudnn_prefer": "fastest", "workspace_MB_limit": 1024})
        in_channels = None
        if len(args) > 3:
            raise TypeError(f"Conv2d takes at most (in_channels, nb_kernels, kernel_size, stride, padding) "
                            f"positionally, got {(nb_kernels, kernel_size) + args}")
        if args:
            in_channels, nb_kernels, kernel_size = nb_kernels, kernel_size, args[0]
        if len(args) > 1:
            stride = args[1]
        if len(args) > 2:
            padding = args[2]
        self.nb_kernels, self.kernel_size = nb_kernels, pair(kernel_size, "kernel_size")
        self.stride = pair(stride, "stride")
        self.padding, self.odd_padding = _padding(padding, "Conv2d")
        self.dilation, self.group, self.bias = pair(dilation, "dilation"), group, bias
        self.pad_mode = _choice(pad_mode, PAD_MODES, "Conv2d: pad_mode")
        self.activation = _choice(activation, ACTIVATIONS, "Conv2d: activation")
        if self.pad_mode == "VALID":
            self.padding, self.odd_padding = (0, 0), NO_EXTRA
        if group < 1 or nb_kernels % group:
            raise ValueError(f"Conv2d: group {group} must be >= 1 and divide nb_kernels {nb_kernels}")
        self.in_channels = in_channels
        if in_channels is not None and not self.pad_mode.startswith("SAME"):
            self._create(in_channels)
            object.__setattr__(self, "_initialized", True)

    def initialize(self, x):
        if x.ndim() != 4:
            raise ValueError(f"{self.name}: expected NCHW input, got shape {x.shape}")
        if self.pad_mode.startswith("SAME"):
            self.padding, self.odd_padding = _same_padding(self.pad_mode, x.shape[2:], self.kernel_size,
                                                           self.stride, self.dilation)
        self._create(x.shape[1])

    def _create(self, in_channels: int):
        if in_channels % self.group:
            raise ValueError(f"Conv2d: group {self.group} must divide in_channels {in_channels}")
        self.in_channels = in_channels
        kh, kw = self.kernel_size
        fan_in = in_channels // self.group * kh * kw
        fan_out = self.nb_kernels // self.group * kh * kw
        self._param((self.nb_kernels, in_channels // self.group, kh, kw), "W").gaussian(
            0.0, math.sqrt(2.0 / (fan_in + fan_out)))
        if self.bias:
            self._param((self.nb_kernels,), "b")

    def forward(self, x):
        y = F.conv2d(x, self.W, self.b if self.bias else None, self.stride, self.padding,
                            self.dilation, self.group, odd_padding=self.odd_padding)
        return F.relu(y) if self.activation == "RELU" else y


class SeparableConv2d(Layer):
    """A depthwise convolution (one kernel per input channel, ``group = in_channels``) followed by a 1x1
    convolution to nb_kernels channels, SINGA's ``SeparableConv2d(nb_kernels, kernel_size, stride=1,
    padding=0, bias=False)``; ``SeparableConv2d(in_channels, nb_kernels, kernel_size, ...)`` also works."""

    def __init__(self, nb_kernels: int, kernel_size, *args, stride=1, padding=0, bias: bool = False,
                 name: str | None = None):
        super().__init__(name)
        if len(args) > 3:
            raise TypeError(f"SeparableConv2d takes at most (in_channels, nb_kernels, kernel_size, stride, "
                            f"padding) positionally, got {(nb_kernels, kernel_size) + args}")
        if args:  # SINGA's older spelling starts with in_channels, which the first input gives anyway
            nb_kernels, kernel_size = kernel_size, args[0]
        if len(args) > 1:
            stride = args[1]
        if len(args) > 2:
            padding = args[2]
        self.nb_kernels, self.kernel_size = nb_kernels, pair(kernel_size, "kernel_size")
        _padding(padding, "SeparableConv2d")  # checked here, applied by the depthwise Conv2d
        self.stride, self.padding, self.bias = pair(stride, "stride"), padding, bias

    def initialize(self, x):
        if x.ndim() != 4:
            raise ValueError(f"{self.name}: expected NCHW input, got shape {x.shape}")
        channels = x.shape[1]
        self.in_channels = channels
        self.depthwise_conv = Conv2d(channels, channels, self.kernel_size, stride=self.stride,
                                     padding=self.padding, group=channels, bias=self.bias)
        self.point_conv = Conv2d(channels, self.nb_kernels, 1, bias=self.bias)

    def forward(self, x):
        return self.point_conv(self.depthwise_conv(x))


class BatchNorm2d(Layer):
    """Batch normalisation over (N, H, W) per channel. ``BatchNorm2d(momentum=0.9)`` infers the channels;
    ``BatchNorm2d(num_features, momentum=0.9)`` creates the tensors at once. Training mode uses batch
    statistics and updates ``running_mean`` / ``running_var`` (SINGA's momentum convention, see
    ``autograd.batchnorm_2d``); evaluation mode uses the running statistics."""

    aux_states = ("running_mean", "running_var")

    def __init__(self, *args, momentum: float = 0.9, eps: float = 1e-5, name: str | None = None):
        super().__init__(name)
        if len(args) > 2:
            raise TypeError(f"BatchNorm2d takes at most (num_features, momentum) positionally, got {args}")
        if len(args) > 1:
            momentum = args[1]
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1], got {momentum}")
        self.momentum, self.eps = momentum, eps
        if args:
            self._create(int(args[0]))
            object.__setattr__(self, "_initialized", True)

    def initialize(self, x):
        if x.ndim() != 4:
            raise ValueError(f"{self.name}: expected NCHW input, got shape {x.shape}")
        self._create(x.shape[1])

    def _create(self, channels: int):
        self.num_features = channels
        self._param((channels,), "scale").set_value(1.0)
        self._param((channels,), "bias")
        self._aux((channels,), "running_mean", 0.0)
        self._aux((channels,), "running_var", 1.0)

    def forward(self, x):
        return F.batchnorm_2d(x, self.scale, self.bias, self.running_mean, self.running_var,
                                     self.momentum, self.eps)


# ---------------------------------------------------------------- layers without parameters
class Pooling2d(Layer):
    """Max (``is_max=True``) or average pooling, SINGA's ``Pooling2d(kernel_size, stride=None, padding=0,
    is_max=True, pad_mode="NOTSET")``; stride defaults to the kernel. padding and pad_mode as in
    :class:`Conv2d` (an uneven part is the operator's ``odd_padding``: max pooling never picks padding).
    Average pooling counts padded zeros (``count_include_pad=True``) unless told."""

    def __init__(self, kernel_size, stride=None, padding=0, is_max: bool = True, pad_mode: str = "NOTSET",
                 count_include_pad: bool = True, name: str | None = None):
        super().__init__(name)
        what = type(self).__name__
        self.kernel_size = pair(kernel_size, f"{what}: kernel_size")
        self.stride = self.kernel_size if stride is None else pair(stride, f"{what}: stride")
        self.padding, self.odd_padding = _padding(padding, what)
        self.is_max, self.count_include_pad = bool(is_max), count_include_pad
        self.pad_mode = _choice(pad_mode, PAD_MODES, f"{what}: pad_mode")
        if self.pad_mode == "VALID":
            self.padding, self.odd_padding = (0, 0), NO_EXTRA

    def initialize(self, x):
        if self.pad_mode.startswith("SAME"):
            self.padding, self.odd_padding = _same_padding(self.pad_mode, x.shape[2:], self.kernel_size,
                                                           self.stride)

    def forward(self, x):
        if self.is_max:
            return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, odd_padding=self.odd_padding)
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.count_include_pad,
                                   odd_padding=self.odd_padding)


class MaxPool2d(Pooling2d):
    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET", name: str | None = None):
        super().__init__(kernel_size, stride, padding, True, pad_mode, name=name)


class AvgPool2d(Pooling2d):
    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET",
                 count_include_pad: bool = True, name: str | None = None):
        super().__init__(kernel_size, stride, padding, False, pad_mode, count_include_pad, name=name)


def _along_width(v, what: str) -> tuple:
    if not isinstance(v, int):
        raise TypeError(f"{what} must be an int for 1-D pooling, got {v!r}")
    return v


class MaxPool1d(Pooling2d):
    """Max pooling along the last axis of (N, C, 1, W) input: a (1, kernel_size) window."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET", name: str | None = None):
        k = _along_width(kernel_size, "MaxPool1d: kernel_size")
        st = k if stride is None else _along_width(stride, "MaxPool1d: stride")
        super().__init__((1, k), (1, st), (0, _along_width(padding, "MaxPool1d: padding")), True, pad_mode,
                         name=name)


class AvgPool1d(Pooling2d):
    """Average pooling along the last axis of (N, C, 1, W) input: a (1, kernel_size) window."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET", name: str | None = None):
        k = _along_width(kernel_size, "AvgPool1d: kernel_size")
        st = k if stride is None else _along_width(stride, "AvgPool1d: stride")
        super().__init__((1, k), (1, st), (0, _along_width(padding, "AvgPool1d: padding")), False, pad_mode,
                         name=name)


class GlobalAvgPool2d(Layer):
    """Mean over H and W: (N, C, H, W) -> (N, C, 1, 1)."""

    def forward(self, x):
        return F.global_avg_pool2d(x)


class _FunctionLayer(Layer):
    """A parameter-free layer applying ``autograd.<function>``; constructor arguments are passed on."""

    function = ""

    def __init__(self, *args, name: str | None = None, **kwargs):
        super().__init__(name)
        self.args, self.kwargs = args, kwargs

    def forward(self, *xs):
        return getattr(F, self.function)(*xs, *self.args, **self.kwargs)


def _function_layer(name: str, function: str, doc: str) -> type:
    return type(name, (_FunctionLayer,), {"function": function, "__doc__": doc, "__module__": __name__})


ReLU = _function_layer("ReLU", "relu", "max(x, 0).")
Sigmoid = _function_layer("Sigmoid", "sigmoid", "1 / (1 + exp(-x)).")
Tanh = _function_layer("Tanh", "tanh", "tanh(x).")
Gelu = _function_layer("Gelu", "gelu", "x * Phi(x), the exact erf form.")
Flatten = _function_layer("Flatten", "flatten", "Flatten(axis=1): keeps the axes before `axis`, merges the rest.")
Dropout = _function_layer("Dropout", "dropout", "Dropout(ratio=0.5): inverted dropout when training, identity "
                                                "in evaluation.")
SoftMax = _function_layer("SoftMax", "softmax", "SoftMax(axis=1).")
SoftMaxCrossEntropy = _function_layer("SoftMaxCrossEntropy", "softmax_cross_entropy",
                                      "loss(logits, target): integer labels or one-hot targets, mean over the batch.")
MeanSquareError = _function_layer("MeanSquareError", "mse_loss",
                                  "loss(prediction, target): mean of the squared errors over all elements, as SINGA.")

CrossEntropy = _function_layer("CrossEntropy", "cross_entropy",
                               "loss(probabilities, target): -sum(target * log(p)) / batch, as SINGA.")
BinaryCrossEntropy = _function_layer("BinaryCrossEntropy", "binary_cross_entropy",
                                     "loss(probabilities, target): -sum(t log(p) + (1 - t) log(1 - p)) / batch.")


class Add(Layer):
    """a + b (broadcasting like numpy)."""

    def forward(self, a, b):
        return F.add(a, b)


class Cat(Layer):
    """Concatenates a list of tensors along ``axis`` (default 0): ``Cat(axis)([x1, x2, ...])``."""

    def __init__(self, axis: int = 0, name: str | None = None):
        super().__init__(name)
        self.axis = axis

    def forward(self, xs):
        if not isinstance(xs, (list, tuple)):
            raise TypeError(f"Cat: expected a list of Tensors, got {type(xs).__name__}")
        return F.cat(list(xs), self.axis)


class Reshape(Layer):
    """``Reshape()(x, shape)``: x with a new shape (one entry may be -1)."""

    def forward(self, x, shape):
        return F.reshape(x, shape)


# ---------------------------------------------------------------- ONNX's Gemm, embeddings
class Gemm(Layer):
    """y = alpha * x' W' + beta * b (ONNX Gemm with the weight W and bias b as parameters); x' = x.T when
    transA, W' = W.T when transB (then W is (nb_kernels, in_features), SINGA's default). W ~ N(0, 2 / (in +
    out)), b = 0 of shape bias_shape (default (1, nb_kernels))."""

    def __init__(self, nb_kernels, alpha=1.0, beta=1.0, transA=False, transB=True, bias=True,  # noqa: N803
                 bias_shape=None):
        super().__init__()
        self.nb_kernels, self.alpha, self.beta = int(nb_kernels), float(alpha), float(beta)
        self.transA, self.transB, self.bias = int(bool(transA)), int(bool(transB)), bool(bias)
        self.bias_shape = tuple(bias_shape) if bias_shape else (1, self.nb_kernels)

    def initialize(self, x):
        self.in_features = x.shape[0] if self.transA else x.shape[-1]
        shape = (self.nb_kernels, self.in_features) if self.transB else (self.in_features, self.nb_kernels)
        self._param(shape, "W").to_device(x.device).gaussian(
            0.0, math.sqrt(2.0 / (self.in_features + self.nb_kernels)))
        if self.bias:
            self._param(self.bias_shape, "b").to_device(x.device)

    def forward(self, x):
        got = x.shape[0] if self.transA else x.shape[-1]
        if got != self.in_features:
            raise ValueError(f"Gemm: expects {self.in_features} input features, got {got} (input shape {x.shape})")
        return F.gemm(x, self.W, self.b if self.bias else None, self.alpha, self.beta, self.transA,
                             self.transB)


class Embedding(Layer):
    """Rows of a (input_dim, output_dim) table W picked by integer ids: (..., ) -> (..., output_dim).
    W ~ N(0, 1) (initializer 'gaussian', SINGA's default) or U(-1, 1) ('uniform')."""

    def __init__(self, input_dim, output_dim, initializer="gaussian"):
        super().__init__()
        if initializer not in ("gaussian", "uniform"):
            raise ValueError(f"Embedding: initializer must be 'gaussian' or 'uniform', got {initializer!r}")
        self.input_dim, self.output_dim, self.initializer = int(input_dim), int(output_dim), initializer

    def initialize(self, x):
        w = self._param((self.input_dim, self.output_dim), "W").to_device(x.device)
        if self.initializer == "uniform":
            w.uniform(-1.0, 1.0)
        else:
            w.gaussian(0.0, 1.0)

    def from_pretrained(self, W, freeze=True):  # noqa: N803
        """Copies W into the table (creating it if needed); freeze=True stops it from training."""
        if "W" not in self.__dict__:
            self._param((self.input_dim, self.output_dim), "W")
            object.__setattr__(self, "_initialized", True)
        self.set_params({"W": W})
        self.W.requires_grad = not freeze
        self.W.stores_grad = not freeze

    def forward(self, x):
        return F.embedding(x, self.W)
