"""A data-parallel model wrapper driven by gradient hooks (the DDP exercises' exercise 4: ``MyDP``).

    rank, device = ddp.init()            # or a communicator from dist.init
    model = parallel.DataParallel(model)  # rank 0's weights on every rank; one hook per parameter
    sgd = opt.SGD(lr=0.1)                 # any optimizer: nothing distributed about it
    for x, y in loader:                   # this rank's share of each batch (ddp.partition_dataset)
        loss = loss_fn(model(x), y)
        sgd(loss)                         # gradients reach sgd averaged over the ranks

Construction broadcasts rank 0's parameter values (after comparing the ranks' models) and registers a
gradient hook on every parameter. In each backward pass, as soon as a parameter's gradient is final the
hook copies it into a fusion buffer (parallel/fusion.Fuser, shared with DistOpt): small gradients are packed
together, a bucket's asynchronous all-reduce ("avg") starts as soon as it is full, and a gradient larger
than the threshold goes alone, so the exchange overlaps the rest of the backward pass. The hook hands the
autograd engine a pending gradient; the engine yields the pairs after the pass, once the exchange has been
waited for, so whatever consumes ``autograd.backward`` -- an optimizer, ``autograd.gradients``, a loop of
the user's -- only ever sees averaged gradients ("wait before the optimizer step").

Every rank must run the same backward passes (same model, same loss): the hooks issue one collective per
bucket in the order gradients become final, which is then the same on every rank. Do not combine with
DistOpt, which averages the gradients again.

The buckets are the reducer's (reducer.py, shared with DistOpt), so ``register_comm_hook(state, hook)``
replaces their all-reduce here as it does there (see DistOpt.register_comm_hook).

Clipping by the global norm works on what backward yields, since those gradients are already averaged and
the same on every rank (optim/clip.py)::

    pairs = list(autograd.backward(loss))
    opt.clip_grad_norm(pairs, max_norm=1.0)
    for p, g in pairs:
        sgd.apply(p.name, p, g)
    sgd.step()

Gradient accumulation, buffers and uneven inputs are DistOpt's (``backward_passes_per_step``, ``no_sync``,
``sync_buffers``, ``join``): this wrapper exchanges at every backward pass.
"""
from __future__ import annotations

from ..layer.base import Layer, is_initialized, sublayers
from . import fusion, replicas
from .fusion import DEFAULT_FIRST_BUCKET, DEFAULT_THRESHOLD
from .reducer import Reducer

__all__ = ["DataParallel", "MyDP"]


