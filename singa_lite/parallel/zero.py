"""ZeRO sharding for DistOpt (``DistOpt(opt, zero_stage=1|2)``): each rank keeps the optimizer state of 1/P of
the parameters (stage 1) and, at stage 2, only the averaged gradients of those parameters too, as DeepSpeed's
ZeRO stages 1 and 2, PyTorch's ZeroRedundancyOptimizer and FSDP's SHARD_GRAD_OP. Parameters stay whole on every
rank (that would be stage 3).

The shard plan (:class:`ShardPlan`). Whole parameters, not flat ranges: the optimizer contract
(optim/optimizer.py) updates one whole parameter per ``apply``, and layer-wise optimizers (LAMB, LARS) need a
parameter's whole norm, so a parameter cut between two ranks would need one more collective per parameter and
per-slice optimizer state that no checkpoint of stage 0 could read. The parameters, in the order of the first
step's backward pass (the order of the buckets, the same on every rank), are cut into P *contiguous* runs balanced
by bytes: a parameter whose byte midpoint falls in [r/P, (r+1)/P) of the total belongs to rank r. A rank's share
is then within the largest parameter of total/P; a rank may own nothing (fewer parameters than ranks, or one
parameter larger than the rest): those are the uneven tails, and every code path below allows an empty shard.
Contiguous runs keep the stage-2 buckets of one owner each (a bucket is cut where the owner changes: at most P - 1
extra buckets per step).

A step, stage 1: the gradients are averaged as at stage 0 (every exchange: plain, half wire, comm hooks,
hierarchical, NCCL, with overlap and accumulation), the owner of each parameter updates it (its optimizer state,
and with amp.MixedPrecision its float32 master, exist on the owner only), then every parameter is broadcast from
its owner in fused chunks of up to ``buffSize`` elements (an all-gather whose pieces differ in size), packed
in the fusion buffer the exchange left idle (no buffer of its own unless the wire's dtype differs). Stage 2:
the fused buckets are *reduced* to their owner (``Communicator.reduce``, "avg") instead of all-reduced, so a
rank ends the exchange with the averaged gradients of its shard only; the gradients of other ranks' parameters
are dropped as soon as their bucket has left (in overlapped steps), and ``PendingStep.synchronize()`` returns
this rank's pairs. Whole-parameter owners make a reduce per bucket, rather than a reduce-scatter of each
bucket, the collective that fits: a bucket belongs to one rank.

Clipping at stage 2 (``pending.clip_grad_norm`` / ``DistOpt.clip_grad_norm``): the global norm is the ranks'
partial sums all-reduced (float64), the same on every rank. ``opt.clip_grad_norm(pending.synchronize(), ...)``
on the pairs would see this rank's shard only; use the step's method.

Checkpoints: ``DistOpt.get_states()`` holds this rank's shard (``zero_stage`` says so); checkpoint.save writes
each rank's shard into its own file (the shards differ between ranks), and checkpoint.load merges the saved
shards (:func:`merge_optimizer_states`) into the whole state, which loads into any stage and any number of
ranks: a sharded DistOpt keeps the part it owns once its plan is known (at its first step).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core, tensor
from ..raw import from_host, to_host
from .fusion import Fuser

CTensor = _core.Tensor

__all__ = ["ShardPlan", "Zero", "ShardedExchange", "check_stage", "merge_optimizer_states", "state_dicts",
           "optimizer_state_bytes"]

STAGES = (0, 1, 2)


def check_stage(stage, who: str) -> int:
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or int(stage) not in STAGES:
        raise ValueError(f"{who}: zero_stage must be 0 (every rank keeps everything), 1 (optimizer state sharded) "
                         f"or 2 (gradients sharded too), got {stage!r}")
    return int(stage)


class ShardPlan:
    """Which rank owns each parameter: contiguous runs of `names` (in order) balanced by bytes (`nbytes`, one
    per name) over `world_size` ranks; see the module."""

    def __init__(self, names, nbytes, world_size: int):
        names, nbytes = list(names), [int(b) for b in nbytes]
        if len(names) != len(nbytes) or len(set(names)) != len(names):
            raise ValueError(f"ShardPlan: expected distinct names with one size each, got {len(names)} names "
                             f"({len(set(names))} distinct) and {len(nbytes)} sizes")
        self.names, self.world_size = names, int(world_size)
        total = sum(nbytes)
        self.owner, self.bytes_per_rank = {}, [0] * self.world_size
        start = 0
        for name, b in zip(names, nbytes):
            mid2 = 2 * start + b  # twice the byte midpoint: integers, so every rank decides alike
            r = min(self.world_size - 1, mid2 * self.world_size // (2 * total)) if total else 0
            self.owner[name] = r
            self.bytes_per_rank[r] += b
            start += b
        self.nbytes = dict(zip(names, nbytes))

    def owned(self, rank: int) -> list:
        """The names rank `rank` owns, in plan order (possibly none)."""
        return [n for n in self.names if self.owner[n] == rank]

    def __repr__(self):
        return f"ShardPlan({len(self.names)} parameters over {self.world_size} ranks, bytes {self.bytes_per_rank})"


# ---------------------------------------------------------------- optimizer state, wherever it lives
def state_dicts(opt):
    """(tensor dicts, scalar dicts) of `opt`'s per-parameter state, {param_name: ...} each, the live
    dictionaries: the optimizer's slots, and for a wrapper (amp.MixedPrecision: ``masters`` and the wrapped
    ``opt``) the wrapped optimizer's too."""
    tensors, scalars = [], []
    seen = set()
    while opt is not None and id(opt) not in seen:
        seen.add(id(opt))
        tensors += [d for d in opt.state_tensors().values() if isinstance(d, dict)]
        scalars += [d for d in opt.state_scalars().values() if isinstance(d, dict)]
        if isinstance(getattr(opt, "masters", None), dict):
            tensors.append(opt.masters)
        inner = getattr(opt, "opt", None)
        opt = inner if inner is not None and hasattr(inner, "state_tensors") else None
    return tensors, scalars


