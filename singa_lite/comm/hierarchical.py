"""Hierarchical all-reduce: within a host over shared memory, across hosts over the world's backend.

    comm = hierarchical.create(dist.init(backend="mpi"))      # under mpiexec, ranks on several hosts
    comm = hierarchical.create(dist.init(init_method="env"))  # tcp: singa-run --hostfile, torchrun, Slurm
    sgd = opt.DistOpt(opt.SGD(lr=0.1), hierarchical=True)      # the same, made by DistOpt

A flat all-reduce over P ranks on H hosts may send a full copy of the data across hosts from every rank
(whenever the algorithm's first, full-size exchange pairs ranks of different hosts, as with ranks placed
cyclically over the hosts); on a slow link the ranks of one host share that link and take turns on it. Here
each all-reduce of floats is done in three steps instead, in one of two forms:

* **leader** (the default): reduce to the host's local rank 0 over shm, all-reduce between these leaders,
  broadcast from the leader within the host.

* **sharded** (every host must run the same number L of ranks):

  1. reduce-scatter within the host over the shm backend (``intra``): local rank j holds the host's sum of
     shard j (1/L of the data);
  2. all-reduce of shard j between the local ranks j of every host (``inter``, one communicator per local
     rank, over the world's backend): L exchanges of 1/L of the data each, in parallel;
  3. all-gather of the shards within the host over shm.

Either way each host sends one copy of the data across hosts, the least an all-reduce can. The sharded form
splits the shared-memory work and the link over all the host's ranks instead of funnelling it through one; on
2 simulated hosts x 2 ranks of a 2-core machine the leader form measured as fast or faster in most cases
(docs/benchmarks/communication.md), hence the default. The result is the same as the flat all-reduce up to
the order of the floating-point sum (the test checks both) and the same bits on every rank. Every other
collective, and all-reduce of integers, goes to the flat world communicator unchanged: they are metadata,
not gradient traffic.

Ranks are grouped into hosts by their host names (exchanged once, at creation), which must agree with the
world communicator's local ranks. The cross-host communicators are made from the world's (``split``: an MPI
split on the mpi backend, a new mesh on the same rendezvous store on the tcp backend). GPU jobs do not need
this: NCCL builds its own rings and trees across hosts.
"""
from __future__ import annotations

import socket

from .. import _core, tensor
from . import averaging
from .communicator import CommError, Communicator
from .holder import new_shm_name, sweep_stale_segments
from .shm import ShmCommunicator

_FLOATS = (tensor.float16, tensor.bfloat16, tensor.float32, tensor.float64)


