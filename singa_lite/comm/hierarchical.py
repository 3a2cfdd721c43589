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

**The pipeline.** An all_reduce of more than ``chunk_bytes`` (default: CHUNK_BYTES over a world whose waits sleep
in the kernel, tcp; none over mpi, whose transfers move only while a thread polls them, see default_chunk_bytes; 0
turns it off) is done in pieces of that many bytes, and the three steps overlap across pieces: while piece i
crosses the hosts (the cross-host communicator's asynchronous work, on its own thread), piece i + 1 is reduced in
the host, and piece i - 1 is broadcast (gathered) once its exchange ended. The link, the slowest part, then waits
less for the shared-memory steps before and after it. Each element is summed in the same order as without pieces
(shm sums the ranks in rank order; two hosts' sum is a + b whatever the algorithm), so with two hosts the result
has the same bits as in one piece (the tests check it); with more hosts the cross-host sum of a piece may
associate its terms otherwise than the whole buffer's would (MPI picks its algorithm by size), a difference within
rounding, and still the same bits on every rank. Before the pieces, one small all-reduce between the hosts and one
in the host check that every rank passes as many elements of the same dtype with the same op: unequal calls raise
CollectiveMismatch on every rank, where a rank with a piece more than the others would otherwise wait for it until
its timeout. Every piece's collectives keep their timeouts, and a failure aborts every part as before, naming its
cause.

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

import collections
import socket

import numpy as np

from .. import _core, tensor
from . import averaging
from .communicator import DTYPES, REDUCE_OPS, CollectiveMismatch, CommError, Communicator
from .holder import new_shm_name, sweep_stale_segments
from .shm import ShmCommunicator

_FLOATS = (tensor.float16, tensor.bfloat16, tensor.float32, tensor.float64)
# The pipeline's piece: an all_reduce of more bytes is cut into pieces of this size (see the module docstring), by
# default over a world that sleeps while it waits (tcp) and not over one that polls (mpi). Both chosen by
# measurement (docs/benchmarks/communication.md, "Pipelined hierarchical all-reduce").
CHUNK_BYTES = 2 << 20
PIPELINE_DEPTH = 1  # pieces whose cross-host exchange may still run while the next one is reduced in the host
DRAIN_S = 5.0  # after a failure, how long to wait for the cross-host exchanges still queued to end


def default_chunk_bytes(world: Communicator) -> int:
    """The pipeline's piece over `world` when none is given: CHUNK_BYTES where the world's waits sleep in the kernel
    while the bytes move (tcp), so the shared-memory steps of the next piece run meanwhile; 0 (no pipeline) where
    a thread must poll for them to move (MPI: its progress engine moves the bytes only while polled, and the
    shared-memory steps then take the CPU that the exchange needs; measured slower there)."""
    return CHUNK_BYTES if world.sleeps_while_waiting else 0


def check_chunk_bytes(value) -> int:
    """chunk_bytes as given, checked: an int >= 0 (0: no pipeline, every all_reduce in one piece)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"hierarchical all-reduce: chunk_bytes must be an int >= 0 (bytes per pipelined piece; 0 "
                         f"for none), got {value!r}")
    return value


class HierarchicalCommunicator(Communicator):
    """The world communicator with all_reduce done in three steps (see the module docstring).

    world: the flat communicator of every rank; intra: this host's ranks (rank = local rank). sharded=True:
    inter is the communicator of the ranks with this rank's local rank on every host (present on every rank);
    sharded=False: inter is the leaders' (local rank 0 of each host) communicator on a leader, None elsewhere."""

    backend = "hierarchical"
    routes_across_hosts = True  # it is the arrangement of cross-host traffic itself
    supports_groups = True

    def __init__(self, world: Communicator, intra: Communicator, inter: Communicator | None, hosts: int,
                 sharded: bool = False, chunk_bytes: int | None = None):
        super().__init__(world.rank, world.world_size, world.local_rank, world.local_size, world.timeout)
        if sharded and inter is None:
            raise ValueError("HierarchicalCommunicator: sharded=True needs inter on every rank (the communicator "
                             "of the ranks with this local rank on every host)")
        self.chunk_bytes = default_chunk_bytes(world) if chunk_bytes is None else check_chunk_bytes(chunk_bytes)
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
        avg = op == "avg"
        if avg:  # the parts' sums round at every step: the rule of comm/averaging.py
            averaging.before_sum(t, self.world_size)
        summing = "sum" if avg else op
        flat = t.reshape([t.numel])
        pieces = self._pieces(flat)
        pending = collections.deque()  # (piece, its cross-host Work or None, what finishes it), oldest first
        try:
            if len(pieces) > 1:
                self._check_same_call(flat, op)
            step = self._sharded_piece if self.sharded else self._leader_piece
            for piece in pieces:
                pending.append(step(piece, summing, avg, len(pieces) > 1))
                if len(pending) > PIPELINE_DEPTH:
                    self._finish(*pending.popleft())
            while pending:
                self._finish(*pending.popleft())
        except CommError as e:
            # The host's other ranks wait in another part (a leader's cross-host exchange failed while they wait
            # for its broadcast): they learn the cause itself, not only that this rank went away.
            for c in self._parts():
                try:
                    c.abort(str(e))
                except CommError:
                    pass
            self._drain(pending)
            raise
        except BaseException:
            self._drain(pending)
            raise

    def _pieces(self, flat) -> list:
        """flat cut into the pipeline's pieces of chunk_bytes (the last one shorter), or whole when it fits in one
        or chunk_bytes is 0. The sharded form's pieces hold a multiple of the local ranks (the last one aside)."""
        n = flat.numel
        per = self.chunk_bytes // flat.dtype.itemsize if self.chunk_bytes else n
        if self.sharded:
            per -= per % self.intra.world_size
        if per <= 0 or n <= per:
            return [flat]
        return [flat.slice(0, lo, min(n, lo + per), 1) for lo in range(0, n, per)]

    def _check_same_call(self, flat, op) -> None:
        """Before a pipelined all_reduce: every rank passes as many elements of the same dtype with the same op,
        else CollectiveMismatch on every rank. The pieces' own collectives cannot tell (sizes of 3 and 2 pieces
        agree on their first two), and one rank running a piece more than the others would wait until its
        timeout. One small all-reduce between the leaders (or the peers of each local rank), then one in the
        host, which hands their verdict to every local rank."""
        mine = [flat.numel, DTYPES.index(flat.dtype), REDUCE_OPS.index(op)]
        sig = self._int_tensor(mine + [-v for v in mine] + [0, 0])
        if self.inter is not None:
            self.inter.all_reduce(sig, "max")
        if self.intra.world_size > 1:
            self.intra.all_reduce(sig, "max")
        got = np.asarray(sig)
        high, low = got[:3], -got[3:6]
        if (high != low).any():
            what = ("elements", "dtype", "op")
            named = {"dtype": lambda i: DTYPES[i].name, "op": lambda i: REDUCE_OPS[i]}
            differ = [f"{w} from {named.get(w, int)(int(lo))} to {named.get(w, int)(int(hi))}"
                      for w, lo, hi in zip(what, low, high) if lo != hi]
            raise CollectiveMismatch(f"hierarchical all_reduce (rank {self.rank}): the ranks' calls do not match: "
                                     f"{'; '.join(differ)} across ranks. Every rank must make the same collective "
                                     f"calls in the same order")

    def _leader_piece(self, piece, op, avg, pipelined):
        """Reduce in the host, then (a leader) the leaders' all-reduce: started and left running while the next
        piece is reduced; _finish broadcasts it."""
        if self.intra.world_size > 1:
            self.intra.reduce(piece, 0, op)
        work = None
        if self.inter is not None:
            work = self._across(piece, op, pipelined)
        return piece, work, lambda: self._leader_done(piece, avg)

    def _leader_done(self, piece, avg):
        if self.inter is not None and avg:  # the leader divides: the host's others get the quotient's bits
            averaging.after_sum(piece, self.world_size)
        if self.intra.world_size > 1:
            self.intra.broadcast(piece, 0)

    def _sharded_piece(self, piece, op, avg, pipelined):
        """Reduce-scatter in the host, then this rank's shard with its peers on the other hosts (left running
        while the next piece is reduce-scattered); _finish all-gathers it."""
        local = self.intra.world_size
        if local == 1:  # nothing to share in the host: this rank is its host's leader
            return self._leader_piece(piece, op, avg, pipelined)
        n = piece.numel
        padded = -(-n // local) * local
        if padded != n:  # reduce-scatter wants equal shards: a staging copy with a tail that nobody reads
            key = (piece.dtype, padded)
            if key not in self._staging:
                self._staging[key] = _core.Tensor([padded], piece.dtype, piece.device)
            whole = self._staging[key]
            _core.copy_(whole.slice(0, 0, n, 1), piece)
        else:
            whole = piece
        shard = self.intra.reduce_scatter(whole, op)  # this rank's 1/local of the host's sum
        work = self._across(shard, op, pipelined)  # the same shard of every host

        def done():
            if avg:  # each rank divides its own shard, before the gather
                averaging.after_sum(shard, self.world_size)
            gathered = self.intra.all_gather(shard).reshape([padded])
            _core.copy_(piece, gathered.slice(0, 0, n, 1) if padded != n else gathered)
        return piece, work, done

    def _across(self, part, op, pipelined):
        """The all-reduce between the hosts: a Work left running while the caller goes on to the next piece
        (pipelined), else done at once (None)."""
        if pipelined:
            return self.inter.all_reduce(part, op, async_op=True)
        self.inter.all_reduce(part, op)
        return None

    @staticmethod
    def _finish(piece, work, done):
        if work is not None:
            work.wait()  # the cross-host communicator's timeout, and its error naming the ranks
        done()

    def _drain(self, pending) -> None:
        """After a failure: waits (bounded) until the cross-host exchanges still queued have ended, so that none
        writes into the caller's tensor after all_reduce raised; their own errors are the same failure's."""
        for _, work, _ in pending:
            if work is not None:
                try:
                    work.wait(min(self.timeout, DRAIN_S))
                except Exception:  # noqa: BLE001 -- the failure being raised is the one to report
                    pass

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


def create(world: Communicator, form: str = "leader", chunk_bytes: int | None = None) -> Communicator:
    """The hierarchical form of `world` (collective: every rank calls it). `world` comes back unchanged
    where there is nothing to gain: a job on one host (the shm backend, or mpi / tcp with one host), and the
    nccl backend, whose rings and trees already keep traffic within a host where they can.
    form: "leader" or "sharded" (see the module docstring; sharded needs the same number of ranks on every
    host, else ValueError). chunk_bytes: the pipeline's piece in bytes (0: no pipeline); default
    default_chunk_bytes(world): CHUNK_BYTES over tcp, none over mpi."""
    if chunk_bytes is not None:
        check_chunk_bytes(chunk_bytes)
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
        return HierarchicalCommunicator(world, intra, peers[world.local_rank], len(hosts), sharded=True,
                                        chunk_bytes=chunk_bytes)
    inter = world.split(world.local_rank == 0)  # the leaders
    return HierarchicalCommunicator(world, intra, inter, len(hosts), chunk_bytes=chunk_bytes)


__all__ = ["CHUNK_BYTES", "FORMS", "HierarchicalCommunicator", "check_chunk_bytes", "create",
           "default_chunk_bytes"]