def optimizer_state_bytes(opt) -> int:
    """Bytes of the per-parameter state tensors `opt` holds now (its slots, amp's masters, a wrapped one's)."""
    tensors, _ = state_dicts(opt)
    return sum(t.data.nbytes for d in tensors for t in d.values())


def merge_optimizer_states(per_rank: list) -> dict:
    """The whole optimizer state from the shards saved by each rank (their get_states(), rank 0 first):
    per-parameter dicts are joined (a name in several shards: the first one's), everything else (the step
    counter, amp's loss scale) is rank 0's. A shard that is not a dict raises ValueError."""
    if not per_rank or not all(isinstance(s, dict) for s in per_rank):
        raise ValueError("the saved optimizer shards are not all dicts of optimizer states")
    merged = {}
    for key, value in per_rank[0].items():
        if isinstance(value, dict):
            joined = {}
            for shard in per_rank:
                part = shard.get(key, {})
                if not isinstance(part, dict):
                    raise ValueError(f"the saved optimizer shards disagree on {key!r}: a dict on rank 0, "
                                     f"{type(part).__name__} on another")
                for name, v in part.items():
                    joined.setdefault(name, v)
            merged[key] = joined
        else:
            merged[key] = value
    return merged


# ---------------------------------------------------------------- stage 2: buckets reduced to their owner
class ShardedExchange(Fuser):
    """Fused buckets averaged into the rank that owns their parameters (``reduce``, "avg"), in the gradients'
    dtype or `wire` (float16 / bfloat16). A bucket holds parameters of one owner: the open bucket leaves when
    the next gradient belongs to another rank. Buckets of other ranks are not written back (this rank's
    gradients of them are dropped once sent)."""

    name = "sharded"

    def __init__(self, comm, buff_elems: int, zero: "Zero", wire=None):
        super().__init__(comm, buff_elems, wire_dtype=wire, op="avg")
        self.zero, self._root = zero, None

    def push(self, t, name=None, param=None) -> None:
        # other ranks' gradients whose reduce is done may go now; at most a buffer's worth of them is held (the
        # oldest waited for beyond that), so a rank's gradient memory stays near its shard's plus one bucket
        self.reap(self.buff_elems * t.itemsize)
        owner = self.zero.owner_of(name)
        if owner != self._root:
            self.send()  # the open bucket(s) belong to the previous owner
            self._root = owner
        super().push(t, name, param)

    def start(self, region):
        return self.comm.reduce(region, self._root, self.op, async_op=True)

    def writes_back(self) -> bool:
        return self._root == self.comm.rank

    def add(self, t, param=None) -> None:
        super().add(t, param)
        if not self.writes_back():  # copied into the bucket: another rank's gradient is not needed here again
            self.forget_last_member(t.dtype)


