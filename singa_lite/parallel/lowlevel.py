"""SINGA's lower-level calls of DistOpt (raw tensors accepted; results are sums, update() divides): all_reduce,
fused_all_reduce and their _half forms, sparsification, wait, update. They complete before returning (their
results are final, so scripts that scale the result right after the call, as SINGA's
distributed-training page does in its parameter synchronisation, are correct); wait() is kept for SINGA's API.
They go around the reducer: no buckets overlapping backward, no vote, no comm hook."""
from __future__ import annotations

from .. import _core, tensor
from ..comm.communicator import raw_tensor
from .exchange import check_spars
from .fusion import Fuser

__all__ = ["SingaCalls"]


def _raw(t, what: str) -> _core.Tensor:
    return raw_tensor(t, f"DistOpt.{what}")


class SingaCalls:
    """Mixed into DistOpt, whose opt, world_size and reducer it uses."""

    def _init_singa_calls(self, communicator, buff_elems: int) -> None:
        self._user = Fuser(communicator, buff_elems, op="sum")  # SINGA's low-level calls sum
        self._user_half = Fuser(communicator, buff_elems, wire_dtype=tensor.float16, op="avg",
                                scale=float(communicator.world_size))

    def all_reduce(self, t) -> None:
        """Sums t over the ranks, in place."""
        self._user.send_alone(_raw(t, "all_reduce"))
        self._user.wait()

    def fused_all_reduce(self, tensors, send=True) -> None:
        """Copies the tensors into the fusion buffer; with send=True sums everything it holds over the ranks
        and writes the results back into the tensors (those of earlier send=False calls included)."""
        for t in tensors:
            self._user.add(_raw(t, "fused_all_reduce"))
        if send:
            self._user.wait()

    def all_reduce_half(self, t) -> None:
        """As all_reduce with float16 on the wire (divided by the world size before the sum, multiplied back
        after it, so the float16 exchange cannot overflow where the float32 sum does not)."""
        self._user_half.send_alone(_raw(t, "all_reduce_half"))
        self._user_half.wait()

    def fused_all_reduce_half(self, tensors, send=True) -> None:
        for t in tensors:
            self._user_half.add(_raw(t, "fused_all_reduce_half"))
        if send:
            self._user_half.wait()

    def sparsification(self, t, accumulation, spars, topK) -> None:
        """Sparse sum of t over the ranks, in place; accumulation (None or a tensor like t) is the error
        feedback residual, updated in place."""
        self.fused_sparsification([t], accumulation, spars, topK)

    def fused_sparsification(self, tensors, accumulation, spars, topK) -> None:
        raws = [_raw(t, "fused_sparsification") for t in tensors]
        spars = check_spars(spars, topK)
        acc = None if accumulation is None else _raw(accumulation, "fused_sparsification")
        if acc is not None and not acc.is_contiguous():
            raise ValueError("DistOpt.fused_sparsification: accumulation must be contiguous (it is updated in "
                             "place); pass a tensor of its own, not a strided view")
        if acc is not None and acc.numel != sum(r.numel for r in raws):
            raise ValueError(f"DistOpt.fused_sparsification: accumulation has {acc.numel} elements, the tensors "
                             f"{sum(r.numel for r in raws)}")
        self.reducer.sparse.reduce_group(raws, None, spars, bool(topK), corr=acc is not None, average=False,
                                         residual=acc)

    def update(self, param, grad) -> None:
        """grad /= world_size, then the wrapped optimizer's update (SINGA's DistOpt.update)."""
        g = _raw(grad, "update")
        _core.mul_scalar(g, 1.0 / self.world_size, out=g)
        p = param if isinstance(param, tensor.Tensor) else tensor.Tensor(data=param, requires_grad=False)
        self.opt.apply(self.opt.name_of(p), p, g)

    def wait(self) -> None:
        """Completes pending fused all-reduces (SINGA's API; the calls above already return complete)."""
        self._user.wait()
        self._user_half.wait()
