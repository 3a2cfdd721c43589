"""The Tensor class and its conversions (``singa_lite.tensor`` re-exports them with SINGA's module functions).

:class:`Tensor` is a thin Python handle over the C++ tensor in ``Tensor.data`` (SINGA's ``CTensor``).
Views (``reshape`` of contiguous data, ``transpose``, slicing with ``[]``) share memory; everything
else allocates. CPU tensors expose their memory to numpy and mpi4py without copies (buffer protocol,
``__array__``, DLPack); ``to_numpy`` returns an independent copy, as in SINGA.

As in SINGA, an integer tensor combined with a Python float (``t + 0.5``, ``t < 2.5``) is computed in
float32, and so is an integer tensor combined with a floating one. SINGA's remaining Tensor methods
(``copy``, ``copy_from``, ``is_transpose``, ``add_column``... ) are in :mod:`singa_lite.tensor.compat`.

Differences from SINGA, on purpose:
- comparisons (``<``, ``lt``...) return ``bool`` tensors, as numpy; ``bool`` tensors combine with
  numeric ones by promotion to the numeric dtype;
- ``Tensor(shape)`` is zero-filled rather than uninitialised;
- ``t == x`` with a number or an array is element-wise (a bool tensor), as in SINGA, but between two
  tensors it keeps Python's identity meaning (``t in some_list`` and dictionary keys work); use
  :func:`eq` to compare two tensors element-wise.
"""
from __future__ import annotations

import builtins
import numbers

import numpy as np

from .. import _core
from ..device import as_device
from .compat import SingaTensorMethods

DType = _core.DType
float16 = DType.float16
float32 = DType.float32
float64 = DType.float64
int32 = DType.int32
int64 = DType.int64
bool_ = DType.bool
bfloat16 = DType.bfloat16

_TO_NUMPY = {float16: np.float16, float32: np.float32, float64: np.float64, int32: np.int32,
             int64: np.int64, bool_: np.bool_}
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items()}
# numpy has no bfloat16: values come in as float64 and are rounded once (to nearest even) by the C++ copy,
# and a bfloat16 tensor reads out as float32, which holds every bfloat16 value exactly (docs/training.md,
# "Mixed precision").
_TO_NUMPY[bfloat16] = np.float64


