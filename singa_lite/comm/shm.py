"""The ``shm`` backend: CPU tensors, ranks on one host started by multiprocessing or singa-run.

The collectives are C++ (csrc/comm/shm_comm.cpp) over one shared-memory segment named by the
NcclIdHolder; they time out by themselves, detect dead ranks, and release the GIL while they run. A group
(new_group) has a segment of its own.
"""
from __future__ import annotations

from .. import _core
from .communicator import DEFAULT_TIMEOUT, Communicator

DEFAULT_SLOT_BYTES = 1 << 20  # per-rank staging buffer in the segment; collectives are chunked through it


class ShmCommunicator(Communicator):
    backend = "shm"
    spans_hosts = False  # one host's shared memory
    supports_groups = True

    def __init__(self, name: str, rank: int, world_size: int, timeout: float = DEFAULT_TIMEOUT,
                 slot_bytes: int = DEFAULT_SLOT_BYTES):
        for what, v in (("rank", rank), ("world_size", world_size)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"shm communicator: {what} must be an int, got {type(v).__name__}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"shm communicator: need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        super().__init__(rank, world_size, rank, world_size, timeout)  # one host: local == global
        self._slot_bytes = int(slot_bytes)
        self._comm = _core.ShmComm(name, rank, world_size, self.timeout, self._slot_bytes)

    def _new_group(self, ranks: list, timeout: float) -> "ShmCommunicator | None":
        """new_group's segment: a new one among the members, as safe as this one's. Its first member makes an
        unguessable, owner-only name (holder.new_shm_name) and the others learn it through this communicator
        (whose segment only this job's ranks share); the segment itself is made and served by the C++
        rendezvous, to processes of this uid only (csrc/comm/shm_rendezvous.h)."""
        from .holder import new_shm_name, sweep_stale_segments

        name = None
        if self.rank == ranks[0]:
            sweep_stale_segments()  # what killed jobs left (the named transport), as a holder does
            name = new_shm_name()
        names = self._agree_on_group(ranks, name)
        if self.rank not in ranks:
            return None
        name = names[ranks[0]]
        try:
            return ShmCommunicator(name, ranks.index(self.rank), len(ranks), timeout=timeout,
                                   slot_bytes=self._slot_bytes)
        except BaseException:
            unlink = getattr(_core, "shm_unlink", None)
            if unlink is not None:  # the named transport: a member that never joined leaves the name behind
                unlink(name)
            raise

    def close(self) -> None:
        """Releases the segment also after a failure (the base class leaves a failed communicator as it is, since
        MPI could block in its teardown; unmapping cannot: an operation still in flight ends by its timeout, or at
        once after an abort). dist.elastic closes the failed communicator of every regroup so."""
        super().close()
        if not self.closed:
            self.closed = True
            self._close()

    def _timeout_changed(self):
        self._comm.timeout = self.timeout

    def _all_reduce(self, t, op): self._comm.all_reduce(t, op)
    def _broadcast(self, t, root): self._comm.broadcast(t, root)
    def _reduce(self, t, root, op): self._comm.reduce(t, root, op)
    def _all_gather(self, out, t): self._comm.all_gather(out, t)
    def _reduce_scatter(self, out, t, op): self._comm.reduce_scatter(out, t, op)
    def _gather(self, out, t, root): self._comm.gather(out, t, root)
    def _scatter(self, out, t, root): self._comm.scatter(out, t, root)
    def _barrier(self): self._comm.barrier()
    def _send(self, t, dst, tag): self._comm.send(t, dst, tag)
    def _recv(self, t, src, tag): self._comm.recv(t, src, tag)
    def _abort(self, reason): self._comm.abort(reason)
    def _close(self): self._comm.close()
