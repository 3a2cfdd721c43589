"""DistOpt: SINGA's distributed optimizer. It wraps any optimizer written to the contract in opt.py and
averages gradients (or parameters) over the ranks of a Communicator, on any backend.

    sgd = opt.DistOpt(opt.SGD(lr=0.005, momentum=0.9))            # under mpiexec
    sgd = opt.DistOpt(sgd, nccl_id=holder, gpu_num=r, gpu_per_node=n)  # multiprocessing, as seed 001
    sgd.backward_and_update(loss)

Four ways to synchronise, as SINGA (and, for the first, its two phases, to work between them):

- ``backward_and_update``: gradients averaged in fused buckets while backward runs (each bucket's
  all-reduce starts as soon as it is full and overlaps the rest of the backward pass; the first bucket of
  a step is sent once it holds ``first_bucket`` elements, so that even a model smaller than ``threshold``
  starts communicating before its backward pass ends);
- ``backward_and_update_half``: the same with float16 on the wire; each rank divides by the world size
  *before* the sum, so the exchange cannot overflow where float32 would not; optional clipping;
- ``backward_and_partial_update``: every rank updates with its own gradients, then one partition of the
  parameter *values* is averaged per call, round robin (``average_parameters()`` averages all of them);
- ``backward_and_sparse_update``: only the significant gradient entries are exchanged (|g| >= spars, or the
  exact top ``ceil(spars * n)`` magnitudes with ``topK=True``), as (index, value) pairs gathered from every
  rank, each divided by the world size, then summed (16-bit values in float32), so the average cannot
  overflow where the ranks' values do not; with ``corr=True`` what was not sent is kept as a residual and
  added next time.

``backward_and_update`` is two phases, public so that a step can read or change the averaged gradients
before they are applied (every rank makes the same calls)::

    pending = sgd.backward(loss)            # backward, each bucket's all-reduce overlapping the rest of it
    for p, g in pending.synchronize():      # waits: the averaged gradients, the same on every rank
        ...                                 # read them, or change them in place (clip, log, ...)
    pending.finish()                        # one update with the gradients as they are now

(``sgd.synchronize()`` / ``sgd.step()`` do the same on the step ``sgd.backward`` left open.)

Training features built on it (each in its own module): gradient accumulation, ``backward_passes_per_step=k``
and ``no_sync()`` (parallel/accumulate.py); clipping by the global norm between the phases,
``pending.clip_grad_norm(max_norm)`` / ``opt.clip_grad_norm(pairs, max_norm)`` (clip.py); buffers,
``broadcast_buffers`` and ``sync_buffers(model)`` (parallel/buffers.py; ``layer.SyncBatchNorm2d`` in
sync_batchnorm.py); uneven inputs, ``with sgd.join():`` (parallel/join.py).

Differences from SINGA, on purpose: buffer bounds are checked; float16 and sparse averages divide before
the sum; top-K compares magnitudes as floats (SINGA's comparator truncated them); at the first step rank
0's parameters are broadcast and the ranks' models are compared (names, shapes, dtypes, order), raising
ValueError on every rank with the difference; a non-finite gradient skips the step on every rank
(``on_nonfinite="skip"``, counted in ``skipped_steps``, a warning on rank 0) or raises FloatingPointError on
every rank (``"raise"``), in both cases with no parameter, optimizer state or residual changed. The fused
modes test the averaged gradients; the partial and sparse modes test each rank's own gradients before
anything changes, at the cost of one all-reduce of ``world_size`` integers per step, and the sparse mode its
averaged gradients too (one more all-reduce of one integer): a residual added to finite gradients can still
overflow.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import warnings

import numpy as np

from .. import _core, autograd, tensor
from ..opt import SGD, Optimizer
from ..raw import from_host, to_host, zeros
from ..tensor import Tensor
from . import buffers, replicas
from .accumulate import Accumulator, check_passes
from ..comm.communicator import raw_tensor
from .join import Join
from .pending import PendingStep
from . import fusion
from .fusion import DEFAULT_FIRST_BUCKET, DEFAULT_THRESHOLD, Fuser, check_first_bucket, check_threshold

CTensor = _core.Tensor
__all__ = ["DistOpt", "PendingStep", "DEFAULT_THRESHOLD", "DEFAULT_FIRST_BUCKET"]


def _raw(t, what: str) -> CTensor:
    return raw_tensor(t, f"DistOpt.{what}")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CPU = _core.Device("cpu")


def _user_stacklevel() -> int:
    """The stacklevel that makes a warning point at the caller's nearest frame outside singa_lite (the user's
    training step, however deep inside the package the warning was raised)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def _all_finite(t: CTensor) -> bool:
    """Whether every element is finite: x * 0 is 0 for a finite x and nan for inf or nan, and a sum of zeros
    cannot overflow, so the sum is nan exactly when some element is not finite. 60 us for 400k floats on one
    core, where max(abs(x)) took 320 us (the max reduction does not vectorise as the sum does)."""
    if t.numel == 0:
        return True
    return math.isfinite(float(to_host(_core.sum(_core.mul_scalar(t, 0.0)))))


