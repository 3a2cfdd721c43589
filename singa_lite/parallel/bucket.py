"""GradBucket: what a communication hook is handed, one bucket of gradients at a time (the seam PyTorch DDP calls
``register_comm_hook``; see singa_lite.parallel.hooks for the hooks shipped).

A hook is ``hook(state, bucket) -> Tensor | handle``: it must return the bucket's gradients *averaged over the
ranks* as a flat tensor of ``bucket.buffer()``'s shape and dtype (it may be the buffer itself, reduced in place),
or an object whose ``wait()`` returns that tensor (a collective's ``async_op=True`` work, or the hooks' own
Future). ``state`` is whatever was registered with the hook (None, a PowerSGDState, a dict...)."""
from __future__ import annotations

from .. import _core, tensor as tensor_module


class GradBucket:
    """One bucket of a step's gradient exchange.

    index: its place in the step (0 is the first bucket sent: the gradients backward computed first).
    buffer: the flat 1-D tensor holding the bucket's gradients back to back, in the order of `parameters`.
    parameters: the parameters whose gradients the bucket holds. last: whether no bucket follows in this step.
    communicator: the Communicator the step exchanges over (the DistOpt's, or its process group)."""

    __slots__ = ("_index", "_buffer", "_parameters", "_last", "_communicator", "_offsets")

    def __init__(self, index: int, buffer, parameters, last: bool, communicator, offsets=None):
        self._index, self._buffer, self._last, self._communicator = int(index), buffer, bool(last), communicator
        self._parameters = list(parameters)
        if offsets is None:  # back to back, each parameter's full size
            offsets, start = [], 0
            for p in self._parameters:
                offsets.append(start)
                start += p.size()
        self._offsets = list(offsets)

    def __repr__(self):
        return (f"GradBucket(index={self._index}, elements={self._buffer.size()}, parameters={len(self._parameters)}"
                f", last={self._last})")

    def index(self) -> int:
        """The bucket's place in the step, from 0."""
        return self._index

    def buffer(self):
        """The flat gradient tensor (a singa_lite Tensor sharing memory with the exchange's buffer: reducing it in
        place is allowed)."""
        return self._buffer

    def parameters(self) -> list:
        """The parameters whose gradients the buffer holds, in buffer order."""
        return list(self._parameters)

    def gradients(self) -> list:
        """Each parameter's part of the buffer, shaped like the parameter (copies: write to buffer() instead)."""
        flat = tensor_module.to_numpy(self._buffer)
        out = []
        for p, start in zip(self._parameters, self._offsets):
            part = flat[start:start + p.size()].reshape(p.shape)
            out.append(tensor_module.from_numpy(part, self._buffer.device))
        return out

    def offsets(self) -> list:
        """Where each parameter's gradient starts in the buffer, in elements."""
        return list(self._offsets)

    def is_last(self) -> bool:
        """Whether this is the step's last bucket (a hook that batches work across buckets flushes here)."""
        return self._last

    @property
    def communicator(self):
        """The Communicator of the exchange: a hook whose state names no group all-reduces over this one."""
        return self._communicator


def take_result(result, buffer, hook, waited: bool = False):
    """Checks what a comm hook produced (`result`: what it returned, or what its handle's wait() returned when
    `waited`) and leaves it in `buffer` (the bucket's Tensor): copied there unless it is the buffer itself,
    moved to the buffer's device when it lives elsewhere. Returns the buffer; TypeError naming the hook when
    the result is not a tensor of the buffer's shape and dtype. The one check of every path that runs a hook
    (the reducer's buckets, hooks.run_comm_hook)."""
    region = buffer.data
    raw = result.data if isinstance(result, tensor_module.Tensor) else result
    if result is buffer or raw is region:
        return buffer
    if not isinstance(raw, _core.Tensor) or list(raw.shape) != list(region.shape) or raw.dtype != region.dtype:
        name = getattr(hook, "__qualname__", None) or repr(hook)
        what = (f"a tensor of shape {list(raw.shape)} and dtype {raw.dtype.name}" if isinstance(raw, _core.Tensor)
                else f"{type(result).__name__} {result!r:.80}")
        via = "its handle's wait() returned" if waited else "returned"
        raise TypeError(f"comm hook {name}: {via} {what}; a hook must return the averaged bucket, a tensor of "
                        f"bucket.buffer()'s shape {list(region.shape)} and dtype {region.dtype.name}, or an object "
                        f"whose wait() returns one")
    if raw.device != region.device:
        raw = raw.to(region.device)
    _core.copy_(region, raw)
    return buffer