class HierarchicalCommunicator(Communicator):
    """The world communicator with all_reduce done in three steps (see the module docstring).

    world: the flat communicator of every rank; intra: this host's ranks (rank = local rank). sharded=True:
    inter is the communicator of the ranks with this rank's local rank on every host (present on every rank);
    sharded=False: inter is the leaders' (local rank 0 of each host) communicator on a leader, None elsewhere."""

    backend = "hierarchical"
    routes_across_hosts = True  # it is the arrangement of cross-host traffic itself
    supports_groups = True

    def __init__(self, world: Communicator, intra: Communicator, inter: Communicator | None, hosts: int,
                 sharded: bool = False):
        super().__init__(world.rank, world.world_size, world.local_rank, world.local_size, world.timeout)
        if sharded and inter is None:
            raise ValueError("HierarchicalCommunicator: sharded=True needs inter on every rank (the communicator "
                             "of the ranks with this local rank on every host)")
        self.world, self.intra, self.inter, self.hosts, self.sharded = world, intra, inter, hosts, sharded
        self._staging = {}  # (dtype, padded size) -> a flat tensor for sizes that local_size does not divide

    def __repr__(self):
        return (f"HierarchicalCommunicator(rank={self.rank}, world_size={self.world_size}, hosts={self.hosts}, "
                f"local_rank={self.local_rank}, local_size={self.local_size}, over={self.world.backend}, "
                f"{'sharded' if self.sharded else 'leader'})")

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
        if op == "avg":  # the parts' sums round at every step: the rule of comm/averaging.py
            averaging.before_sum(t, self.world_size)
        summing = "sum" if op == "avg" else op
        try:
            if self.sharded:
                self._sharded(t, summing)
            else:
                self._leader(t, summing)
        except CommError as e:
            # The host's other ranks wait in another part (a leader's cross-host exchange failed while they wait
            # for its broadcast): they learn the cause itself, not only that this rank went away.
            for c in self._parts():
                try:
                    c.abort(str(e))
                except CommError:
                    pass
            raise
        if op == "avg":
            averaging.after_sum(t, self.world_size)

    def _leader(self, t, op):
        if self.intra.world_size > 1:
            self.intra.reduce(t, 0, op)
        if self.inter is not None:  # a leader
            self.inter.all_reduce(t, op)
        if self.intra.world_size > 1:
            self.intra.broadcast(t, 0)

    def _sharded(self, t, op):
        local = self.intra.world_size
        n = t.numel
        if local == 1:
            self.inter.all_reduce(t, op)
            return
        flat = t.reshape([n])
        padded = -(-n // local) * local
        if padded != n:  # reduce-scatter wants equal shards: a staging copy with a tail that nobody reads
            key = (t.dtype, padded)
            if key not in self._staging:
                self._staging[key] = _core.Tensor([padded], t.dtype, t.device)
            whole = self._staging[key]
            _core.copy_(whole.slice(0, 0, n, 1), flat)
        else:
            whole = flat
        shard = self.intra.reduce_scatter(whole, op)  # this rank's 1/local of the host's sum
        self.inter.all_reduce(shard, op)  # the same shard of every host
        gathered = self.intra.all_gather(shard).reshape([padded])
        _core.copy_(flat, gathered.slice(0, 0, n, 1) if padded != n else gathered)

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

    def _new_group(self, ranks: list, timeout: float) -> "Communicator | None":
        """new_group of a hierarchical communicator: a flat group of the world's backend (world.new_group, with
        its checks and timeouts), made hierarchical again by create() where its members span several hosts
        (always the leader form: the sharded one needs as many members on every host)."""
        flat = self.world.new_group(ranks, timeout)
        if not flat.is_member:
            return None
        return create(flat)

    def _abort(self, reason):
        for c in self._parts():
            c.abort(reason)

    def _close(self):
        for c in self._parts():
            c.close()


FORMS = ("leader", "sharded")


def create(world: Communicator, form: str = "leader") -> Communicator:
    """The hierarchical form of `world` (collective: every rank calls it). `world` comes back unchanged
    where there is nothing to gain: a job on one host (the shm backend, or mpi / tcp with one host), and the
    nccl backend, whose rings and trees already keep traffic within a host where they can.
    form: "leader" or "sharded" (see the module docstring; sharded needs the same number of ranks on every
    host, else ValueError)."""
    if form not in FORMS:
        raise ValueError(f"hierarchical.create: form must be one of {', '.join(FORMS)}, got {form!r}")
    if isinstance(world, HierarchicalCommunicator):
        return world
    if not isinstance(world, Communicator):
        raise TypeError(f"hierarchical.create: expected a Communicator (dist.init()), got {type(world).__name__}")
    if not world.spans_hosts or world.routes_across_hosts:  # shm: one host; nccl: its own rings and trees
        return world
    if not world.supports_groups or world.device_kind != "cpu":
        raise ValueError(f"hierarchical all-reduce runs over the mpi backend (ranks started by mpiexec) or the tcp "
                         f"backend (singa-run, torchrun, Slurm), got backend {world.backend!r}; use "
                         f"hierarchical=False with it")
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
    sizes = {sum(1 for e in every if e["host"] == h) for h in hosts}
    if form == "sharded" and len(sizes) > 1:
        intra.close()
        raise ValueError(f"hierarchical.create: form 'sharded' needs the same number of ranks on every host; these "
                         f"hosts run {', '.join(str(sum(1 for e in every if e['host'] == h)) for h in hosts)} "
                         f"ranks: use form 'leader'")
    if form == "sharded":  # one cross-host communicator per local rank
        peers = [world.split(world.local_rank == j) for j in range(world.local_size)]
        return HierarchicalCommunicator(world, intra, peers[world.local_rank], len(hosts), sharded=True)
    inter = world.split(world.local_rank == 0)  # the leaders
    return HierarchicalCommunicator(world, intra, inter, len(hosts))


__all__ = ["HierarchicalCommunicator", "create"]
