"""PowerSGD gradient compression as a communication hook (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical
Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019), with PyTorch's option names
(``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``).

For each bucket, every gradient with 2 or more dimensions whose compression pays is viewed as a matrix M
(n x m: its first axis by the rest) and replaced by a rank-r approximation of the ranks' average:

    M += e                    error feedback: what earlier approximations left out, this rank's own
    P = M Q                   Q (m x r): the last step's (warm start) orthogonalised, or random (the same
                              seed, so the same values, on every rank)
    P = sum over ranks of P   one all-reduce for every P of the bucket
    P = orthogonalise(P)      Gram-Schmidt over its columns (orthogonalization_epsilon added to each norm)
    Q = M^T P                 then one all-reduce (sum) for every Q of the bucket, Q /= world size
    M^ = P Q^T                the approximation of the average of the ranks' M
    e = M - M^                kept on this rank for the next step

Biases and other 1-dimensional gradients, and matrices whose compression would not save at least
``min_compression_rate`` times their size, are averaged uncompressed (one all-reduce per bucket, issued
with the P all-reduce). Before ``start_powerSGD_iter`` steps, the hook is the plain all-reduce (compression
is harmful early in training, when gradients change fast).

Everything runs with singa_lite tensor ops on the buffer's device (a GPU bucket is compressed on the GPU);
numpy only draws the initial Q, which must be the same bits on every rank and every device.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core, tensor
from ..tensor import Tensor
from .bucket import GradBucket
from .hook_state import HookFuture, HookState, resolve_state

__all__ = ["PowerSGDState", "powerSGD_hook", "orthogonalize"]


class PowerSGDState(HookState):
    """Options and memory of :func:`powerSGD_hook` (PyTorch's names and defaults).

    process_group: the Communicator to all-reduce over; None: each bucket's own.
    matrix_approximation_rank: r, the rank of the approximation (1 is often enough; 2-4 for harder tasks).
    start_powerSGD_iter: steps of plain all-reduce before compression starts (a step ends with the
        bucket whose ``is_last()`` is true).
    min_compression_rate: a matrix n x m is compressed only when n m > (n + m) r times this.
    use_error_feedback: carry each rank's approximation error into its next step (the paper's Algorithm 2;
        without it PowerSGD converges to a worse model).
    warm_start: start each step's power iteration from the last step's Q (one iteration per step then
        tracks the gradients' top subspace); otherwise a new random Q every step.
    orthogonalization_epsilon: added to each column's norm in Gram-Schmidt (0: none; a column whose norm is
        exactly 0 then stays 0 instead of becoming NaN).
    random_seed: the seed of the initial Qs (the same on every rank).

    Memory, per bucket index (rebuilt when the bucket's parameters change): the error of each compressed
    matrix and the Q of the last step. Counters: ``iter`` (steps seen), ``bytes_sent`` / ``bytes_plain`` /
    ``buckets`` (see HookState) and :meth:`compression_stats`."""

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0):
        who = "PowerSGDState"
        self.matrix_approximation_rank = _int(matrix_approximation_rank, 1, who, "matrix_approximation_rank")
        self.start_powerSGD_iter = _int(start_powerSGD_iter, 0, who, "start_powerSGD_iter")
        self.min_compression_rate = _real(min_compression_rate, who, "min_compression_rate", positive=True)
        self.use_error_feedback = _bool(use_error_feedback, who, "use_error_feedback")
        self.warm_start = _bool(warm_start, who, "warm_start")
        self.orthogonalization_epsilon = _real(orthogonalization_epsilon, who, "orthogonalization_epsilon")
        self.random_seed = _int(random_seed, 0, who, "random_seed")
        # Initial Qs: one seed drawn per bucket (per step without warm start), in bucket order: the same
        # sequence on every rank, since every rank sees the same buckets in the same order.
        self.rng = np.random.RandomState(self.random_seed)
        self.iter = 0
        self._buckets = {}  # bucket index -> _BucketMemory
        self.total_numel_before_compression = self.total_numel_after_compression = 0
        super().__init__(process_group)

    def compression_stats(self) -> tuple:
        """(compression rate, elements before, elements after) over the compressed steps so far, as PyTorch's
        ``PowerSGDState.compression_stats`` (elements of the whole buckets; 1-D gradients count on both sides)."""
        after = self.total_numel_after_compression
        return (self.total_numel_before_compression / after if after else 0.0,
                self.total_numel_before_compression, after)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """A step ends with its last bucket."""
        if bucket.is_last():
            self.iter += 1

    def __repr__(self):
        return (f"PowerSGDState(matrix_approximation_rank={self.matrix_approximation_rank}, "
                f"start_powerSGD_iter={self.start_powerSGD_iter}, min_compression_rate="
                f"{self.min_compression_rate}, use_error_feedback={self.use_error_feedback}, warm_start="
                f"{self.warm_start}, orthogonalization_epsilon={self.orthogonalization_epsilon}, random_seed="
                f"{self.random_seed}, iter={self.iter}, bytes_sent={self.bytes_sent}, bytes_plain="
                f"{self.bytes_plain})")


class _Matrix:
    """One compressed gradient: its place in the buffer, its matrix shape and rank, its P and Q places."""
    __slots__ = ("offset", "n", "m", "r", "p_offset", "q_offset", "e_offset")

    def __init__(self, offset, n, m, r, p_offset, q_offset, e_offset):
        self.offset, self.n, self.m, self.r = offset, n, m, r
        self.p_offset, self.q_offset, self.e_offset = p_offset, q_offset, e_offset


class _BucketMemory:
    """What PowerSGD keeps for one bucket index between steps, and the bucket's layout."""

    def __init__(self, signature, bucket: GradBucket, state: PowerSGDState):
        self.signature = signature
        buf = bucket.buffer()
        dtype, device = buf.dtype, buf.data.device
        self.matrices, self.plain = [], []  # plain: (offset, size, offset in the uncompressed buffer)
        p_total = q_total = e_total = u_total = 0
        for p, offset in zip(bucket.parameters(), bucket.offsets()):
            size = p.size()
            if p.ndim() >= 2 and size:
                n = p.shape[0]
                m = size // n
                r = min(n, m, state.matrix_approximation_rank)
                if n * m > (n + m) * r * state.min_compression_rate:
                    self.matrices.append(_Matrix(offset, n, m, r, p_total, q_total, e_total))
                    p_total, q_total, e_total = p_total + n * r, q_total + m * r, e_total + n * m
                    continue
            if size:
                self.plain.append((offset, size, u_total))
                u_total += size
        self.p = _zeros(p_total, dtype, device)
        self.q = _zeros(q_total, dtype, device)
        self.plain_buffer = _zeros(u_total, dtype, device) if u_total else None
        self.error = _zeros(e_total, dtype, device) if state.use_error_feedback and e_total else None
        self.q_ready = False  # False until a Q was drawn (warm start reuses it after)
        self.compressed_numel = e_total
        self.uncompressed_numel = u_total


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket):
    """The PowerSGD hook (see the module docstring): returns a handle whose wait() finishes the exchange and
    returns the bucket's buffer, holding the approximated average of the compressed gradients and the exact
    average of the others."""
    if not isinstance(state, PowerSGDState):
        raise TypeError(f"powerSGD_hook: state must be a PowerSGDState, got {type(state).__name__}; e.g. "
                        f"register_comm_hook(PowerSGDState(matrix_approximation_rank=1), powerSGD_hook)")
    group, _ = resolve_state(state, bucket, "powerSGD_hook")
    buf = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:  # plain all-reduce until compression starts
        state.maybe_increase_iter(bucket)
        state.count_bucket(buf.memsize(), buf.memsize())
        return group.all_reduce(buf, "avg", async_op=True)
    if not buf.dtype.is_floating:
        raise TypeError(f"powerSGD_hook: the bucket holds {buf.dtype.name} gradients; PowerSGD compresses "
                        f"floating gradients only (use allreduce_hook)")
    mem = _memory(state, bucket)
    state.maybe_increase_iter(bucket)
    if not mem.matrices:  # nothing pays to compress in this bucket: the plain average
        state.count_bucket(buf.memsize(), buf.memsize())
        return group.all_reduce(buf, "avg", async_op=True)

    work_buf = buf if buf.is_contiguous() else Tensor(data=buf.data.contiguous(), requires_grad=False)
    flat = work_buf.data.reshape([-1])
    world = group.world_size

    # The uncompressed gradients, packed and averaged while the matrices are being multiplied.
    plain_work = None
    if mem.plain_buffer is not None:
        for offset, size, at in mem.plain:
            _core.copy_(mem.plain_buffer.data.slice(0, at, at + size), flat.slice(0, offset, offset + size))
        plain_work = group.all_reduce(mem.plain_buffer, "avg", async_op=True)

    ms = [_view(flat, x.offset, x.n, x.m) for x in mem.matrices]
    ps = [_view(mem.p.data, x.p_offset, x.n, x.r) for x in mem.matrices]
    qs = [_view(mem.q.data, x.q_offset, x.m, x.r) for x in mem.matrices]
    es = ([_view(mem.error.data, x.e_offset, x.n, x.m) for x in mem.matrices] if mem.error is not None
          else [None] * len(ms))
    for m, e in zip(ms, es):
        if e is not None:
            tensor.add(m, e, ret=m)  # error feedback: this rank's M now includes what was left out before
    if state.warm_start and mem.q_ready:
        for q in qs:  # last step's Q, averaged (so the same on every rank): orthogonalised for stability
            orthogonalize(q, state.orthogonalization_epsilon)
    else:
        _random_q(mem, state, buf)
    for m, p, q in zip(ms, ps, qs):
        tensor.matmul(m, q, out=p)
    p_work = group.all_reduce(mem.p, "sum", async_op=True)

    sent = mem.p.memsize() + mem.q.memsize() + (mem.plain_buffer.memsize() if mem.plain_buffer is not None else 0)
    state.count_bucket(sent, buf.memsize())
    state.total_numel_before_compression += mem.compressed_numel + mem.uncompressed_numel
    state.total_numel_after_compression += (mem.p.size() + mem.q.size() + mem.uncompressed_numel)

    def finish():
        if plain_work is not None:
            plain_work.wait()
            for offset, size, at in mem.plain:
                _core.copy_(flat.slice(0, offset, offset + size), mem.plain_buffer.data.slice(0, at, at + size))
        p_work.wait()
        for m, p, q in zip(ms, ps, qs):
            orthogonalize(p, state.orthogonalization_epsilon)
            tensor.matmul(m.T(), p, out=q)
        group.all_reduce(mem.q, "sum")
        mem.q /= world  # Q of the average; kept as the next step's warm start
        for m, p, q, e in zip(ms, ps, qs, es):
            approx = tensor.matmul(p, q.T())
            if e is not None:
                tensor.sub(m, approx, ret=e)  # this rank's error: its M minus the shared approximation
            _core.copy_(m.data, approx.data)
        if work_buf is not buf:
            _core.copy_(buf.data, work_buf.data)
        return buf
    return HookFuture(finish)


