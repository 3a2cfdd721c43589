"""The reducer: one data-parallel step, from the gradients backward yields to the update, shared by DistOpt
(dist_opt.py, SINGA's face of it), ddp.DistributedOptimizer (through DistOpt) and DataParallel (its exchange).

A step is data flowing one way::

    backward(loss) ─ (name, param, grad) ─> gradients()        clip, first-step model check, accumulation
                                            │
                                            v
                                      exchange (exchange.py)   plain / half / hook: fused buckets that leave
                                            │                  while backward runs; partial / sparse: after it
                                            v
                       PendingStep ─> complete(): wait, scale (join), vote: finite on every rank?
                                            │
                                            v
                                      apply(): opt.apply per gradient, opt.step()

Nothing downstream calls back upstream: PendingStep (pending.py) and Join (join.py) use the public methods here.
gradients() is the one path every gradient takes before bucketing; with find_unused_parameters (unused.py) the
pass's gradients are then completed by the used-mask (zeros for parameters used on other ranks, in the declared
order) before the first bucket. complete() / apply() are where every step that updates passes (the check of the
replicas every N steps follows apply()).
"""
from __future__ import annotations

import math
import os
import sys
import warnings

import numpy as np

from .. import _core, engine
from ..raw import from_host, to_host
from . import fusion, hooks, replicas
from .accumulate import Accumulator
from .exchange import HalfExchange, HookExchange, PartialExchange, PlainExchange, SparseExchange
from .pending import PendingStep
from .step_stats import BACKWARD, FORWARD

CTensor = _core.Tensor
_CPU = _core.Device("cpu")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

__all__ = ["Reducer", "all_finite", "EXCHANGE_MODES", "check_exchange_mode"]

# Where a pass's bucket all-reduces run: "thread" (the communicator's thread, while backward goes on) or
# "inline" (the training thread, as each bucket is sent). "thread" is the default: on a 2-core host whose
# ranks fill the cores, inline used less CPU time per step but no less wall time, because the thread also hides
# the wait for a peer that reaches the bucket later (docs/benchmarks/distopt.md, "Against the
# communication-free floor").
EXCHANGE_MODES = ("thread", "inline")


def check_exchange_mode(mode, who: str) -> str:
    if mode not in EXCHANGE_MODES:
        raise ValueError(f"{who}: exchange must be 'thread' (the default: each bucket's all-reduce on the "
                         f"communication thread, overlapping backward) or 'inline' (on the training thread, as the "
                         f"bucket is sent), got {mode!r}")
    return mode


