"""Automatic differentiation, with SINGA's names (``singa.autograd``).

An :class:`Operator` computes on the raw C++ tensors (``Tensor.data``); calling it on ``tensor.Tensor``s
records the graph when ``autograd.training`` is true and some input ``requires_grad``. Leaves with
``stores_grad=True`` are parameters. :func:`backward` is a generator: it yields ``(param, grad)`` the moment
a parameter's gradient is final, so an optimizer (or DistOpt's all-reduce) can start on it while the rest
of the backward pass runs.

How backward works
------------------
1. The ops reachable from ``y`` are listed sources-first (a depth-first post-order). An op is *useful* when
   one of its inputs is a parameter or the output of a useful op; only useful ops run backward, and
   ``op.needs_grad[i]`` tells an op which input gradients it may skip.
2. Dependency counting: every edge from a useful op to one of its inputs' nodes (the creator op, or the
   parameter) adds one to that node's count. Running an op's backward hands one gradient along each
   edge and decrements the count; gradients arriving at the same node are summed. At zero, a parameter's
   gradient is final and is yielded at once; an op has all its output gradients and becomes ready.
   Ready ops run last-in first-out, which is a valid reverse topological order and walks the network from
   the loss towards the inputs, so the last layer's parameters come out first.
3. Each op's state (cached inputs, masks) is dropped right after its backward, so activations are freed as
   the pass goes; a second backward through the same graph raises ``ValueError``.

Broadcasting: binary operators broadcast like numpy; their backward sums the gradient over the axes an input
was broadcast along (``_reduce_to``: the leading axes it lacks and the axes where it has size 1).

Memory rules for operator writers: ``backward`` must not modify its ``dys`` in place (they can be shared);
an operator whose gradients may share memory with ``dy`` or with each other sets ``aliased_grads = True``,
and the engine then copies before accumulating in place or handing a gradient to an optimizer.

Choices (differences from SINGA 3 noted):
- ``backward(y)`` raises ``ValueError`` when ``y`` has no recorded graph (forward ran with
  ``training = False``, or ``y`` came from plain tensor operators, which are not recorded) or when ``y``
  does not depend on any parameter; SINGA silently yields nothing for the latter.
- ``y`` need not be a scalar: ``dy`` defaults to ones of ``y``'s shape (may be a number or a Tensor).
- Only leaves are yielded; an intermediate tensor with ``stores_grad=True`` is not (SINGA yields it).
- ``mse_loss`` is the mean of the squared error over all elements (SINGA: sum / (2 * batch)).
- ``slice`` follows SINGA/ONNX's ``slice(x, starts, ends, axes=None, steps=None)`` with Python's rules
  for negative and out-of-range bounds.
- ``Linear``'s W is drawn from N(0, 2 / (in + out)) as SINGA does; b starts at zero.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _core, tensor
from .tensor import Tensor

CTensor = _core.Tensor
training = False


# ---------------------------------------------------------------- the operator contract
class Operator:
    """A differentiable operation: subclasses implement ``forward(*xs)`` and ``backward(*dys)`` on raw
    ``_core.Tensor``s, returning one raw tensor or a tuple. ``backward`` returns one gradient per input
    (None for an input that gets none, e.g. labels). Calling an operator returns a tuple of Tensors."""

    op_count = 0
    aliased_grads = False  # True when backward may return dy itself, views of it, or one tensor twice
    needs_grad = (True, True)  # per input; backward() sets it before calling an op's backward

    def __init__(self, name=None):
        if name is None:
            name = f"{type(self).__name__}#{Operator.op_count}"
            Operator.op_count += 1
        self.name = name

    def __call__(self, *xs):
        for x in xs:
            if not isinstance(x, Tensor):
                raise TypeError(f"{self.name}: inputs must be tensor.Tensor, got {type(x).__name__}")
        try:
            ys = self.forward(*(x.data for x in xs))
        except (ValueError, TypeError, IndexError) as e:  # say which autograd op failed, keep the type
            raise type(e)(f"{self.name}: {e}") from e
        ys = ys if isinstance(ys, tuple) else (ys,)
        self.requires_grad = any(x.requires_grad for x in xs)
        record = training and self.requires_grad
        outs = tuple(Tensor(data=y, requires_grad=self.requires_grad, creator=self if record else None,
                            name=f"{self.name}:{i}") for i, y in enumerate(ys))
        if record:  # the graph: one edge per input, (creator op, output index) or (parameter, 0) or None
            self.src = [_edge(x) for x in xs]
            self.y_id2idx = {id(y): i for i, y in enumerate(outs)}
            self.y_meta = [(y.shape, y.dtype, y.device) for y in ys]
        return outs

    def forward(self, *xs):
        raise NotImplementedError

    def backward(self, *dys):
        raise NotImplementedError

    def _release(self):
        """Drops everything backward needed; keeps what later graphs need to refer to our outputs."""
        keep = {k: self.__dict__[k] for k in ("name", "y_id2idx") if k in self.__dict__}
        self.__dict__.clear()
        self.__dict__.update(keep, released=True)


Operation = Operator  # SINGA 2's name


def _edge(x: Tensor):
    if x.creator is not None and x.requires_grad:
        return (x.creator, x.creator.y_id2idx[id(x)])
    if x.stores_grad:
        return (x, 0)
    return None


# ---------------------------------------------------------------- backward
def backward(y: Tensor, dy=None):
    """Yields ``(param, grad)`` for every parameter y depends on, each once, as soon as it is final."""
    if not isinstance(y, Tensor):
        raise TypeError(f"backward: y must be a tensor.Tensor, got {type(y).__name__}")
    g0, owned0 = _initial_dy(y, dy)
    if y.creator is None:
        if y.stores_grad:
            yield y, Tensor(data=g0 if owned0 else g0.clone(), requires_grad=False, name=f"{y.name}_g")
            return
        raise ValueError("backward: y has no recorded graph; set autograd.training = True before the forward "
                         "pass and build y with autograd operators (tensor operators such as + are not recorded)")
    order = _graph(y.creator)
    useful = set()
    for op in order:  # sources first, so an op's input creators are decided before it
        op.needs_grad = tuple(e is not None and (isinstance(e[0], Tensor) or e[0] in useful) for e in op.src)
        if any(op.needs_grad):
            useful.add(op)
    if y.creator not in useful:
        raise ValueError("backward: y does not depend on any parameter (a leaf tensor with stores_grad=True)")
    deps = {}
    for op in useful:
        for e, need in zip(op.src, op.needs_grad):
            if need:
                deps[e[0]] = deps.get(e[0], 0) + 1
    grads = {y.creator: [None] * len(y.creator.y_meta)}
    grads[y.creator][y.creator.y_id2idx[id(y)]] = (g0, owned0)
    ready = [y.creator]
    while ready:
        op = ready.pop()
        dys = [g[0] if g is not None else _zeros(*meta) for g, meta in zip(grads.pop(op), op.y_meta)]
        dxs = op.backward(*dys)
        dxs = dxs if isinstance(dxs, (tuple, list)) else (dxs,)
        if len(dxs) != len(op.src):
            raise RuntimeError(f"{op.name}.backward returned {len(dxs)} gradients for {len(op.src)} inputs")
        del dys
        for i, (e, need, dx) in enumerate(zip(op.src, op.needs_grad, dxs)):
            if not need:
                continue
            if dx is None:
                raise RuntimeError(f"{op.name}.backward returned no gradient for input {i}, which needs one")
            node, idx = e
            slots = grads.get(node)
            if slots is None:
                slots = grads[node] = [None] * (1 if isinstance(node, Tensor) else len(node.y_meta))
            slots[idx] = _accumulate(slots[idx], dx, not op.aliased_grads)
            deps[node] -= 1
            if deps[node] == 0:
                if isinstance(node, Tensor):
                    g, owned = grads.pop(node)[0]
                    yield node, Tensor(data=g if owned else g.clone(), requires_grad=False, name=f"{node.name}_g")
                else:
                    ready.append(node)
        del dxs
        op._release()


def gradients(y: Tensor, dy=None) -> dict:
    """{param: grad} for every parameter y depends on."""
    return {p: g for p, g in backward(y, dy)}


def _initial_dy(y: Tensor, dy):
    if dy is None or isinstance(dy, numbers.Number):
        g = CTensor(list(y.shape), y.dtype, y.data.device)
        _core.fill_(g, 1.0 if dy is None else float(dy))
        return g, True
    if isinstance(dy, Tensor):
        if dy.shape != y.shape:
            raise ValueError(f"backward: dy has shape {dy.shape}, y has shape {y.shape}")
        return dy.data, False
    raise TypeError(f"backward: dy must be None, a number or a Tensor, got {type(dy).__name__}")


def _graph(root: Operator) -> list:
    """The ops reachable from root, every op after the ops that produced its inputs."""
    order, seen, stack = [], {root}, [(root, iter(_src(root)))]
    while stack:
        op, edges = stack[-1]
        for e in edges:
            if e is not None and isinstance(e[0], Operator) and e[0] not in seen:
                seen.add(e[0])
                stack.append((e[0], iter(_src(e[0]))))
                break
        else:
            stack.pop()
            order.append(op)
    return order


def _src(op: Operator):
    if getattr(op, "released", False):
        raise ValueError(f"backward: the graph through {op.name} was freed by an earlier backward; run the "
                         f"forward pass again")
    return op.src


def _accumulate(slot, dx, owned: bool):
    """slot + dx as (tensor, owned); in place only into a tensor nobody else refers to."""
    if slot is None:
        return dx, owned
    acc, acc_owned = slot
    if acc_owned:
        return _core.add(acc, dx, out=acc), True
    return _core.add(acc, dx), True


# ---------------------------------------------------------------- helpers on raw tensors
def _zeros(shape, dtype, device) -> CTensor:
    t = CTensor(list(shape), dtype, device)
    _core.fill_(t, 0.0)
    return t


def _reduce_to(dx: CTensor, shape) -> CTensor:
    """Sums dx over the axes along which a tensor of `shape` was broadcast to dx's shape."""
    shape = tuple(shape)
    if dx.shape == shape:
        return dx
    lead = dx.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and dx.shape[lead + i] != 1]
    return _core.sum(dx, axes, True).reshape(list(shape))