# SINGA's as_type('int') / as_type('float') mean its kInt and kFloat32 (numpy would read int64 and float64).
_SINGA_NAMES = {"int": DType.int32, "float": DType.float32}


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype that to_numpy gives a tensor of `dtype` (a DType or one of SINGA's names)."""
    return np.dtype(_TO_NUMPY[to_dtype(dtype)])


def to_dtype(dtype) -> DType:
    """Accepts a singa_lite dtype, a numpy dtype or type, or a name such as 'float32' ('int' and 'float' are
    int32 and float32, as in SINGA)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in _SINGA_NAMES:
        return _SINGA_NAMES[dtype]
    if isinstance(dtype, str) and dtype == "bfloat16":
        return bfloat16
    try:
        npd = np.dtype(dtype)
    except TypeError:
        npd = None
    if npd is not None and npd in _FROM_NUMPY:
        return _FROM_NUMPY[npd]
    raise TypeError(f"unsupported dtype {dtype!r}; singa_lite supports float16, bfloat16, float32, float64, "
                    f"int32, int64 and bool")


def _np_supported(arr: np.ndarray) -> np.ndarray:
    """numpy data in a dtype singa_lite stores (uint8 images become float32, other ints int32/int64)."""
    if arr.dtype in _FROM_NUMPY:
        return arr
    if arr.dtype.kind == "u" or arr.dtype.kind == "i":
        return arr.astype(np.int64 if arr.dtype.itemsize > 4 else np.int32)
    if arr.dtype.kind == "f":
        return arr.astype(np.float32)
    raise TypeError(f"cannot make a tensor from numpy dtype {arr.dtype}; convert it first, e.g. "
                    f"array.astype(numpy.float32)")


class Tensor(SingaTensorMethods):
    """A multi-dimensional array on a device.

    ``Tensor(shape=(), device=None, dtype=None, data=None, requires_grad=True, stores_grad=False,
    creator=None, name=None)``. ``data`` may be a numpy array (copied, converted to ``dtype`` when given,
    else keeping its own), a C++ tensor (wrapped) or None (zeros of ``shape`` and ``dtype``, float32 by
    default). ``requires_grad``, ``stores_grad``, ``creator`` and ``name`` are used by autograd.
    """

    __array_priority__ = 100  # numpy defers to our operators in `ndarray + Tensor`
    _grad_hooks = None  # {handle id: hook} once register_hook is called; None keeps autograd's fast path

    def __init__(self, shape=(), device=None, dtype=None, data=None, requires_grad=True, stores_grad=False,
                 creator=None, name=None):
        if isinstance(data, _core.Tensor):  # first: autograd wraps every op's output this way
            self.data = data
        elif data is None:
            dt = float32 if dtype is None else to_dtype(dtype)
            self.data = _core.Tensor(_shape_tuple(shape), dt, as_device(device).core)
            _core.fill_(self.data, 0)
        elif isinstance(data, Tensor):
            self.data = data.data
        else:
            dev = as_device(device)
            arr = np.asarray(data) if dtype is None else np.asarray(data, _TO_NUMPY[to_dtype(dtype)])
            arr = _np_supported(arr)
            self.data = _core.Tensor(arr.shape, bfloat16 if dtype is not None and to_dtype(dtype) == bfloat16
                                     else _FROM_NUMPY[arr.dtype], dev.core)
            _core.copy_(self.data, _core.Tensor.from_buffer(np.ascontiguousarray(arr).reshape(arr.shape)))
        self.requires_grad = requires_grad
        self.stores_grad = stores_grad
        self.creator = creator
        self.name = name

    # ----- what it is
    # shape, dtype and device are read from .data. SINGA's Python tensor stores them as attributes, and its
    # helpers set them after assigning .data (`t.data = c; t.shape = tuple(c.shape())`): the setters accept
    # the values .data already has and refuse others, since a tensor cannot be changed by relabelling it.
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @shape.setter
    def shape(self, value) -> None:
        if tuple(value) != tuple(self.data.shape):
            raise ValueError(f"shape is read from .data, {tuple(self.data.shape)}; it cannot be set to "
                             f"{tuple(value)}: use reshape() or assign a new .data")

    @property
    def dtype(self) -> DType:
        return self.data.dtype

    @dtype.setter
    def dtype(self, value) -> None:
        if to_dtype(value) != self.data.dtype:
            raise ValueError(f"dtype is read from .data, {self.data.dtype.name}; it cannot be set to {value!r}: "
                             f"use as_type() / to_type()")

    @property
    def device(self):
        return as_device(self.data.device)

    @device.setter
    def device(self, value) -> None:
        if as_device(value).core != self.data.device:
            raise ValueError(f"device is read from .data, {self.data.device}; it cannot be set to {value!r}: "
                             f"use to_device()")

    def ndim(self) -> int:
        return self.data.ndim

    def size(self) -> int:
        """Number of elements (SINGA's meaning, not numpy's shape)."""
        return self.data.numel

    def memsize(self) -> int:
        return self.data.nbytes

    def is_contiguous(self) -> bool:
        return self.data.is_contiguous()

    def __len__(self):
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def _derive(self, core: _core.Tensor) -> Tensor:
        """A new tensor over `core` with this tensor's autograd flags."""
        return Tensor(data=core, requires_grad=self.requires_grad, stores_grad=False)

    # ----- autograd
    def register_hook(self, hook) -> HookHandle:
        """Calls ``hook(grad)`` in every backward pass, when this parameter's gradient is final and before
        ``autograd.backward`` yields it (so also under ``autograd.gradients``, an optimizer or DistOpt).
        The hook returns None (keep ``grad``), a Tensor of the same shape, dtype and device (used instead, and
        what later hooks see), or an object whose ``wait()`` returns the gradient later; the engine then yields
        this pair, and those behind it, after the pass (see ``autograd``). Hooks run in the order they were
        registered. Returns a handle whose ``remove()`` unregisters the hook (PyTorch's
        ``Tensor.register_hook``; hooks are for parameters, the tensors autograd yields)."""
        if not callable(hook):
            raise TypeError(f"register_hook: hook must be callable, got {type(hook).__name__}")
        if not self.stores_grad:
            raise ValueError(f"register_hook: {self.name or 'this tensor'} is not a parameter (stores_grad=False); "
                             f"autograd computes final gradients, and calls hooks, for parameters only")
        if self._grad_hooks is None:
            self._grad_hooks = {}
        handle = HookHandle(self._grad_hooks)
        self._grad_hooks[handle.id] = hook
        return handle

    # ----- shape
    def reshape(self, shape) -> Tensor:
        """A tensor of the new shape: a view when the memory allows, otherwise a copy."""
        return self._derive(self.data.reshape(_shape_tuple(shape)))

    def transpose(self, axes=None) -> Tensor:
        return self._derive(self.data.transpose(list(axes) if axes is not None else []))

    def T(self) -> Tensor:
        """A view with the axes reversed (a matrix's transpose), for any number of axes as in SINGA."""
        return self.transpose()

    def contiguous(self) -> Tensor:
        return self if self.data.is_contiguous() else self._derive(self.data.contiguous())

    def repeat(self, repeats, axis=None) -> Tensor:
        return repeat(self, repeats, axis)

    def squeeze(self, axis=None) -> Tensor:
        axes = [] if axis is None else ([axis] if isinstance(axis, int) else list(axis))
        return self._derive(self.data.squeeze(axes))

    def unsqueeze(self, axis: int) -> Tensor:
        return self._derive(self.data.unsqueeze(axis))

    # ----- copies, dtypes, devices
    def clone(self) -> Tensor:
        t = Tensor(data=self.data.clone(), requires_grad=self.requires_grad, stores_grad=self.stores_grad,
                   name=self.name)
        return t

    deepcopy = clone

    def as_type(self, dtype) -> Tensor:
        """A copy converted to `dtype` (self when it already has it)."""
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._derive(self.data.cast(dt))

    def to_type(self, dtype) -> Tensor:
        """Converts this tensor's storage to `dtype` in place."""
        self.data = self.data.cast(to_dtype(dtype))
        return self

    def to_device(self, device) -> Tensor:
        """Moves this tensor to `device` in place (SINGA semantics) and returns it."""
        self.data = self.data.to(as_device(device).core)
        return self

    def to_host(self) -> Tensor:
        """Moves this tensor to the CPU in place and returns it."""
        return self.to_device("cpu")

    def reset_like(self, t: Tensor) -> None:
        """Replaces this tensor's storage by zeros with t's shape, dtype and device."""
        self.data = _core.Tensor(t.shape, t.dtype, t.data.device)
        _core.fill_(self.data, 0)

    def copy_from_numpy(self, np_array, offset: int = 0) -> None:
        """Copies values from a numpy array of the same number of elements (cast to this dtype)."""
        arr = _np_supported(np.asarray(np_array))
        n = self.size() - offset
        if arr.size != n or offset < 0:
            raise ValueError(f"copy_from_numpy: the array has {arr.size} elements, the tensor has room for "
                             f"{n} (shape {self.shape}, offset {offset})")
        src = _core.Tensor.from_buffer(np.ascontiguousarray(arr).reshape(-1))
        if offset == 0 and self.data.is_contiguous():
            _core.copy_(self.data, src.reshape(self.shape))
        else:
            flat = self.data.reshape([-1]) if self.data.is_contiguous() else None
            if flat is None:
                raise ValueError("copy_from_numpy: an offset needs a contiguous tensor; call contiguous()")
            _core.copy_(flat.slice(0, offset, offset + n), src)

    def copy_data(self, t: Tensor) -> None:
        """Copies t's values into this tensor (broadcasting and casting as needed)."""
        _core.copy_(self.data, as_raw(t))

    def set_value(self, x, inplace: bool = True) -> Tensor:
        """Fills every element with the scalar x."""
        target = self if inplace else self.clone()
        _core.fill_(target.data, float(x))
        return target

    # ----- random fills: in place, or into a new tensor of this shape with inplace=False
    def gaussian(self, mean: float = 0.0, std: float = 1.0, inplace: bool = True) -> Tensor:
        target = self if inplace else self._derive(self.data.clone())
        _core.gaussian_(target.data, float(mean), float(std))
        return target

    def uniform(self, low: float = 0.0, high: float = 1.0, inplace: bool = True) -> Tensor:
        target = self if inplace else self._derive(self.data.clone())
        _core.uniform_(target.data, float(low), float(high))
        return target

    def bernoulli(self, p: float, inplace: bool = True) -> Tensor:
        target = self if inplace else self._derive(self.data.clone())
        _core.bernoulli_(target.data, float(p))
        return target

    # ----- values
    def l1(self) -> float:
        return float(scalar_value(_core.mean(_core.abs(self.data))))

    def l2(self) -> float:
        """The L2 norm divided by the size, as SINGA's l2 (its C++ Tensor::l2, like l1, divides by Size())."""
        return float(np.sqrt(scalar_value(_core.sum(_core.square(self.data.cast(float64)))))) / self.size()

    def item(self):
        if self.size() != 1:
            raise ValueError(f"item(): the tensor has {self.size()} elements, expected 1")
        return to_numpy(self).reshape(-1)[0].item()

    def numpy(self) -> np.ndarray:
        return to_numpy(self)

    def __array__(self, dtype=None, copy=None):
        arr = np.asarray(_host_readable(self.data))
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        return arr.copy() if copy else arr

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()

    def __repr__(self):
        extra = f", name={self.name!r}" if self.name else ""
        return f"Tensor({to_numpy(self)!r}, dtype={self.dtype.name}, device={self.device}{extra})"

    def __str__(self):
        return str(to_numpy(self))

    def __bool__(self):
        # SINGA's tensors are always true (``if labels:`` tests that a tensor was given, as in its examples);
        # a value test is to_numpy(t).any() / .all(), or float(t) for one element.
        return True

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    # ----- indexing: ints, slices, None and ... give views
    def __getitem__(self, key) -> Tensor:
        return self._derive(_index(self.data, key, keep_int_axes=True))

    def __setitem__(self, key, value) -> None:
        view = _index(self.data, key)
        if isinstance(value, numbers.Number):
            _core.fill_(view, float(value))
        else:
            _core.copy_(view, as_raw(value, like=self))

    # ----- arithmetic (scalars, tensors and numpy arrays on either side)
    def __add__(self, x): return binary("add", self, x)
    def __radd__(self, x): return binary("add", self, x, scalar_first=True)
    def __sub__(self, x): return binary("sub", self, x)
    def __rsub__(self, x): return binary("sub", self, x, scalar_first=True)
    def __mul__(self, x): return binary("mul", self, x)
    def __rmul__(self, x): return binary("mul", self, x, scalar_first=True)
    def __truediv__(self, x): return binary("div", self, x)
    def __rtruediv__(self, x): return binary("div", self, x, scalar_first=True)
    def __pow__(self, x): return binary("pow", self, x)
    def __rpow__(self, x): return binary("pow", self, x, scalar_first=True)
    def __matmul__(self, x): return matmul(self, x)
    def __lt__(self, x): return binary("lt", self, x)
    def __le__(self, x): return binary("le", self, x)
    def __gt__(self, x): return binary("gt", self, x)
    def __ge__(self, x): return binary("ge", self, x)

    def __eq__(self, x):
        """Element-wise with a number or an array (SINGA); identity with another tensor (see the module doc)."""
        if x is None or isinstance(x, (Tensor, _core.Tensor)):
            return self is x
        return binary("eq", self, x)

    def __ne__(self, x):
        if x is None or isinstance(x, (Tensor, _core.Tensor)):
            return self is not x
        return binary("ne", self, x)

    def __neg__(self): return self._derive(_core.neg(self.data))
    def __abs__(self): return self._derive(_core.abs(self.data))

    def __iadd__(self, x): return binary("add", self, x, out=self)
    def __isub__(self, x): return binary("sub", self, x, out=self)
    def __imul__(self, x): return binary("mul", self, x, out=self)
    def __itruediv__(self, x): return binary("div", self, x, out=self)
    def __ipow__(self, x): return binary("pow", self, x, out=self)

    __hash__ = object.__hash__  # identity: tensors are dictionary keys in autograd


class HookHandle:
    """What ``Tensor.register_hook`` returns: ``remove()`` unregisters the hook (calling it again does nothing)."""

    _ids = 0

    def __init__(self, hooks: dict):
        self._hooks = hooks
        HookHandle._ids += 1
        self.id = HookHandle._ids

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


# ---------------------------------------------------------------- helpers
def _shape_tuple(shape) -> tuple:
    if isinstance(shape, numbers.Integral):
        return (int(shape),)
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"a shape must be an int or a sequence of ints, got {shape!r}") from None


