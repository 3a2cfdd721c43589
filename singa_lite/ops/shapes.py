"""Shapes and indexing: reshape, flatten, transpose, squeeze / unsqueeze, expand, tile, upsample, depth / space
rearrangements, concatenation and splitting, slicing, padding, gather / scatter, and the operators whose output
does not depend differentiably on the input (shape, nonzero, constant_of_shape, onehot).

Reshapes, views and broadcasts run on the device. gather, scatter_elements, pad's reflect and edge modes,
nonzero, onehot, shape and constant_of_shape work through numpy on the host (indices are small and these ops are
rare in training loops). The operators written on ``_Reshaping``, ``_IndexMap`` and ``_Constant`` also accept
``dy`` None or a number in ``backward``, as SINGA's ``op.backward()`` does. Integer-valued outputs (shape,
nonzero, indices) have no gradient.
"""
from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from .. import _core
from ..engine import CTensor, Operator
from ..raw import from_host, grad_like, to_host, zeros
from ..tensor import Tensor
from .common import norm_axis, reduce_to

__all__ = [
    'Concat', 'ConstantOfShape', 'DepthToSpace', 'Expand', 'Flatten', 'Gather', 'NonZero', 'OneHot', 'Pad',
    'Reshape', 'ScatterElements', 'Shape', 'Slice', 'SpaceToDepth', 'Split', 'Squeeze', 'Tile', 'Transpose',
    'Unsqueeze', 'UpSample', '_slice', 'cat', 'concat', 'constant_of_shape', 'depth_to_space', 'expand',
    'flatten', 'gather', 'nonzero', 'onehot', 'pad', 'reshape', 'scatter_elements', 'shape', 'slice',
    'space_to_depth', 'split', 'squeeze', 'tile', 'transpose', 'unsqueeze', 'upsample',
]


# ---------------------------------------------------------------- reshapes and views
class Reshape(Operator):
    """numpy.reshape, plus SINGA/ONNX's 0 = keep that dimension."""
    aliased_grads = True

    def __init__(self, shape):
        super().__init__()
        self.shape = list(shape)

    def forward(self, x):
        self.xshape = x.shape
        return x.reshape([x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(self.shape)])

    def backward(self, dy):
        return dy.reshape(list(self.xshape))


def reshape(x, shape):
    return Reshape(shape)(x)[0]


class Flatten(Operator):
    """(d0, ..., dn) -> (d0 * ... * d(axis-1), d(axis) * ... * dn)."""
    aliased_grads = True

    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.xshape = x.shape
        ax = norm_axis(self.axis, x.ndim)
        if not 0 <= ax <= x.ndim:
            raise IndexError(f"flatten: axis {self.axis} is out of range for {x.ndim} dimensions")
        return x.reshape([math.prod(x.shape[:ax]), math.prod(x.shape[ax:])])

    def backward(self, dy):
        return dy.reshape(list(self.xshape))


def flatten(x, axis=1):
    return Flatten(axis)(x)[0]


class Transpose(Operator):
    """numpy.transpose (a view); perm None reverses the axes."""
    aliased_grads = True

    def __init__(self, perm=None):
        super().__init__()
        self.perm = None if perm is None else list(perm)

    def forward(self, x):
        self.p = self.perm if self.perm is not None else list(reversed(range(x.ndim)))
        return x.transpose(self.p)

    def backward(self, dy):
        return dy.transpose([self.p.index(i) for i in range(len(self.p))])


def transpose(x, shape=None):
    """SINGA's name for the permutation argument is `shape`."""
    return Transpose(shape)(x)[0]


def _int_list(v, what):
    if isinstance(v, numbers.Integral):
        return [int(v)]
    if isinstance(v, Tensor):
        v = to_host(v.data)
    try:
        return [int(i) for i in np.asarray(v).reshape(-1)]
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected an int or a list of ints, got {v!r}") from None