def _swap_last(t: CTensor) -> CTensor:
    perm = list(range(t.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return t.transpose(perm)


def _const(v, like: Tensor) -> Tensor:
    """A scalar operand as a 0-d tensor in like's dtype and device (it gets no gradient)."""
    if isinstance(v, Tensor):
        return v
    if not isinstance(v, (numbers.Number, np.number)):
        raise TypeError(f"expected a Tensor or a number, got {type(v).__name__}")
    t = CTensor([], like.dtype, like.data.device)
    _core.fill_(t, float(v))
    return Tensor(data=t, requires_grad=False)


def _axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def _softmax(x: CTensor, axis: int) -> CTensor:
    e = _core.sub(x, _core.max(x, [axis], True))
    _core.exp(e, out=e)
    return _core.div(e, _core.sum(e, [axis], True), out=e)


def _log_softmax(x: CTensor, axis: int) -> CTensor:
    shifted = _core.sub(x, _core.max(x, [axis], True))
    lse = _core.log(_core.sum(_core.exp(shifted), [axis], True))
    return _core.sub(shifted, lse, out=shifted)


# ---------------------------------------------------------------- element-wise binary (numpy broadcasting)
class Add(Operator):
    aliased_grads = True

    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return _core.add(a, b)

    def backward(self, dy):
        return _reduce_to(dy, self.shapes[0]), _reduce_to(dy, self.shapes[1])


class Sub(Operator):
    aliased_grads = True

    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return _core.sub(a, b)

    def backward(self, dy):
        return _reduce_to(dy, self.shapes[0]), _core.neg(_reduce_to(dy, self.shapes[1]))


class Mul(Operator):
    def forward(self, a, b):
        self.a, self.b = a, b
        return _core.mul(a, b)

    def backward(self, dy):
        da = _reduce_to(_core.mul(dy, self.b), self.a.shape) if self.needs_grad[0] else None
        db = _reduce_to(_core.mul(dy, self.a), self.b.shape) if self.needs_grad[1] else None
        return da, db


class Div(Operator):
    def forward(self, a, b):
        self.ashape, self.b = a.shape, b
        self.y = _core.div(a, b)
        return self.y

    def backward(self, dy):
        q = _core.div(dy, self.b)  # dL/da = dy / b;  dL/db = -dy * a / b^2 = -q * y
        db = None
        if self.needs_grad[1]:
            db = _core.mul(q, self.y)
            db = _reduce_to(_core.neg(db, out=db), self.b.shape)
        return _reduce_to(q, self.ashape), db


class Pow(Operator):
    def forward(self, a, b):
        self.a, self.b = a, b
        self.y = _core.pow(a, b)
        return self.y

    def backward(self, dy):
        da = db = None
        if self.needs_grad[0]:  # b * a^(b-1) * dy
            da = _core.pow(self.a, _core.sub_scalar(self.b, 1.0))
            _core.mul(da, self.b, out=da)
            da = _reduce_to(_core.mul(da, dy, out=da), self.a.shape)
        if self.needs_grad[1]:  # a^b * log(a) * dy
            db = _core.mul(self.y, _core.log(self.a))
            db = _reduce_to(_core.mul(db, dy, out=db), self.b.shape)
        return da, db


def add(a, b):
    return Add()(a, _const(b, a))[0]


def sub(a, b):
    return Sub()(a, _const(b, a))[0]


def mul(x, y):
    return Mul()(x, _const(y, x))[0]


def div(a, b):
    return Div()(a, _const(b, a))[0]


def pow(a, b):  # noqa: A001 - SINGA's name
    """a ** b, element-wise; b a Tensor (broadcast) or a number."""
    return Pow()(a, _const(b, a))[0]


# ---------------------------------------------------------------- linear algebra
class Matmul(Operator):
    """numpy.matmul: 2-D, batched with broadcast batch axes, and 1-D operands."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return _core.matmul(a, b)

    def backward(self, dy):
        a, b = self.a, self.b
        a2 = a.unsqueeze(0) if a.ndim == 1 else a  # the 1-D cases as matrices, as numpy does
        b2 = b.unsqueeze(1) if b.ndim == 1 else b
        if b.ndim == 1:
            dy = dy.unsqueeze(dy.ndim)
        if a.ndim == 1:
            dy = dy.unsqueeze(dy.ndim - 1)
        da = db = None
        if self.needs_grad[0]:
            da = _reduce_to(_core.matmul(dy, _swap_last(b2)), a2.shape).reshape(list(a.shape))
        if self.needs_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:  # one GEMM over the folded batch instead of a batch then a sum
                k, n = b2.shape
                db = _core.matmul(a2.reshape([-1, k]).transpose([1, 0]), dy.reshape([-1, n]))
            else:
                db = _reduce_to(_core.matmul(_swap_last(a2), dy), b2.shape)
            db = db.reshape(list(b.shape))
        return da, db


def matmul(x, w):
    return Matmul()(x, w)[0]


class AddBias(Operator):
    """x (2-D) + b: axis=0 adds b to every row (b has one value per column), axis=1 to every column."""
    aliased_grads = True

    def __init__(self, axis=0):
        super().__init__()
        if axis not in (0, 1):
            raise ValueError(f"add_bias: axis must be 0 (rows) or 1 (columns), got {axis}")
        self.axis = axis

    def forward(self, x, b):
        if x.ndim != 2 or b.ndim != 1 or b.shape[0] != x.shape[1 - self.axis]:
            raise ValueError(f"add_bias: expected a matrix and a vector of its {('columns', 'rows')[self.axis]} "
                             f"count, got shapes {x.shape} and {b.shape} (axis={self.axis})")
        return _core.add(x, b.reshape([1, -1] if self.axis == 0 else [-1, 1]))

    def backward(self, dy):
        return dy, _core.sum(dy, [self.axis])


def add_bias(x, b, axis=0):
    return AddBias(axis)(x, b)[0]


# ---------------------------------------------------------------- shapes
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
        ax = _axis(self.axis, x.ndim)
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


class Concat(Operator):
    aliased_grads = True

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def forward(self, *xs):
        if not xs:
            raise ValueError("concat: needs at least one tensor")
        self.ax = _axis(self.axis, xs[0].ndim)
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
            t = t.slice(_axis(int(ax), t.ndim), int(st), int(en), int(sp))
        return t

    def forward(self, x):
        self.xmeta = x.shape, x.dtype, x.device
        return self._view(x)

    def backward(self, dy):
        dx = _zeros(*self.xmeta)
        _core.copy_(self._view(dx), dy)
        return dx


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - SINGA's name
    return Slice(starts, ends, axes, steps)(x)[0]


_slice = slice


# ---------------------------------------------------------------- sums and means
class Sum(Operator):
    """Element-wise sum of several tensors (SINGA's autograd.sum); broadcasting like add."""
    aliased_grads = True

    def forward(self, *xs):
        self.shapes = [x.shape for x in xs]
        y = xs[0]
        for x in xs[1:]:
            y = _core.add(y, x)
        return y

    def backward(self, dy):
        return tuple(_reduce_to(dy, s) for s in self.shapes)


def sum(*l):  # noqa: A001 - SINGA's name
    return Sum()(*l)[0]


class Mean(Operator):
    """Element-wise mean of several tensors (SINGA's autograd.mean)."""
    aliased_grads = True

    def forward(self, *xs):
        self.shapes = [x.shape for x in xs]
        y = xs[0]
        for x in xs[1:]:
            y = _core.add(y, x)
        return _core.mul_scalar(y, 1.0 / len(xs))

    def backward(self, dy):
        g = _core.mul_scalar(dy, 1.0 / len(self.shapes))
        return tuple(_reduce_to(g, s) for s in self.shapes)


def mean(*l):
    return Mean()(*l)[0]


class ReduceSum(Operator):
    """Sum over `axes` (all when None); keepdims=1 keeps them with size 1 (SINGA's default)."""
    aliased_grads = True  # the gradient is a broadcast view of dy

    def __init__(self, axes=None, keepdims=1):
        super().__init__()
        self.axes = [axes] if isinstance(axes, numbers.Integral) else axes
        self.keepdims = bool(keepdims)
        self.scale = False

    def forward(self, x):
        self.xshape = x.shape
        axes = None if self.axes is None else [_axis(int(a), x.ndim) for a in self.axes]
        self.kshape = [1 if axes is None or i in axes else s for i, s in enumerate(x.shape)]
        y = _core.sum(x, axes, self.keepdims)
        self.n = max(x.numel // max(y.numel, 1), 1)
        return _core.mul_scalar(y, 1.0 / self.n, out=y) if self.scale else y

    def backward(self, dy):
        if self.scale:
            dy = _core.mul_scalar(dy, 1.0 / self.n)
        return dy.reshape(self.kshape).broadcast_to(list(self.xshape))


class ReduceMean(ReduceSum):
    def __init__(self, axes=None, keepdims=1):
        super().__init__(axes, keepdims)
        self.scale = True


def reduce_sum(x, axes=None, keepdims=1):
    return ReduceSum(axes, keepdims)(x)[0]


def reduce_mean(x, axes=None, keepdims=1):
    return ReduceMean(axes, keepdims)(x)[0]


# ---------------------------------------------------------------- element-wise unary
class ReLU(Operator):
    def forward(self, x):
        self.y = _core.relu(x)
        return self.y

    def backward(self, dy):
        g = _core.sign(self.y)  # 1 where x > 0, else 0
        return _core.mul(g, dy, out=g)


def relu(x):
    return ReLU()(x)[0]


class LeakyRelu(Operator):
    """x for x >= 0, a * x otherwise."""

    def __init__(self, a=0.01):
        super().__init__()
        self.a = float(a)

    def forward(self, x):
        self.x = x
        y = _core.mul_scalar(x, self.a)
        _core.axpy_(1.0 - self.a, _core.relu(x), y)  # a*x + (1-a)*relu(x)
        return y

    def backward(self, dy):
        g = _core.sign(_core.relu(self.x))
        _core.mul_scalar(g, 1.0 - self.a, out=g)
        _core.add_scalar(g, self.a, out=g)
        return _core.mul(g, dy, out=g)


def leakyrelu(x, a=0.01):
    return LeakyRelu(a)(x)[0]


class Elu(Operator):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        self.x = x
        y = _core.relu(x)
        _core.axpy_(self.alpha, _core.expm1(_core.clip(x, None, 0.0)), y)
        return y

    def backward(self, dy):
        pos = _core.sign(_core.relu(self.x))  # 1 where x > 0
        g = _core.mul_scalar(_core.exp(_core.clip(self.x, None, 0.0)), self.alpha)
        _core.mul(g, _core.sub_scalar(pos, 1.0, True), out=g)  # alpha * exp(x) where x <= 0
        _core.add(g, pos, out=g)
        return _core.mul(g, dy, out=g)


def elu(x, alpha=1.0):
    return Elu(alpha)(x)[0]


class Sigmoid(Operator):
    def forward(self, x):
        self.y = _core.sigmoid(x)
        return self.y

    def backward(self, dy):
        g = _core.sub_scalar(self.y, 1.0, True)  # y * (1 - y) * dy
        _core.mul(g, self.y, out=g)
        return _core.mul(g, dy, out=g)


def sigmoid(x):
    return Sigmoid()(x)[0]


class Tanh(Operator):
    def forward(self, x):
        self.y = _core.tanh(x)
        return self.y

    def backward(self, dy):
        g = _core.square(self.y)  # (1 - y^2) * dy
        _core.sub_scalar(g, 1.0, True, out=g)
        return _core.mul(g, dy, out=g)


def tanh(x):
    return Tanh()(x)[0]


class SoftPlus(Operator):
    """log(1 + exp(x)), computed stably."""

    def forward(self, x):
        self.x = x
        return _core.softplus(x)

    def backward(self, dy):
        g = _core.sigmoid(self.x)
        return _core.mul(g, dy, out=g)


def softplus(x):
    return SoftPlus()(x)[0]


class Gelu(Operator):
    """x * Phi(x) with the exact normal CDF Phi(x) = (1 + erf(x / sqrt(2))) / 2."""

    def forward(self, x):
        self.x = x
        self.cdf = _core.mul_scalar(x, 1.0 / math.sqrt(2.0))
        _core.erf(self.cdf, out=self.cdf)
        _core.add_scalar(self.cdf, 1.0, out=self.cdf)
        _core.mul_scalar(self.cdf, 0.5, out=self.cdf)
        return _core.mul(x, self.cdf)

    def backward(self, dy):
        g = _core.square(self.x)  # (Phi(x) + x * pdf(x)) * dy
        _core.mul_scalar(g, -0.5, out=g)
        _core.exp(g, out=g)
        _core.mul_scalar(g, 1.0 / math.sqrt(2.0 * math.pi), out=g)
        _core.mul(g, self.x, out=g)
        _core.add(g, self.cdf, out=g)
        return _core.mul(g, dy, out=g)


def gelu(x):
    return Gelu()(x)[0]


class Exp(Operator):
    def forward(self, x):
        self.y = _core.exp(x)
        return self.y

    def backward(self, dy):
        return _core.mul(dy, self.y)


def exp(a):
    return Exp()(a)[0]


class Log(Operator):
    def forward(self, x):
        self.x = x
        return _core.log(x)

    def backward(self, dy):
        return _core.div(dy, self.x)


def log(x):
    return Log()(x)[0]


class Sqrt(Operator):
    def forward(self, x):
        self.y = _core.sqrt(x)
        return self.y

    def backward(self, dy):
        g = _core.div(dy, self.y)
        return _core.mul_scalar(g, 0.5, out=g)


def sqrt(x):
    return Sqrt()(x)[0]


class Abs(Operator):
    def forward(self, x):
        self.x = x
        return _core.abs(x)

    def backward(self, dy):
        g = _core.sign(self.x)
        return _core.mul(g, dy, out=g)


def abs(a):  # noqa: A001 - SINGA's name
    return Abs()(a)[0]


class Negative(Operator):
    def forward(self, x):
        return _core.neg(x)

    def backward(self, dy):
        return _core.neg(dy)


def negative(x):
    return Negative()(x)[0]


class Identity(Operator):
    aliased_grads = True

    def forward(self, x):
        return x

    def backward(self, dy):
        return dy


def identity(x):
    return Identity()(x)[0]


class Clip(Operator):
    """Limits x to [min, max] (either may be None); the gradient passes where x is inside."""

    def __init__(self, min=None, max=None):  # noqa: A002 - SINGA's names
        super().__init__()
        self.min = None if min is None else float(min)
        self.max = None if max is None else float(max)

    def forward(self, x):
        self.x = x
        self.y = _core.clip(x, self.min, self.max)
        return self.y

    def backward(self, dy):
        g = _core.eq(self.x, self.y).cast(dy.dtype)
        return _core.mul(g, dy, out=g)


def clip(x, min=None, max=None):  # noqa: A002
    return Clip(min, max)(x)[0]


class Cast(Operator):
    """A copy in dtype `to` (x itself when it already has it); the gradient is cast back."""
    aliased_grads = True

    def __init__(self, to):
        super().__init__()
        self.to = tensor.to_dtype(to)

    def forward(self, x):
        self.src_dtype = x.dtype
        return x if x.dtype == self.to else x.cast(self.to)

    def backward(self, dy):
        return dy if dy.dtype == self.src_dtype else dy.cast(self.src_dtype)


def cast(x, to):
    return Cast(to)(x)[0]


class Dropout(Operator):
    """Inverted dropout: zeroes each element with probability `ratio` and scales the rest by
    1 / (1 - ratio) while autograd.training is true; the identity otherwise."""
    aliased_grads = True  # the identity case hands dy through

    def __init__(self, ratio=0.5):
        super().__init__()
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def forward(self, x):
        self.mask = None
        if not training or self.ratio == 0.0:
            return x
        self.mask = CTensor(list(x.shape), x.dtype, x.device)
        _core.bernoulli_(self.mask, 1.0 - self.ratio)
        _core.mul_scalar(self.mask, 1.0 / (1.0 - self.ratio), out=self.mask)
        return _core.mul(x, self.mask)

    def backward(self, dy):
        return dy if self.mask is None else _core.mul(dy, self.mask)


def dropout(x, ratio=0.5):
    return Dropout(ratio)(x)[0]


# ---------------------------------------------------------------- softmax and losses
class SoftMax(Operator):
    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.y = _softmax(x, self.axis)
        return self.y

    def backward(self, dy):
        g = _core.mul(dy, self.y)  # y * (dy - sum(dy * y))
        s = _core.sum(g, [self.axis], True)
        _core.sub(dy, s, out=g)
        return _core.mul(g, self.y, out=g)


def softmax(x, axis=1):
    return SoftMax(axis)(x)[0]


class LogSoftmax(Operator):
    def __init__(self, axis=1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        self.y = _log_softmax(x, self.axis)
        return self.y

    def backward(self, dy):
        g = _core.exp(self.y)  # dy - softmax * sum(dy)
        _core.mul(g, _core.sum(dy, [self.axis], True), out=g)
        return _core.sub(dy, g, out=g)


def log_softmax(x, axis=1):
    return LogSoftmax(axis)(x)[0]


def _targets(t: CTensor, x: CTensor, op: str):
    """t as a (N, C) tensor in x's dtype, and whether each row is known to sum to 1.

    Integer labels of shape (N,) become one-hot rows; integer or bool (N, C) tensors are one-hot already
    (SINGA scripts pass int32 one-hot); floating (N, C) targets may be soft."""
    if x.ndim != 2:
        raise ValueError(f"{op}: expected (batch, classes) predictions, got shape {x.shape}")
    integral = not t.dtype.is_floating
    if integral and t.ndim == 1 and t.shape[0] == x.shape[0]:
        return _core.one_hot(t, x.shape[1], x.dtype), True
    if t.shape != x.shape:
        raise ValueError(f"{op}: targets must be class labels of shape ({x.shape[0]},) or one-hot / "
                         f"probability rows of shape {x.shape}; got shape {t.shape} ({t.dtype.name})")
    return (t if t.dtype == x.dtype else t.cast(x.dtype)), integral


class CrossEntropy(Operator):
    """-sum(t * log(y)) / N for probabilities y of shape (N, C) and targets t (one-hot or labels)."""

    def forward(self, y, t):
        self.y = y
        self.t = _targets(t, y, "cross_entropy")[0]
        loss = _core.log(y)
        _core.mul(loss, self.t, out=loss)
        loss = _core.sum(loss)
        return _core.mul_scalar(loss, -1.0 / y.shape[0], out=loss)

    def backward(self, dy):
        g = _core.div(self.t, self.y)
        _core.mul_scalar(g, -1.0 / self.y.shape[0], out=g)
        return _core.mul(g, dy, out=g), None


def cross_entropy(y, t):
    return CrossEntropy()(y, t)[0]


class SoftMaxCrossEntropy(Operator):
    """Mean over the batch of -sum(t * log_softmax(x)); x are logits (N, C); t integer labels (N,),
    or one-hot / probability rows (N, C) of any dtype. t is a constructor argument, as in SINGA."""

    def __init__(self, t):
        super().__init__()
        if not isinstance(t, Tensor):
            raise TypeError(f"softmax_cross_entropy: the targets must be a tensor.Tensor, got {type(t).__name__}")
        self.traw = t.data

    def forward(self, x):
        self.t, self.rows_sum_to_one = _targets(self.traw, x, "softmax_cross_entropy")
        self.logp = _log_softmax(x, 1)
        loss = _core.sum(_core.mul(self.logp, self.t))
        return _core.mul_scalar(loss, -1.0 / x.shape[0], out=loss)

    def backward(self, dy):
        g = _core.exp(self.logp)  # (softmax * rowsum(t) - t) / N * dy
        if not self.rows_sum_to_one:
            _core.mul(g, _core.sum(self.t, [1], True), out=g)
        _core.sub(g, self.t, out=g)
        _core.mul_scalar(g, 1.0 / g.shape[0], out=g)
        return _core.mul(g, dy, out=g)


def softmax_cross_entropy(x, t):
    return SoftMaxCrossEntropy(t)(x)[0]


class MeanSquareError(Operator):
    """mean((x - t)^2) over all elements."""

    def forward(self, x, t):
        self.shapes = x.shape, t.shape
        self.err = _core.sub(x, t)
        return _core.mean(_core.square(self.err))

    def backward(self, dy):
        g = _core.mul_scalar(self.err, 2.0 / max(self.err.numel, 1))
        _core.mul(g, dy, out=g)
        dt = _core.neg(_reduce_to(g, self.shapes[1])) if self.needs_grad[1] else None
        return _reduce_to(g, self.shapes[0]), dt


def mse_loss(x, t):
    return MeanSquareError()(x, t)[0]


# ---------------------------------------------------------------- layers
# The layer classes live in layer.py, one implementation for both of SINGA's spellings; scripts written
# against SINGA's autograd reach them here (autograd.Conv2d(1, 20, 5), autograd.Linear(800, 500), ...).
from .layer import AvgPool2d, BatchNorm2d, Conv2d, GlobalAvgPool2d, Layer, Linear, MaxPool2d  # noqa: E402,F401
from .nn_ops import (GlobalAveragePool, _AvgPool2d, _BatchNorm2d, _Conv2d, _MaxPool2d, avg_pool2d, batchnorm_2d, conv2d, global_avg_pool2d, globalaveragepool, max_pool2d)  # noqa: E402,F401,E501
