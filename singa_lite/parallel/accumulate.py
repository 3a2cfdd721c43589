"""Gradient accumulation for DistOpt: ``DistOpt(..., backward_passes_per_step=k)`` and ``with
dist_opt.no_sync():`` (Horovod's and PyTorch DDP's names).

A backward pass that does not synchronise adds its gradients into a per-parameter running sum on this rank
and sends nothing; the pass that synchronises adds the sum into its own gradients as they come out of
backward, divides by the number of passes gathered (``average_accumulated=True``, the default) and hands
them to the usual exchange. So ``k`` micro-batches of a mean-reduced loss on each of ``P`` ranks train as
one process on the whole batch of ``P * k`` micro-batches, with no change to the loss, and the ranks
exchange once per ``k`` passes (``bytes_sent`` falls by ``k``). ``average_accumulated=False`` sums instead,
as PyTorch DDP's ``no_sync`` and Horovod's ``backward_passes_per_step`` do: divide the loss by ``k`` then.

Which pass synchronises: with ``backward_passes_per_step=k``, every k-th backward pass; inside ``no_sync()``,
none; the first pass after leaving ``no_sync()`` synchronises when the passes gathered reach k (with k=1,
always). Every rank must make the same passes (it is the same rule on every rank).
"""
from __future__ import annotations

import numbers

from .. import _core
from ..tensor import Tensor

CTensor = _core.Tensor


def check_passes(k, who: str) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"{who}: backward_passes_per_step must be an int >= 1 (1: exchange at every backward "
                         f"pass), got {k!r}")
    return int(k)


class Accumulator:
    """This rank's running sums of gradients between two synchronising passes."""

    def __init__(self, passes_per_step: int, average: bool = True):
        self.passes_per_step = passes_per_step
        self.average = bool(average)
        self.no_sync_depth = 0
        self.passes = 0  # passes added since the last synchronising pass
        self._sums = {}  # parameter name -> [param, CTensor sum], in order of first appearance

    @property
    def empty(self) -> bool:
        return self.passes == 0

    def next_pass_syncs(self) -> bool:
        """Whether the coming backward pass is one that exchanges (the same answer on every rank)."""
        return self.no_sync_depth == 0 and self.passes + 1 >= self.passes_per_step

    def add(self, triples) -> None:
        """Adds one local pass's (name, param, grad) to the sums (grads are not kept: they are copied)."""
        for name, p, g in triples:
            entry = self._sums.get(name)
            if entry is None:
                self._sums[name] = [p, g.data.clone()]
            else:
                _core.add(entry[1], g.data, out=entry[1])
        self.passes += 1

    def merge(self, name: str, grad: CTensor) -> None:
        """In place: grad becomes (grad + the sum kept for `name`) / passes (or the plain sum). Called for
        each gradient of the synchronising pass as it comes out of backward."""
        entry = self._sums.get(name)
        if entry is not None:
            _core.add(grad, entry[1], out=grad)
        if self.average and self.passes:
            _core.mul_scalar(grad, 1.0 / (self.passes + 1), out=grad)

    def leftovers(self, seen) -> list:
        """(name, param, grad) for parameters that had gradients in the gathered passes but none in the
        synchronising one (a branch not taken this time): their sums, scaled as merge() scales."""
        out = []
        for name, (p, total) in self._sums.items():
            if name not in seen:
                g = total.clone()
                if self.average:
                    _core.mul_scalar(g, 1.0 / (self.passes + 1), out=g)
                out.append((name, p, Tensor(data=g, requires_grad=False)))
        return out

    def clear(self) -> None:
        self._sums.clear()
        self.passes = 0