class _Reshaping(Operator):
    """Output = a reshape / view of the input; backward reshapes dy back (also sums broadcast axes)."""
    aliased_grads = True

    def forward(self, x):
        self.xshape, self.xdtype, self.xdev = x.shape, x.dtype, x.device
        y = self.f(x)
        self.yshape = y.shape
        return y

    def backward(self, dy=None):
        return self.grad(grad_like(dy, self.yshape, self.xdtype, self.xdev))

    def grad(self, dy):
        return dy.reshape(list(self.xshape))


class Squeeze(_Reshaping):
    """Removes the size-1 axes listed in `axis` (all size-1 axes when it is empty)."""

    def __init__(self, axis=()):
        super().__init__()
        self.axis = _int_list(axis, "squeeze") if axis is not None else []

    def f(self, x):
        axes = {norm_axis(a, x.ndim) for a in self.axis}
        for a in axes:
            if not 0 <= a < x.ndim or x.shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} is not a size-1 axis of a tensor of shape {x.shape}")
        keep = [s for i, s in enumerate(x.shape) if (i not in axes if axes else s != 1)]
        return x.reshape(keep)


def squeeze(x, axis=()):
    return Squeeze(axis)(x)[0]


class Unsqueeze(_Reshaping):
    """Inserts size-1 axes at the positions `axis` of the output (ONNX's rule)."""

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = _int_list(axis, "unsqueeze")

    def f(self, x):
        nd = x.ndim + len(self.axis)
        axes = sorted(norm_axis(a, nd) for a in self.axis)
        if len(set(axes)) != len(axes) or any(not 0 <= a < nd for a in axes):
            raise ValueError(f"unsqueeze: axes {self.axis} are repeated or out of range for {nd} output axes")
        shape = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
        return x.reshape(shape)


def unsqueeze(x, axis=-1):
    return Unsqueeze(axis)(x)[0]