class DataParallel:
    """Wraps `model` for data-parallel training (the DDP exercises' ``MyDP``; PyTorch's DDP in spirit).

    model: a Layer / Model, or a plain class whose attributes are layers (SINGA's ``CNN``); its parameters
    must exist (layers that infer their input size create them on their first call: run one forward pass or
    ``model.compile([x])`` first). communicator: default the one of ``ddp.init`` (joined with its defaults if
    needed). buffSize, threshold, first_bucket: as DistOpt (fusion buffer elements; a gradient above threshold
    is sent alone; a pass's first bucket leaves at first_bucket elements). root: the rank whose weights every
    rank starts from. find_unused_parameters=True (ranks whose forward takes different branches) is refused
    with a ValueError: use DistOpt(..., find_unused_parameters=True), which completes the gradients itself.

    Calling the wrapper calls the model; ``forward`` calls ``model.forward``; other attributes are the
    model's (``get_params``, ``train``, ``save_states``...). ``check_parameter_closeness()`` is the DDP exercises'
    check; ``remove_hooks()`` turns the wrapper off.
    """

    def __init__(self, model, communicator=None, *, buffSize: int = 4194304, threshold: int = DEFAULT_THRESHOLD,
                 first_bucket: int = DEFAULT_FIRST_BUCKET, root: int = 0, find_unused_parameters: bool = False):
        from . import ddp

        if not isinstance(find_unused_parameters, bool):
            raise TypeError(f"DataParallel: find_unused_parameters must be True or False, got "
                            f"{find_unused_parameters!r}")
        if find_unused_parameters:
            raise ValueError(f"DataParallel: find_unused_parameters={find_unused_parameters!r} is not supported: "
                             f"the gradient hooks see only this rank's backward graph, so a parameter this rank's "
                             f"forward did not use gets no gradient here and the optimizer would not update it "
                             f"while the other ranks do; train with opt.DistOpt(sgd, find_unused_parameters=True, "
                             f"parameters=model.get_params()) (or ddp.DistributedOptimizer(sgd, "
                             f"find_unused_parameters=True, parameters=...)) instead of this wrapper")

        if isinstance(buffSize, bool) or not isinstance(buffSize, int) or buffSize < 1:
            raise ValueError(f"DataParallel: buffSize must be an int >= 1, got {buffSize!r}")
        threshold = fusion.check_threshold(threshold, buffSize, "DataParallel")
        first_bucket = fusion.check_first_bucket(first_bucket, "DataParallel")
        if communicator is None:
            ddp.init()  # joins the group with its defaults, or returns the one already joined
            communicator = ddp.communicator()
        lazy = _uninitialized_layers(model)
        if lazy:
            raise ValueError(f"DataParallel: {', '.join(lazy)} create their parameters on their first call, so they "
                             f"do not exist yet; run one forward pass (or model.compile([x])) before wrapping, or "
                             f"give the layers their input sizes")
        object.__setattr__(self, "model", model)
        self.communicator = communicator
        self.threshold, self.first_bucket = int(threshold), int(first_bucket)
        named, seen = [], set()
        for name, p in replicas.named_parameters(model, "DataParallel"):
            if id(p) not in seen:  # a parameter shared by two layers is exchanged once
                seen.add(id(p))
                named.append((name, p))
        self._named = named
        replicas.broadcast_parameters(communicator, named, root, who="DataParallel")
        # no optimizer: the reducer only exchanges here; a pass per backward, begun at its first hook
        self._reducer = Reducer(communicator, None, int(buffSize), first_bucket=self.first_bucket,
                                who="DataParallel")
        self._exchange = None  # the pass under way
        # each hook knows its parameter's name: when the ranks' buckets differ, the error names what a rank skipped
        self._handles = [p.register_hook(lambda grad, name=name, p=p: self._hook(grad, name, p)) for name, p in named]

    # ----- the model's face
    @property
    def module(self):
        """The wrapped model (PyTorch's name; ``model`` is the DDP exercises')."""
        return self.model

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.model.forward(*args, **kwargs)

    def __getattr__(self, name):
        if name == "model":  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def __repr__(self):
        return (f"DataParallel({type(self.model).__name__}, {len(self._named)} parameters, rank "
                f"{self.communicator.rank} of {self.communicator.world_size})")

    # ----- replicas
    def check_parameter_closeness(self, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        """True when every rank's parameters equal rank 0's within atol + rtol * |rank 0's|; otherwise a
        RuntimeWarning names the worst parameter, and False. The same answer on every rank."""
        return replicas.check_parameter_closeness(self.communicator, self._named, rtol, atol,
                                                  who="DataParallel.check_parameter_closeness")

    def register_comm_hook(self, state, hook) -> None:
        """``hook(state, bucket)`` reduces each bucket instead of the plain averaged all-reduce (once, before
        the first backward pass); see DistOpt.register_comm_hook."""
        self._reducer.register_comm_hook(state, hook)

    def remove_hooks(self) -> None:
        """Unregisters the hooks (after completing an exchange in progress): gradients stay local."""
        self._finish()
        for h in self._handles:
            h.remove()
        self._handles = []

    # ----- the exchange
    def _hook(self, grad, name=None, param=None):
        """A gradient is final: queue it for the averaged all-reduce; the engine waits before yielding it."""
        if self._exchange is None or not self._exchange.in_pass:  # the first gradient of a backward pass
            self._exchange = self._reducer.begin_pass(self.threshold)
        self._exchange.push(grad.data, name, param)
        return _Averaged(self, grad)

    def _finish(self) -> None:
        """Sends the open bucket and waits for every bucket; results are written back into the gradients."""
        x = self._exchange
        if x is not None and x.in_pass:
            try:
                x.finish()
            except ValueError as e:  # the ranks' buckets differ: name the parameters a rank skipped
                explained = x.explain(e, "DataParallel", [n for n, _ in self._named])
                if explained is e:
                    raise
                raise explained from e


class _Averaged:
    """A gradient whose all-reduce is under way; ``wait()`` returns it averaged over the ranks."""

    __slots__ = ("dp", "grad")

    def __init__(self, dp: DataParallel, grad):
        self.dp, self.grad = dp, grad

    def wait(self):
        self.dp._finish()  # the first wait of a pass completes the whole exchange; later ones return at once
        return self.grad


MyDP = DataParallel  # the DDP exercises' name


def _uninitialized_layers(model) -> list:
    """Attribute paths of the model's layers that create parameters on their first call and have not been
    called yet."""
    if isinstance(model, Layer):
        stack = [("", model)]
    elif hasattr(model, "__dict__") and not isinstance(model, (dict, list, tuple)):
        stack = [(k, v) for k, v in vars(model).items() if isinstance(v, Layer)]
    else:
        stack = []
    lazy = []
    while stack:
        path, layer = stack.pop()
        if not is_initialized(layer) and type(layer).initialize is not Layer.initialize:
            lazy.append(f"{path or 'the model'} ({type(layer).__name__})")
        stack.extend((f"{path}.{k}" if path else k, sub) for k, sub in sublayers(layer).items())
    return sorted(lazy)