def as_raw(x, like: Tensor | None = None) -> _core.Tensor:
    """The C++ tensor behind x: a Tensor, a C++ tensor, or a numpy array / list (converted to like's dtype)."""
    if isinstance(x, Tensor):
        return x.data
    if isinstance(x, _core.Tensor):
        return x
    if isinstance(x, (np.ndarray, list, tuple)) or np.isscalar(x):
        arr = np.asarray(x)
        if like is not None:
            return Tensor(data=arr, dtype=like.dtype, device=like.device).data
        return Tensor(data=arr).data
    raise TypeError(f"expected a Tensor or a numpy array, got {type(x).__name__}")


def binary(name, a: Tensor, b, out: Tensor | None = None, scalar_first=False) -> Tensor:
    fn = getattr(_core, name)
    out_raw = out.data if out is not None else None
    if isinstance(b, _core.Tensor):
        # SINGA's Tensor operators read an operand that is not a Tensor with float(): a one-element raw tensor
        # is its number (the dy our autograd hands a root operator, where SINGA's is the float 1.0)
        if b.numel != 1:
            raise TypeError(f"tensor {name}: a raw tensor operand must have one element (SINGA reads it with "
                            f"float()), got shape {tuple(b.shape)}; wrap it as tensor.Tensor(data=raw) for the "
                            "element-wise operation")
        b = float(b)
    if isinstance(b, (numbers.Number, np.number)) and not isinstance(b, np.ndarray):
        integral = isinstance(b, (numbers.Integral, np.integer))
        if a.dtype == bool_ and name not in ("eq", "ne", "lt", "le", "gt", "ge"):
            a = a.as_type(int32 if integral else float32)
        elif a.dtype in (int32, int64) and not integral and out is None:
            a = a.as_type(float32)  # SINGA: an integer tensor with a float scalar is computed in float32
        r = getattr(_core, name + "_scalar")(a.data, float(b), scalar_first, out_raw)
    else:
        if isinstance(b, Tensor):
            braw = b.data
        elif isinstance(b, (np.ndarray, list, tuple)):
            braw = as_raw(b, like=a)
        else:
            return NotImplemented
        araw, braw = promoted(a.data, braw)
        if scalar_first:
            araw, braw = braw, araw
        r = fn(araw, braw, out_raw)
    if out is not None:
        return out
    rg = a.requires_grad or (isinstance(b, Tensor) and b.requires_grad)
    return Tensor(data=r, requires_grad=rg)


