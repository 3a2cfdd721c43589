"""In-process elasticity, the Horovod way: ``dist.elastic.run(train)(state)`` goes on without restarting
processes when ranks fail or join.

    from singa_lite import dist, opt
    from singa_lite.data import ElasticSampler

    comm = dist.elastic.init(min_np=2, max_np=4)      # an env-launched job: RANK, WORLD_SIZE, MASTER_ADDR, ...
    sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9), communicator=comm)
    # ... build the model, model.set_optimizer(sgd), model.compile(...)
    sampler = ElasticSampler(len(x), comm.rank, comm.world_size, batch_size=32, seed=0)
    state = dist.elastic.State(model=model, optimizer=sgd, sampler=sampler, every=10)

    @dist.elastic.run
    def train(state):
        for epoch in range(state.epoch, epochs):
            state.sampler.set_epoch(epoch)            # keeps the restored cursor in the restored epoch
            for idx in state.sampler:
                train_step(x[idx], y[idx])
                state.step()                          # an in-memory commit every 10 steps
            state.commit()

    train(state)

When a rank fails, the others' collectives raise CommError; ``run`` catches it, aborts and closes the
communicator, and the survivors meet again without the failed rank (comm/membership.py: a new round through
the job's store, ranks renumbered densely, a new communicator of the job's backend). Every member then restores
the latest in-memory commit, sent by the survivor that holds it, re-partitions the data (the sampler takes its
new rank and world size; an ElasticSampler's cursor is the job's, so every sample of the epoch is used exactly
once across the failure), rebinds the DistOpt to the new communicator, and calls ``train(state)`` again.

Processes that come later (new ones, or one whose host was cut off and is back) wait in the store's join
queue; the members' next commit lets them in (up to ``max_np``): the commit raises MembersChanged on every
member, ``run`` regroups with them and they start from that commit. Below ``min_np`` a round waits for
more, up to the timeout, and then fails on every member with a message saying what it waited for.

What survives a failure: what State holds (the model's parameters and buffers, the optimizer's state, DistOpt's
counters and sparse residuals, the sampler's epoch and cursor, a loss scaler's, a numpy Generator's and the
devices' random state, ``commit(extra=)``) as of the last commit: each member that took part in that commit
restores its own, a newcomer the source's (with zero residuals and its own random streams). What does not: the
steps after it (trained again), the failed processes and what only they held, the old communicator's buckets.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from .. import tensor
from ..checkpoint.periodic import PeriodicCommit, check_every
from .communicator import CollectiveMismatch, CommError
from .membership import ElasticTimeout, JobFinished, Membership, MembersChanged, counts_from_env

__all__ = ["init", "run", "State", "MembersChanged", "ElasticTimeout", "JobFinished", "current", "shutdown"]

_current: Membership | None = None


def init(min_np: int | None = None, max_np: int | None = None, backend: str | None = None,
         timeout: float | None = None, comm_timeout: float | None = None, **options):
    """Joins the elastic job this process was launched into (``singa-run --elastic``, or plain processes with
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, or Slurm's variables: a launcher that lets the
    survivors live when a rank fails) and returns its communicator. Any process may fail, except the one that
    serves the job's store: launch rank 0 of plain processes (under singa-run --elastic, singa-run itself).
    min_np / max_np: the fewest ranks the job trains on (below, it waits up to `timeout`, then fails) and the
    most (joiners beyond wait); default SINGA_LITE_ELASTIC_MIN_NP / SINGA_LITE_ELASTIC_MAX_NP (singa-run
    --min-np / --max-np), else 1 and no limit. timeout: seconds any round may wait (default
    SINGA_LITE_ELASTIC_TIMEOUT or 600); comm_timeout: each collective's (default SINGA_LITE_COMM_TIMEOUT or
    300), which is also how long a cut-off peer takes to be noticed. backend, options: as dist.init's.

    A process that comes after the start (round 0 over) gets a one-rank stand-in communicator: it builds its
    model alone, and ``run`` lets it into the job at the members' next commit."""
    global _current
    if _current is not None and not _current.closed:
        raise RuntimeError("dist.elastic.init: this process already joined the elastic job; use "
                           "dist.elastic.current().communicator, or dist.elastic.shutdown() first")
    from . import env

    if env.detect() in ("singa-run", "mpiexec"):
        raise ValueError(f"dist.elastic needs a job launched with environment variables (RANK, WORLD_SIZE, "
                         f"MASTER_ADDR, MASTER_PORT, or Slurm's), by a launcher that lets the survivors live when "
                         f"a rank fails; this process was started by {env.detect()}, which stops every rank when "
                         f"one fails: start it with `singa-run --elastic`, or use the restarts "
                         f"(checkpoint.ElasticState, docs/elastic.md)")
    min_np, max_np = counts_from_env(min_np, max_np)
    launch = env.read()
    _current = Membership(launch, backend=backend, min_np=min_np, max_np=max_np, timeout=timeout,
                          comm_timeout=comm_timeout, **options)
    try:
        return _current.start()
    except BaseException:
        _current.close()
        raise


