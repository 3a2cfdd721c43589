"""The autograd engine: the operator contract, the recorded graph, backward and gradient hooks, and the
``training`` flag. It imports only the tensor layer; the operators (the ``ops`` package) are built on it, the
layers (layer.py) on those, and ``autograd`` re-exports all of them under SINGA's names.

An :class:`Operator` computes on the raw C++ tensors (``Tensor.data``); calling it on ``tensor.Tensor``s
records the graph when ``training`` is true (``autograd.training``: the same flag) and some input
``requires_grad``. Leaves with ``stores_grad=True`` are parameters. :func:`backward` is a generator: it yields
``(param, grad)`` the moment a parameter's gradient is final, so an optimizer (or DistOpt's all-reduce) can
start on it while the rest of the backward pass runs.

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
3. The graph outlives its backward, as in SINGA: a second backward through it (a GAN's discriminator
   loss read by two optimizers, say) gives the same gradients. Its ops' state (cached inputs, masks) is
   dropped when the next recorded forward begins (or with the graph, when nothing refers to it any more),
   so a training loop holds one step's activations, never two; a backward through ops dropped that way
   raises ``ValueError``. The cost: the activations live until the end of the backward pass instead of
   being freed as it goes (SINGA's too).
4. Gradient hooks (``Tensor.register_hook``) run here, when a parameter's gradient is final and before it is
   yielded, so they run whoever consumes the generator (:func:`gradients`, an optimizer, DistOpt). A hook
   ``hook(grad)`` returns None (keep ``grad``), a replacement gradient (the next hook sees it), or a
   *pending* gradient: an object whose ``wait()`` returns the gradient later, e.g. an asynchronous
   all-reduce (``parallel.DataParallel``). A pending pair, and every pair behind it, is held back and
   yielded after the pass, in the same order, once ``wait()`` returned (hooks registered after the one that
   deferred then run on the waited gradient): communication started by a hook overlaps the rest of the
   backward pass, and consumers still only ever see final gradients. Parameters without hooks cost the
   pass one attribute test each.

Time profiling (``Device.SetVerbosity``) and the timeline (``timeline.py``): while either is on, the engine
calls the operator hook's ``forward(op, raw_inputs)`` / ``backward(op, dys)`` in place of ``op.forward`` /
``op.backward``; otherwise each operator call pays one global test. ``device.on_op_hook`` tells this module
which hook to call (device.py decides it, so that neither tool imports the engine).

Broadcasting: binary operators broadcast like numpy; their backward sums the gradient over the axes an input
was broadcast along (``ops.common.reduce_to``: the leading axes it lacks and the axes where it has size 1).

Memory rules for operator writers: ``backward`` must not modify its ``dys`` in place (they can be shared);
an operator whose gradients may share memory with ``dy`` or with each other sets ``aliased_grads = True``,
and the engine then copies before accumulating in place or handing a gradient to an optimizer.

Choices (differences from SINGA 3 noted):
- ``backward(y)`` raises ``ValueError`` when ``y`` has no recorded graph (forward ran with
  ``training = False``, or ``y`` came from plain tensor operators, which are not recorded) or when ``y``
  does not depend on any parameter; SINGA silently yields nothing for the latter.
- ``y`` need not be a scalar: ``dy`` defaults to ones of ``y``'s shape (may be a number or a Tensor).
- Only leaves are yielded; an intermediate tensor with ``stores_grad=True`` is not (SINGA yields it).
"""
from __future__ import annotations

import numbers
import weakref

from . import _core, device
from .raw import zeros
from .tensor import Tensor

CTensor = _core.Tensor
training = False
# Weak references to the ops that ran a backward: their state is dropped when the next recorded forward
# begins (see the module doc); weak, so that a graph nobody refers to is freed at once, as before.
_spent = []
# The operator hook (device.on_op_hook): None unless a device profiles or the timeline records; then the
# engine calls _timer.forward(op, raw_inputs) / _timer.backward(op, dys) instead of op.forward / op.backward.
_timer = None


def _set_op_hook(hook) -> None:
    global _timer
    _timer = hook


def op_hook():
    """The operator hook the engine calls now (None: none)."""
    return _timer


