"""The ``nccl`` backend: GPU tensors, ranks started by ``mpiexec`` or by multiprocessing with a NcclIdHolder.

One communicator per process and GPU (NCCL binds a communicator to the device current at its creation, so it
is created once the device is known: ``device=``, else the default device when it is a GPU, else
``cuda:<local rank>`` as SINGA does). NCCL itself is loaded at run time from the nvidia-nccl wheel
(``pip install 'singa_lite[cuda13]'``) or the system; a CUDA build imports without it.

How waiting works (csrc/comm/nccl.h has the details). Collectives run on the device's communication stream,
after the work already queued on its compute stream. ``wait()`` does not block the host: it makes the compute
stream wait for the operation (an event), so every GPU operation queued afterwards sees the result (including
copies to the host, which wait for the compute stream), while the host goes on queueing work -- this is
what lets DistOpt overlap the gradient exchange with the rest of the backward pass. ``wait(timeout)`` and
``Work.synchronize()`` also block the host until the GPU has finished, for code that needs that.
``barrier()`` always blocks the host. Nothing hangs forever: a watchdog aborts the communicator when an
operation has not finished after ``timeout`` seconds or NCCL reports an error, and every later call raises
``CommError``. NCCL cannot tell which rank is missing, so the ranks of one host keep a board of the
collectives each has entered (comm/board.py, a small shared-memory file): a timed-out rank reads it and
names the ranks that never entered the collective it waits in, and the user's line that entered it there
(ranks on other hosts are out of its sight, and the message says so).

CPU tensors are accepted for small metadata (DistOpt's finiteness flag, the object collectives): they are
copied to the GPU and back, and such calls complete on the host before returning. Tensors on another GPU
raise ValueError. ``send`` / ``recv`` ignore ``tag``: NCCL pairs them between two ranks in call order.
"""
from __future__ import annotations

import atexit
import contextlib
import socket
import sys
import threading
import time
import weakref

import numpy as np

from .. import _core, tensor
from .._runtime.wheels import nvidia_lib_dir
from . import board as host_board, mpi_setup
from .communicator import DEFAULT_TIMEOUT, CommError, Communicator, Work
from .mpi import abort_on_uncaught_exception, broadcast_bytes, import_mpi, launched_by_mpiexec

CudaError = _core.CudaError
NOT_COMPILED = ("the nccl backend needs a CUDA build with NCCL, which this build does not have (python -m "
                "singa_lite shows what was compiled in); use backend='shm' or 'mpi' for CPU tensors")


# ---------------------------------------------------------------- the library
def compiled() -> bool:
    """Was this singa_lite built with its CUDA sources (and so with the NCCL backend)?"""
    return hasattr(_core, "NcclComm")


def wheel_library_dir() -> str | None:
    """The lib/ folder of an installed nvidia-nccl wheel (nvidia-nccl-cu12 / -cu13), or None."""
    return nvidia_lib_dir(("nccl/lib",), "libnccl.so.2")


_configured = False


def _configure() -> None:
    """Points the loader at the wheel's library once (it is looked for there before the system's)."""
    global _configured
    if not _configured and compiled():
        lib = wheel_library_dir()
        if lib is not None:
            _core.nccl_set_library_dir(lib)
        _configured = True


def available() -> bool:
    """Can this process use NCCL: a CUDA build whose NCCL library loads? (A GPU is checked separately.)"""
    if not compiled():
        return False
    _configure()
    return _core.nccl_available()


def version() -> int:
    """The loaded NCCL's version code (23203 for 2.32.3); CommError when NCCL cannot be loaded."""
    if not compiled():
        raise CommError(NOT_COMPILED)
    _configure()
    return _core.nccl_version()


def unique_id() -> bytes:
    """A new NCCL unique id (128 bytes) for one communicator. Does not initialise CUDA, so a parent process
    may call it and still fork workers that use the GPU. CommError / CudaError say what is missing."""
    if not compiled():
        raise CommError(NOT_COMPILED)
    _configure()
    return _core.nccl_get_unique_id()


def readiness() -> str:
    """'' when this process can run the nccl backend, else what is missing and how to get it."""
    if not compiled():
        return NOT_COMPILED
    if _core.cuda_device_count() == 0:
        return f"the nccl backend needs a GPU: {_core.cuda_unavailable_reason()}"
    _configure()
    if not _core.nccl_available():
        return _core.nccl_unavailable_reason()
    return ""


def _require_ready() -> None:
    problem = readiness()
    if problem:
        raise CommError(problem)