def current() -> Membership:
    """This process's membership (after init)."""
    if _current is None or _current.closed:
        raise RuntimeError("dist.elastic: call dist.elastic.init() first (every process of the job)")
    return _current


def shutdown() -> None:
    """Closes the communicator, the heartbeat and the store connection (the store's server: stops serving)."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


class State(PeriodicCommit):
    """The training state ``dist.elastic.run`` restores after a failure or a join, committed in memory.

    model: a Layer/Model (get_states / set_states) or a dict of named tensors; optimizer: a DistOpt (rebound to
    each new communicator with DistOpt.rebind) or a plain Optimizer; sampler: an ElasticSampler (or anything
    with rank, world_size, cursor, state_dict and load_state_dict); rng: a numpy Generator; scaler: a loss
    scaler (get_states / set_states); every: commit every `every` calls of step() (None: only when commit()
    is called); log: where rank 0 says what a regroup did (a function of one string; None for silence)."""

    def __init__(self, model=None, optimizer=None, sampler=None, rng=None, scaler=None, every=None, log=print):
        check_every(every, "dist.elastic.State")
        if sampler is not None and not all(hasattr(sampler, a) for a in ("rank", "world_size", "state_dict",
                                                                        "load_state_dict", "cursor")):
            raise TypeError(f"dist.elastic.State: the sampler must be re-partitioned at every change of the ranks: "
                            f"use a data.ElasticSampler, got {type(sampler).__name__}")
        if scaler is not None and not (hasattr(scaler, "get_states") and hasattr(scaler, "set_states")):
            raise TypeError(f"dist.elastic.State: scaler must have get_states() and set_states(), got "
                            f"{type(scaler).__name__}")
        self.model, self.optimizer, self.sampler, self.rng, self.scaler = model, optimizer, sampler, rng, scaler
        self.every, self.log = every, log
        self.steps = 0  # steps taken so far, all epochs (restored with the commit)
        self.extra: dict = {}  # what the last commit(extra=) passed, restored with it
        self.committed = None  # the last in-memory commit
        self.committed_step = -1
        self.resets = 0  # how many times run() regrouped

    @property
    def communicator(self):
        return current().communicator

    @property
    def rank(self) -> int:
        return self.communicator.rank

    @property
    def world_size(self) -> int:
        return self.communicator.world_size

    @property
    def epoch(self) -> int:
        return getattr(self.sampler, "epoch", 0)

    # ----- commits
    def commit(self, extra=None) -> None:
        """Keeps the whole state in memory (a copy of the parameters, buffers and optimizer state), then lets
        waiting processes in when there is room (MembersChanged, caught by run; collective: every member
        commits at the same steps)."""
        self.committed = self.snapshot(extra)
        self.committed_step = self.steps
        if current().join_due():
            raise MembersChanged(f"processes wait to join at step {self.steps}")

    def snapshot(self, extra=None) -> dict:
        snap = {"steps": self.steps, "user": extra if extra is not None else {}}
        if self.model is not None:
            states = self.model if isinstance(self.model, dict) else self.model.get_states()
            snap["model"] = {k: tensor.to_numpy(v).copy() for k, v in states.items()}
        if is_dist_opt(self.optimizer):
            states = self.optimizer.get_states()
            snap["optimizer"] = states["opt"]
            # the residuals' keys are tuples of names: as a list, as checkpoints keep them
            snap["distopt"] = {"partial": int(states["partial"]), "skipped_steps": int(states["skipped_steps"]),
                               "residuals": [{"names": list(k), "values": np.asarray(v)}
                                             for k, v in states["residuals"].items()]}
        elif self.optimizer is not None:
            snap["optimizer"] = self.optimizer.get_states()
        if self.sampler is not None:
            snap["sampler"] = self.sampler.state_dict()
        if self.scaler is not None:
            snap["scaler"] = self.scaler.get_states()
        if self.rng is not None:
            snap["rng"] = self.rng.bit_generator.state
        snap["generators"] = device_rng_states()
        return snap

    def restore(self, snap: dict, own: bool = True) -> None:
        """Restores a commit: this process's own (own=True: everything, its residuals and random streams too),
        or another member's (own=False: what the members share; sparse residuals start at zero and the devices'
        random streams go on as they are, since they belong to the process that made the commit)."""
        comm = self.communicator
        if is_dist_opt(self.optimizer):
            residuals = {tuple(e["names"]): e["values"] for e in snap["distopt"]["residuals"]} if own else {}
            self.optimizer.set_states({"opt": snap["optimizer"], "partial": snap["distopt"]["partial"],
                                       "skipped_steps": snap["distopt"]["skipped_steps"], "synced": True,
                                       "residuals": residuals})
        elif self.optimizer is not None:
            self.optimizer.set_states(snap["optimizer"])
        if isinstance(self.model, dict):  # named tensors (a model in SINGA's plain autograd style), in place
            missing = sorted(set(self.model) ^ set(snap["model"]))
            if missing:
                raise ValueError(f"dist.elastic.State: the commit's tensors and the model's differ: {missing[:5]}")
            for k, v in self.model.items():
                v.copy_from_numpy(np.asarray(snap["model"][k], dtype=tensor.to_numpy(v).dtype))
        elif self.model is not None:
            self.model.set_states(snap["model"])
        if self.sampler is not None:
            self.sampler.rank, self.sampler.world_size = comm.rank, comm.world_size
            state = snap["sampler"]
            if hasattr(self.sampler, "resharded_state"):
                state = self.sampler.resharded_state(state)
            self.sampler.load_state_dict(state)
        if self.scaler is not None:
            self.scaler.set_states(snap["scaler"])
        if self.rng is not None:
            self.rng.bit_generator.state = snap["rng"]
        if own:
            set_device_rng_states(snap.get("generators", {}))
        self.steps = self.committed_step = int(snap["steps"])
        self.extra = snap["user"]
        self.committed = snap

    def sync(self, source: int = 0) -> None:
        """Every member goes on from rank `source`'s last commit (collective): the source packs it (taking one
        first when it has none: the start) and broadcasts it. A member that holds a commit of the same step (it
        took part in that commit) restores its own, which may differ from the source's where ranks differ
        (partial updates' parameters and optimizer state, sparse residuals, random streams); the others (a
        newcomer, a member whose last commit is older) restore the source's. The steps after it are done
        again."""
        from ..checkpoint.format import pack, unpack

        comm = self.communicator
        data = b""
        if comm.rank == source:
            if self.committed is None:
                self.committed, self.committed_step = self.snapshot(), self.steps
            data = pack({"kind": "elastic"}, self.committed)
        if comm.world_size > 1:
            data = broadcast_bytes(comm, data, source)
        snap = self.committed if comm.rank == source else unpack("the elastic commit of rank " + str(source), data,
                                                                 {"kind": "elastic"})
        mine = self.committed if self.committed is not None and self.committed_step == int(snap["steps"]) else None
        self.restore(mine if mine is not None else snap, own=mine is not None)

    def __repr__(self) -> str:
        return (f"dist.elastic.State(step={self.steps}, every={self.every}, last commit at step {self.committed_step}, "
                f"{self.resets} regroup(s))")


def is_dist_opt(optimizer) -> bool:
    """A DistOpt (singa_lite.parallel, above this layer): what can be rebound to a new communicator."""
    return callable(getattr(optimizer, "rebind", None)) and hasattr(optimizer, "communicator")


def devices() -> list:
    """This process's devices whose random streams a commit keeps: the CPU and every GPU it sees."""
    from .. import _core, device

    return [device.create_cpu_device()] + [device.as_device(f"cuda:{i}") for i in range(_core.cuda_device_count())]