device.on_op_hook(_set_op_hook)


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
        # Runs for every operator of every step: plain loops and list comprehensions, no generators.
        requires_grad = False
        for x in xs:
            if not isinstance(x, Tensor):
                raise TypeError(f"{self.name}: inputs must be tensor.Tensor, got {type(x).__name__}")
            requires_grad = requires_grad or x.requires_grad
        try:
            raw = [x.data for x in xs]
            ys = self.forward(*raw) if _timer is None else _timer.forward(self, raw)
        except (ValueError, TypeError, IndexError) as e:  # say which autograd op failed, keep the type
            raise type(e)(f"{self.name}: {e}") from e
        ys = ys if isinstance(ys, tuple) else (ys,)
        self.requires_grad = requires_grad
        record = training and requires_grad
        if record and _spent:
            release_spent()
        creator = self if record else None
        outs = tuple([Tensor(data=y, requires_grad=requires_grad, creator=creator, name=f"{self.name}:{i}")
                      for i, y in enumerate(ys)])
        if record:  # the graph: one edge per input, (creator op, output index) or (parameter, 0) or None
            self.src = [_edge(x) for x in xs]
            self.y_id2idx = {id(y): i for i, y in enumerate(outs)}
            self.y_meta = [(y.shape, y.dtype, y.device) for y in ys]
        return outs

    @classmethod
    def apply(cls, *xs, **kwargs):
        """``cls(**kwargs)(*xs)``: SINGA's function form of an operator (``relu = ReLU.apply``). Returns the
        output tensor, or the tuple of them for an operator with several outputs."""
        ys = cls(**kwargs)(*xs)
        return ys[0] if len(ys) == 1 else ys

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


def release_spent() -> None:
    """Drops the state of every op that ran a backward (called when a new graph starts recording): their
    graphs cannot be differentiated again, and their activations are freed."""
    refs = list(_spent)
    _spent.clear()
    for ref in refs:
        op = ref()
        if op is not None and not getattr(op, "released", False):
            op._release()


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
            grad = Tensor(data=g0 if owned0 else g0.clone(), requires_grad=False, name=f"{y.name}_g")
            yield y, (_hooked(y, grad, y._grad_hooks) if y._grad_hooks else grad)
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
    held = []  # (param, gradient or _Pending) behind a hook's pending gradient, yielded after the pass
    while ready:
        op = ready.pop()
        dys = [g[0] if g is not None else zeros(*meta) for g, meta in zip(grads.pop(op), op.y_meta)]
        dxs = op.backward(*dys) if _timer is None else _timer.backward(op, dys)
        dxs = dxs if isinstance(dxs, (tuple, list)) else (dxs,)
        if len(dxs) != len(op.src):
            raise RuntimeError(f"{op.name}.backward returned {len(dxs)} gradients for {len(op.src)} inputs")
        del dys
        for i, (e, need, dx) in enumerate(zip(op.src, op.needs_grad, dxs)):
            if not need:
                continue
            if dx is None:
                raise RuntimeError(f"{op.name}.backward returned no gradient for input {i}, which needs one")
            if not isinstance(dx, CTensor):
                hint = ": return its .data" if isinstance(dx, Tensor) else ""
                raise TypeError(f"{op.name}.backward returned a {type(dx).__name__} for input {i}; an operator's "
                                f"backward returns raw tensors (as SINGA's does){hint}")
            node, idx = e
            slots = grads.get(node)
            if slots is None:
                slots = grads[node] = [None] * (1 if isinstance(node, Tensor) else len(node.y_meta))
            slots[idx] = _accumulate(slots[idx], dx, not op.aliased_grads)
            deps[node] -= 1
            if deps[node] == 0:
                if isinstance(node, Tensor):
                    g, owned = grads.pop(node)[0]
                    grad = Tensor(data=g if owned else g.clone(), requires_grad=False, name=f"{node.name}_g")
                    if not (node._grad_hooks or held):  # the common case: no hooks, nothing held back
                        yield node, grad
                    else:
                        if node._grad_hooks:
                            grad = _run_hooks(node, grad, list(node._grad_hooks.values()))
                        if held or isinstance(grad, _Pending):
                            held.append((node, grad))
                        else:
                            yield node, grad
                else:
                    ready.append(node)
        del dxs
        if not getattr(op, "spent", False):
            op.spent = True
            _spent.append(weakref.ref(op))
    for node, grad in held:
        yield node, _resolve(node, grad)