def orthogonalize(matrix: Tensor, epsilon: float = 0.0) -> Tensor:
    """The columns of `matrix` (n x r) made orthonormal in place by Gram-Schmidt (modified: each column is
    normalised, then removed from the columns after it); epsilon is added to each norm (0: a column of
    norm exactly 0 stays 0). Returns matrix."""
    cols = matrix.shape[1]
    for i in range(cols):
        col = matrix[:, i:i + 1]
        norm = tensor.sqrt(tensor.sum(col * col))  # a 0-d tensor: no copy to the host on a GPU
        # A zero column (an unused layer's gradient) would divide 0 by 0: divide by 1 there instead.
        norm = norm + epsilon if epsilon else norm + tensor.eq(norm, 0)
        tensor.div(col, norm, ret=col)
        if i + 1 < cols:
            rest = matrix[:, i + 1:]
            tensor.sub(rest, tensor.sum(col * rest, axis=0, keepdims=True) * col, ret=rest)
    return matrix


# ----------------------------------------------------------------------------------------- helpers
def _memory(state: PowerSGDState, bucket: GradBucket) -> _BucketMemory:
    """The bucket index's memory, rebuilt when the bucket now holds other parameters (a reducer that rebuilt
    its buckets): error and warm start belong to the gradients they were computed from."""
    buf = bucket.buffer()
    signature = (tuple((id(p), tuple(p.shape)) for p in bucket.parameters()), tuple(bucket.offsets()),
                 buf.size(), buf.dtype, str(buf.data.device))
    mem = state._buckets.get(bucket.index())
    if mem is None or mem.signature != signature:
        end = max((o + p.size() for p, o in zip(bucket.parameters(), bucket.offsets())), default=0)
        if end > buf.size():
            raise ValueError(f"powerSGD_hook: bucket {bucket.index()}'s parameters span {end} elements but its "
                             f"buffer has {buf.size()}")
        mem = state._buckets[bucket.index()] = _BucketMemory(signature, bucket, state)
    return mem


