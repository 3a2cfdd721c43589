"""Layers, with SINGA 3's names (``singa.layer``); the same classes are exported by ``autograd`` for
scripts written against SINGA's autograd layers (``autograd.Conv2d(1, 20, 5)``, ``autograd.Linear(800, 500)``).

A :class:`Layer` is called like a function. Parameters (tensors with ``stores_grad=True``) are created in
the constructor when all shapes are known, otherwise lazily on the first call from the input's shape, as
SINGA does: ``Linear(500)`` and ``Linear(800, 500)`` are both valid, and so are ``Conv2d(20, 5)`` and
``Conv2d(1, 20, 5)``.

Names. Assigning a layer to an attribute of another layer makes it a sublayer. A parameter's name is its
attribute path from the outermost layer (``conv1.W``, ``block.fc.b``): that is the key of ``get_params()``
and ``get_states()`` and the name optimizers key their state by, so it is the same in every run. A layer
used on its own (not an attribute of another layer, as in SINGA's example scripts where the model is a plain
class) keeps a unique automatic prefix (``Conv2d#3.W``), so two such layers never share optimizer state.
"""
from __future__ import annotations

import math

import numpy as np

from . import ops as F
from . import tensor
from .device import as_device
from .raw import pair
from .tensor import Tensor

__all__ = ["Layer", "Linear", "Conv2d", "SeparableConv2d", "Pooling2d", "MaxPool2d", "AvgPool2d", "MaxPool1d",
           "AvgPool1d", "GlobalAvgPool2d", "BatchNorm2d", "ReLU", "Sigmoid", "Tanh", "Gelu", "Flatten", "Dropout",
           "SoftMax", "SoftMaxCrossEntropy", "MeanSquareError", "CrossEntropy", "BinaryCrossEntropy", "Add", "Cat",
           "Reshape"]

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
_FLOAT_DTYPES = (tensor.float16, tensor.bfloat16, tensor.float32, tensor.float64)


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


