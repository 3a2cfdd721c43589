"""Hierarchical all-reduce: within a host over shared memory, across hosts between one leader per host.

    comm = hierarchical.create(dist.init(backend="mpi"))      # under mpiexec, ranks on several hosts
    sgd = opt.DistOpt(opt.SGD(lr=0.1), hierarchical=True)      # the same, made by DistOpt

A flat all-reduce over P ranks on H hosts sends every rank's data across the network; on a slow link the
ranks of one host share that link and take turns on it. Here each all-reduce runs in three steps:

1. reduce to the host's leader (local rank 0) over the shm backend (``intra``, this host's ranks);
2. all-reduce between the leaders only (``inter``, one rank per host, over the world's backend);
3. broadcast from the leader to the host's ranks over shm.

So each host sends one rank's worth of data across hosts instead of ``local_size`` ranks' worth. The result
is the same as the flat all-reduce up to the order of the floating-point sum (the test checks both). Every
other collective, and all-reduce of integers, goes to the flat world communicator unchanged: they are
metadata, not gradient traffic.

Ranks are grouped into hosts by their host names (exchanged once, at creation), which must agree with the
world communicator's local ranks. The leaders' communicator is made from the world's: an MPI split for the
mpi backend. GPU jobs do not need this: NCCL builds its own rings and trees across hosts.
"""
from __future__ import annotations

import socket

from .. import _core, tensor
from .communicator import CommError, Communicator
from .holder import new_shm_name, sweep_stale_segments
from .shm import ShmCommunicator

_FLOATS = (tensor.float16, tensor.bfloat16, tensor.float32, tensor.float64)


class HierarchicalCommunicator(Communicator):
    """The world communicator with all_reduce done in three steps (see the module docstring).

    world: the flat communicator of every rank; intra: this host's ranks (rank = local rank, leader 0);
    inter: the leaders' communicator on a leader, None on the other ranks."""

    backend = "hierarchical"

    def __init__(self, world: Communicator, intra: Communicator, inter: Communicator | None, hosts: int):
        super().__init__(world.rank, world.world_size, world.local_rank, world.local_size, world.timeout)
        self.world, self.intra, self.inter, self.hosts = world, intra, inter, hosts

    def __repr__(self):
        return (f"HierarchicalCommunicator(rank={self.rank}, world_size={self.world_size}, hosts={self.hosts}, "
                f"local_rank={self.local_rank}, local_size={self.local_size}, over={self.world.backend})")

    def _timeout_changed(self):
        for c in self._parts():
            c.timeout = self.timeout

    def _parts(self) -> list:
        return [c for c in (self.intra, self.inter, self.world) if c is not None]

    # ----- all_reduce: the three steps, on this communicator's own runner (so async_op overlaps as usual)
    def all_reduce(self, t, op: str = "sum", async_op: bool = False):
        raw = self._check_tensor(t, "all_reduce")
        self._check_op(op, raw, "all_reduce")
        if raw.dtype not in _FLOATS:
            return self.world.all_reduce(t, op, async_op)
        return self._run("all_reduce", lambda: self._in_place(raw, lambda c: self._all_reduce(c, op)) or t,
                         async_op)

    def _all_reduce(self, t, op):
        half = t.dtype in (tensor.float16, tensor.bfloat16)
        if op == "avg" and half:  # divided first, so that the sum cannot overflow where the mean does not
            _core.div_scalar(t, float(self.world_size), out=t)
        if self.intra.world_size > 1:
            self.intra.reduce(t, 0, "sum" if op == "avg" else op)
        if self.inter is not None:  # a leader
            self.inter.all_reduce(t, "sum" if op == "avg" else op)
            if op == "avg" and not half:
                _core.div_scalar(t, float(self.world_size), out=t)  # once, before the broadcast
        if self.intra.world_size > 1:
            self.intra.broadcast(t, 0)

    # ----- everything else: the flat world communicator
    def broadcast(self, t, root: int = 0, async_op: bool = False):
        return self.world.broadcast(t, root, async_op)

    def reduce(self, t, root: int = 0, op: str = "sum", async_op: bool = False):
        return self.world.reduce(t, root, op, async_op)

    def all_gather(self, t, async_op: bool = False):
        return self.world.all_gather(t, async_op)

    def reduce_scatter(self, t, op: str = "sum", async_op: bool = False):
        return self.world.reduce_scatter(t, op, async_op)

    def gather(self, t, root: int = 0, async_op: bool = False):
        return self.world.gather(t, root, async_op)

    def scatter(self, t, root: int = 0, async_op: bool = False):
        return self.world.scatter(t, root, async_op)

    def barrier(self, async_op: bool = False):
        return self.world.barrier(async_op)

    def send(self, t, dst: int, tag: int = 0, async_op: bool = False):
        return self.world.send(t, dst, tag, async_op)

    def recv(self, t, src: int, tag: int = 0, async_op: bool = False):
        return self.world.recv(t, src, tag, async_op)

    def _abort(self, reason):
        for c in self._parts():
            c.abort(reason)

    def _close(self):
        for c in self._parts():
            c.close()


def create(world: Communicator) -> Communicator:
    """The hierarchical form of `world` (collective: every rank calls it). `world` comes back unchanged
    where there is nothing to gain: a job on one host (the shm backend, or mpi with one host), and the
    nccl backend, whose rings and trees already keep traffic within a host where they can."""
    if isinstance(world, HierarchicalCommunicator):
        return world
    if not isinstance(world, Communicator):
        raise TypeError(f"hierarchical.create: expected a Communicator (dist.init()), got {type(world).__name__}")
    if world.backend in ("shm", "nccl"):  # one host; NCCL builds rings and trees across hosts by itself
        return world
    if world.backend != "mpi":
        raise ValueError(f"hierarchical all-reduce runs over the mpi backend (ranks started by mpiexec), got "
                         f"backend {world.backend!r}; use hierarchical=False with it")
    # Host names and local ranks, once: the hosts, and each host's shm rendezvous from its leader.
    if world.local_rank == 0:
        sweep_stale_segments()  # what killed jobs left, as a holder does
    every = world.all_gather_object({"host": socket.gethostname(), "local_rank": world.local_rank,
                                     "shm": new_shm_name() if world.local_rank == 0 else None})
    hosts = sorted({e["host"] for e in every}, key=lambda h: min(r for r, e in enumerate(every) if e["host"] == h))
    mine = [e for e in every if e["host"] == socket.gethostname()]
    if len(mine) != world.local_size or sorted(e["local_rank"] for e in mine) != list(range(world.local_size)):
        raise CommError(f"hierarchical all-reduce: rank {world.rank} sees {len(mine)} ranks on host "
                        f"{socket.gethostname()!r} but the {world.backend} backend says this host has "
                        f"{world.local_size}: give every host a distinct host name")
    if len(hosts) == 1 or world.world_size == 1:
        return world
    shm_name = next(e["shm"] for e in mine if e["local_rank"] == 0)
    intra = ShmCommunicator(shm_name, world.local_rank, world.local_size, timeout=world.timeout)
    inter = world.split(world.local_rank == 0)  # the leaders
    return HierarchicalCommunicator(world, intra, inter, len(hosts))


__all__ = ["HierarchicalCommunicator", "create"]