class Gradients(dict):
    """What :func:`gradients` returns: ``{param: grad}``, also readable by ``id(param)`` as SINGA keys it
    (``grads[id(w)]``, ``id(w) in grads``); iterating gives the parameters."""

    def __missing__(self, key):
        if isinstance(key, int) and not isinstance(key, bool):
            for p, g in self.items():
                if id(p) == key:
                    return g
        raise KeyError(key)

    def __contains__(self, key):
        if isinstance(key, int) and not isinstance(key, bool):
            return any(id(p) == key for p in self.keys())
        return dict.__contains__(self, key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


def gradients(y: Tensor, dy=None) -> Gradients:
    """{param: grad} for every parameter y depends on (readable by ``id(param)`` too, see Gradients)."""
    return Gradients((p, g) for p, g in backward(y, dy))


# ---------------------------------------------------------------- gradient hooks
class _Pending:
    """A hook's pending gradient (``work.wait()`` returns it) and the hooks still to run on it."""

    __slots__ = ("work", "hook", "rest")

    def __init__(self, work, hook, rest):
        self.work, self.hook, self.rest = work, hook, rest


def _run_hooks(param: Tensor, grad: Tensor, hooks: list):
    """grad through the hooks in order: the final gradient, or a _Pending when one of them deferred."""
    for i, hook in enumerate(hooks):
        out = hook(grad)
        if out is None:
            continue
        if isinstance(out, (Tensor, CTensor)):
            grad = _checked_grad(param, out, hook)
        elif callable(getattr(out, "wait", None)):
            return _Pending(out, hook, hooks[i + 1:])
        else:
            raise TypeError(f"backward: the gradient hook {_hook_name(hook)} of {param.name} returned "
                            f"{type(out).__name__}; a hook returns None, a Tensor (the new gradient), or an "
                            f"object whose wait() returns the gradient")
    return grad


def _resolve(param: Tensor, grad):
    """Waits for a pending gradient (and for any that the hooks after it return)."""
    while isinstance(grad, _Pending):
        done = _checked_grad(param, grad.work.wait(), grad.hook, "'s pending gradient: wait() returned")
        grad = _run_hooks(param, done, grad.rest)
    return grad


def _hooked(param: Tensor, grad: Tensor, hooks: dict) -> Tensor:
    return _resolve(param, _run_hooks(param, grad, list(hooks.values())))


def _checked_grad(param: Tensor, out, hook, what: str = " returned") -> Tensor:
    if isinstance(out, CTensor):
        out = Tensor(data=out, requires_grad=False)
    if not isinstance(out, Tensor):
        raise TypeError(f"backward: the gradient hook {_hook_name(hook)} of {param.name}{what} "
                        f"{type(out).__name__}, expected a Tensor like the parameter")
    p, g = param.data, out.data
    if g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
        raise ValueError(f"backward: the gradient hook {_hook_name(hook)} of {param.name}{what} a gradient of "
                         f"shape {tuple(g.shape)}, {g.dtype.name} on {g.device}; the parameter is "
                         f"{tuple(p.shape)}, {p.dtype.name} on {p.device}")
    return out


def _hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


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
        raise ValueError(f"backward: the graph through {op.name} was freed: a new forward pass began recording "
                         f"after its backward; run its forward pass again")
    return op.src


def _accumulate(slot, dx, owned: bool):
    """slot + dx as (tensor, owned); in place only into a tensor nobody else refers to."""
    if slot is None:
        return dx, owned
    acc, acc_owned = slot
    if acc_owned:
        return _core.add(acc, dx, out=acc), True
    return _core.add(acc, dx), True


# SINGA_LITE_TIMELINE=path: record from the first operator on (the timeline wraps the operator hook).
from . import timeline  # noqa: E402  (last: recording starts at once, and the engine takes the hook above)

timeline.start_from_environment()