class Expand(_Reshaping):
    """Broadcasts x with `shape` (numpy's rule: the result has the larger size on each axis)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = _int_list(shape, "expand")

    def f(self, x):
        try:
            out = np.broadcast_shapes(tuple(x.shape), tuple(self.shape))
        except ValueError:
            raise ValueError(f"expand: shape {x.shape} cannot be broadcast to {tuple(self.shape)}") from None
        return x.broadcast_to(list(out)).contiguous()

    def grad(self, dy):
        return reduce_to(dy, self.xshape)


def expand(x, shape):
    return Expand(shape)(x)[0]


class Tile(_Reshaping):
    """SINGA's tile: repeats x `repeats[i]` times along axis i. A shorter `repeats` (or one int) lines up
    from axis 0, the axes after it repeated once (SINGA; numpy.tile lines it up from the last axis); a
    longer one gives x leading axes of size 1 first, as numpy.tile."""

    def __init__(self, repeats):
        super().__init__()
        self.repeats = _int_list(repeats, "tile")

    def f(self, x):
        nd = builtins.max(x.ndim, len(self.repeats))
        shape = [1] * (nd - x.ndim) + list(x.shape)
        reps = self.repeats + [1] * (nd - len(self.repeats))
        if any(r < 0 for r in reps):
            raise ValueError(f"tile: repeats must be >= 0, got {self.repeats}")
        self.split = [v for r, s in zip(reps, shape) for v in (r, s)]  # (r0, s0, r1, s1, ...)
        xi = x.reshape([v for s in shape for v in (1, s)])
        return xi.broadcast_to(self.split).contiguous().reshape([r * s for r, s in zip(reps, shape)])

    def grad(self, dy):
        g = _core.sum(dy.reshape(self.split), list(range(0, len(self.split), 2)))
        return g.reshape(list(self.xshape))


def tile(x, repeats):
    return Tile(repeats)(x)[0]


class UpSample(_Reshaping):
    """Nearest-neighbour upsampling by the integer factor scales[i] on each axis i."""

    def __init__(self, mode, scales):
        super().__init__()
        if mode != "nearest":
            raise ValueError(f"upsample: only mode 'nearest' is supported, got {mode!r}")
        sc = [float(s) for s in np.asarray(scales).reshape(-1)]
        if any(s < 1 or s != int(s) for s in sc):
            raise ValueError(f"upsample: scales must be integers >= 1, got {sc}")
        self.scales = [int(s) for s in sc]

    def f(self, x):
        if len(self.scales) != x.ndim:
            raise ValueError(f"upsample: {len(self.scales)} scales for a {x.ndim}-d input")
        self.split = [v for s, r in zip(x.shape, self.scales) for v in (s, r)]  # (s0, r0, s1, r1, ...)
        xi = x.reshape([v for s in x.shape for v in (s, 1)])
        return xi.broadcast_to(self.split).contiguous().reshape([s * r for s, r in zip(x.shape, self.scales)])

    def grad(self, dy):
        g = _core.sum(dy.reshape(self.split), list(range(1, len(self.split), 2)))
        return g.reshape(list(self.xshape))


def upsample(x, mode, scales):
    return UpSample(mode, scales)(x)[0]


def _d2s(x, bs, mode):
    """(N, C, H, W) -> (N, C / bs^2, H * bs, W * bs); DCR: depth is (block row, block col, channel),
    CRD: (channel, block row, block col)."""
    n, c, h, w = x.shape
    if c % (bs * bs):
        raise ValueError(f"depth_to_space: {c} channels are not a multiple of blocksize^2 = {bs * bs}")
    if mode == "DCR":
        t = x.contiguous().reshape([n, bs, bs, c // (bs * bs), h, w]).transpose([0, 3, 4, 1, 5, 2])
    else:
        t = x.contiguous().reshape([n, c // (bs * bs), bs, bs, h, w]).transpose([0, 1, 4, 2, 5, 3])
    return t.contiguous().reshape([n, c // (bs * bs), h * bs, w * bs])


def _s2d(x, bs, mode):
    """The inverse of _d2s: (N, C, H, W) -> (N, C * bs^2, H / bs, W / bs)."""
    n, c, h, w = x.shape
    if h % bs or w % bs:
        raise ValueError(f"space_to_depth: height and width {h}, {w} are not multiples of blocksize {bs}")
    t = x.contiguous().reshape([n, c, h // bs, bs, w // bs, bs])
    t = t.transpose([0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return t.contiguous().reshape([n, c * bs * bs, h // bs, w // bs])


class DepthToSpace(_Reshaping):
    def __init__(self, blocksize, mode="DCR"):
        super().__init__()
        if mode not in ("DCR", "CRD"):
            raise ValueError(f"depth_to_space: mode must be 'DCR' or 'CRD', got {mode!r}")
        self.bs, self.mode = int(blocksize), mode

    def f(self, x):
        if x.ndim != 4:
            raise ValueError(f"depth_to_space: expected a 4-d (N, C, H, W) tensor, got shape {x.shape}")
        return _d2s(x, self.bs, self.mode)

    def grad(self, dy):
        return _s2d(dy, self.bs, self.mode)


class SpaceToDepth(DepthToSpace):
    def f(self, x):
        if x.ndim != 4:
            raise ValueError(f"space_to_depth: expected a 4-d (N, C, H, W) tensor, got shape {x.shape}")
        return _s2d(x, self.bs, self.mode)

    def grad(self, dy):
        return _d2s(dy, self.bs, self.mode)


def depth_to_space(x, blocksize, mode="DCR"):
    return DepthToSpace(blocksize, mode)(x)[0]


def space_to_depth(x, blocksize, mode="DCR"):
    return SpaceToDepth(blocksize, mode)(x)[0]


# ---------------------------------------------------------------- joining, splitting, slicing
class Concat(Operator):
    aliased_grads = True

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def forward(self, *xs):
        if not xs:
            raise ValueError("concat: needs at least one tensor")
        self.ax = norm_axis(self.axis, xs[0].ndim)
        self.sizes = [x.shape[self.ax] if 0 <= self.ax < x.ndim else 0 for x in xs]
        return _core.concat(list(xs), self.axis)

    def backward(self, dy):
        return tuple(_core.split(dy, self.sizes, self.ax))


def cat(xs, axis=0):
    return Concat(axis)(*xs)[0]


concat = cat


class Split(Operator):
    """Views of x along `axis`: pieces of sizes `parts`, or `num_output` equal pieces when parts is None."""

    def __init__(self, axis, parts, num_output=None):
        super().__init__()
        if parts is None and num_output is None:
            raise ValueError("split: give parts (a list of sizes) or num_output")
        self.axis, self.parts, self.num_output = axis, parts, num_output

    def forward(self, x):
        if self.parts is None:
            return tuple(_core.split_sections(x, int(self.num_output), self.axis))
        return tuple(_core.split(x, [int(p) for p in self.parts], self.axis))

    def backward(self, *dys):
        return _core.concat(list(dys), self.axis)


def split(x, axis, parts, num_output=None):
    """A tuple of tensors (SINGA's signature)."""
    return Split(axis, parts, num_output)(x)


class Slice(Operator):
    """x[starts[i]:ends[i]:steps[i]] along axes[i] (default axes 0, 1, ...); Python's bound rules."""

    def __init__(self, starts, ends, axes=None, steps=None):
        super().__init__()
        if len(starts) != len(ends) or (axes is not None and len(axes) != len(starts)) or \
                (steps is not None and len(steps) != len(starts)):
            raise ValueError("slice: starts, ends, axes and steps must have the same length")
        self.starts, self.ends, self.axes, self.steps = list(starts), list(ends), axes, steps

    def _view(self, t):
        axes = self.axes if self.axes is not None else range(len(self.starts))
        steps = self.steps if self.steps is not None else [1] * len(self.starts)
        for ax, st, en, sp in zip(axes, self.starts, self.ends, steps):
            t = t.slice(norm_axis(int(ax), t.ndim), int(st), int(en), int(sp))
        return t

    def forward(self, x):
        self.xmeta = x.shape, x.dtype, x.device
        return self._view(x)

    def backward(self, dy):
        dx = zeros(*self.xmeta)
        _core.copy_(self._view(dx), dy)
        return dx


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - SINGA's name
    return Slice(starts, ends, axes, steps)(x)[0]


_slice = slice


# ---------------------------------------------------------------- index maps through numpy
class _IndexMap(Operator):
    """y.flat[k] = x.flat[src[k]] (src < 0: a constant); the gradient scatters dy back through src."""

    def forward(self, x):
        self.xmeta = x.shape, x.dtype, x.device
        src = self.index_map(np.arange(math.prod(x.shape), dtype=np.int64).reshape(x.shape))
        self.srcmap = src
        vals = to_host(x).reshape(-1)[np.clip(src, 0, None)]
        if (src < 0).any():
            vals = np.where(src < 0, self.fill, vals)
        return from_host(vals, x.device, x.dtype)

    fill = 0.0

    def backward(self, dy=None):
        shape, dtype, dev = self.xmeta
        g = to_host(grad_like(dy, self.srcmap.shape, dtype, dev)).reshape(-1)
        src = self.srcmap.reshape(-1)
        dx = np.zeros(math.prod(shape), dtype=g.dtype)
        np.add.at(dx, src[src >= 0], g[src >= 0])
        return from_host(dx.reshape(shape), dev, dtype)


class Pad(_IndexMap):
    """ONNX Pad: pads = [begin_0, begin_1, ..., end_0, end_1, ...]; mode 'constant' (with `constant`),
    'reflect' (mirror without the edge) or 'edge' (repeat the edge)."""

    def __init__(self, mode, pads, constant=0.0):
        super().__init__()
        if mode not in ("constant", "reflect", "edge"):
            raise ValueError(f"pad: mode must be 'constant', 'reflect' or 'edge', got {mode!r}")
        self.mode, self.pads, self.fill = mode, _int_list(pads, "pad"), float(constant)

    def index_map(self, idx):
        if len(self.pads) != 2 * idx.ndim or any(p < 0 for p in self.pads):
            raise ValueError(f"pad: expected {2 * idx.ndim} non-negative pads for a {idx.ndim}-d input, "
                             f"got {self.pads}")
        width = [(self.pads[i], self.pads[i + idx.ndim]) for i in range(idx.ndim)]
        if self.mode == "constant":
            return np.pad(idx, width, mode="constant", constant_values=-1)
        return np.pad(idx, width, mode=self.mode)


def pad(x, mode, pads, constant=0.0):
    return Pad(mode, pads, constant)(x)[0]


class Gather(_IndexMap):
    """numpy.take(x, indices, axis): indices an int, a (nested) list or an integer Tensor; negative
    indices count from the end."""

    def __init__(self, axis, indices):
        super().__init__()
        self.axis = int(axis)
        self.indices = np.asarray(to_host(indices.data) if isinstance(indices, Tensor) else indices)
        if self.indices.dtype.kind not in "iu" and not (self.indices.dtype.kind == "f" and
                                                       (self.indices == np.round(self.indices)).all()):
            raise TypeError(f"gather: indices must be integers, got {self.indices.dtype}")

    def index_map(self, idx):
        ax = norm_axis(self.axis, idx.ndim)
        n = idx.shape[ax] if 0 <= ax < idx.ndim else 0
        ind = self.indices.astype(np.int64)
        if ((ind < -n) | (ind >= n)).any():
            raise IndexError(f"gather: indices {ind.tolist()} out of range for axis {self.axis} of size {n}")
        return np.take(idx, ind, axis=ax)


def gather(x, axis, indices):
    return Gather(axis, indices)(x)[0]


_SCATTER_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


class ScatterElements(Operator):
    """A copy of x with out[..., indices[i, j], ...] = updates[i, j] along `axis` (ONNX ScatterElements). With
    a `reduction` ('add', 'mul', 'max', 'min') each update is combined with what is there instead, repeated
    indices each counting. The gradient of x: dy with the overwritten places zeroed ('none'), dy ('add'), dy
    times the product of the updates there ('mul'), dy where x is still the value ('max' / 'min'). indices
    and updates get no gradient."""

    def __init__(self, indices, updates, axis=0, reduction="none"):
        super().__init__()
        host = [to_host(v.data) if isinstance(v, Tensor) else np.asarray(v) for v in (indices, updates)]
        self.indices, self.updates, self.axis = host[0].astype(np.int64), host[1], int(axis)
        if self.indices.shape != self.updates.shape:
            raise ValueError(f"scatter_elements: indices {self.indices.shape} and updates {self.updates.shape} "
                             f"must have the same shape")
        if reduction != "none" and reduction not in _SCATTER_REDUCE:
            raise ValueError(f"scatter_elements: reduction must be 'none', 'add', 'mul', 'max' or 'min', got "
                             f"{reduction!r}")
        self.reduction = reduction

    def forward(self, x):
        xs = np.array(to_host(x))
        ax = norm_axis(self.axis, xs.ndim)
        n = xs.shape[ax]
        ind = np.where(self.indices < 0, self.indices + n, self.indices)
        if ((ind < 0) | (ind >= n)).any():
            raise IndexError(f"scatter_elements: indices out of range for axis {self.axis} of size {n}")
        # the place of update [i, j, ...]: (i, j, ...) with indices[i, j, ...] along axis; indices may be
        # smaller than x along the other axes too (ONNX), which numpy's put_along_axis does not allow
        where = list(np.indices(ind.shape, sparse=True))
        where[ax] = ind
        self.where, self.xmeta = tuple(where), (x.shape, x.dtype, x.device)
        updates = self.updates.astype(xs.dtype)
        if self.reduction == "none":
            xs[self.where] = updates
        else:
            self.x_host = xs.copy()
            _SCATTER_REDUCE[self.reduction].at(xs, self.where, updates)  # repeated places: each update counts
            self.y_host = xs
        return from_host(xs, x.device, x.dtype)

    def backward(self, dy=None):
        shape, dtype, dev = self.xmeta
        g = np.array(to_host(grad_like(dy, shape, dtype, dev)))
        if self.reduction == "none":
            g[self.where] = 0
        elif self.reduction == "mul":  # y = x * the product of the updates at that place
            factor = np.ones_like(g)
            np.multiply.at(factor, self.where, self.updates.astype(g.dtype))
            g = g * factor
        elif self.reduction in ("max", "min"):
            g = np.where(self.y_host == self.x_host, g, 0).astype(g.dtype)
        return from_host(g, dev, dtype)


def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    return ScatterElements(indices, updates, axis, reduction)(x)[0]


# ---------------------------------------------------------------- outputs without a gradient
class _Constant(Operator):
    """Operators whose output does not depend differentiably on the input: the gradient is zero."""

    def forward(self, x):
        self.xmeta = x.shape, x.dtype, x.device
        return self.f(x)

    def backward(self, dy=None):
        return zeros(*self.xmeta)


class Shape(_Constant):
    """x's shape as a 1-d int64 tensor."""

    def f(self, x):
        return from_host(np.array(x.shape, dtype=np.int64), x.device)

    def backward(self, dy=None):
        if dy is not None and "needs_grad" not in self.__dict__:  # called by a script, not by the engine:
            return list(dy.shape)  # SINGA hands back dy's shape
        return super().backward()


shape = Shape.apply


class NonZero(_Constant):
    """numpy.nonzero(x) as an int64 tensor of shape (x.ndim, count)."""

    def f(self, x):
        return from_host(np.array(np.nonzero(to_host(x)), dtype=np.int64).reshape(x.ndim, -1), x.device)


nonzero = NonZero.apply


class ConstantOfShape(_Constant):
    """A tensor of the shape held by the 1-d tensor x, filled with `value` (float32, or int32 for an int)."""

    def __init__(self, value=0.0):
        super().__init__()
        self.value = value

    def f(self, x):
        dims = [int(d) for d in to_host(x).reshape(-1)]
        if any(d < 0 for d in dims):
            raise ValueError(f"constant_of_shape: the shape {dims} has a negative size")
        dtype = _core.DType.int32 if isinstance(self.value, numbers.Integral) else _core.DType.float32
        t = CTensor(dims, dtype, x.device)
        _core.fill_(t, float(self.value))
        return t


def constant_of_shape(x, value=0):
    return ConstantOfShape(value)(x)[0]


class OneHot(_Constant):
    """A one-hot encoding of `indices` with `depth` classes inserted as axis `axis`; values = [off, on].
    Negative indices count from depth (ONNX)."""

    def __init__(self, axis, depth, values):
        super().__init__()
        depth = np.asarray(depth).reshape(-1)
        if depth.size != 1:
            raise ValueError(f"onehot: depth must be one number, got {depth.tolist()}")
        vals = np.asarray(to_host(values.data) if isinstance(values, Tensor) else values).reshape(-1)
        if vals.size != 2:
            raise ValueError(f"onehot: values must be [off_value, on_value], got {vals.tolist()}")
        self.axis, self.depth, self.values = int(axis), int(depth[0]), vals

    def f(self, x):
        ind = to_host(x)
        ax = self.axis + ind.ndim + 1 if self.axis < 0 else self.axis
        classes = np.arange(self.depth).reshape([1] * ax + [self.depth] + [1] * (ind.ndim - ax))
        hot = np.expand_dims(np.mod(ind.astype(np.int64), self.depth), ax) == classes
        out = np.where(hot, self.values[1], self.values[0]).astype(np.float32)
        return from_host(out, x.device)


def onehot(axis, indices, depth, values):
    return OneHot(axis, depth, values)(indices)[0]