def _random_q(mem: _BucketMemory, state: PowerSGDState, buf: Tensor) -> None:
    # numpy, not the core's generator: the values must be the same bits on every rank, whatever its device
    # (a GPU's generator differs from the CPU's), and this runs once per bucket with warm start.
    seed = state.rng.randint(1_000_000_000)
    values = np.random.default_rng(seed).standard_normal(mem.q.size())
    _core.copy_(mem.q.data, tensor.from_numpy(values, buf.device).data)  # cast to the buffer's dtype
    mem.q_ready = True


def _view(flat: _core.Tensor, offset: int, n: int, m: int) -> Tensor:
    """Elements [offset, offset + n m) of a flat contiguous tensor as an n x m matrix, sharing its memory."""
    return Tensor(data=flat.slice(0, offset, offset + n * m).reshape([n, m]), requires_grad=False)


def _zeros(n: int, dtype, device) -> Tensor:
    raw = _core.Tensor([n], dtype, device)
    _core.fill_(raw, 0)
    return Tensor(data=raw, requires_grad=False)


def _int(value, lo: int, who: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise ValueError(f"{who}: {name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _real(value, who: str, name: str, positive: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"{who}: {name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _bool(value, who: str, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{who}: {name} must be True or False, got {value!r}")
    return bool(value)
