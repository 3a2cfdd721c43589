"""Communication hooks: what replaces the plain all-reduce of a bucket of gradients (PyTorch DDP's
``register_comm_hook``; the bucket a hook gets is :class:`~singa_lite.parallel.bucket.GradBucket`).

A hook is ``hook(state, bucket)``; it returns the bucket's gradients averaged over the ranks, as a flat tensor
of ``bucket.buffer()``'s shape and dtype (the buffer itself, reduced in place, is fine), or a handle whose
``wait()`` returns that tensor. Shipped here, each working on every backend (CPU tensors over mpi, shm, tcp;
GPU tensors over nccl: they use only the communicator's collectives and singa_lite tensor ops)::

    allreduce_hook        the plain average (what DistOpt does without a hook)
    fp16_compress_hook    the average computed with float16 on the wire (half the bytes)
    bf16_compress_hook    the same with bfloat16 (float32's range, fewer mantissa bits)
    powerSGD_hook         low-rank compression with error feedback (Vogels et al., NeurIPS 2019), state:
                          PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=1000, ...)

``state``: None (the hook all-reduces over ``bucket.communicator`` and counts nothing), a Communicator (the
group to all-reduce over, as PyTorch passes a process group), or a :class:`HookState` (a group, or None for
the bucket's, plus the byte counters ``bytes_sent`` / ``bytes_plain`` that measurements read), or, for
``powerSGD_hook``, a :class:`PowerSGDState`.

For the owner of the exchange (DistOpt, a reducer), two entry points::

    state, hook = check_comm_hook(state, hook, "DistOpt.register_comm_hook")   # at registration
    handle = run_comm_hook(hook, state, bucket)   # per bucket, instead of all_reduce(buf, "avg", async_op=True)
    handle.wait()                                 # the averaged gradients are in bucket.buffer() now

A handle must be waited for on every rank, in the same order on every rank: a hook's later collectives
(PowerSGD's second all-reduce) are issued by ``wait()``.
"""
from __future__ import annotations

from .. import _core, tensor
from ..tensor import Tensor
from .bucket import GradBucket, take_result
from .hook_state import HookFuture, HookState, check_group, resolve_state
from .powersgd import PowerSGDState, powerSGD_hook

__all__ = ["HookState", "HookFuture", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "powerSGD_hook", "PowerSGDState", "check_comm_hook", "run_comm_hook"]


# ----------------------------------------------------------------------------------------- the plain hooks
def allreduce_hook(state, bucket: GradBucket):
    """The average over the ranks of the bucket, in place in its buffer; returns the collective's handle
    (``wait()`` gives the buffer). PyTorch's ``default_hooks.allreduce_hook``."""
    group, counter = resolve_state(state, bucket, "allreduce_hook")
    buf = bucket.buffer()
    if counter is not None:
        counter.count_bucket(buf.memsize(), buf.memsize())
    return group.all_reduce(buf, "avg", async_op=True)


def fp16_compress_hook(state, bucket: GradBucket):
    """The average computed on a float16 copy of the bucket (half of float32's bytes), cast back into the
    buffer. Every backend's "avg" of 16-bit floats divides before it sums, or sums in float32 (shm), so the
    exchange overflows only where the averaged values do; gradients beyond float16's range (65504) do not
    survive the cast: use bf16_compress_hook for those. PyTorch's ``default_hooks.fp16_compress_hook``."""
    return _compress_hook(state, bucket, tensor.float16, "fp16_compress_hook")


def bf16_compress_hook(state, bucket: GradBucket):
    """The average computed on a bfloat16 copy of the bucket (float32's range, 8 bits of mantissa), cast back
    into the buffer. PyTorch's ``default_hooks.bf16_compress_hook``."""
    return _compress_hook(state, bucket, tensor.bfloat16, "bf16_compress_hook")


def _compress_hook(state, bucket, dtype, who: str):
    group, counter = resolve_state(state, bucket, who)
    buf = bucket.buffer()
    if not buf.dtype.is_floating:
        raise TypeError(f"{who}: the bucket holds {buf.dtype.name} gradients; a 16-bit float compression "
                        f"needs floating gradients (use allreduce_hook)")
    wire = buf.as_type(dtype)  # a copy, or the buffer itself when it already has the dtype
    if counter is not None:
        counter.count_bucket(wire.memsize(), buf.memsize())
    work = group.all_reduce(wire, "avg", async_op=True)

    def finish():
        work.wait()
        if wire is not buf:
            _core.copy_(buf.data, wire.data)  # casts back, on the buffer's device
        return buf
    return HookFuture(finish)


# ----------------------------------------------------------------------------------------- for the owner
def check_comm_hook(state, hook, who: str = "register_comm_hook"):
    """(state, hook) once checked: hook callable, state None, a Communicator or a HookState; a clear error
    otherwise (at registration, not at the first step)."""
    if not callable(hook):
        swapped = " (the arguments are (state, hook): were they swapped?)" if callable(state) else ""
        raise TypeError(f"{who}: hook must be a callable hook(state, bucket), got {type(hook).__name__}"
                        f"{swapped}; e.g. singa_lite.parallel.hooks.powerSGD_hook")
    if hook is powerSGD_hook and not isinstance(state, PowerSGDState):
        raise TypeError(f"{who}: powerSGD_hook needs a PowerSGDState as its state, got "
                        f"{type(state).__name__}; e.g. PowerSGDState(matrix_approximation_rank=2)")
    if state is not None and not isinstance(state, HookState) and hook in (allreduce_hook, fp16_compress_hook,
                                                                              bf16_compress_hook):
        check_group(state, who + ": state")
    return state, hook


def run_comm_hook(hook, state, bucket: GradBucket) -> HookFuture:
    """Calls hook(state, bucket) and returns a handle whose wait() checks what the hook produced (a tensor of
    the buffer's shape and dtype: bucket.take_result, as the reducer does) and leaves it in bucket.buffer();
    wait() returns the buffer."""
    result = hook(state, bucket)

    def finish():
        handle = hasattr(result, "wait") and not isinstance(result, (Tensor, _core.Tensor))
        return take_result(result.wait() if handle else result, bucket.buffer(), hook, waited=handle)
    return HookFuture(finish)