def device_rng_states() -> dict:
    return {str(d): list(d.get_rng_state()) for d in devices()}


def set_device_rng_states(states: dict) -> None:
    here = {str(d): d for d in devices()}
    for name, st in states.items():
        if name in here:
            here[name].set_rng_state(st)


def broadcast_bytes(comm, data: bytes, root: int) -> bytes:
    """Rank root's bytes on every rank, as one int32 tensor (after their length)."""
    size = int(comm.broadcast_object(len(data) if comm.rank == root else None, root))
    padded = np.zeros((size + 3) // 4, np.int32)
    if comm.rank == root:
        padded.view(np.uint8)[:size] = np.frombuffer(data, np.uint8)
    t = tensor.from_numpy(padded)
    if comm.device_kind != "cpu":
        t.to_device(comm_device(comm))
    comm.broadcast(t, root)
    return tensor.to_numpy(t).view(np.uint8)[:size].tobytes()


def comm_device(comm):
    from .. import device

    return getattr(comm, "device", None) or device.get_default_device()


def run(fn):
    """``run(train)(state, *args)``: calls train(state, *args) and, whenever a rank fails (CommError on this
    one) or processes join (MembersChanged at a commit), regroups and calls it again from the last commit,
    without restarting the process. Returns what train returns. A CollectiveMismatch (the ranks called
    different collectives: a bug) and anything else is raised as it is."""
    @functools.wraps(fn)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError(f"dist.elastic.run: the first argument must be a dist.elastic.State, got "
                            f"{type(state).__name__}")
        member = current()
        cause = "joining" if member.pending else None
        while True:
            try:
                if cause is not None:
                    started, before = time.monotonic(), state.world_size if not member.pending else None
                    regroup(member, state, cause)
                state.sync(member.source)
                member.passed()  # every member is in this round now: the earlier rounds' keys can go
                if cause is not None and state.rank == 0 and state.log is not None:
                    why = ("processes joined" if isinstance(cause, MembersChanged) else "a process joined"
                           if not isinstance(cause, CommError) else f"a failure ({str(cause).splitlines()[0][:300]})")
                    state.log(f"elastic: round {member.round}: {before or '?'} -> {state.world_size} rank(s) after "
                              f"{why}; going on from the commit at step {state.committed_step} (epoch {state.epoch}, "
                              f"{time.monotonic() - started:.2f} s)")
                cause = None
                out = fn(state, *args, **kwargs)
                member.finish()
                return out
            except CollectiveMismatch:
                raise
            except JobFinished as e:
                if state.log is not None:
                    state.log(str(e))
                raise
            except ElasticTimeout:
                raise
            except (CommError, MembersChanged) as e:
                if isinstance(e, CommError) and "used after close()" in str(e):  # not a failure: a stale reference
                    raise RuntimeError(f"dist.elastic.run: the training function used a communicator that a regroup "
                                       f"closed ({e}); take it from state.communicator each time (a DistOpt is "
                                       f"rebound by itself)") from e
                cause = e
    return wrapper


def regroup(member: Membership, state: State, cause) -> None:
    """Closes what the failed (or outgrown) communicator had, makes the next round's and rebinds the DistOpt."""
    failure = cause if isinstance(cause, CommError) else None
    optimizer = state.optimizer if is_dist_opt(state.optimizer) else None
    if optimizer is not None and optimizer.communicator is not member.communicator:  # hierarchical: its own
        _close_quietly(optimizer.communicator, failure)
    comm = member.regroup(state.committed_step, failure)
    if optimizer is not None:
        optimizer.rebind(comm)
    state.resets += 1


def _close_quietly(comm, failure) -> None:
    try:
        if failure is not None:
            comm.abort(f"dist.elastic: regrouping after {failure}")
    except Exception:  # noqa: BLE001
        pass
    try:
        comm.close()
    except Exception:  # noqa: BLE001
        pass