def promoted(a: _core.Tensor, b: _core.Tensor) -> tuple:
    """a and b in a common dtype: bool masks take the other operand's dtype and, as in SINGA, an integer
    operand takes a floating one's. Other mixes (float32 with float64...) are left for the op to refuse."""
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b
    if da == bool_ or (not da.is_floating and db.is_floating):
        return a.cast(db), b
    if db == bool_ or (not db.is_floating and da.is_floating):
        return a, b.cast(da)
    return a, b


def _index(t: _core.Tensor, key, keep_int_axes: bool = False) -> _core.Tensor:
    """Basic indexing (ints, slices, None, Ellipsis) as views. An int drops its axis as in numpy, or with
    keep_int_axes selects a length-1 slice as SINGA's ``t[i]`` does."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_real > t.ndim:
        raise IndexError(f"too many indices: the tensor has {t.ndim} dimensions, {n_real} were given")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (t.ndim - n_real))
        else:
            expanded.append(k)
    axis = 0
    for k in expanded:
        if k is None:
            t = t.unsqueeze(axis)
            axis += 1
        elif isinstance(k, slice):
            start, stop, step = k.start, k.stop, k.step
            step = 1 if step is None else int(step)
            if step == 0:
                raise ValueError("slice step cannot be zero")
            if start is None:
                start = 0 if step > 0 else t.shape[axis] - 1
            if stop is None:
                stop = t.shape[axis] if step > 0 else -t.shape[axis] - 1
            t = t.slice(axis, int(start), int(stop), step)
            axis += 1
        elif isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, bool):
            if not keep_int_axes:
                t = t.select(axis, int(k))
                continue
            n, i = t.shape[axis], int(k)
            if not -n <= i < n:  # IndexError, so that iterating over a tensor stops at its end
                raise IndexError(f"index {i} is out of bounds for axis {axis} of size {n}")
            i += n if i < 0 else 0
            t = t.slice(axis, i, i + 1, 1)
            axis += 1
        else:
            raise TypeError(f"unsupported index {k!r}: use ints, slices, None or '...'; for gathers, "
                            f"index the numpy array from tensor.to_numpy(t)")
    return t


def wrap(core: _core.Tensor) -> Tensor:
    return Tensor(data=core)


# ---------------------------------------------------------------- SINGA module functions
def from_numpy(np_array, dev=None) -> Tensor:
    """A tensor holding a copy of np_array (uint8 / other ints / floats mapped to supported dtypes)."""
    return Tensor(device=dev, data=np.asarray(np_array))


def _host_readable(raw: _core.Tensor) -> _core.Tensor:
    """raw, or a CPU copy of it, in a dtype numpy reads (bfloat16 as float32, exactly)."""
    if not raw.device.is_cpu():
        raw = raw.to(_core.Device("cpu"))
    return raw.cast(float32) if raw.dtype == bfloat16 else raw


def scalar_value(raw: _core.Tensor):
    """The value of a one-element raw tensor on any device."""
    return np.asarray(_host_readable(raw)).reshape(-1)[0]


def to_numpy(t: Tensor) -> np.ndarray:
    """An independent numpy copy of t's values."""
    return np.array(t, copy=True)