class DistOpt:
    """Wraps `opt` (default ``SGD()``) for data-parallel training.

    nccl_id: None for the MPI bootstrap (``mpiexec``); the parent's ``NcclIdHolder`` for processes started
    by multiprocessing, with local_rank / world_size (SINGA's seed scripts pass them as gpu_num /
    gpu_per_node, accepted too). buffSize: the fusion buffer's size in elements. communicator: an existing
    ``dist.Communicator`` to use instead (backend / timeout otherwise go to ``dist.init``). overlap=False
    starts the gradient exchange only after the whole backward pass (to measure what overlapping gains).
    hierarchical=True: gradients are summed within each host over shared memory, across hosts between one
    leader per host, then broadcast within the host (comm/hierarchical.py; ranks on several hosts under
    mpiexec; one host is left as it is).
    first_bucket: elements after which a step's first bucket is sent (0: it waits for ``threshold`` too).
    ``bytes_sent`` counts the gradient payload this rank has handed to all-reduces.

    backward_passes_per_step=k: gradients accumulate on each rank and are exchanged once per k backward
    passes (``no_sync()`` defers the exchange by hand); average_accumulated=True divides the gathered sum by
    the number of passes, so a mean-reduced loss needs no 1/k (False sums them: divide the loss by k).
    broadcast_buffers: what ``sync_buffers(model)`` (called by Model.eval()) does with batch norm's running
    statistics: True, rank 0's to every rank; "average", their mean; False, nothing (parallel/buffers.py);
    also which buffers a checkpoint's one model gets (rank 0's, or with "average" the mean; singa_lite.checkpoint).
    Gradient accumulation (parallel/accumulate.py)::

        sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), backward_passes_per_step=4)
        for x, y in micro_batches:          # 4 micro-batches per update
            sgd.backward_and_update(loss_fn(model(x), y))   # updates (and communicates) on every 4th call
    """

    def __init__(self, opt=None, nccl_id=None, local_rank=None, world_size=None, buffSize=4194304, *,
                 gpu_num=None, gpu_per_node=None, communicator=None, backend=None, timeout=None,
                 on_nonfinite: str = "skip", overlap: bool = True, first_bucket: int = DEFAULT_FIRST_BUCKET,
                 backward_passes_per_step: int = 1, average_accumulated: bool = True,
                 broadcast_buffers=True, hierarchical: bool = False):
        from ..comm import hierarchical as hier, init

        self.opt = SGD() if opt is None else opt
        if not isinstance(self.opt, Optimizer):
            raise TypeError(f"DistOpt: opt must follow the Optimizer contract (subclass opt.Optimizer), got "
                            f"{type(self.opt).__name__}")
        local_rank = _same("local_rank", local_rank, "gpu_num", gpu_num)
        world_size = _same("world_size", world_size, "gpu_per_node", gpu_per_node)
        if isinstance(buffSize, bool) or not isinstance(buffSize, numbers.Integral) or buffSize < 1:
            raise ValueError(f"DistOpt: buffSize must be a positive number of elements, got {buffSize!r}")
        first_bucket = check_first_bucket(first_bucket, "DistOpt")
        backward_passes_per_step = check_passes(backward_passes_per_step, "DistOpt")
        self.broadcast_buffers = buffers.check_mode(broadcast_buffers, "DistOpt")  # "broadcast", "average", None
        if on_nonfinite not in ("skip", "raise"):
            raise ValueError(f"DistOpt: on_nonfinite must be 'skip' or 'raise', got {on_nonfinite!r}")
        if communicator is None:
            if nccl_id is None:
                communicator = init(backend=backend, timeout=timeout)
            else:
                communicator = init(backend=backend, holder=nccl_id, rank=local_rank, world_size=world_size,
                                    timeout=timeout)
        if not isinstance(hierarchical, bool):
            raise TypeError(f"DistOpt: hierarchical must be True or False, got {hierarchical!r}")
        if hierarchical:
            communicator = hier.create(communicator)
        self.communicator = communicator
        self.buffSize = int(buffSize)
        self.on_nonfinite = on_nonfinite
        self.overlap = bool(overlap)
        self.first_bucket = int(first_bucket)
        self.world_size = communicator.world_size
        self.global_rank = self.rank_in_global = communicator.rank
        self.local_rank = self.rank_in_local = communicator.local_rank
        self.skipped_steps = 0
        self.partial = 0  # SINGA's name: which parameter partition the next partial update averages
        self._residuals = {}  # parameter name -> CTensor: sparse error feedback
        self._synced = False  # rank 0's parameters broadcast and the models compared (first step)
        self._params = []  # (name, param) of the last step, in backward order
        self._reference = None  # the parameter names every rank had at the first step (to explain mismatches)
        self._fusers = {}
        self._pending = None  # the PendingStep that backward() left open
        self._accum = Accumulator(backward_passes_per_step, average_accumulated)  # gradient accumulation
        self._join = None  # the Join of a `with join():` block under way (parallel/join.py)
        self._user = Fuser(communicator, self.buffSize, op="sum")  # SINGA's low-level calls sum
        self._user_half = Fuser(communicator, self.buffSize, wire_dtype=tensor.float16, op="avg",
                                scale=float(self.world_size))

    def __repr__(self):
        return (f"DistOpt({type(self.opt).__name__}, rank {self.global_rank} of {self.world_size}, "
                f"{self.communicator.backend} backend)")

    # ----- the four training steps
    def __call__(self, loss) -> None:
        self.backward_and_update(loss)

    def backward_and_update(self, loss, threshold=DEFAULT_THRESHOLD) -> None:
        """Backward; gradients averaged over the ranks in fused buckets as they come; then one update."""
        self.backward(loss, threshold).finish()

    def backward_and_update_half(self, loss, threshold=DEFAULT_THRESHOLD, clipping=False, clip_Value=100,
                                 dtype=tensor.float16) -> None:
        """As backward_and_update, with float16 (or dtype=tensor.bfloat16) on the wire; clipping clamps
        gradients to [-clip_Value, clip_Value] before they are cast."""
        if clipping and not clip_Value > 0:
            raise ValueError(f"DistOpt.backward_and_update_half: clip_Value must be > 0, got {clip_Value!r}")
        self.backward(loss, threshold, half=dtype, clip=clip_Value if clipping else None).finish()

    # ----- the fused step in two phases
    def backward(self, loss, threshold=DEFAULT_THRESHOLD, *, half: bool = False, clip=None) -> "PendingStep":
        """The backward pass from `loss`, each gradient queued for the averaged all-reduce as it comes (a
        bucket leaves as soon as it is full, overlapping the rest of the pass). Returns the open step:
        ``synchronize()`` waits for the exchange and gives the averaged gradients, ``finish()`` applies
        them (``discard()`` drops them). half: float16 on the wire, as backward_and_update_half; clip: a
        bound > 0 the gradients are clamped to before they are sent (None: no clamping). half may also name
        the wire dtype: tensor.float16 (as True) or tensor.bfloat16.

        One step is open at a time: finish or discard it before the next backward on this DistOpt.

        With gradient accumulation (backward_passes_per_step, no_sync), a pass that does not exchange
        returns a step whose ``accumulating`` is True: synchronize() gives no pairs, finish() adds the pass's
        gradients to this rank's sums, discard() drops them. The pass that exchanges adds the sums to its
        gradients as they come (discarding it drops the sums too)."""
        self._require_no_open_step("backward")
        threshold = self._threshold(threshold)
        wire = _wire_dtype(half)
        loss = self._scaled(loss)
        if clip is not None:
            if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not clip > 0:
                raise ValueError(f"DistOpt.backward: clip must be None or a bound > 0, got {clip!r}")
            clip = float(clip)
        acc = self._accum
        if not acc.next_pass_syncs():  # gradient accumulation: nothing leaves this rank
            triples = []
            for p, g in autograd.backward(loss):
                if clip is not None:
                    _core.clip(g.data, -clip, clip, out=g.data)
                triples.append((self.opt._name_of(p), p, g))
            self._first_step(triples)
            self._pending = PendingStep(self, None, triples)
            return self._pending
        fuser = self._fuser(wire)
        triples = []
        overlap = self._synced and self.overlap  # the first step compares the models before any exchange
        join, scale = self._join, None
        if join is not None:  # uneven inputs: how many ranks still train decides the divisor
            scale = join.factor(join.vote(True))
        fuser.begin(threshold, self.first_bucket)
        gradients = autograd.backward(loss)
        try:
            for p, g in gradients:
                if clip is not None:
                    _core.clip(g.data, -clip, clip, out=g.data)
                name = self.opt._name_of(p)
                acc.merge(name, g.data)  # the sums of earlier passes, when accumulating (else nothing)
                triples.append((name, p, g))
                if overlap:
                    fuser.push(g.data, name)
            if not acc.empty:  # parameters the earlier passes reached and this one did not
                for extra in acc.leftovers({n for n, _, _ in triples}):
                    triples.append(extra)
                    if overlap:
                        fuser.push(extra[2].data, extra[0])
            if not overlap:
                self._first_step(triples)
                for name, _, g in triples:
                    fuser.push(g.data, name)
        except BaseException as e:
            fuser.cancel()  # the next backward starts a new pass; nothing here may block on a collective
            if not fusion.is_mismatch(e):
                raise
            # The ranks' buckets differ (met while a full buffer waited for its buckets): the rest of the pass
            # gives the names of every parameter with a gradient, which explain() names the missing ones from.
            names = [n for n, _, _ in triples] + [self.opt._name_of(p) for p, _ in gradients]
            explained = fuser.explain(e, "DistOpt", self._reference, names)
            if explained is e:
                raise
            raise explained from e
        acc.clear()
        if overlap:
            self._params = [(n, p) for n, p, _ in triples]
        if join is not None:
            join.record(threshold, self.first_bucket, half, triples)
        self._pending = PendingStep(self, fuser, triples, scale, joined=join is not None)
        return self._pending

    def join(self, divide_by_initial_world_size: bool = False) -> Join:
        """A context for uneven inputs: a rank whose data ran out leaves the block and keeps answering the
        others' exchanges with zeros until every rank has left (see parallel/join.py)::

            with sgd.join():
                for x, y in my_shard:          # shards of different lengths
                    sgd.backward_and_update(loss_fn(model(x), y))

        The gradients of a pass are averaged over the ranks that contributed to it (or over the world size
        with divide_by_initial_world_size=True). Every rank enters the block and makes at least one
        exchanging pass in it."""
        return Join(self, divide_by_initial_world_size)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate their gradients on this rank and exchange nothing; the first
        pass after the block that reaches backward_passes_per_step exchanges everything gathered (PyTorch
        DDP's ``no_sync``; every rank must do the same passes)::

            with sgd.no_sync():
                for x, y in micro_batches[:-1]:
                    sgd.backward_and_update(loss_fn(model(x), y))   # accumulates only
            sgd.backward_and_update(loss_fn(model(x_last), y_last))  # exchanges, then one update
        """
        self._accum.no_sync_depth += 1
        try:
            yield self
        finally:
            self._accum.no_sync_depth -= 1

    @property
    def backward_passes_per_step(self) -> int:
        return self._accum.passes_per_step

    @property
    def accumulated_passes(self) -> int:
        """Backward passes gathered on this rank since the last exchange."""
        return self._accum.passes

    def _gather_passes(self, triples):
        """Gradient accumulation for the partial and sparse modes (whose gradients are all computed before
        anything is sent): None when this pass only accumulates, else the gradients with the sums merged."""
        acc = self._accum
        if not acc.next_pass_syncs():
            self._first_step(triples)
            acc.add(triples)
            return None
        if acc.empty:
            return triples
        for name, _, g in triples:
            acc.merge(name, g.data)
        triples = triples + acc.leftovers({n for n, _, _ in triples})
        acc.clear()
        return triples

    def synchronize(self) -> list:
        """Waits for the exchange of the step ``backward`` left open; returns its averaged gradients as
        ``(param, grad)`` pairs (see PendingStep.synchronize)."""
        return self._open_step("synchronize").synchronize()

    def step(self) -> None:
        """Applies the step ``backward`` left open (synchronizing first if not done); see PendingStep.finish."""
        self._open_step("step").finish()

    def clip_grad_norm(self, max_norm, norm_type=2.0) -> float:
        """Clips the averaged gradients of the open step by their global norm (synchronizing first when
        needed); returns the norm before clipping, the same on every rank. See opt.clip_grad_norm."""
        return self._open_step("clip_grad_norm").clip_grad_norm(max_norm, norm_type)

    def discard(self) -> None:
        """Drops the step ``backward`` left open, its exchange completed (nothing when none is open)."""
        if self._pending is not None:
            self._pending.discard()

    @property
    def pending(self) -> "PendingStep | None":
        """The step ``backward`` left open, or None."""
        return self._pending

    def _open_step(self, what: str) -> "PendingStep":
        if self._pending is None:
            raise RuntimeError(f"DistOpt.{what}: no step is open; call backward(loss) first (or "
                               f"backward_and_update(loss), which does both phases)")
        return self._pending

    def _refuse_in_join(self, what: str) -> None:
        if self._join is not None:
            raise RuntimeError(f"DistOpt.{what}: not supported inside a join() block (a rank out of data answers "
                               f"the fused exchange only); use backward_and_update or the two-phase step there")

    def _require_no_accumulation(self, what: str) -> None:
        if not self._accum.empty:
            raise RuntimeError(f"DistOpt.{what}: {self._accum.passes} backward pass(es) of gradient accumulation "
                               f"are gathered and not yet exchanged; call it after the pass that updates (every "
                               f"{self._accum.passes_per_step} passes, or the first one after no_sync())")

    def _require_no_open_step(self, what: str) -> None:
        if self._pending is not None:
            raise RuntimeError(f"DistOpt.{what}: the step of the previous backward() is still open; apply it "
                               f"with finish() / step(), or drop it with discard(), first")

    # ----- the other steps
    def _local_step(self, who: str, loss):
        """The common start of the modes that update from this rank's own gradients (partial, sparse): the
        pass's (name, param, grad) triples once the accumulated passes are gathered, the first step's model
        check done and every rank's gradients finite; None when there is nothing to apply (a pass that only
        accumulates, or a step skipped on every rank). Checked before anything changes: a NaN below the
        threshold would never be sent but would stay in a residual, and a step skipped on some ranks only
        would leave the replicas apart."""
        self._require_no_open_step(who)
        self._refuse_in_join(who)
        triples = self._gather_passes(self._local_gradients(loss))
        if triples is None:
            return None
        self._first_step(triples)
        if not self._finite_everywhere([g.data for _, _, g in triples], local=True):
            return None
        return triples

    def backward_and_partial_update(self, loss, threshold=DEFAULT_THRESHOLD) -> None:
        """Local update with local gradients, then one partition of parameter values averaged (round robin;
        partitions hold about `threshold` elements)."""
        threshold = self._threshold(threshold)
        triples = self._local_step("backward_and_partial_update", loss)
        if triples is None:
            return
        self._apply(triples)
        parts = _partitions([p for _, p, _ in triples], threshold, size=lambda p: p.data.numel)
        if parts:
            self._average_values(parts[self.partial % len(parts)], threshold)
            self.partial = (self.partial + 1) % len(parts)

    def backward_and_sparse_update(self, loss, threshold=DEFAULT_THRESHOLD, spars=0.05, topK=False,
                                   corr=True) -> None:
        """Only significant gradient entries are exchanged: |g| >= spars, or with topK=True the largest
        ceil(spars * n) magnitudes of each fused group; corr=True keeps what was not sent as a residual."""
        threshold = self._threshold(threshold)
        spars = _check_spars(spars, topK)
        triples = self._local_step("backward_and_sparse_update", loss)
        if triples is None:
            return
        residuals = [self._sparse_group([g.data for _, _, g in group], [n for n, _, _ in group], spars,
                                        bool(topK), bool(corr), average=True)
                     for group in _partitions(triples, threshold, size=lambda tr: tr[2].data.numel)]
        # Each rank's gradients were finite (_local_step), but a residual added to them can overflow: the
        # averages are checked too, and only a step applied everywhere keeps its new residuals.
        if not self._finite_everywhere([g.data for _, _, g in triples]):
            return
        for key, res in residuals:
            if key is not None:
                self._residuals[key] = res
        self._apply(triples)

    # ----- SINGA's lower-level calls (raw tensors accepted; results are sums, update() divides)
    # They complete before returning (their results are final, so scripts that scale the result right after
    # the call, as seed 001's parameter synchronisation does, are correct); wait() is kept for SINGA's API.
    def update(self, param, grad) -> None:
        """grad /= world_size, then the wrapped optimizer's update (SINGA's DistOpt.update)."""
        g = _raw(grad, "update")
        _core.mul_scalar(g, 1.0 / self.world_size, out=g)
        p = param if isinstance(param, Tensor) else Tensor(data=param, requires_grad=False)
        self.opt.apply(self.opt._name_of(p), p, g)

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
        spars = _check_spars(spars, topK)
        acc = None if accumulation is None else _raw(accumulation, "fused_sparsification")
        if acc is not None and not acc.is_contiguous():
            raise ValueError("DistOpt.fused_sparsification: accumulation must be contiguous (it is updated in "
                             "place); pass a tensor of its own, not a strided view")
        if acc is not None and acc.numel != sum(r.numel for r in raws):
            raise ValueError(f"DistOpt.fused_sparsification: accumulation has {acc.numel} elements, the tensors "
                             f"{sum(r.numel for r in raws)}")
        self._sparse_group(raws, None, spars, bool(topK), corr=acc is not None, average=False, residual=acc)

    def wait(self) -> None:
        """Completes pending fused all-reduces (SINGA's API; the calls above already return complete)."""
        self._user.wait()
        self._user_half.wait()

    # ----- parameters across ranks
    def broadcast_parameters(self, params) -> None:
        """Compares the ranks' models and gives every rank rank 0's values (what the first step does by itself;
        Model.compile calls this when its optimizer is a DistOpt, so that even the first step's gradients come
        from identical replicas). params: tensors, or a dict of them (Model.get_params())."""
        params = self._param_list(params, "broadcast_parameters")
        self._first_step([(p.name or f"param{i}", p, None) for i, p in enumerate(params)], force=True)

    def average_parameters(self, params=None, threshold=DEFAULT_THRESHOLD) -> None:
        """Averages the parameter values over the ranks (after partial updates: before evaluating or saving).
        params: tensors (default: those of the last step)."""
        self._require_no_open_step("average_parameters")
        params = self._param_list(params, "average_parameters")
        self._average_values(params, self._threshold(threshold))

    def check_parameter_closeness(self, params=None, rtol=1e-5, atol=1e-8) -> bool:
        """True when every rank's parameters equal rank 0's within atol + rtol * |rank 0's|; a warning names
        the worst parameter otherwise. The same answer on every rank."""
        params = self._param_list(params, "check_parameter_closeness")
        return replicas.check_parameter_closeness(
            self.communicator, [(p.name or f"parameter {i}", p) for i, p in enumerate(params)], rtol, atol,
            who="DistOpt")

    def sync_buffers(self, model, how=None) -> None:
        """Gives every rank the same buffers (batch norm's running statistics): rank 0's, or their mean over
        the ranks, as ``broadcast_buffers`` (or `how`: True / "broadcast", "average", False) says. model: a
        Layer / Model, a plain class with Layer attributes, or a dict of buffer tensors. Every rank calls it
        (Model.eval() does for a Model whose optimizer is this DistOpt); see parallel/buffers.py."""
        mode = self.broadcast_buffers if how is None else buffers.check_mode(how, "DistOpt.sync_buffers")
        if mode is None:
            return
        named = buffers.named_buffers(model, "DistOpt.sync_buffers")
        buffers.sync_buffers(self.communicator, named, mode, who="DistOpt.sync_buffers")

    # ----- checkpoints
    def get_states(self) -> dict:
        """Everything a resumed DistOpt needs, as plain data (numpy arrays, ints, bools):

        - ``opt``: the wrapped optimizer's get_states();
        - ``partial``: which parameter partition the next partial update averages;
        - ``skipped_steps``: steps skipped for non-finite gradients so far;
        - ``synced``: whether the first step's model comparison and broadcast of rank 0's parameters is
          done (a resumed replica that was synced must not be overwritten by rank 0's at its next step);
        - ``residuals``: {tuple of parameter names: numpy array}, the error feedback of sparse updates.

        Residuals (and, after partial updates, parameters) differ per rank: save each rank's. A step left
        open by backward() is not part of the state: finish or discard it first."""
        self._require_no_open_step("get_states")
        self._require_no_accumulation("get_states")
        return {"opt": self.opt.get_states(), "partial": int(self.partial), "skipped_steps": int(self.skipped_steps),
                "synced": bool(self._synced),
                "residuals": {tuple(k): np.array(to_host(v)) for k, v in self._residuals.items()}}

    def set_states(self, states: dict) -> None:
        """Restores what get_states() returned. ``synced`` and ``skipped_steps`` may be absent (states of an
        older singa_lite): the flag then stays as it is, the count becomes 0. Everything is checked before
        anything changes; a ValueError or TypeError leaves this DistOpt as it was."""
        self._require_no_open_step("set_states")
        if not isinstance(states, dict):
            raise TypeError(f"DistOpt.set_states: expected the dict of get_states(), got {type(states).__name__}")
        missing = {"opt", "partial", "residuals"} - set(states)
        if missing:
            raise ValueError(f"DistOpt.set_states: missing {sorted(missing)}; pass what get_states() returned")
        partial = _count(states["partial"], "partial")
        skipped = _count(states.get("skipped_steps", 0), "skipped_steps")
        synced = states.get("synced", self._synced)
        if not isinstance(synced, (bool, np.bool_)):
            raise TypeError(f"DistOpt.set_states: synced must be a bool, got {synced!r}")
        if not isinstance(states["residuals"], dict):
            raise TypeError(f"DistOpt.set_states: residuals must be a dict {{tuple of parameter names: array}}, "
                            f"got {type(states['residuals']).__name__}")
        residuals = {}
        for k, v in states["residuals"].items():
            names = (k,) if isinstance(k, str) else tuple(k)
            if not all(isinstance(n, str) for n in names):
                raise TypeError(f"DistOpt.set_states: residual keys are tuples of parameter names, got {k!r}")
            residuals[names] = CTensor.from_buffer(np.array(v, copy=True))
        self.opt.set_states(states["opt"])  # checks its own states and changes nothing when it raises
        self.partial, self.skipped_steps, self._synced = partial, skipped, bool(synced)
        self._residuals = residuals

    @property
    def synced(self) -> bool:
        """Whether the first step's model comparison and broadcast of rank 0's parameters is done."""
        return self._synced

    # ----- internals
    def _threshold(self, threshold) -> int:
        return check_threshold(threshold, self.buffSize, "DistOpt")

    @property
    def bytes_sent(self) -> int:
        return sum(f.bytes_sent for f in self._fusers.values())

    def _fuser(self, wire_dtype) -> Fuser:
        key = None if wire_dtype is None else wire_dtype.name
        if key not in self._fusers:
            self._fusers[key] = Fuser(self.communicator, self.buffSize, wire_dtype=wire_dtype, op="avg")
        return self._fusers[key]

    def _local_gradients(self, loss) -> list:
        return [(self.opt._name_of(p), p, g) for p, g in autograd.backward(self._scaled(loss))]

    def _scaled(self, loss):
        """The loss the wrapped optimizer wants differentiated: amp.MixedPrecision's scale_loss multiplies it
        by its loss scale (once: a loss it already scaled is returned as it is); others take it as it is."""
        scale_loss = getattr(self.opt, "scale_loss", None)
        return loss if scale_loss is None else scale_loss(loss)

    def _apply(self, triples) -> None:
        for name, p, g in triples:
            self.opt.apply(name, p, g)
        self.opt.step()

    def _finite_everywhere(self, regions, local: bool = False) -> bool:
        """Whether every tensor of `regions` is finite on every rank, decided the same way on every rank (an
        all-reduce of the ranks' verdicts), so ranks never diverge on skipping a step. regions: the averaged
        gradients (the same on every rank), or with `local` each rank's own gradients (partial and sparse
        updates, checked before anything changes; the verdicts then name the ranks)."""
        verdicts = np.zeros(self.world_size if local else 1, np.int32)
        verdicts[self.global_rank if local else 0] = 0 if all(_all_finite(r) for r in regions) else 1
        bad = from_host(verdicts, self._vote_device(regions))
        self.communicator.all_reduce(bad, "max")
        bad = to_host(bad)
        if not bad.any():
            return True
        what = (f"the gradients of rank {', '.join(map(str, np.flatnonzero(bad)))}" if local
                else "the averaged gradients")
        if self.on_nonfinite == "raise":
            raise FloatingPointError(f"DistOpt: {what} contain inf or nan; no parameter was changed on any rank "
                                     f"(on_nonfinite='skip' skips such steps instead)")
        self.skipped_steps += 1
        skipped = getattr(self.opt, "step_skipped", None)  # amp.MixedPrecision backs its loss scale off
        if skipped is not None:
            skipped()
        if self.global_rank == 0:
            warnings.warn(f"DistOpt: inf or nan in {what}: step skipped on every rank ({self.skipped_steps} so "
                          f"far)", RuntimeWarning, stacklevel=_user_stacklevel())
        return False

    def _abstain(self, regions) -> None:
        """This rank's part in the finiteness vote of _finite_everywhere when it has nothing to vote on (a step
        discarded inside join(), whose ranks out of data still vote): a verdict of "finite"."""
        self.communicator.all_reduce(from_host(np.zeros(1, np.int32), self._vote_device(regions)), "max")

    @staticmethod
    def _vote_device(regions):
        """Where a vote lives: the communicator's kind of memory, that of the gradients (NCCL: the GPU)."""
        return regions[0].device if regions else _CPU

    def _first_step(self, triples, force: bool = False) -> None:
        """Once: compare the ranks' models, then give every rank rank 0's parameter values."""
        if not force:
            self._params = [(n, p) for n, p, _ in triples]
        if self._synced and not force:
            return
        try:
            replicas.broadcast_parameters(self.communicator, [(n, p) for n, p, _ in triples], 0, who="DistOpt")
        except ValueError as e:
            if force:
                raise
            line = fusion.user_line()  # in a backward pass, a parameter without a gradient is missing too
            raise ValueError(f"{e}, or one rank's forward did not use some parameters at the first step (called "
                             f"from {line or 'this process'}), so its backward gave them no gradient") from e
        self._reference = [n for n, _, _ in triples]
        self._synced = True

    def _average_values(self, params, threshold: int) -> None:
        fuser = self._fuser(None)
        fuser.begin(threshold)
        for p in params:
            fuser.push(p.data)
        fuser.finish()

    def _param_list(self, params, what: str) -> list:
        if params is None:
            if not self._params:
                raise ValueError(f"DistOpt.{what}: no training step has run yet; pass the parameters "
                                 f"(e.g. list(model.get_params().values()))")
            return [p for _, p in self._params]
        params = list(params.values()) if isinstance(params, dict) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"DistOpt.{what}: parameters must be tensor.Tensor, got {type(p).__name__}")
        return params

    def _sparse_group(self, raws, names, spars, topK, corr, average, residual=None) -> tuple:
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
        dense = self._sparse_sum(idx, vals, n, dtype, where, 1.0 / self.world_size if average else None)
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
        gradients' device and dtype after set_states, which restores residuals on the host)."""
        res = self._residuals.get(key)
        if res is None or res.numel != n:
            return zeros([n], dtype, where)
        if res.device != where or res.dtype != dtype:
            return res.reshape([n]).cast(dtype).to(where) if res.device.is_cpu() else res.to(where).cast(dtype)
        return res

    def _sparse_sum(self, idx: CTensor, vals: CTensor, n: int, dtype, where, scale=None) -> CTensor:
        """Sum over ranks of the vectors holding vals at idx and zero elsewhere, each first multiplied by
        scale (1 / world size for an average: a sum of the ranks' shares cannot overflow where their average
        does not, as the fused half exchange divides before its sum): every rank's (index, value) pairs are
        all-gathered (indices as int32 when they fit), then added in rank order, so every rank gets the same
        result. 16-bit values are scaled and added in float32 and the result cast back."""
        comm = self.communicator
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


