"""What crosses the wire in a data-parallel step: one strategy object per way, each owning its state.

- :class:`PlainExchange`: gradients averaged in fused buckets, in their own dtype (``backward_and_update``);
- :class:`HalfExchange`: the same with float16 or bfloat16 on the wire (``backward_and_update_half``);
- :class:`HookExchange`: the same buckets, each reduced by a user's comm hook (``register_comm_hook``);
- :class:`PartialExchange`: one partition of the parameter *values* averaged per step, round robin
  (``backward_and_partial_update``); its state is the next partition;
- :class:`SparseExchange`: only the significant entries of the gradients, as (index, value) pairs
  (``backward_and_sparse_update``); its state is the error-feedback residuals, which a checkpoint stores through
  :meth:`SparseExchange.entries` and friends.

The three fused strategies are Fusers (fusion.py): a pass is ``begin``, ``push`` as gradients come out of backward
(buckets leave while backward runs), ``finish``. The reducer (reducer.py) picks one per step; partial and sparse
run after the whole backward pass, so they are not fused passes.

Comm hooks replace the plain exchange only: half, partial and sparse already decide what crosses the wire, so a
DistOpt with a hook refuses them (``parallel.hooks`` ships hooks that compress instead).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core, tensor
from ..raw import from_host, to_host, zeros
from .bucket import GradBucket, take_result
from .fusion import Fuser

CTensor = _core.Tensor
_CPU = _core.Device("cpu")

__all__ = ["PlainExchange", "HalfExchange", "HookExchange", "PartialExchange", "SparseExchange", "wire_dtype",
           "check_spars", "partitions"]


class PlainExchange(Fuser):
    """Fused buckets averaged over the ranks ("avg"), each gradient in its own dtype."""

    name = "plain"

    def __init__(self, comm, buff_elems: int):
        super().__init__(comm, buff_elems, op="avg")


class HalfExchange(Fuser):
    """Fused buckets averaged over the ranks in a 16-bit float on the wire (the communicator divides before
    it sums, so the exchange cannot overflow where the float32 one would not)."""

    name = "half"

    def __init__(self, comm, buff_elems: int, dtype):
        super().__init__(comm, buff_elems, wire_dtype=dtype, op="avg")


class HookExchange(Fuser):
    """Fused buckets, each handed to ``hook(state, bucket)`` (a :class:`~.bucket.GradBucket`) instead of the
    plain all-reduce. The hook returns the averaged buffer, or a handle whose ``wait()`` returns it; the result
    is checked (a tensor of the buffer's shape and dtype) and copied into the buffer unless it is the buffer.
    A bucket is handed over once the next gradient (or the end of backward) shows whether it is the last."""

    name = "hook"

    def __init__(self, comm, buff_elems: int, state, hook):
        super().__init__(comm, buff_elems, op="avg", reduce=self._call)
        self.state, self.hook = state, hook

    def _call(self, region: CTensor, params, offsets, index: int, last: bool):
        buffer = tensor.from_raw_tensor(region)
        result = self.hook(self.state, GradBucket(index, buffer, params, last, self.comm, offsets))
        if callable(getattr(result, "wait", None)):
            return _HookWork(self, result, buffer)
        take_result(result, buffer, self.hook)  # a result already there: checked now, where the hook returned it
        return _Done(buffer)


class _HookWork:
    __slots__ = ("_x", "_handle", "_buffer")

    def __init__(self, x: HookExchange, handle, buffer):
        self._x, self._handle, self._buffer = x, handle, buffer

    def wait(self):
        take_result(self._handle.wait(), self._buffer, self._x.hook, waited=True)
        return self._buffer


class _Done:
    __slots__ = ("_buffer",)

    def __init__(self, buffer):
        self._buffer = buffer

    def wait(self):
        return self._buffer


def wire_dtype(half):
    """backward()'s half: False -> None (each gradient's own dtype), True -> float16, or a 16-bit float dtype."""
    if half is False or half is None:
        return None
    if half is True:
        return tensor.float16
    if half in (tensor.float16, tensor.bfloat16):
        return half
    raise ValueError(f"DistOpt: the wire dtype of a half exchange must be tensor.float16 or tensor.bfloat16, "
                     f"got {half!r}")


# ---------------------------------------------------------------- partial: parameter values, round robin
class PartialExchange:
    """Every rank updates with its own gradients; then one partition of the parameter values (about
    `threshold` elements, as SINGA forms them) is averaged, the next one at the next step. State: ``next``, the
    partition the next step averages (SINGA's ``DistOpt.partial``)."""

    name = "partial"

    def __init__(self):
        self.next = 0

    def average_next(self, params, threshold: int, average_values) -> None:
        """Averages the next partition of `params` with average_values(params, threshold)."""
        parts = partitions(params, threshold, size=lambda p: p.data.numel)
        if parts:
            average_values(parts[self.next % len(parts)], threshold)
            self.next = (self.next + 1) % len(parts)

    def state(self) -> int:
        return int(self.next)

    def set_state(self, value: int) -> None:
        self.next = int(value)


def partitions(items, threshold: int, size) -> list:
    """Consecutive groups as SINGA forms them: an item larger than threshold alone; smaller ones gathered
    until the group passes threshold. size(item) -> elements."""
    groups, current, acc = [], [], 0
    for x in items:
        n = size(x)
        if n > threshold:
            groups.append([x])
            continue
        current.append(x)
        acc += n
        if acc > threshold:
            groups.append(current)
            current, acc = [], 0
    if current:
        groups.append(current)
    return groups


# ---------------------------------------------------------------- sparse: (index, value) pairs
def check_spars(spars, topK) -> float:
    if isinstance(spars, bool) or not isinstance(spars, numbers.Real) or not math.isfinite(spars):
        raise ValueError(f"DistOpt: spars must be a number, got {spars!r}")
    if topK and not 0 < spars <= 1:
        raise ValueError(f"DistOpt: with topK=True, spars is the fraction of entries sent, in (0, 1]; got {spars}")
    if not topK and spars < 0:
        raise ValueError(f"DistOpt: with topK=False, spars is the magnitude threshold, >= 0; got {spars}")
    return float(spars)


class SparseExchange:
    """Only the significant gradient entries travel (|g| >= spars, or the exact top ``ceil(spars * n)``
    magnitudes with topK), as (index, value) pairs gathered from every rank. State: ``residuals``, {tuple of
    parameter names: CTensor}, what was not sent (error feedback, ``corr=True``), added next time. Residuals
    differ per rank."""

    name = "sparse"

    def __init__(self, comm):
        self.comm = comm
        self.residuals = {}

    def exchange(self, triples, threshold: int, spars: float, topK: bool, corr: bool,
                 per_parameter: bool = False) -> list:
        """Averages the gradients of (name, param, grad) triples in place, group by group (groups of about
        `threshold` elements). Returns the new residuals, for commit() once the step is known to apply.
        per_parameter: residuals keyed by each parameter's name alone (a group's residual is the concatenation
        of its members'), for groups whose members change from step to step (find_unused_parameters)."""
        groups = partitions(triples, threshold, size=lambda tr: tr[2].data.numel)
        if not (per_parameter and corr):
            return [self.reduce_group([g.data for _, _, g in group], [n for n, _, _ in group], spars, topK, corr,
                                      average=True)
                    for group in groups]
        out = []
        for group in groups:
            raws = [g.data for _, _, g in group]
            own = [self._residual((n,), g.data.numel, g.data.dtype, g.data.device) for n, _, g in group]
            res = _core.concat([r.reshape([r.numel]) for r in own], 0)  # a copy: updated in place below
            self.reduce_group(raws, [n for n, _, _ in group], spars, topK, corr, average=True, residual=res)
            off = 0
            for (n, _, _), r in zip(group, own):
                out.append(((n,), res.slice(0, off, off + r.numel, 1)))
                off += r.numel
        return out

    def commit(self, new_residuals) -> None:
        for key, res in new_residuals:
            if key is not None:
                self.residuals[key] = res

    def reduce_group(self, raws, names, spars, topK, corr, average, residual=None) -> tuple:
        """Sparse all-reduce of the tensors as one flat vector, written back in place, all on the tensors'
        device (C++ kernels: the selection, the gather and the adds of (index, value) pairs). Returns (key,
        new residual) for the caller to keep once the step is known to apply ((None, None) without error
        feedback); a residual given (fused_sparsification's accumulation) is updated in place instead."""
        where = raws[0].device if raws else _CPU
        dtype = raws[0].dtype if raws else tensor.float32
        if any(r.dtype != dtype or r.device != where for r in raws):
            raise TypeError("DistOpt: the tensors of one sparse group must share one dtype and device, got "
                            + ", ".join(f"{r.dtype.name} on {r.device}" for r in raws))
        n = sum(r.numel for r in raws)
        flat = _core.concat([r.reshape([r.numel]) for r in raws], 0) if raws else zeros([0], dtype, where)
        key = None
        if corr:
            if residual is not None:
                res = residual.reshape([n])
            else:
                key = tuple(names)
                res = self._residual(key, n, dtype, where)
            _core.add(flat, res, out=flat)
        idx = _core.select_significant(flat, spars, topK)
        vals = _core.take(flat, idx)
        dense = self._sum(idx, vals, n, dtype, where, 1.0 / self.comm.world_size if average else None)
        if corr:  # what was not sent: flat (a copy: concat) with the sent entries set to exactly 0
            _core.index_add_(flat, idx, _core.neg(vals))
            if residual is not None:
                _core.copy_(res, flat)
        off = 0
        for r in raws:
            _core.copy_(r, dense.slice(0, off, off + r.numel, 1).reshape(list(r.shape)))
            off += r.numel
        return (key, flat) if key is not None else (None, None)

    def _residual(self, key, n: int, dtype, where) -> CTensor:
        """The error-feedback residual of a group of parameters, read only (zeros the first time; moved to the
        gradients' device and dtype after set_state, which restores residuals on the host)."""
        res = self.residuals.get(key)
        if res is None or res.numel != n:
            return zeros([n], dtype, where)
        if res.device != where or res.dtype != dtype:
            return res.reshape([n]).cast(dtype).to(where) if res.device.is_cpu() else res.to(where).cast(dtype)
        return res

    def _sum(self, idx: CTensor, vals: CTensor, n: int, dtype, where, scale=None) -> CTensor:
        """Sum over ranks of the vectors holding vals at idx and zero elsewhere, each first multiplied by
        scale (1 / world size for an average: a sum of the ranks' shares cannot overflow where their average
        does not, as the fused half exchange divides before its sum): every rank's (index, value) pairs are
        all-gathered (indices as int32 when they fit), then added in rank order, so every rank gets the same
        result. 16-bit values are scaled and added in float32 and the result cast back."""
        comm = self.comm
        counts = to_host(comm.all_gather(from_host(np.array([idx.numel], np.int64), where)))[:, 0]
        width = max(int(counts.max()), 1)
        wire = tensor.int32 if n < 2 ** 31 else tensor.int64
        my_idx, my_val = zeros([width], wire, where), zeros([width], dtype, where)
        if idx.numel:
            _core.copy_(my_idx.slice(0, 0, idx.numel, 1), idx)
            _core.copy_(my_val.slice(0, 0, idx.numel, 1), vals)
        all_idx, all_val = comm.all_gather(my_idx), comm.all_gather(my_val)
        wide = tensor.float32 if dtype in (tensor.float16, tensor.bfloat16) else dtype
        if wide != dtype:
            all_val = all_val.cast(wide)
        if scale is not None:
            _core.mul_scalar(all_val, scale, out=all_val)
        dense = zeros([n], wide, where)
        for r in range(comm.world_size):
            c = int(counts[r])
            if c:
                rank_idx = all_idx.select(0, r).slice(0, 0, c, 1).cast(tensor.int64)
                _core.index_add_(dense, rank_idx, all_val.select(0, r).slice(0, 0, c, 1))
        return dense if wide == dtype else dense.cast(dtype)

    # ----- state: DistOpt.get_states()["residuals"] and the checkpoint's per-rank entries
    def state(self) -> dict:
        """{tuple of parameter names: numpy array}, copies on the host."""
        return {tuple(k): np.array(to_host(v)) for k, v in self.residuals.items()}

    @staticmethod
    def parse_state(value, who: str) -> dict:
        """What state() returned (keys may be one name or a tuple of names), as {tuple: CTensor} for
        set_state(); TypeError on anything else, before anything changes."""
        if not isinstance(value, dict):
            raise TypeError(f"{who}: residuals must be a dict {{tuple of parameter names: array}}, got "
                            f"{type(value).__name__}")
        residuals = {}
        for k, v in value.items():
            names = (k,) if isinstance(k, str) else tuple(k)
            if not all(isinstance(n, str) for n in names):
                raise TypeError(f"{who}: residual keys are tuples of parameter names, got {k!r}")
            residuals[names] = CTensor.from_buffer(np.array(v, copy=True))
        return residuals

    def set_state(self, parsed: dict) -> None:
        self.residuals = parsed

    @staticmethod
    def entries(state: dict) -> list:
        """state() as a checkpoint stores it: [{"names": [...], "values": array}] (its keys are tuples)."""
        return [{"names": list(k), "values": np.asarray(v)} for k, v in state.items()]

    @staticmethod
    def from_entries(entries) -> dict:
        """entries() back to a state for parse_state()."""
        return {tuple(e["names"]): e["values"] for e in entries}

    @staticmethod
    def check_entries(entries) -> bool:
        """Whether `entries` is a list of well-formed checkpoint entries."""
        return isinstance(entries, list) and all(
            isinstance(e, dict) and isinstance(e.get("values"), np.ndarray) for e in entries)

    @staticmethod
    def merge_entries(per_rank) -> list:
        """The entries of a job resumed on another number of ranks: each group's residual averaged over the
        saved ranks (in float64, then in its dtype). per_rank: each saved rank's entries, well formed. A
        ValueError names a group whose shapes differ between ranks."""
        sums, dtypes = {}, {}
        for entries in per_rank:
            for e in entries:
                key = tuple(e.get("names", ()))
                if key in sums and sums[key].shape != e["values"].shape:
                    raise ValueError(f"the ranks' residuals of {list(key)} differ in shape")
                sums[key] = sums.get(key, 0) + e["values"].astype(np.float64)
                dtypes[key] = e["values"].dtype
        count = len(per_rank)
        return [{"names": list(k), "values": (v / count).astype(dtypes[k])} for k, v in sums.items()]