# ---------------------------------------------------------------- the sharded step
class Zero:
    """A DistOpt's sharding at `stage` (1 or 2) over `comm`, updating with `opt`: the plan, the parameters'
    broadcast from their owners, stage 2's exchanges and clipping, and what memory_report counts."""

    def __init__(self, stage: int, comm, opt, buff_elems: int, who: str = "DistOpt", fusers=list):
        self.stage, self.comm, self.opt, self.buff_elems, self.who = stage, comm, opt, int(buff_elems), who
        self.fusers = fusers  # () -> the owner's Fusers, whose idle buffers the broadcast chunks borrow
        self.rank, self.world_size = comm.rank, comm.world_size
        self.plan = None
        self._trimmed = False  # after_first_update() done
        self.device = _core.Device("cpu")
        self._exchanges = {}  # wire dtype name (None: the gradients' own) -> ShardedExchange
        self._gather = {}  # dtype -> flat CTensor of buff_elems elements: the broadcast chunks

    @property
    def ready(self) -> bool:
        return self.plan is not None

    def ensure_plan(self, named) -> None:
        """The plan from (name, param) pairs in backward order, made once (at the first step), after which the
        state of parameters this rank does not own (a whole state loaded from a checkpoint) is dropped. Later
        steps must name parameters of the plan."""
        if self.plan is None:
            self.plan = ShardPlan([n for n, _ in named], [p.data.nbytes for _, p in named], self.world_size)
            self.device = named[0][1].data.device if named else _core.Device("cpu")  # where votes live
            self.prune()
            return
        unknown = [n for n, _ in named if n not in self.plan.owner]
        if unknown:
            raise ValueError(f"{self.who}: parameters {unknown} were not in the first step's backward pass, so "
                             f"zero_stage={self.stage} assigned them to no rank; every step must train the same "
                             f"parameters (use zero_stage=0 for a model whose parameters change)")

    def owner_of(self, name) -> int:
        try:
            return self.plan.owner[name]
        except (AttributeError, KeyError):
            raise ValueError(f"{self.who}: no rank owns parameter {name!r} (zero_stage={self.stage}: the shard "
                             f"plan is made at the first step from its parameters)") from None

    def owns(self, name) -> bool:
        return self.owner_of(name) == self.rank

    def prune(self) -> None:
        """Drops the optimizer state of parameters other ranks own."""
        tensors, scalars = state_dicts(self.opt)
        for d in tensors + scalars:
            for name in [n for n in d if n in self.plan.owner and self.plan.owner[n] != self.rank]:
                del d[name]

    def owned(self, triples) -> list:
        return [tr for tr in triples if self.owns(tr[0])]

    # ----- stage 2
    def exchange(self, wire=None) -> ShardedExchange:
        key = None if wire is None else wire.name
        if key not in self._exchanges:
            self._exchanges[key] = ShardedExchange(self.comm, self.buff_elems, self, wire)
        return self._exchanges[key]

    def exchanges(self) -> list:
        return list(self._exchanges.values())

    def keep(self, name, g):
        """What a stage-2 step keeps of a gradient once its bucket has left: this rank's own only."""
        return g if self.stage < 2 or self.owns(name) else None

    def clip_grad_norm(self, pairs, max_norm, norm_type=2.0) -> float:
        """Clips this rank's shard of the averaged gradients by the global norm over every rank's shard;
        returns that norm (the same on every rank). pairs: this rank's (param, grad)."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm > 0:
            raise ValueError(f"clip_grad_norm: max_norm must be a number > 0, got {max_norm!r}")
        if isinstance(norm_type, str) and norm_type.lower() == "inf":
            norm_type = math.inf
        if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or not norm_type > 0:
            raise ValueError(f"clip_grad_norm: norm_type must be a number > 0 or 'inf', got {norm_type!r}")
        p = float(norm_type)
        grads = [g.data for _, g in pairs]
        local = 0.0
        for g in grads:
            if g.numel == 0:
                continue
            g32 = g if g.dtype in (tensor.float32, tensor.float64) else g.cast(tensor.float32)
            if p == math.inf:
                local = max(local, _host(_core.max(_core.abs(g32))))
            elif p == 2.0:
                local += _host(_core.sum(_core.square(g32)))
            else:
                local += _host(_core.sum(_core.pow_scalar(_core.abs(g32), p)))
        where = grads[0].device if grads else self.device
        total = from_host(np.array([local], np.float64), where)
        self.comm.all_reduce(total, "max" if p == math.inf else "sum")
        total = float(to_host(total)[0])
        norm = total if p in (math.inf, 1.0) or not math.isfinite(total) else total ** (1.0 / p)
        factor = float(max_norm) / (norm + 1e-6)  # clip_grad_norm's factor (optim/clip.py), as PyTorch's
        if math.isfinite(norm) and factor < 1.0:
            for g in grads:
                _core.mul_scalar(g, factor, out=g)
        return norm

    # ----- after the update: every parameter from its owner
    def after_first_update(self) -> None:
        """Stage 2: the first step held every gradient (its exchange waits for the whole backward pass, as the
        plan is made from it); later steps hold this rank's shard, so the allocator's cached blocks of that
        first step are returned to the system (the GPU's driver) instead of staying in the process."""
        if self.stage == 2 and not self._trimmed:
            self._trimmed = True
            if self.device.is_cpu():
                from .._runtime.malloc import trim

                _core.empty_cache()
                trim()  # freed blocks below the top of glibc's heap stay in the process otherwise
            else:
                _core.cuda_empty_cache(self.device.index)

    def broadcast_parameters(self, named) -> None:
        """Every rank gets each parameter's values from its owner: per owner, chunks of up to buff_elems
        elements of one dtype, one broadcast each (a parameter larger than that goes alone, in place)."""
        for owner in range(self.world_size):
            chunk, used, dtype = [], 0, None
            for name, p in named:
                if self.plan.owner.get(name) != owner:
                    continue
                t = p.data
                if t.numel > self.buff_elems or not t.is_contiguous():
                    whole = t if t.is_contiguous() else t.contiguous()
                    self.comm.broadcast(whole, owner)
                    if whole is not t:
                        _core.copy_(t, whole)
                    continue
                if chunk and (t.dtype != dtype or used + t.numel > self.buff_elems):
                    self._send_chunk(chunk, dtype, owner)
                    chunk, used = [], 0
                chunk.append(t)
                used += t.numel
                dtype = t.dtype
            if chunk:
                self._send_chunk(chunk, dtype, owner)

    def _send_chunk(self, tensors, dtype, owner: int) -> None:
        where = tensors[0].device
        buf = next((b for b in (x.idle_buffer(dtype, where) for x in self.fusers()) if b is not None), None)
        if buf is None:  # no fusion buffer of this dtype (a 16-bit wire): one of its own, kept
            buf = self._gather.get(dtype)
            if buf is None or buf.device != where:
                buf = self._gather[dtype] = CTensor([self.buff_elems], dtype, where)
        n = sum(t.numel for t in tensors)
        region = buf.slice(0, 0, n, 1)
        off = 0
        if self.rank == owner:
            for t in tensors:
                _core.copy_(region.slice(0, off, off + t.numel, 1), t.reshape([t.numel]))
                off += t.numel
        self.comm.broadcast(region, owner)
        if self.rank != owner:
            for t in tensors:
                _core.copy_(t, region.slice(0, off, off + t.numel, 1).reshape(list(t.shape)))
                off += t.numel

    @property
    def gather_bytes(self) -> int:
        """Bytes of the parameter broadcast's chunk buffers (stage 2's exchange buffers are the reducer's)."""
        return sum(b.nbytes for b in self._gather.values())


def _host(t) -> float:
    return float(to_host(t).reshape(-1)[0])
