"""DistOpt: SINGA's distributed optimizer. It wraps any optimizer written to the contract of
optim/optimizer.py and averages gradients (or parameters) over the ranks of a Communicator, on any backend.

    sgd = opt.DistOpt(opt.SGD(lr=0.005, momentum=0.9))            # under mpiexec
    sgd = opt.DistOpt(sgd, nccl_id=holder, gpu_num=r, gpu_per_node=n)  # multiprocessing, as SINGA's page
    sgd.backward_and_update(loss)

Four ways to synchronise, as SINGA, each an exchange strategy (parallel/exchange.py, which details them):
``backward_and_update`` (fused buckets averaged while backward runs; the first bucket leaves at ``first_bucket``
elements), ``backward_and_update_half`` (the same in float16 / bfloat16, divided before the sum),
``backward_and_partial_update`` (local updates, then one partition of parameter values averaged per call) and
``backward_and_sparse_update`` (significant entries only, with residuals). ``register_comm_hook(state, hook)`` lets a
user's hook reduce the buckets of the first, as PyTorch DDP's. The step itself (buckets, overlap, accumulation, the
finiteness vote, the update) is the reducer's (parallel/reducer.py); this class is its face.

``backward_and_update`` is two phases, public so that a step can read or change the averaged gradients
before they are applied (every rank makes the same calls)::

    pending = sgd.backward(loss)            # backward, each bucket's all-reduce overlapping the rest of it
    for p, g in pending.synchronize():      # waits: the averaged gradients, the same on every rank
        ...                                 # read them, or change them in place (clip, log, ...)
    pending.finish()                        # one update with the gradients as they are now

(``sgd.synchronize()`` / ``sgd.step()`` do the same on the step ``sgd.backward`` left open.)

Training features built on it (each in its own module): gradient accumulation, ``backward_passes_per_step=k`` and
``no_sync()`` (parallel/accumulate.py); clipping by the global norm between the phases,
``pending.clip_grad_norm(max_norm)`` / ``opt.clip_grad_norm(pairs, max_norm)`` (optim/clip.py); buffers,
``broadcast_buffers`` and ``sync_buffers(model)`` (parallel/buffers.py; ``SyncBatchNorm2d`` in
parallel/sync_batchnorm.py); uneven inputs, ``with sgd.join():`` (parallel/join.py); rank-dependent branches,
``find_unused_parameters=True`` (parallel/unused.py).

Differences from SINGA, on purpose: buffer bounds are checked; float16 and sparse averages divide before the sum; top-K
compares magnitudes as floats (SINGA's comparator truncated them); at the first step rank 0's parameters are broadcast
and the ranks' models are compared (names, shapes, dtypes, order), raising ValueError on every rank with the
difference; a non-finite gradient skips the step on every rank (``on_nonfinite="skip"``, counted in ``skipped_steps``,
a warning on rank 0) or raises FloatingPointError on every rank (``"raise"``), in both cases with no parameter,
optimizer state or residual changed. The fused modes test the averaged gradients; the partial and sparse modes test
each rank's own gradients before anything changes, at the cost of one all-reduce of ``world_size`` integers per step,
and the sparse mode its averaged gradients too (one more all-reduce of one integer): a residual added to finite
gradients can still overflow.
"""
from __future__ import annotations

import contextlib
import numbers

import numpy as np

from .. import _core, tensor
from ..optim.algorithms import SGD
from ..comm.straggler import check_every, report_every_from_environment
from ..optim.optimizer import Optimizer
from ..tensor import Tensor
from . import buffers, replicas, unused, zero
from .accumulate import check_passes
from .exchange import SparseExchange, check_spars, wire_dtype
from .fusion import DEFAULT_FIRST_BUCKET, DEFAULT_THRESHOLD, check_first_bucket, check_threshold
from .join import Join
from .lowlevel import SingaCalls
from .pending import PendingStep
from .reducer import Reducer, check_exchange_mode
from .replica_check import ReplicaCheck
from .step_stats import StepStats, StragglerReport

__all__ = ["DistOpt", "PendingStep", "DEFAULT_THRESHOLD", "DEFAULT_FIRST_BUCKET"]