def user_stacklevel() -> int:
    """The stacklevel that makes a warning point at the caller's nearest frame outside singa_lite (the user's
    training step, however deep inside the package the warning was raised)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def all_finite(t: CTensor) -> bool:
    """Whether every element is finite. First the plain sum: an inf or nan element makes it inf or nan, so a
    finite sum settles it in one pass over t. A sum that is not finite may also be an overflow of finite values;
    then x * 0 decides: it is 0 for a finite x and nan for inf or nan, and a sum of zeros cannot overflow, so that
    sum is nan exactly when some element is not finite. Sums rather than max(abs(x)): the sum reduction vectorises
    and the max does not (docs/benchmarks/distopt.md, "The finiteness test")."""
    if t.numel == 0:
        return True
    if math.isfinite(float(to_host(_core.sum(t)))):
        return True
    return math.isfinite(float(to_host(_core.sum(_core.mul_scalar(t, 0.0)))))


class Reducer:
    """One rank's side of data-parallel steps over `communicator`, updating with `opt` (None: exchange only,
    as DataParallel). buff_elems, first_bucket, overlap, on_nonfinite, passes_per_step, average_accumulated:
    as DistOpt's buffSize, first_bucket, overlap, on_nonfinite, backward_passes_per_step, average_accumulated.
    who: the name errors begin with."""

    def __init__(self, communicator, opt, buff_elems: int, *, first_bucket: int, overlap: bool = True,
                 on_nonfinite: str = "skip", passes_per_step: int = 1, average_accumulated: bool = True,
                 who: str = "DistOpt", exchange: str = "thread"):
        self.communicator, self.opt, self.buff_elems, self.who = communicator, opt, int(buff_elems), who
        self.first_bucket, self.overlap, self.on_nonfinite = int(first_bucket), bool(overlap), on_nonfinite
        self.world_size, self.rank = communicator.world_size, communicator.rank
        self.skipped_steps = 0
        self.synced = False  # rank 0's parameters broadcast and the models compared (first step)
        self.params = []  # (name, param) of the last step, in backward order
        self.reference = None  # the parameter names every rank had at the first step (to explain mismatches)
        self.accumulator = Accumulator(passes_per_step, average_accumulated)
        self.pending = None  # the PendingStep left open
        self.join = None  # the Join of a `with join():` block under way (join.py)
        self.partial = PartialExchange()
        self.sparse = SparseExchange(communicator)
        self._fused = {}  # wire dtype name (None: the gradients' own) -> PlainExchange / HalfExchange
        self._hook = None  # HookExchange once register_comm_hook was called
        self._passes = 0  # backward passes begun (a comm hook is registered before the first)
        self.updates = 0  # optimizer updates applied: the step number the replica check counts
        self.replica_check = None  # a replica_check.ReplicaCheck (DistOpt's check_replicas_every), or None
        self.unused = None  # an unused.UnusedParameters (DistOpt's find_unused_parameters=True), or None
        self.zero = None  # a zero.Zero (DistOpt's zero_stage=1 or 2), or None
        self.stats = None  # a step_stats.StepStats (DistOpt's step phases and reports), or None
        # where the buckets' all-reduces run: "thread" (the communicator's thread, overlapping the rest of
        # backward) or "inline" (this thread, as each bucket is sent)
        self.exchange_mode = check_exchange_mode(exchange, who)

    # ----- what crosses the wire
    def register_comm_hook(self, state, hook) -> None:
        """Every later plain exchange hands its buckets to ``hook(state, bucket)`` (see exchange.HookExchange)."""
        state, hook = hooks.check_comm_hook(state, hook, f"{self.who}.register_comm_hook")
        if self._hook is not None:
            raise RuntimeError(f"{self.who}.register_comm_hook: a comm hook is already registered "
                               f"({getattr(self._hook.hook, '__qualname__', self._hook.hook)!r}); only one can be")
        if self._passes:
            raise RuntimeError(f"{self.who}.register_comm_hook: register the comm hook before the first backward "
                               f"pass ({self._passes} made already), so that every step's buckets use it")
        self._hook = HookExchange(self.communicator, self.buff_elems, state, hook)

    @property
    def comm_hook(self):
        """(state, hook) registered, or None."""
        return None if self._hook is None else (self._hook.state, self._hook.hook)

    def fused(self, wire=None):
        """The fused exchange of a step with `wire` on the wire (None: each gradient's own dtype; the comm
        hook's when one is registered)."""
        if self._hook is not None:
            if wire is not None:
                self.refuse_with_hook(f"backward_and_update_half (a {wire.name} exchange)")
            return self._hook
        if self.zero is not None and self.zero.stage == 2:
            return self.zero.exchange(wire)
        if wire is None:
            return self.values_exchange()
        if wire.name not in self._fused:
            self._fused[wire.name] = HalfExchange(self.communicator, self.buff_elems, wire)
        return self._fused[wire.name]

    def _place(self, exchange) -> None:
        """Sets where a pass of the plain or half exchange runs its buckets (a hook or ZeRO reduces its own way,
        on the communication thread)."""
        if type(exchange) in (PlainExchange, HalfExchange):
            exchange.inline = self.exchange_mode == "inline"

    def values_exchange(self) -> PlainExchange:
        """The plain fused all-reduce ("avg"): gradients without a hook, and parameter values always."""
        if None not in self._fused:
            self._fused[None] = PlainExchange(self.communicator, self.buff_elems)
        return self._fused[None]

    def refuse_with_hook(self, what: str) -> None:
        if self._hook is not None:
            raise RuntimeError(f"{self.who}: {what} chooses what crosses the wire itself, and a comm hook is "
                               f"registered, which replaces the plain exchange only; train with "
                               f"backward_and_update (the hook may compress, e.g. parallel.hooks)")

    @property
    def bytes_sent(self) -> int:
        """Payload this rank handed to the exchanges (with a hook: the buckets given to it)."""
        return sum(x.bytes_sent for x in self.exchanges())

    def exchanges(self) -> list:
        return (list(self._fused.values()) + ([self._hook] if self._hook is not None else [])
                + (self.zero.exchanges() if self.zero is not None else []))

    # ----- the fused step: backward -> exchange -> PendingStep
    def backward(self, loss, threshold: int, wire=None, clip=None) -> PendingStep:
        """The backward pass from `loss`, each gradient queued for the exchange as it comes; the open step."""
        self.require_no_open_step("backward")
        if wire is not None:  # refused at every pass, not only at those that exchange
            self.refuse_with_hook(f"backward_and_update_half (a {wire.name} exchange)")
        self.charge(FORWARD)
        acc = self.accumulator
        self._passes += 1
        if not acc.next_pass_syncs():  # gradient accumulation: nothing leaves this rank
            triples = list(self.gradients(loss, clip))
            self.first_step(triples)
            self.charge(BACKWARD)
            return self._open(None, triples)
        exchange = self.fused(wire)
        triples = []
        # the first step compares the models before any exchange; the used-mask needs the whole pass first
        # ZeRO stage 2 routes each bucket to its owner: the plan (made at the first step) must exist first
        overlap = self.synced and self.overlap and self.unused is None and (self.zero is None or self.zero.ready)
        zero = self.zero
        join, scale = self.join, None
        if join is not None:  # uneven inputs: how many ranks still train decides the divisor
            scale = join.factor(join.vote(True))
        self._place(exchange)
        exchange.begin(threshold, self.first_bucket)
        gradients = self.gradients(loss, clip, merge=True)
        try:
            for name, p, g in gradients:
                triples.append((name, p, g))  # first: a push that fails must still count this gradient as had
                if overlap:
                    exchange.push(g.data, name, p)
                    if zero is not None:  # stage 2: another rank's gradient is not kept once sent
                        triples[-1] = (name, p, zero.keep(name, g))
            if not acc.empty:  # parameters the earlier passes reached and this one did not
                for extra in acc.leftovers({n for n, _, _ in triples}):
                    triples.append(extra)
                    if overlap:
                        exchange.push(extra[2].data, extra[0], extra[1])
            if not overlap:
                self.first_step(triples)
                if self.unused is not None:  # zeros where this rank's forward did not use a parameter
                    triples = self.unused.complete(triples, self.opt.name_of)
                    self.params = [(n, p) for n, p, _ in triples]
                if zero is not None:
                    zero.ensure_plan([(n, p) for n, p, _ in triples])
                for name, p, g in triples:
                    exchange.push(g.data, name, p)
                if zero is not None:
                    triples = [(n, p, zero.keep(n, g)) for n, p, g in triples]
        except BaseException as e:
            exchange.cancel()  # the next backward starts a new pass; nothing here may block on a collective
            if not fusion.is_mismatch(e):
                raise
            # The ranks' buckets differ (met while a full buffer waited for its buckets): the rest of the pass
            # gives the names of every parameter with a gradient, which explain() names the missing ones from.
            names = [n for n, _, _ in triples] + [n for n, _, _ in gradients]
            explained = exchange.explain(e, self.who, self.reference, names)
            if explained is e:
                raise
            raise explained from e
        acc.clear()
        if overlap:
            self.params = [(n, p) for n, p, _ in triples]
        if join is not None:
            join.record(threshold, self.first_bucket, wire, triples)
        self.charge(BACKWARD)
        return self._open(exchange, triples, scale, joined=join is not None)

    def gradients(self, loss, clip=None, merge: bool = False):
        """(name, param, grad) as backward yields them: the loss scaled as the optimizer wants, gradients
        clamped to [-clip, clip] (clip not None), and with merge the sums of accumulated passes added."""
        scale_loss = getattr(self.opt, "scale_loss", None)  # amp.MixedPrecision: its loss scale, once
        # engine.backward looked up at each call: a script's replacement of it (or of autograd.backward,
        # which the façade forwards to the engine) sees DistOpt's backward passes too.
        for p, g in engine.backward(loss if scale_loss is None else scale_loss(loss)):
            if clip is not None:
                _core.clip(g.data, -clip, clip, out=g.data)
            name = self.opt.name_of(p)
            if merge:
                self.accumulator.merge(name, g.data)
            yield name, p, g

    def begin_pass(self, threshold: int):
        """The fused exchange of a pass whose gradients the caller pushes itself (DataParallel's hooks)."""
        exchange = self.fused()
        self._passes += 1
        self._place(exchange)
        exchange.begin(threshold, self.first_bucket)
        return exchange

    def answer(self, exchange, zeros, threshold: int, first_bucket: int, scale) -> None:
        """A rank out of data inside join(): its zeros through the same buckets as the ranks that train, then
        the same vote and update."""
        exchange.begin(threshold, first_bucket)
        for name, p, z in zeros:
            exchange.push(z.data, name, p)
        self._open(exchange, list(zeros), scale).finish()

    def _open(self, exchange, triples, scale=None, joined=False) -> PendingStep:
        self.pending = PendingStep(self, exchange, triples, scale, joined)
        return self.pending

    # ----- what PendingStep calls, in this order
    def complete(self, exchange, triples, scale) -> bool:
        """Waits for the exchange, scales the averages (join), and votes: whether the step applies."""
        try:
            regions = exchange.finish()
            if scale is not None:  # joined ranks sent zeros: the mean over the ranks that trained
                for _, _, g in triples:
                    _core.mul_scalar(g.data, scale, out=g.data)
            return self.finite_everywhere(regions)
        except BaseException as e:
            # the ranks' buckets (or the finiteness vote behind them) differ: name the parameters
            explained = exchange.explain(e, self.who, self.reference, [n for n, _, _ in triples])
            if explained is e:
                raise
            raise explained from e

    def apply(self, triples, replicas_equal: bool = True) -> None:
        """One update of the optimizer with these gradients; then, every N updates, the replica check
        (replicas_equal=False: an update after which the ranks' parameters differ on purpose, the partial mode's)."""
        zero = self.zero
        if zero is not None:  # this rank updates its shard, then every parameter comes from its owner
            zero.ensure_plan([(n, p) for n, p, _ in triples])
            named = list(self.params)  # every parameter of the step (stage 2's triples are this rank's only)
            triples = zero.owned(triples)
        for name, p, g in triples:
            self.opt.apply(name, p, g)
        self.opt.step()
        if zero is not None:
            zero.broadcast_parameters(named)
            zero.after_first_update()
        self.updates += 1
        if self.replica_check is not None and replicas_equal:
            self.replica_check.after_step(self.updates, [(n, p) for n, p, _ in triples], self.opt)

    def drop(self, exchange, joined: bool) -> None:
        """A discarded step: its exchange completed (the other ranks made it) and, inside join(), this rank's
        part in the vote the ranks out of data make ("finite")."""
        regions = exchange.finish()
        if joined:
            self.communicator.all_reduce(from_host(np.zeros(1, np.int32), _vote_device(regions)), "max")

    def kept(self, triples) -> list:
        """The (name, param, grad) of an exchanged step that this rank keeps: its shard's at ZeRO stage 2."""
        if self.zero is None or self.zero.stage < 2:
            return triples
        return self.zero.owned(triples)

    def clip_grad_norm(self, pairs, max_norm, norm_type) -> float | None:
        """Clips a stage-2 step's shard by the global norm over the ranks' shards (None: not sharded, the
        caller clips the pairs, which are every gradient)."""
        if self.zero is None or self.zero.stage < 2:
            return None
        return self.zero.clip_grad_norm(pairs, max_norm, norm_type)

    def release(self, step) -> None:
        """The step is over: the next backward may begin."""
        if self.pending is step:
            self.pending = None

    # ----- the straggler report's clock (step_stats.py): where each step's time goes
    def charge(self, phase: int) -> None:
        """The time since the last charge goes to `phase` (comm.straggler.PHASES; less data loading and time blocked in
        collectives meanwhile)."""
        if self.stats is not None:
            self.stats.charge(phase)

    def step_over(self, completed: bool = True) -> None:
        """A step (a backward pass and what follows it) is over on this rank; completed: it ended normally."""
        if self.stats is not None:
            self.stats.step_over(completed)

    # ----- the modes that update from each rank's own gradients (partial, sparse)
    def local_step(self, what: str, loss):
        """The pass's (name, param, grad) once the accumulated passes are gathered, the first step's model
        check done and every rank's gradients finite; None when there is nothing to apply (a pass that only
        accumulates, or a step skipped on every rank). Checked before anything changes: a NaN below the
        threshold would never be sent but would stay in a residual, and a step skipped on some ranks only
        would leave the replicas apart."""
        self.require_no_open_step(what)
        if self.join is not None:
            raise RuntimeError(f"{self.who}.{what}: not supported inside a join() block (a rank out of data "
                               f"answers the fused exchange only); use backward_and_update or the two-phase step "
                               f"there")
        self.refuse_with_hook(what)
        self.charge(FORWARD)
        self._passes += 1
        triples = list(self.gradients(loss))
        self.charge(BACKWARD)
        acc = self.accumulator
        if not acc.next_pass_syncs():
            self.first_step(triples)
            acc.add(triples)
            return None
        if not acc.empty:
            for name, _, g in triples:
                acc.merge(name, g.data)
            triples = triples + acc.leftovers({n for n, _, _ in triples})
            acc.clear()
        self.first_step(triples)
        if self.unused is not None:  # the same parameters, in the declared order, on every rank
            triples = self.unused.complete(triples, self.opt.name_of)
            self.params = [(n, p) for n, p, _ in triples]
        if not self.finite_everywhere([g.data for _, _, g in triples], local=True):
            return None
        return triples

    def average_values(self, params, threshold: int) -> None:
        """Averages the parameters' values over the ranks, in place (fused, "avg")."""
        x = self.values_exchange()
        x.begin(threshold)
        for p in params:
            x.push(p.data)
        x.finish()

    # ----- the vote
    def finite_everywhere(self, regions, local: bool = False) -> bool:
        """Whether every tensor of `regions` is finite on every rank, decided the same way on every rank (an
        all-reduce of the ranks' verdicts), so ranks never diverge on skipping a step. regions: the averaged
        gradients (the same on every rank), or with `local` each rank's own gradients (partial and sparse
        updates, checked before anything changes; the verdicts then name the ranks)."""
        verdicts = np.zeros(self.world_size if local else 1, np.int32)
        verdicts[self.rank if local else 0] = 0 if all(all_finite(r) for r in regions) else 1
        bad = from_host(verdicts, _vote_device(regions))
        self.communicator.all_reduce(bad, "max")
        bad = to_host(bad)
        if not bad.any():
            return True
        what = (f"the gradients of rank {', '.join(map(str, np.flatnonzero(bad)))}" if local
                else "the averaged gradients")
        if self.on_nonfinite == "raise":
            raise FloatingPointError(f"{self.who}: {what} contain inf or nan; no parameter was changed on any rank "
                                     f"(on_nonfinite='skip' skips such steps instead)")
        self.skipped_steps += 1
        skipped = getattr(self.opt, "step_skipped", None)  # amp.MixedPrecision backs its loss scale off
        if skipped is not None:
            skipped()
        if self.rank == 0:
            warnings.warn(f"{self.who}: inf or nan in {what}: step skipped on every rank ({self.skipped_steps} so "
                          f"far)", RuntimeWarning, stacklevel=user_stacklevel())
        return False

    # ----- the replicas
    def first_step(self, triples, force: bool = False) -> None:
        """Once: compare the ranks' models, then give every rank rank 0's parameter values."""
        if not force:
            self.params = [(n, p) for n, p, _ in triples]
        if self.synced and not force:
            return
        named = [(n, p) for n, p, _ in triples]
        if self.unused is not None and not force:  # the declared set, not what this rank's backward reached
            named = self.unused.resolve()
        try:
            replicas.broadcast_parameters(self.communicator, named, 0, who=self.who)
        except ValueError as e:
            if force or self.unused is not None:
                raise
            line = fusion.user_line()  # in a backward pass, a parameter without a gradient is missing too
            hint = " (DistOpt(..., find_unused_parameters=True) allows that)" if self.who == "DistOpt" else ""
            raise ValueError(f"{e}, or one rank's forward did not use some parameters at the first step (called "
                             f"from {line or 'this process'}), so its backward gave them no gradient{hint}") from e
        self.reference = [n for n, _ in named]
        self.synced = True

    # ----- guards
    def require_no_open_step(self, what: str) -> None:
        if self.pending is not None:
            raise RuntimeError(f"{self.who}.{what}: the step of the previous backward() is still open; apply it "
                               f"with finish() / step(), or drop it with discard(), first")

    def require_no_accumulation(self, what: str) -> None:
        acc = self.accumulator
        if not acc.empty:
            raise RuntimeError(f"{self.who}.{what}: {acc.passes} backward pass(es) of gradient accumulation "
                               f"are gathered and not yet exchanged; call it after the pass that updates (every "
                               f"{acc.passes_per_step} passes, or the first one after no_sync())")


def _vote_device(regions):
    """Where a vote lives: the communicator's kind of memory, that of the gradients (NCCL: the GPU)."""
    return regions[0].device if regions else _CPU