# ---------------------------------------------------------------- asynchronous handles
class NcclWork(Work):
    """An operation queued on the GPU. ``wait()`` returns its result once it is *ordered*: the compute stream
    waits for it, so later GPU work (and copies to the host) see the result; the host itself does not wait.
    ``wait(timeout)`` and ``synchronize()`` block the host until the GPU has finished too."""

    def __init__(self, name: str, comm, works: list, result, number: int = 0):
        super().__init__(name, comm)
        self._works = works
        self._result = result
        self._number = number  # its number on the host board (0: none)

    def is_completed(self) -> bool:
        """True once the GPU has finished the operation (or the communicator failed: wait() raises)."""
        return all(w.completed() for w in self._works)

    def wait(self, timeout: float | None = None):
        """Orders the result for later GPU work and returns it; with timeout (seconds), first blocks the host
        until the GPU has finished, at most that long (CommError after it; the communicator stays usable).
        CommError when the communicator failed (the result would be garbage)."""
        with self._raising():
            if timeout is not None:
                self.synchronize(timeout)
            for w in self._works:
                w.order()
        return self._result

    def synchronize(self, timeout: float | None = None) -> None:
        """Blocks the host until the GPU has finished the operation. Default timeout: the communicator's,
        whose expiry aborts the communicator; an explicit timeout only ends this wait."""
        own = timeout is None
        limit = self._comm.timeout if own else float(timeout)
        if not limit > 0:
            raise ValueError(f"wait: timeout must be a positive number of seconds, got {timeout!r}")
        end = time.monotonic() + limit
        with self._raising():
            for w in self._works:
                w.synchronize(max(end - time.monotonic(), 1e-6), own)

    @contextlib.contextmanager
    def _raising(self):
        try:
            yield
        except CommError as e:
            # Only a failure of the NCCL communicator itself breaks this one. An explicit wait(timeout) that ran
            # out aborts nothing (the operation may still finish), so later operations must stay possible.
            failed = self._comm._comm.error or self._comm._comm.closed
            if failed and self._comm._broken is not None:
                raise self._comm._broken from None  # explained already (by an earlier wait)
            explained = self._comm._explained(e, self.name, self._number)
            if failed:
                self._comm._broken = explained
            if explained is e:
                raise
            raise explained from None


# ---------------------------------------------------------------- the communicator
_open = weakref.WeakSet()  # communicators to close before interpreter teardown