class Layer:
    """Base of all layers. Subclasses implement ``forward`` and, for lazily shaped parameters,
    ``initialize(*inputs)``; auxiliary (non-trainable) state tensors are listed in ``aux_states``."""

    aux_states: tuple = ()  # attribute names of non-trainable state tensors (e.g. running statistics)
    _count = 0

    def __init__(self, name: str | None = None):
        object.__setattr__(self, "_layers", {})
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_attr", None)
        object.__setattr__(self, "_initialized", False)
        if name is None:
            name = f"{type(self).__name__}#{Layer._count}"
            Layer._count += 1
        object.__setattr__(self, "name", name)

    # ----- structure and names
    def __setattr__(self, key, value):
        object.__setattr__(self, key, value)
        self.__dict__.pop("_tensor_attrs", None)  # device_check's list of tensor attributes is stale
        if isinstance(value, Layer) and not key.startswith("_"):
            self._layers[key] = value
            object.__setattr__(value, "_parent", self)
            object.__setattr__(value, "_attr", key)
            self._root()._rename()
        elif isinstance(value, Tensor) and (value.stores_grad or key in self.aux_states):
            value.name = self._prefix() + key

    def _root(self) -> Layer:
        layer = self
        while layer._parent is not None:
            layer = layer._parent
        return layer

    def _prefix(self) -> str:
        if self._parent is not None:
            return self._parent._prefix() + self._attr + "."
        return "" if self._layers else self.name + "."

    def _own_tensors(self) -> dict:
        return {k: v for k, v in vars(self).items()
                if isinstance(v, Tensor) and (v.stores_grad or k in self.aux_states)}

    def _rename(self) -> None:
        prefix = self._prefix()
        for k, v in self._own_tensors().items():
            v.name = prefix + k
        for sub in self._layers.values():
            sub._rename()

    def _param(self, shape, attr: str) -> Tensor:
        """A new zero parameter, named and registered as attribute `attr`."""
        p = Tensor(tuple(shape), requires_grad=True, stores_grad=True)
        setattr(self, attr, p)
        return p

    def _aux(self, shape, attr: str, value: float) -> Tensor:
        t = Tensor(tuple(shape), requires_grad=False, stores_grad=False).set_value(value)
        setattr(self, attr, t)
        return t

    # ----- calling
    def __call__(self, *xs, **kwargs):
        if not self._initialized:
            self.initialize(*xs)
            object.__setattr__(self, "_initialized", True)
        self.device_check(*xs)
        return self.forward(*xs, **kwargs)

    def initialize(self, *xs) -> None:
        """Creates parameters whose shapes depend on the input (called once, before the first forward)."""

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def device_check(self, *xs) -> None:
        """Moves this layer's tensors to the first input's device and, when that input is floating point,
        casts them to its dtype (SINGA's device_check + dtype_check: a float16 input trains float16
        parameters)."""
        first = next((x.data for x in xs if isinstance(x, Tensor)), None)
        if first is None:
            return
        core_dev, dtype = first.device, first.dtype
        cast = dtype in _FLOAT_DTYPES
        # Runs on every call: compare the C++ devices of the attributes listed once (the list is rebuilt
        # when an attribute is assigned) instead of rescanning vars() and wrapping each device.
        names = self.__dict__.get("_tensor_attrs")
        if names is None:
            names = tuple(self._own_tensors())
            object.__setattr__(self, "_tensor_attrs", names)
        for k in names:
            t = self.__dict__[k]
            if t.data.device != core_dev:
                t.to_device(as_device(core_dev))
            if cast and t.data.dtype != dtype:
                t.to_type(dtype)

    def dtype_check(self, *xs) -> None:
        """Casts every tensor to the first one's dtype, in place (SINGA's behaviour)."""
        dtype = xs[0].dtype
        for x in xs[1:]:
            if x.dtype != dtype:
                x.to_type(dtype)

    def register_layers(self, *layers) -> None:
        """Registers sublayers given as arguments (named ``<Class>_<i>``) or as one dict of name -> layer,
        as SINGA's models build lists of blocks; each is then also an attribute of this layer."""
        if len(layers) == 1 and isinstance(layers[0], dict):
            items = list(layers[0].items())
        else:
            items = [(f"{type(v).__name__}_{i}", v) for i, v in enumerate(layers)]
        for name, value in items:
            if not isinstance(value, Layer):
                raise TypeError(f"register_layers: {name} is a {type(value).__name__}, not a Layer")
            setattr(self, name, value)

    # ----- parameters and states
    def get_params(self) -> dict:
        """Trainable tensors by attribute path relative to this layer."""
        return self._collect(lambda layer: {k: v for k, v in vars(layer).items()
                                            if isinstance(v, Tensor) and v.stores_grad})

    def get_states(self) -> dict:
        """Parameters plus auxiliary states (running statistics...): what a checkpoint must hold."""
        return self._collect(lambda layer: layer._own_tensors())

    def _collect(self, own) -> dict:
        out = dict(own(self))
        for attr, sub in self._layers.items():
            out.update({f"{attr}.{k}": v for k, v in sub._collect(own).items()})
        return out

    def set_params(self, parameters=None, **kwargs) -> None:
        """Copies values (Tensors or numpy arrays) into parameters, in place; all names are checked first."""
        self._assign(self.get_params(), dict(parameters or {}, **kwargs), "set_params")

    def set_states(self, states=None, **kwargs) -> None:
        self._assign(self.get_states(), dict(states or {}, **kwargs), "set_states")

    def _assign(self, targets: dict, values: dict, what: str) -> None:
        values = _flatten(values)
        checked = []
        for k, v in values.items():  # validate everything before writing anything
            if k not in targets:
                kind = "parameter" if what == "set_params" else "state"
                raise KeyError(f"{self.name}.{what}: no {kind} {k!r}; the {kind}s are {sorted(targets)}")
            src = v if isinstance(v, Tensor) else tensor.from_numpy(np.asarray(v))
            if src.shape != targets[k].shape:
                raise ValueError(f"{self.name}.{what}: {k!r} has shape {targets[k].shape}, the value has "
                                 f"{src.shape}")
            checked.append((targets[k], src))
        for dst, src in checked:
            dst.copy_data(src)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


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


_EXTRA = ("RNN", "LSTM", "Gemm", "Embedding")


def __getattr__(name):
    # SINGA's RNN, LSTM, Gemm and Embedding live in layer_extra.py (which imports this module): resolved on
    # first use so the import graph stays one way.
    if name in _EXTRA:
        from . import layer_extra
        return getattr(layer_extra, name)
    if name == "SyncBatchNorm2d":  # sync_batchnorm.py: BatchNorm2d with the statistics of every rank's batch
        from .sync_batchnorm import SyncBatchNorm2d
        return SyncBatchNorm2d
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