class DistOpt(SingaCalls):
    """Wraps `opt` (default ``SGD()``) for data-parallel training.

    nccl_id: None for the MPI bootstrap (``mpiexec``); the parent's ``NcclIdHolder`` for processes started by
    multiprocessing, with local_rank / world_size (SINGA's distributed-training page: gpu_num / gpu_per_node, accepted
    too). buffSize: the fusion buffer's size in elements. communicator: an existing ``dist.Communicator`` to use
    instead (backend / timeout otherwise go to ``dist.init``). overlap=False starts the gradient exchange only after
    the whole backward pass (to measure what overlapping gains). hierarchical=True: gradients are summed within each
    host over shared memory, across hosts between one leader per host, then broadcast within the host
    (comm/hierarchical.py; ranks on several hosts under mpiexec; one host is left as it is). first_bucket: elements
    after which a step's first bucket is sent (0: it waits for ``threshold`` too). ``bytes_sent`` counts the gradient
    payload this rank has handed to all-reduces.

    backward_passes_per_step=k: gradients accumulate on each rank and are exchanged once per k backward passes
    (``no_sync()`` defers the exchange by hand); average_accumulated=True divides the gathered sum by the number of
    passes, so a mean-reduced loss needs no 1/k (False sums them: divide the loss by k). broadcast_buffers: what
    ``sync_buffers(model)`` (called by Model.eval()) does with batch norm's running statistics: True, rank 0's to every
    rank; "average", their mean; False, nothing (parallel/buffers.py); also which buffers a checkpoint's one model gets
    (rank 0's, or with "average" the mean; singa_lite.checkpoint). check_replicas_every=N: every N updates the ranks
    compare hashes of parameters and optimizer state; ReplicaMismatch names the ranks and the first tensor that differs
    (parallel/replica_check.py; not after partial updates). find_unused_parameters=True: parameters a rank's forward
    did not use count as zeros there (the ranks agree on a used-mask each step; those used nowhere are not updated);
    parameters= the whole set, a dict (Model.get_params()) or a list; a Model whose optimizer this is supplies its own.
    Every mode and join() (not zero_stage); see parallel/unused.py. zero_stage: 0 (every rank keeps all
    optimizer state and gradients), 1 (each rank keeps the optimizer state of its shard of the parameters,
    updates that shard, then the parameters are broadcast from their owners) or 2 (the gradients' buckets are
    reduced into their owner too, so each rank keeps its shard of them); see parallel/zero.py and ``memory_report()``.
    step_stats (default True): time each step's phases and each collective on this rank, for ``stats()``, the
    straggler report (comm/straggler.py; a few microseconds a step); report_every=N: the ranks compare
    those every N steps and rank 0 prints the table (default: SINGA_LITE_REPORT, which ``singa-run --report N``
    sets; None: only when ``stats()`` is called). exchange: where the plain and half exchanges run each bucket's
    all-reduce: "thread" (default: the communicator's thread, overlapping the rest of backward) or "inline" (the
    training thread, as the bucket is sent: less CPU time where the ranks fill the cores; docs/training.md).
    Gradient accumulation (parallel/accumulate.py)::

        sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), backward_passes_per_step=4)
        for x, y in micro_batches:          # 4 micro-batches per update
            sgd.backward_and_update(loss_fn(model(x), y))   # updates (and communicates) on every 4th call
    """

    def __init__(self, opt=None, nccl_id=None, local_rank=None, world_size=None, buffSize=4194304, *,
                 gpu_num=None, gpu_per_node=None, communicator=None, backend=None, timeout=None,
                 on_nonfinite: str = "skip", overlap: bool = True, first_bucket: int = DEFAULT_FIRST_BUCKET,
                 backward_passes_per_step: int = 1, average_accumulated: bool = True,
                 broadcast_buffers=True, hierarchical: bool = False, check_replicas_every: int | None = None,
                 find_unused_parameters: bool = False, parameters=None, zero_stage: int = 0,
                 step_stats: bool = True, report_every: int | None = None, exchange: str = "thread"):
        from ..comm import hierarchical as hier, init

        # what rebind() makes this DistOpt again with, on another communicator
        self._settings = dict(buffSize=buffSize, on_nonfinite=on_nonfinite, overlap=overlap, first_bucket=first_bucket,
                              backward_passes_per_step=backward_passes_per_step,
                              average_accumulated=average_accumulated, broadcast_buffers=broadcast_buffers,
                              hierarchical=hierarchical, check_replicas_every=check_replicas_every,
                              find_unused_parameters=find_unused_parameters, parameters=parameters,
                              zero_stage=zero_stage, exchange=exchange)
        self.opt = SGD() if opt is None else opt
        if not isinstance(self.opt, Optimizer):
            raise TypeError(f"DistOpt: opt must follow the Optimizer contract (subclass opt.Optimizer), got "
                            f"{type(self.opt).__name__}")
        local_rank = _same("local_rank", local_rank, "gpu_num", gpu_num)
        world_size = _same("world_size", world_size, "gpu_per_node", gpu_per_node)
        if isinstance(buffSize, bool) or not isinstance(buffSize, numbers.Integral) or buffSize < 1:
            raise ValueError(f"DistOpt: buffSize must be a positive number of elements, got {buffSize!r}")
        first_bucket = check_first_bucket(first_bucket, "DistOpt")
        check_exchange_mode(exchange, "DistOpt")
        backward_passes_per_step = check_passes(backward_passes_per_step, "DistOpt")
        self.broadcast_buffers = buffers.check_mode(broadcast_buffers, "DistOpt")  # "broadcast", "average", None
        if on_nonfinite not in ("skip", "raise"):
            raise ValueError(f"DistOpt: on_nonfinite must be 'skip' or 'raise', got {on_nonfinite!r}")
        used_mask = unused.configure(find_unused_parameters, parameters, None, "DistOpt")  # checked before init
        zero_stage = zero.check_stage(zero_stage, "DistOpt")
        if not isinstance(step_stats, bool):
            raise TypeError(f"DistOpt: step_stats must be True or False, got {step_stats!r}")
        report_every = check_every(report_every, "DistOpt")
        if report_every is None:
            report_every = report_every_from_environment()  # singa-run --report N
        if report_every is not None and not step_stats:
            raise ValueError("DistOpt: report_every needs step_stats=True (the reports compare those figures)")
        if zero_stage and check_replicas_every is not None:
            raise ValueError(f"DistOpt: zero_stage={zero_stage} with check_replicas_every is not supported: the "
                             f"ranks' optimizer states differ on purpose (each holds its shard); pass one of them")
        if zero_stage and used_mask is not None:
            raise ValueError(f"DistOpt: zero_stage={zero_stage} with find_unused_parameters=True is not supported "
                             f"(the shard plan needs the same parameters at every step); pass one of them")
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
        # the step itself, from backward to the update (reducer.py); this class is SINGA's face of it
        self.reducer = Reducer(communicator, self.opt, self.buffSize, first_bucket=self.first_bucket,
                               overlap=self.overlap, on_nonfinite=on_nonfinite,
                               passes_per_step=backward_passes_per_step, average_accumulated=average_accumulated,
                               exchange=exchange)
        if check_replicas_every is not None:
            self.reducer.replica_check = ReplicaCheck(communicator, check_replicas_every)
        if used_mask is not None:
            used_mask.comm, self.reducer.unused = communicator, used_mask
        self.zero_stage = zero_stage
        if zero_stage:
            self.reducer.zero = zero.Zero(zero_stage, communicator, self.opt, self.buffSize,
                                          fusers=self.reducer.exchanges)
        self._init_singa_calls(communicator, self.buffSize)
        if step_stats:  # last: every rank starts timing its collectives at the same point
            self.reducer.stats = StepStats(communicator, report_every)

    def rebind(self, communicator) -> None:
        """Goes on over `communicator` (dist.elastic: a new membership after ranks left or joined): the same
        settings and wrapped optimizer, a fresh exchange (buckets, the first step's comparison and broadcast of
        rank 0's parameters, a comm hook registered again). The state to continue from is set after it
        (set_states): what belonged to the old communicator (residuals, counters) starts afresh here."""
        hook = self.reducer.comm_hook
        self.__init__(self.opt, communicator=communicator, **self._settings)
        if hook is not None:
            self.register_comm_hook(*hook)

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

    def backward_and_partial_update(self, loss, threshold=DEFAULT_THRESHOLD) -> None:
        """Local update with local gradients, then one partition of parameter values averaged (round robin;
        partitions hold about `threshold` elements)."""
        threshold = self._threshold(threshold)
        self._refuse_zero("backward_and_partial_update")
        with self._step():
            r = self.reducer
            triples = r.local_step("backward_and_partial_update", loss)
            if triples is None:
                return
            r.apply(triples, replicas_equal=False)
            # find_unused_parameters: partitions of the whole declared set, the same at every step whatever the
            # branches (those of the step's parameters would change with them and the round robin would not cycle)
            params = [p for _, p in r.unused.resolve()] if r.unused is not None else [p for _, p, _ in triples]
            r.partial.average_next(params, threshold, r.average_values)

    def backward_and_sparse_update(self, loss, threshold=DEFAULT_THRESHOLD, spars=0.05, topK=False,
                                   corr=True) -> None:
        """Only significant gradient entries are exchanged: |g| >= spars, or with topK=True the largest
        ceil(spars * n) magnitudes of each fused group; corr=True keeps what was not sent as a residual."""
        threshold = self._threshold(threshold)
        spars = check_spars(spars, topK)
        self._refuse_zero("backward_and_sparse_update")
        with self._step():
            r = self.reducer
            triples = r.local_step("backward_and_sparse_update", loss)
            if triples is None:
                return
            # find_unused_parameters: a group's parameters change with the branches, so residuals are kept per
            # parameter there (one used on no rank keeps its residual for a later step)
            residuals = r.sparse.exchange(triples, threshold, spars, bool(topK), bool(corr),
                                          per_parameter=r.unused is not None)
            # Each rank's gradients were finite (local_step), but a residual added to them can overflow: the
            # averages are checked too, and only a step applied everywhere keeps its new residuals.
            if not r.finite_everywhere([g.data for _, _, g in triples]):
                return
            r.sparse.commit(residuals)
            r.apply(triples)

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
        self.reducer.require_no_open_step("backward")
        threshold = self._threshold(threshold)
        wire = wire_dtype(half)
        if clip is not None:
            if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not clip > 0:
                raise ValueError(f"DistOpt.backward: clip must be None or a bound > 0, got {clip!r}")
            clip = float(clip)
        return self.reducer.backward(loss, threshold, wire, clip)

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
        if self.reducer.pending is not None:
            self.reducer.pending.discard()

    @property
    def pending(self) -> "PendingStep | None":
        """The step ``backward`` left open, or None."""
        return self.reducer.pending

    def _open_step(self, what: str) -> "PendingStep":
        if self.reducer.pending is None:
            raise RuntimeError(f"DistOpt.{what}: no step is open; call backward(loss) first (or "
                               f"backward_and_update(loss), which does both phases)")
        return self.reducer.pending

    # ----- what crosses the wire
    def register_comm_hook(self, state, hook) -> None:
        """PyTorch DDP's seam: ``hook(state, bucket)`` reduces each bucket of the fused exchange instead of the
        plain all-reduce. bucket is a :class:`parallel.bucket.GradBucket` (``buffer()`` the flat gradients,
        ``parameters()``, ``index()``, ``is_last()``, ``communicator``); the hook returns the bucket averaged
        over the ranks (a tensor of the buffer's shape and dtype, the buffer itself reduced in place allowed)
        or a handle whose ``wait()`` returns it. Buckets still overlap backward: each is handed to the hook as
        soon as the next gradient shows whether it is the last one; the handles are waited for at
        synchronize(). The finiteness vote, join() and accumulation work on what the hook returns.

        Once, before the first backward pass. The hook replaces the plain (full-precision) exchange of
        backward_and_update / backward; backward_and_update_half, the partial and the sparse updates choose
        the wire themselves and raise RuntimeError while a hook is registered. SINGA's low-level calls
        (all_reduce, fused_all_reduce...) and parameter averaging stay plain."""
        if self.zero_stage == 2:
            raise ValueError("DistOpt.register_comm_hook: not supported with zero_stage=2, whose buckets are "
                             "reduced to their owner rather than all-reduced; use zero_stage=1 with a hook")
        self.reducer.register_comm_hook(state, hook)

    # ----- training features: uneven inputs, gradient accumulation
    def join(self, divide_by_initial_world_size: bool = False) -> Join:
        """A context for uneven inputs: a rank whose data ran out leaves the block and keeps answering the
        others' exchanges with zeros until every rank has left (see parallel/join.py)::

            with sgd.join():
                for x, y in my_shard:          # shards of different lengths
                    sgd.backward_and_update(loss_fn(model(x), y))

        The gradients of a pass are averaged over the ranks that contributed to it (or over the world size
        with divide_by_initial_world_size=True). Every rank enters the block and makes at least one
        exchanging pass in it."""
        self._refuse_zero("join")
        return Join(self.reducer, divide_by_initial_world_size)

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
        self.reducer.accumulator.no_sync_depth += 1
        try:
            yield self
        finally:
            self.reducer.accumulator.no_sync_depth -= 1

    @property
    def backward_passes_per_step(self) -> int:
        return self.reducer.accumulator.passes_per_step

    @property
    def accumulated_passes(self) -> int:
        """Backward passes gathered on this rank since the last exchange."""
        return self.reducer.accumulator.passes

    # ----- parameters across ranks
    def broadcast_parameters(self, params) -> None:
        """Compares the ranks' models and gives every rank rank 0's values (what the first step does by itself;
        Model.compile calls this when its optimizer is a DistOpt, so that even the first step's gradients come
        from identical replicas). params: tensors, or a dict of them (Model.get_params())."""
        params = self._param_list(params, "broadcast_parameters")
        self.reducer.first_step([(p.name or f"param{i}", p, None) for i, p in enumerate(params)], force=True)

    def average_parameters(self, params=None, threshold=DEFAULT_THRESHOLD) -> None:
        """Averages the parameter values over the ranks (after partial updates: before evaluating or saving).
        params: tensors (default: those of the last step)."""
        self.reducer.require_no_open_step("average_parameters")
        params = self._param_list(params, "average_parameters")
        self.reducer.average_values(params, self._threshold(threshold))

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
        - ``residuals``: {tuple of parameter names: numpy array}, the error feedback of sparse updates;
        - ``zero_stage``: 0, or with ZeRO sharding 1 / 2, when ``opt`` holds this rank's shard of the optimizer
          state only (checkpoint.load joins the ranks' shards; set_states takes a whole state or a shard and
          keeps the part this rank owns).

        Residuals (and, after partial updates, parameters) differ per rank: save each rank's. A step left
        open by backward() is not part of the state: finish or discard it first."""
        r = self.reducer
        r.require_no_open_step("get_states")
        r.require_no_accumulation("get_states")
        return {"opt": self.opt.get_states(), "partial": r.partial.state(), "skipped_steps": int(r.skipped_steps),
                "synced": bool(r.synced), "residuals": r.sparse.state(), "zero_stage": self.zero_stage}

    def set_states(self, states: dict) -> None:
        """Restores what get_states() returned. ``synced`` and ``skipped_steps`` may be absent (states of an
        older singa_lite): the flag then stays as it is, the count becomes 0. Everything is checked before
        anything changes; a ValueError or TypeError leaves this DistOpt as it was."""
        r = self.reducer
        r.require_no_open_step("set_states")
        if not isinstance(states, dict):
            raise TypeError(f"DistOpt.set_states: expected the dict of get_states(), got {type(states).__name__}")
        missing = {"opt", "partial", "residuals"} - set(states)
        if missing:
            raise ValueError(f"DistOpt.set_states: missing {sorted(missing)}; pass what get_states() returned")
        partial = _count(states["partial"], "partial")
        skipped = _count(states.get("skipped_steps", 0), "skipped_steps")
        synced = states.get("synced", r.synced)
        if not isinstance(synced, (bool, np.bool_)):
            raise TypeError(f"DistOpt.set_states: synced must be a bool, got {synced!r}")
        residuals = SparseExchange.parse_state(states["residuals"], "DistOpt.set_states")
        self.opt.set_states(states["opt"])  # checks its own states and changes nothing when it raises
        if r.zero is not None and r.zero.ready:  # a whole state (or another plan's shard): keep this rank's part
            r.zero.prune()
        r.partial.set_state(partial)
        r.skipped_steps, r.synced = skipped, bool(synced)
        r.sparse.set_state(residuals)

    # ----- the reducer's state under SINGA's (and earlier singa_lite's) names
    @property
    def synced(self) -> bool:
        """Whether the first step's model comparison and broadcast of rank 0's parameters is done."""
        return self.reducer.synced

    @property
    def skipped_steps(self) -> int:
        """Steps skipped on every rank for a non-finite gradient (on_nonfinite="skip")."""
        return self.reducer.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.reducer.skipped_steps = value

    @property
    def partial(self) -> int:
        """SINGA's name: which parameter partition the next partial update averages."""
        return self.reducer.partial.next

    @partial.setter
    def partial(self, value: int) -> None:
        self.reducer.partial.set_state(value)

    @property
    def _residuals(self) -> dict:
        """The sparse updates' error feedback, {tuple of parameter names: CTensor} (exchange.SparseExchange)."""
        return self.reducer.sparse.residuals

    @property
    def bytes_sent(self) -> int:
        """The gradient (and parameter value) payload this rank handed to the exchanges."""
        return self.reducer.bytes_sent

    # ----- what this rank holds
    def memory_report(self) -> dict:
        """The bytes this rank holds now, to see what a ZeRO stage saves (plain ints; see docs/training.md):

        - ``parameters``: the parameters of the last step (whole on every rank at every stage);
        - ``gradients``: the averaged gradients this rank keeps from the exchange to the update (every
          parameter's at stages 0 and 1, its shard's at stage 2);
        - ``optimizer_state``: the optimizer's per-parameter state tensors held now (with amp.MixedPrecision,
          the float32 masters too);
        - ``communication_buffers``: the fusion buffers and, with ZeRO, the parameter broadcast's chunks;
        - ``gpu_peak``: on a GPU, the allocator's peak bytes in use (``Device.memory_stats()``); else None;
        - ``zero_stage``, ``world_size``, ``owned_parameters`` (how many parameters this rank updates).

        Before the first step the parameters are not known yet: parameters and gradients are 0."""
        r = self.reducer
        params = [p for _, p in r.params]
        z = r.zero
        owned = [p for n, p in r.params if z is None or not z.ready or z.owns(n)]
        kept = owned if z is not None and z.stage == 2 else params
        gpu = None
        cuda = [p.data.device for p in params if not p.data.device.is_cpu()]
        if cuda:
            gpu = int(_core.cuda_memory_stats(cuda[0].index)["peak_in_use"])
        return {"parameters": sum(p.data.nbytes for p in params),
                "gradients": sum(p.data.nbytes for p in kept),
                "optimizer_state": zero.optimizer_state_bytes(self.opt),
                "communication_buffers": sum(x.buffer_bytes for x in r.exchanges())
                + (z.gather_bytes if z is not None else 0),
                "gpu_peak": gpu, "zero_stage": self.zero_stage, "world_size": self.world_size,
                "owned_parameters": len(owned)}

    # ----- the straggler report
    def stats(self) -> "StragglerReport":
        """Which rank is slow, and where each rank's time goes (comm/straggler.py; docs/straggler.md). A
        collective: every rank calls it at the same point (one small all-gather of each rank's figures since the
        last report). Returns the report of every step so far but the first, the same on every rank: per rank
        the milliseconds per step in data loading, forward, backward, update and blocked in collectives (wait),
        how long it waited for the others inside collectives (waited) and they for it (caused), how often it
        arrived last, and its extra working time over the median rank and the phase it went to; ``straggler``
        names the rank the others wait for (None when none stands out) and ``summary`` says so in a sentence.
        ``str(report)`` is the table; ``report.to_dict()`` plain data. With ``report_every=N`` (or ``singa-run
        --report N``) the ranks also compare every N steps, and rank 0 prints each period's table."""
        if self.reducer.stats is None:
            raise RuntimeError("DistOpt.stats: this DistOpt was made with step_stats=False, which measures "
                               "nothing; make it with step_stats=True (the default)")
        self.reducer.require_no_open_step("stats")
        return self.reducer.stats.gather()

    @contextlib.contextmanager
    def _step(self):
        """A step of the partial or sparse modes: over when the block ends (a report every N steps)."""
        completed = False
        try:
            yield
            completed = True
        finally:
            self.reducer.step_over(completed)

    # ----- internals
    def _refuse_zero(self, what: str) -> None:
        if self.zero_stage:
            raise ValueError(f"DistOpt.{what}: not supported with zero_stage={self.zero_stage} (it updates or "
                             f"exchanges every parameter on every rank); use backward_and_update, "
                             f"backward_and_update_half or the two-phase step, or zero_stage=0")

    def _threshold(self, threshold) -> int:
        return check_threshold(threshold, self.buffSize, "DistOpt")

    def _param_list(self, params, what: str) -> list:
        if params is None:
            if not self.reducer.params:
                raise ValueError(f"DistOpt.{what}: no training step has run yet; pass the parameters "
                                 f"(e.g. list(model.get_params().values()))")
            return [p for _, p in self.reducer.params]
        params = list(params.values()) if isinstance(params, dict) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"DistOpt.{what}: parameters must be tensor.Tensor, got {type(p).__name__}")
        return params


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