def _wire_dtype(half):
    """backward()'s half: False -> None (each gradient's own dtype), True -> float16, or a 16-bit float dtype."""
    if half is False or half is None:
        return None
    if half is True:
        return tensor.float16
    if half in (tensor.float16, tensor.bfloat16):
        return half
    raise ValueError(f"DistOpt: the wire dtype of a half exchange must be tensor.float16 or tensor.bfloat16, "
                     f"got {half!r}")


def _check_spars(spars, topK) -> float:
    if isinstance(spars, bool) or not isinstance(spars, numbers.Real) or not math.isfinite(spars):
        raise ValueError(f"DistOpt: spars must be a number, got {spars!r}")
    if topK and not 0 < spars <= 1:
        raise ValueError(f"DistOpt: with topK=True, spars is the fraction of entries sent, in (0, 1]; got {spars}")
    if not topK and spars < 0:
        raise ValueError(f"DistOpt: with topK=False, spars is the magnitude threshold, >= 0; got {spars}")
    return float(spars)


def _partitions(items, threshold: int, size) -> list:
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


def _count(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"DistOpt.set_states: {what} must be an int >= 0, got {value!r}")
    return int(value)


def _same(name, value, alias, alias_value):
    if alias_value is None:
        return value
    if value is not None and value != alias_value:
        raise ValueError(f"DistOpt: {name}={value} and {alias}={alias_value} disagree; pass one of them")
    return alias_value
