"""The base class of every layer, :class:`Layer` (``layer.Layer``): calling, lazy parameter creation,
sublayers, the names of parameters, and their values and states for checkpoints.

Names. Assigning a layer to an attribute of another layer makes it a sublayer. A parameter's name is its
attribute path from the outermost layer (``conv1.W``, ``block.fc.b``): that is the key of ``get_params()``
and ``get_states()`` and the name optimizers key their state by, so it is the same in every run. A layer
used on its own (not an attribute of another layer, as in SINGA's seed scripts where the model is a plain
class) keeps a unique automatic prefix (``Conv2d#3.W``), so two such layers never share optimizer state.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import tensor
from ..device import as_device
from ..tensor import Tensor

__all__ = ["Layer", "is_initialized", "sublayers"]

_FLOAT_DTYPES = (tensor.float16, tensor.bfloat16, tensor.float32, tensor.float64)


class Layer:
    """Base of all layers. Subclasses implement ``forward`` and, for lazily shaped parameters,
    ``initialize(*inputs)``; auxiliary (non-trainable) state tensors are listed in ``aux_states``."""

    aux_states: tuple = ()  # attribute names of non-trainable state tensors (e.g. running statistics)
    _count = 0

    def __init_subclass__(cls, **kwargs):
        # As SINGA's layer metaclass: a subclass's own forward runs initialize(*inputs) on its first call,
        # also when called directly (a model's train_one_batch calls self.forward, never self(...)).
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("forward")
        if fn is not None and not getattr(fn, "__singa_lite_init_first__", False):
            cls.forward = _initializing_forward(fn)

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
        """A new zero parameter, named and registered as attribute `attr`, on the device of the input that
        initializes the layer (so that its initializer draws from that device's generator, as SINGA's layers do:
        `dev.SetRandSeed(s)` makes a model on `dev` start from the same weights every run)."""
        p = Tensor(tuple(shape), device=self.__dict__.get("_creating_on"), requires_grad=True, stores_grad=True)
        setattr(self, attr, p)
        return p

    def _aux(self, shape, attr: str, value: float) -> Tensor:
        t = Tensor(tuple(shape), device=self.__dict__.get("_creating_on"), requires_grad=False,
                   stores_grad=False).set_value(value)
        setattr(self, attr, t)
        return t

    # ----- calling
    def __call__(self, *xs, **kwargs):
        if not self._initialized:
            self._initialize_first(xs)
        self.device_check(*xs)
        return self.forward(*xs, **kwargs)

    def _initialize_first(self, xs) -> None:
        """initialize(*xs), creating the parameters on the first input tensor's device (see _param)."""
        first = next((x.data for x in xs if isinstance(x, Tensor)), None)
        object.__setattr__(self, "_creating_on", None if first is None else as_device(first.device))
        try:
            self.initialize(*xs)
        finally:
            object.__setattr__(self, "_creating_on", None)
        object.__setattr__(self, "_initialized", True)

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


def _initializing_forward(forward):
    @functools.wraps(forward)
    def wrapper(self, *xs, **kwargs):
        if not self._initialized:
            self._initialize_first(xs)
        return forward(self, *xs, **kwargs)

    wrapper.__singa_lite_init_first__ = True
    return wrapper


def is_initialized(layer: Layer) -> bool:
    """Whether the layer has created its parameters (given every shape, or called once)."""
    return layer._initialized


def sublayers(layer: Layer) -> dict:
    """The layer's direct sublayers, ``{attribute: layer}`` (the outer layer's own dictionary: not to be changed)."""
    return layer._layers