class NcclCommunicator(Communicator):
    """All ranks of one NCCL communicator, this process on one GPU (``self.device``).

    unique_id: 128 bytes from :func:`unique_id`, the same on every rank. local_rank / local_size: this
    host's ranks (default: rank / world_size, one host). device: the GPU (a Device, 'cuda:N' or None for
    the default device when it is a GPU, else cuda:<local_rank>). ``abort()`` ends this rank's
    communicator at once; NCCL cannot signal the others, which fail when their timeout expires.
    """

    backend = "nccl"
    device_kind = "cuda"
    routes_across_hosts = True  # NCCL builds its own rings and trees across hosts
    supports_groups = True
    _times_out_itself = True

    def __init__(self, unique_id: bytes, rank: int, world_size: int, local_rank: int | None = None,
                 local_size: int | None = None, device=None, timeout: float = DEFAULT_TIMEOUT):
        for what, v in (("rank", rank), ("world_size", world_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"nccl communicator: {what} must be an int, got {type(v).__name__}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"nccl communicator: need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != 128:
            raise ValueError("nccl communicator: unique_id must be the 128 bytes of nccl.unique_id() (or a "
                             "NcclIdHolder's nccl_id), the same on every rank")
        _require_ready()
        local_rank = rank if local_rank is None else local_rank
        local_size = world_size if local_size is None else local_size
        super().__init__(rank, world_size, local_rank, local_size, timeout)
        self.device = choose_device(device, self.local_rank, self.local_size)
        self._lock = threading.RLock()  # one operation at a time: every rank issues the same sequence
        self._pending = []  # C++ works queued by the operation in progress
        # The host board is mapped before NCCL's rendezvous, so every rank of the host has it once init returns.
        self._board, self._board_missing = host_board.HostBoard.open(unique_id, self.rank, self.world_size,
                                                                     self.local_size)
        self._comm = _core.NcclComm(bytes(unique_id), self.rank, self.world_size, self.device.index, self.timeout)
        _open.add(self)

    def __repr__(self):
        return super().__repr__()[:-1] + f", device={self.device})"

    # ----- how operations run: queued at once, on the caller's thread (no background thread needed)
    def _run(self, name: str, fn, async_op: bool):
        if self._broken is not None:
            raise self._broken
        number = 0
        with self._lock:
            if self._board is not None and name in host_board.KINDS:  # send / recv are not collectives
                # GPU work is only queued here and its error surfaces later, elsewhere: the user's line is
                # remembered now (cheap next to a collective: docs/benchmarks/communication.md)
                site = host_board.call_site(2)
                number = self._board.enter(name, site)
            self._pending = []
            try:
                result = self._guard(fn)
            except CommError as e:
                explained = self._explained(e, name, number)
                if self._broken is e:
                    self._broken = explained
                if explained is e:
                    raise
                raise explained from None
            finally:
                works, self._pending = self._pending, []
        work = NcclWork(name, self, works, result, number)
        return work if async_op else work.wait()

    def _explained(self, error: CommError, name: str, number: int) -> CommError:
        """`error` with what the host board knows about collective #number (who never entered it), or with why
        nothing is known; `error` itself when it is not about a collective."""
        if name not in host_board.KINDS:
            return error
        if self._board is None:
            why = (f"cannot name the missing ranks: this rank has no host board of collectives entered "
                   f"({self._board_missing})")
        else:
            why = "host board of collectives entered per rank: " + self._board.explain(number)
        return CommError(f"{error} [singa_lite {why}.]")

    def _check_device(self, raw, what: str) -> None:
        if raw.device.kind == "cpu":
            return  # staged through the GPU (see _staged)
        if raw.device != self.device.core:
            raise ValueError(f"{what}: this nccl communicator (rank {self.rank}) moves tensors on {self.device}, got "
                             f"one on {raw.device}; move it with to_device() (one communicator per process and "
                             f"GPU)")

    def _in_place(self, raw, fn) -> None:
        if raw.is_contiguous():
            fn(raw)
            return None
        tmp = raw.contiguous()
        fn(tmp)
        for w in self._pending:  # the copy back runs on the compute stream: after the operation
            w.order()
        _core.copy_(raw, tmp)
        return None

    @contextlib.contextmanager
    def _staged(self, *tensors, written: int):
        """GPU versions of the tensors (None stays None); CPU ones are copied to the device and, for the first
        `written`, back once the operation has finished on the GPU (waited for on the host, with the timeout)."""
        on_gpu = [t if t is None or t.device.kind != "cpu" else t.to(self.device.core) for t in tensors]
        yield on_gpu
        back = [(t, g) for t, g in zip(tensors[:written], on_gpu[:written]) if t is not None and g is not t]
        if back:
            for w in self._pending:
                w.synchronize(self.timeout, True)
                w.order()
            for t, g in back:
                _core.copy_(t, g)

    # ----- hooks
    def _all_reduce(self, t, op):
        with self._staged(t, written=1) as (g,):
            self._pending.append(self._comm.all_reduce(g, op))

    def _broadcast(self, t, root):
        with self._staged(t, written=1) as (g,):
            self._pending.append(self._comm.broadcast(g, root))

    def _reduce(self, t, root, op):
        with self._staged(t, written=1) as (g,):
            self._pending.append(self._comm.reduce(g, root, op))

    def _all_gather(self, out, t):
        with self._staged(out, t, written=1) as (g_out, g_in):
            self._pending.append(self._comm.all_gather(g_out, g_in))

    def _reduce_scatter(self, out, t, op):
        with self._staged(out, t, written=1) as (g_out, g_in):
            self._pending.append(self._comm.reduce_scatter(g_out, g_in, op))

    def _gather(self, out, t, root):
        with self._staged(out, t, written=1) as (g_out, g_in):
            self._pending.append(self._comm.gather(g_out, g_in, root))

    def _scatter(self, out, t, root):
        with self._staged(out, t, written=1) as (g_out, g_in):
            self._pending.append(self._comm.scatter(g_out, g_in, root))

    def _barrier(self):
        # A one-element all-reduce, then the host waits for it (with the timeout): when barrier returns,
        # every rank has reached it.
        flag = _core.Tensor([1], tensor.int32, self.device.core)
        work = self._comm.all_reduce(flag, "sum")
        self._pending.append(work)
        work.synchronize(self.timeout, True)

    def _send(self, t, dst, tag):
        with self._staged(t, written=0) as (g,):
            self._pending.append(self._comm.send(g, dst))

    def _recv(self, t, src, tag):
        with self._staged(t, written=1) as (g,):
            self._pending.append(self._comm.recv(g, src))

    def _abort(self, reason):
        self._comm.abort(reason)

    def _close(self):
        _open.discard(self)
        self._comm.close()

    def close(self) -> None:
        """Finalizes and destroys the NCCL communicator (before CUDA is torn down: the package also does this
        at exit); later operations raise CommError."""
        if self._board is not None:
            if self._broken is None:  # the others then know this rank ended normally, not that it hangs
                self._board.mark(host_board.CLOSED)
            self._board.unlink()  # normally gone already (once every rank of the host had mapped it)
        super().close()
        if not self._comm.closed:  # failed earlier: NCCL aborted it already; this stops its watchdog
            _open.discard(self)
            self._comm.close()

    def _timeout_changed(self):
        self._comm.timeout = self.timeout

    def _new_group(self, ranks: list, timeout: float) -> "NcclCommunicator | None":
        """new_group's NCCL communicator: the group's first member creates a new unique id, which reaches the
        others through this communicator (with every rank's host, for the group's local ranks); the members then
        join it with ncclCommInitRank on this communicator's GPU. (ncclCommSplit would need NCCL 2.18; this
        works with any NCCL the backend loads.) A first member that cannot create the id makes every member
        raise CommError saying why."""
        first = ranks[0]
        made, problem = None, ""
        if self.rank == first:
            try:
                made = unique_id().hex()
            except (CommError, CudaError) as e:
                problem = str(e)
        every = self._agree_on_group(ranks, [socket.gethostname(), made, problem])
        if self.rank not in ranks:
            return None
        _, made, problem = every[first]
        if made is None:
            raise CommError(f"nccl new_group (rank {self.rank}): rank {first}, the group's first member, could not "
                            f"create its NCCL unique id: {problem}")
        here = [r for r in ranks if every[r][0] == every[self.rank][0]]
        return NcclCommunicator(bytes.fromhex(made), ranks.index(self.rank), len(ranks), here.index(self.rank),
                                len(here), device=self.device, timeout=timeout)


def choose_device(device, local_rank: int, local_size: int):
    """The GPU a rank's communicator uses: `device` when given; else the default device when it is a GPU
    (the user chose it); else cuda:<local_rank>, SINGA's mapping (one GPU per rank of a host)."""
    from .. import device as devices

    if device is not None:
        dev = devices.as_device(device)
        if not dev.is_cuda():
            raise ValueError(f"nccl: device must be a GPU, got {dev}; the nccl backend moves GPU tensors (use "
                             f"backend='shm' or 'mpi' for CPU tensors)")
        return devices.create_cuda_gpu_on(dev.index)
    default = devices.get_default_device()
    if default.is_cuda():
        return default
    n = _core.cuda_device_count()
    if local_rank >= n:
        raise ValueError(f"nccl: local rank {local_rank} of {local_size} on this host, but the host has {n} GPU(s): "
                         f"NCCL needs one GPU per rank; start at most {n} ranks per host, or pass device=")
    return devices.create_cuda_gpu_on(local_rank)


# ---------------------------------------------------------------- bootstraps
def create(holder=None, rank=None, world_size=None, timeout: float = DEFAULT_TIMEOUT, device=None,
           comm=None) -> NcclCommunicator:
    """dist.init(backend='nccl'): from the parent's NcclIdHolder (rank= and world_size= of this process),
    from MPI (under mpiexec, or comm= an mpi4py communicator: rank 0's unique id is broadcast), or, for a
    single process, on its own."""
    if holder is not None:
        return _from_holder(holder, rank, world_size, timeout, device)
    if comm is not None or launched_by_mpiexec():
        return _from_mpi(comm, rank, world_size, timeout, device)
    if world_size not in (None, 1) or rank not in (None, 0):
        raise ValueError(f"backend 'nccl' with rank={rank}, world_size={world_size} needs the parent's NcclIdHolder "
                         f"(holder=) or a launch by mpiexec")
    _require_ready()
    return NcclCommunicator(unique_id(), 0, 1, 0, 1, device, timeout)


def _from_holder(holder, rank, world_size, timeout, device) -> NcclCommunicator:
    # Checked by what it carries, not by class: holder.py imports this module to create the id, and the
    # dependency stays one-way (dist.NcclIdHolder is the one class with these fields).
    if not all(hasattr(holder, field) for field in ("nccl_id", "nccl_error", "shm_name")):
        raise TypeError(f"holder must be a NcclIdHolder (dist.NcclIdHolder(), made by the parent process), got "
                        f"{type(holder).__name__}")
    if rank is None or world_size is None:
        raise ValueError("backend 'nccl' needs rank= and world_size= with the holder (e.g. the gpu_num and "
                         "gpu_per_node your launcher passes)")
    _require_ready()
    if holder.nccl_id is None:
        raise CommError(f"backend 'nccl': the NcclIdHolder carries no NCCL id; when the parent created it: "
                        f"{holder.nccl_error}. Create the holder in a process that can load NCCL and see a GPU")
    return NcclCommunicator(holder.nccl_id, rank, world_size, rank, world_size, device, timeout)


def _from_mpi(comm, rank, world_size, timeout, device) -> NcclCommunicator:
    MPI = import_mpi(timeout)
    comm = comm or MPI.COMM_WORLD
    for name, given, actual in (("rank", rank, comm.rank), ("world_size", world_size, comm.size)):
        if given is not None and given != actual:
            raise ValueError(f"backend 'nccl' under MPI: {name}={given} disagrees with MPI's {actual}; leave it out")

    def problem(local_rank, local_size) -> str:
        try:
            why = readiness()
            if not why:
                choose_device(device, local_rank, local_size)
            return why
        except (ValueError, TypeError, CommError, CudaError) as e:
            return str(e)
    nccl_id, local_rank, local_size = mpi_bootstrap(comm, timeout, problem, unique_id)
    result = NcclCommunicator(nccl_id, comm.rank, comm.size, local_rank, local_size, device, timeout)
    if comm == MPI.COMM_WORLD:  # the whole job: an uncaught exception on a rank must end it, not hang it
        abort_on_uncaught_exception(result, MPI.COMM_WORLD.Abort)
    return result


def mpi_bootstrap(comm, timeout: float, problem, make_id) -> tuple:
    """The MPI half of the nccl backend's start under mpiexec: (rank 0's unique id, local rank, local size) on
    every rank of the mpi4py communicator `comm`, each wait bounded by `timeout` (mpi_setup: a rank that never
    comes to a step is named, and the job is aborted at exit). problem(local_rank, local_size) -> '' or why this
    rank cannot run NCCL: every rank checks before any waits in NCCL's own rendezvous, so a rank without a GPU or
    NCCL makes every rank fail at once, naming it, instead of the others timing out there. make_id() -> rank 0's
    id (CommError / CudaError say why not: that reaches every rank too, with the broadcast)."""
    MPI = import_mpi(timeout)
    try:
        local = mpi_setup.bounded(comm, "the split into hosts, MPI_Comm_split_type", timeout,
                                  lambda: comm.Split_type(MPI.COMM_TYPE_SHARED))
        local_rank, local_size = local.rank, local.size
        local.Free()
        mine = problem(local_rank, local_size)
        flags = mpi_setup.gather_arrivals(comm, "every rank's readiness for NCCL", timeout, b"\x01" if mine else b"",
                                          1)
        bad = [r for r in range(comm.size) if flags[r]]
        if bad:
            raise CommError(f"nccl init (rank {comm.rank} of {comm.size}): rank(s) {', '.join(map(str, bad))} cannot "
                            f"use NCCL" + (f": {mine}" if mine else " (their own errors say why)"))
        payload = None
        if comm.rank == 0:  # its failure travels with the broadcast, so that nobody waits for an id that never comes
            try:
                payload = b"\x00" + make_id()
            except (CommError, CudaError) as e:
                payload = b"\x01" + str(e).encode()
        payload = broadcast_bytes(payload, 0, comm, timeout, "nccl init: rank 0's unique id")
        if comm == MPI.COMM_WORLD:  # the whole job's MPI end is bounded too (every rank got here)
            mpi_setup.arm_exit_guard(MPI, comm, timeout)
    except mpi_setup.StuckError as e:  # operations in flight: MPI_Finalize would wait for them for ever
        mpi_setup.abort_at_exit(MPI, comm.rank, e)
        raise
    if payload[:1] != b"\x00":
        raise CommError(f"nccl init: rank 0 could not create the NCCL unique id: {payload[1:].decode()}")
    return payload[1:], local_rank, local_size


# ---------------------------------------------------------------- teardown
@atexit.register
def _close_all() -> None:
    """NCCL communicators are finalized and destroyed while CUDA still works (before interpreter teardown)."""
    for c in list(_open):
        try:
            c.close()
        except Exception as e:  # noqa: BLE001 -- report and go on closing the others
            print(f"singa_lite: closing the nccl communicator of rank {c.rank} at exit: {e}", file=sys.stderr)