def to_host(t: Tensor) -> Tensor:
    """A copy of t on the CPU."""
    return Tensor(data=t.data.clone() if t.device.is_cpu() else t.data.to(_core.Device("cpu")))


def from_raw_tensor(t: _core.Tensor) -> Tensor:
    return Tensor(data=t)


def from_raw_tensors(tt) -> list:
    return [from_raw_tensor(t) for t in tt]


# SINGA's names: the C++ tensor class, and PlaceHolder, an alias SINGA's ONNX examples use for inputs.
CTensor = _core.Tensor
PlaceHolder = Tensor


# Tensor methods call these two; singa_lite.tensor exports them with the other module functions.
def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a @ b; a bool or integer operand takes the other's floating dtype (e.g. a mask from ``gt``)."""
    r = _core.matmul(*promoted(a.data, as_raw(b, like=a)), out.data if out is not None else None)
    return out if out is not None else Tensor(data=r, requires_grad=a.requires_grad)


def repeat(t: Tensor, repeats, axis=None) -> Tensor:
    """numpy.repeat: each element repeated `repeats` times along `axis` (flattened when axis is None)."""
    src = t.data if axis is not None else t.data.reshape([-1])
    ax = 0 if axis is None else axis
    ax = ax + src.ndim if ax < 0 else ax
    if not 0 <= ax < src.ndim:
        raise IndexError(f"repeat: axis {axis} is out of range for {src.ndim} dimensions")
    if isinstance(repeats, numbers.Integral):
        if repeats < 0:
            raise ValueError(f"repeat: repeats must be >= 0, got {repeats}")
        shape = list(src.shape)
        expanded = src.unsqueeze(ax + 1)
        target = shape[:ax + 1] + [int(repeats)] + shape[ax + 1:]
        merged = shape[:ax] + [shape[ax] * int(repeats)] + shape[ax + 1:]
        return t._derive(expanded.broadcast_to(target).reshape(merged))
    reps = [int(r) for r in repeats]
    if len(reps) != src.shape[ax]:
        raise ValueError(f"repeat: {len(reps)} repeat counts for an axis of size {src.shape[ax]}")
    pieces = [src.slice(ax, i, i + 1, 1) for i, r in enumerate(reps) for _ in range(r)]
    if not pieces:
        shape = list(src.shape)
        shape[ax] = 0
        return t._derive(_core.Tensor(shape, src.dtype, src.device))
    return t._derive(_core.concat(pieces, ax))
