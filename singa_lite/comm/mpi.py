"""The ``mpi`` backend (CPU tensors, processes started by ``mpiexec``) and the MPI bootstrap helpers.

The per-call work (the arrival board, the call check, polling, the small all_reduce) runs in C++
(mpi_hot.py, ``_core.MpiHotPath``) when mpi4py speaks the MPICH ABI (MPICH, Intel MPI, MVAPICH): done in Python it
costs more than MPI's own small all_reduce (docs/benchmarks/communication.md, "the per-call work in C++").
Elsewhere, or with SINGA_LITE_MPI_HOT_PATH=0, the same work runs in Python here, with the same results.

mpi4py works on the tensors' own memory (buffer protocol, no copies). float16 and bfloat16 have no MPI
datatype: they travel as 2-byte integers reduced by user-defined operations that compute in float32 and
round once (numpy's float16 arithmetic; bfloat16 widened and rounded with bit operations, as numpy has no
bfloat16); float16 sums and averages on up to FP16_GATHER_MAX_RANKS ranks are gathered and reduced in C++.
Blocking MPI calls cannot time out, so every operation is started as a
nonblocking one and completed by polling ``Test`` (as ``MPI_Wait`` itself busy-polls in MPICH) until the
timeout; on expiry the ranks that had not entered the operation are read from an "arrival board" (a
one-sided MPI window holding each rank's operation count) and named in the ``CommError``. A communicator
that timed out is broken: at interpreter exit it aborts the MPI job (``MPI_Abort``), as ``MPI_Finalize``
would otherwise wait forever for the stuck operation. Making the communicator (mpi_setup.py: MPI_Init, every
rank's arrival, Idup, the split into hosts, the window's creation), closing it (every rank's end on the arrival
board before the collective MPI_Win_free, see _wait_for_every_close) and MPI_Finalize at exit are bounded by the
same timeout: a rank that never comes fails the others there too, named.
"""
from __future__ import annotations

import atexit
import os
import struct
import sys
import time
import warnings

import numpy as np

from .. import _core, tensor
from . import averaging, mpi_hot, mpi_setup, watch
from ._arrays import array as _array, bf16_to_f32 as _bf16_to_f32, f32_to_bf16 as _f32_to_bf16
from .communicator import (DEFAULT_TIMEOUT, DTYPES, REDUCE_OPS, CollectiveMismatch, CommError, Communicator,
                           check_timeout)
# The hot path's switch, spin and library check are this backend's public names too (HOT_PATH_VAR, HOT_SPIN_NS,
# mpich_abi_library).
from .mpi_hot import (DTYPE_CODE, HOT_PATH_VAR, HOT_SPIN_NS, KIND_CODE, KINDS, OP_CODE, SPIN_S,  # noqa: F401
                      mpich_abi_library)
# Start-up, setup and abort helpers (mpi_setup.py); the names that other modules import from here stay here too.
from .mpi_setup import (ABORT_EXIT_S, ABORT_GRACE_S, MPI_LAUNCH_VARS, abort_at_exit, abort_job,  # noqa: F401
                        abort_on_uncaught_exception, await_setup, broadcast_bytes, import_mpi, join,
                        launched_by_mpiexec, mpiexec_ranks, poll, unlink_mpich_segments)
from ..tensor import Tensor

# After a mismatch was found, how long to wait for the mismatched data collectives to end (they were started
# together with the check): those that match as MPI collectives (same kind) end; others may never.
MISMATCH_DRAIN_S = 2.0
# close() waits for every rank to close for the timeout plus this long (see _wait_for_every_close).
CLOSE_GRACE_S = 5.0
# Every call's signature check is an all-gather of a fixed slot per rank: the signature (6 int64) and room for
# FUSE_BYTES of data. An all_reduce that fits travels in that same all-gather and is reduced locally (in rank
# order, so every rank computes the same bits): the check then costs no collective of its own. Bigger calls
# start their data collective next to the check. The room moves with every call (a barrier's too), so it
# shrinks with the number of ranks: P * room stays within FUSE_TOTAL_BYTES.
FUSE_BYTES = 4096
FUSE_TOTAL_BYTES = 64 << 10
_SIG_BYTES = 6 * 8
_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
# A fused all_reduce reduces in numpy, which warns where MPI's own reduction silently gives inf or nan (a sum
# that overflows, inf - inf). Filtered for this module only, once: np.errstate per call would be a sizeable
# part of a small all_reduce (docs/benchmarks/communication.md, "Measurements behind the code's choices").
warnings.filterwarnings("ignore", r"(overflow|invalid value) encountered in (reduce|cast|divide)", RuntimeWarning,
                        r"singa_lite\.comm\.mpi$")
_ITEMSIZE = {d: d.itemsize for d in DTYPES}  # a dict lookup is cheaper per call than the property
FP16_GATHER_MAX_RANKS = 4  # see _all_reduce_fp16_by_gather
BOARD_QUERY_S = 3.0  # after a timeout: how long the ranks have to answer a query of their progress


class _Mismatch(Exception):
    """The ranks' call signatures differ (raised to the caller as CollectiveMismatch)."""

    def __init__(self, message: str, paired: bool):
        super().__init__(message)
        self.paired = paired


def _fp16_op(MPI, name: str):
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[name]

    def combine(inbuf, inoutbuf, datatype):
        a = np.frombuffer(inbuf, np.float16)
        b = np.frombuffer(inoutbuf, np.float16)
        ufunc(a, b, out=b)  # numpy computes float16 arithmetic in float32 and rounds once
    return MPI.Op.Create(combine, commute=True)


def _bf16_op(MPI, name: str):
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[name]

    def combine(inbuf, inoutbuf, datatype):
        a = np.frombuffer(inbuf, np.uint16)
        b = np.frombuffer(inoutbuf, np.uint16)
        b[...] = _f32_to_bf16(ufunc(_bf16_to_f32(a), _bf16_to_f32(b)))
    return MPI.Op.Create(combine, commute=True)


_HALF = (tensor.float16, tensor.bfloat16)


class MpiCommunicator(Communicator):
    """All ranks of an MPI communicator (COMM_WORLD by default); local rank and size from its
    shared-memory split (the ranks on this host).

    verify (default True): check that all ranks made the same call (operation, dtype, size, root, op, and the
    call's number), raising CollectiveMismatch (a ValueError) on every rank, naming what each passed, when they
    did not. Mismatched collectives are undefined in MPI: without the check a rank may get garbage and carry on
    (all_reduce of ten float32 against a barrier returned -1.6e29). The check is a small all-gather of each rank's call
    signature started together with the data collective (both in flight at once, so the check adds little
    latency), and it is completed and compared before the result is handed back. After a mismatch the
    communicator stays usable when every rank called the same kind of collective and the data collectives
    ended (a wrong size, dtype or op); otherwise (different kinds) it is broken, like after a timeout, and
    the job is aborted at exit. "auto" is accepted as True, for scripts that pass it. False: no check (a
    mismatched call may return garbage, hang until the timeout, or fail with MPI's truncation error)."""

    backend = "mpi"
    _times_out_itself = False  # asynchronous work blocks in MPI on the background thread

    def __init__(self, comm=None, timeout: float = DEFAULT_TIMEOUT, verify=True):
        timeout = check_timeout(timeout)
        if verify not in (True, False, "auto"):
            raise ValueError(f"verify must be True, False or 'auto', got {verify!r}")
        MPI = import_mpi(timeout)
        self.verify = verify
        self._MPI = MPI
        self._stuck = None  # the CommError of a close() that timed out (see _close): the job is aborted at exit
        parent = comm or MPI.COMM_WORLD
        # Every step of the setup is bounded by the timeout: a rank that never comes (stuck in its own code
        # before init) must not leave the others waiting forever. A setup that failed leaves MPI requests in
        # flight on `parent`, which MPI_Finalize would wait for: the job is aborted at exit then.
        try:
            self._comm = join(MPI, parent, timeout)  # our own context: user traffic cannot interleave
            self._set_up(MPI, comm, timeout)
        except BaseException as e:
            abort_at_exit(MPI, parent.rank, e)
            raise

    def _set_up(self, MPI, comm, timeout: float) -> None:
        """The rest of the setup, on our own communicator that every rank has joined (see mpi_setup.join). Every
        step is bounded by the timeout: those without a nonblocking form in MPI (the split into hosts, the
        window's creation) are mpi_setup.bounded steps (a rank that never comes to one is named), the others
        are nonblocking and polled."""
        local = mpi_setup.bounded(self._comm, "the split into hosts, MPI_Comm_split_type", timeout,
                                  lambda: self._comm.Split_type(MPI.COMM_TYPE_SHARED))
        super().__init__(self._comm.rank, self._comm.size, local.rank, local.size, timeout)
        # Every rank's host, so that a timeout can name the host of the ranks that no longer answer.
        self._hosts = [h.decode(errors="replace") for h in mpi_setup.gather_arrivals(
            self._comm, "every rank's host name", timeout, MPI.Get_processor_name().encode(), 256)]
        whole_job = comm is None or comm == MPI.COMM_WORLD
        self._types = {tensor.float32: MPI.FLOAT, tensor.float64: MPI.DOUBLE, tensor.int32: MPI.INT32_T,
                       tensor.int64: MPI.INT64_T, tensor.float16: MPI.INT16_T, tensor.bfloat16: MPI.INT16_T}
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD, "avg": MPI.SUM}
        self._fp16_ops = {}  # (dtype name, op) -> user-defined MPI op
        # The check's slot (see FUSE_BYTES): this rank's, and every rank's after the all-gather.
        self._fuse_bytes = min(FUSE_BYTES, FUSE_TOTAL_BYTES // self.world_size) // 8 * 8
        self._slot = np.zeros((_SIG_BYTES + self._fuse_bytes) // 8, np.int64)
        self._slots = np.zeros((self.world_size, self._slot.size), np.int64)
        self._slot_u8 = self._slot.view(np.uint8)
        self._slots_u8 = self._slots.view(np.uint8)
        self._descriptor = self._slot[:6]
        self._descriptors = self._slots[:, :6]
        self._descriptor_bytes = memoryview(self._slot_u8)
        self._fused_views = {}  # (dtype, count) -> (this rank's data in the slot, every rank's rows)
        self._check = None  # (request, kind) of the signature all-gather in flight with the current call
        # The all-gather as a persistent collective (MPI-4): set up once, each call only starts it. That costs
        # a fraction of a new Iallgather's cost (docs/benchmarks/communication.md, "The mpi backend's call check").
        # The arrival board: entry = number of operations this rank has entered.
        # One passive-target epoch for the communicator's lifetime: a rank updates its own entry with a
        # local store + Win_sync, and a timed-out rank reads the others with Get + Flush.
        def create():
            try:
                check = self._comm.Allgather_init(self._slot, self._slots)
            except (AttributeError, NotImplementedError, MPI.Exception):  # mpi4py < 4 or an MPI-3 library
                check = None
            return check, MPI.Win.Allocate(8, 8, comm=self._comm)
        self._check_request, self._board = mpi_setup.bounded(
            self._comm, "the arrival board's creation, MPI_Win_allocate", timeout, create)
        self._entered = np.frombuffer(self._board.tomemory(), np.int64)
        self._entered[0] = 0
        self._board.Lock_all(MPI.MODE_NOCHECK)
        await_setup(self._comm.Ibarrier(), "the barrier after the arrival board's creation", timeout,
                     self.rank, self.world_size)
        self._watch_name = None
        self._progress = None  # (the watcher's progress board, this rank's slot): see watch.py
        if whole_job:  # every rank of the job has passed MPI_Init, so every one has mapped MPICH's segments
            if self.local_rank == 0:
                unlink_mpich_segments()
            self._watch_name = self._start_watcher(local)
            abort_on_uncaught_exception(self, self._comm.Abort, self._watch_name)
            watch_name, rank = self._watch_name, self.rank
            mpi_setup.arm_exit_guard(MPI, self._comm, timeout, before_abort=None if watch_name is None else
                                     lambda: watch.tell(watch_name, "reported", rank))
        local.Free()
        self._spin_free = self._own_cpus()  # the C++ wait polls without yielding the CPU (see HOT_SPIN_NS)
        self._hot = mpi_hot.make(MPI, self._comm, self._board, self._check_request, self._slot, self._slots,
                                 self._entered, self._progress, self._types, self._ops, self._spin_free)
        atexit.register(self._at_exit)

    def _own_cpus(self) -> bool:
        """Whether every rank of this host can have a CPU of its own (of those this process may run on)."""
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        return self.local_size <= cpus

    supports_groups = True

    def split(self, member: bool) -> "MpiCommunicator | None":
        """Collective: a group (new_group) of the ranks that pass member=True, in this one's rank order (with this
        one's timeout and check); None on the others. A checked, timed barrier comes first, so that a rank that
        never comes is named as split's."""
        try:
            self.barrier()
        except CommError as e:
            raise CommError(f"mpi split: its rendezvous failed: {e}") from e
        return super().split(member)

    def _new_group(self, ranks: list, timeout: float) -> "MpiCommunicator | None":
        """new_group's MPI_Comm_split (key: the place in `ranks`), with this communicator's check."""
        MPI = self._MPI
        # MPI has no nonblocking split: a checked, timed exchange first (it names a rank that never comes, and
        # one that called another collective instead), so that Split only starts once every rank is there.
        try:
            self._agree_on_group(ranks)
        except CommError as e:
            raise CommError(f"mpi new_group: its rendezvous failed: {e}") from e
        member = self.rank in ranks
        try:  # (every rank is here: the exchange was the arrival)
            sub = mpi_setup.bounded(self._comm, "new_group, MPI_Comm_split", self.timeout,
                                    lambda: self._comm.Split(0 if member else MPI.UNDEFINED,
                                                             ranks.index(self.rank) if member else self.rank),
                                    arrive=False)
        except CommError as e:  # a rank stuck in it: MPI_Finalize would wait for it too
            self._broken = self._stuck = e
            raise
        if sub == MPI.COMM_NULL:
            return None
        try:
            return MpiCommunicator(comm=sub, timeout=timeout, verify=self.verify)
        finally:
            sub.Free()  # the new communicator works on its own Dup

    # ----- buffers
    def _buf(self, t, count=None):
        """[memory, count, datatype] over the tensor's own memory (float16 and bfloat16 as 2-byte integers).
        count: the elements per rank where MPI wants that (the gathered side of gathers, the scattered side of
        scatters)."""
        return [_array(t), t.numel if count is None else count, self._types[t.dtype]]

    def _op(self, op: str, dtype):
        if dtype not in _HALF:
            return self._ops[op]
        name = "sum" if op == "avg" else op
        key = (dtype.name, name)
        if key not in self._fp16_ops:
            self._fp16_ops[key] = (_fp16_op if dtype == tensor.float16 else _bf16_op)(self._MPI, name)
        return self._fp16_ops[key]

    def _enter(self, kind: str, t=None, root: int = -1, op: str = "", payload=None) -> None:
        """Counts the operation on the arrival board, then starts the check that every rank called the same
        collective with the same dtype, size, root and op (see ``verify``): mismatched calls are undefined
        behaviour in MPI (garbage, a hang or a truncated message), so they raise CollectiveMismatch (a ValueError) on
        every rank. The check's all-gather is only started here: the hook starts its data collective right after, and
        _complete() finishes and compares the check before it finishes the data."""
        if self._hot is not None and payload is None:
            check = self.verify is not False
            self._hot.enter(KIND_CODE[kind], -1 if t is None else DTYPE_CODE[t.dtype], -1 if t is None else t.numel,
                            root, OP_CODE.get(op, -1), check)
            self._check = (self._check_request, kind) if check else None
            return
        self._entered[0] += 1
        self._board.Sync()
        if self._progress is not None:
            board, slot = self._progress
            board[slot] = int(self._entered[0])
        if self.verify is False or self.world_size == 1:
            return
        if self._check is not None:  # the previous call failed between its check and its data collective
            self._check[0].Wait()  # (that call raised already: its signatures do not matter any more)
            self._check = None
        struct.pack_into("6q", self._descriptor_bytes, 0, KIND_CODE[kind],
                         -1 if t is None else DTYPE_CODE[t.dtype], -1 if t is None else t.numel, root,
                         OP_CODE.get(op, -1), int(self._entered[0]))
        if payload is not None:  # a fused all_reduce: its data rides in the check's slot
            payload[1][...] = payload[0]
        # Every call starts with this all-gather, whatever its kind: the ranks' checks always pair up as MPI
        # collectives (same type and size), even when the calls themselves do not.
        if self._check_request is not None:
            self._check_request.Start()
            self._check = (self._check_request, kind)
        else:
            self._check = (self._comm.Iallgather(self._descriptor, self._descriptors), kind)

    def _compare(self, kind: str):
        """None when every rank's signature equals this rank's, else the _Mismatch to raise. `paired` (the same
        on every rank, computed from the signatures alone): every rank called the same kind of collective and
        either every one or none fused its data into the check, so the data collectives pair up in MPI."""
        every = self._descriptors
        if every.tobytes() == self._descriptor.tobytes() * self.world_size:
            return None
        fused = {self._fused_signature(row) for row in every}
        return _Mismatch(self._mismatch_message(kind, every),
                         paired=bool((every[:, 0] == every[0, 0]).all()) and len(fused) == 1)

    def _fusable(self, dtype, count: int) -> bool:
        return self._check_request is not None and self._check is None and self.verify is not False \
            and self.world_size > 1 and count * _ITEMSIZE[dtype] <= self._fuse_bytes

    def _fused_signature(self, row) -> bool:
        """Whether the rank whose signature is `row` sent its all_reduce inside the check (see _fusable)."""
        kind, dtype, count = int(row[0]), int(row[1]), int(row[2])
        return (kind == KIND_CODE["all_reduce"] and 0 <= dtype < len(DTYPES) and self._check_request is not None
                and count * DTYPES[dtype].itemsize <= self._fuse_bytes)

    def _mismatch_message(self, kind: str, every: np.ndarray) -> str:
        def says(r):
            k, d, n, rt, o, seq = every[r]
            what = f"{KINDS[k]}" + ("" if d < 0 else f" of {n} {DTYPES[d].name} elements")
            return (what + (f", root {rt}" if rt >= 0 else "") + (f", op {REDUCE_OPS[o]}" if o >= 0 else "")
                    + f" (its call #{seq})")
        bad = [r for r in range(self.world_size) if not np.array_equal(every[r], every[0])]
        return (f"mpi {kind}: the ranks' calls do not match: rank 0 called {says(0)}; "
                + "; ".join(f"rank {r} called {says(r)}" for r in bad)
                + ". Every rank must make the same collective calls in the same order")

    def _complete(self, request, name: str) -> None:
        """Waits for a nonblocking MPI operation, at most the timeout, together with the call's signature check
        when one is in flight (see _enter): one polling loop for both (each Test drives all of MPI's progress),
        the check's verdict taken as soon as it is done. On a mismatch the data collective, started together
        with the check, is given MISMATCH_DRAIN_S to end when every rank called the same kind of collective
        (its result is garbage; the tensor's contents are undefined): then CollectiveMismatch on every rank (the
        signatures are the same on every rank, so every rank sees the mismatch). The communicator is broken
        when the kinds differ or the data collective did not end."""
        if self._hot is not None:  # polls in C++ with the GIL released: on the background thread too
            kind = name if self._check is None else self._check[1]
            self._check = None
            status = self._hot.wait(self._MPI._addressof(request), self.timeout)
            if status != mpi_hot.DONE:
                self._hot_failed(status, kind, lambda: self._drain(request))
            return
        if self._check is None:
            self._wait(name, request.Test, request.Wait)
            return
        check, kind = self._check
        self._check = None
        verdict = []  # [None] once the signatures matched, [_Mismatch] when they did not

        def settled() -> bool:
            if not verdict:
                if not check.Test():
                    return False
                verdict.append(self._compare(kind))
                if verdict[0] is not None:
                    return True
            return request.Test()

        def block() -> None:
            check.Wait()
            verdict.append(self._compare(kind))
            if verdict[0] is None:
                request.Wait()

        self._wait(name, settled, block)
        mismatch = verdict[0]
        if mismatch is None:
            return
        # The same collective with other arguments still pairs up in MPI: let it end, and the communicator
        # goes on. Different collectives may or may not pair up (MPICH pairs an all_reduce with a barrier, not
        # with a broadcast): the communicator is broken either way, the same on every rank.
        if not (mismatch.paired and self._drain(request)):
            self._broken = CommError(f"mpi communicator of rank {self.rank}: unusable after a mismatched call whose "
                                     f"data collectives did not pair up ({mismatch})")
        raise CollectiveMismatch(str(mismatch))

    def _drain(self, request) -> bool:
        """Whether a (mismatched) request ended within MISMATCH_DRAIN_S; MPI's own errors count as ended."""
        try:
            return poll(request, MISMATCH_DRAIN_S)
        except self._MPI.Exception:  # e.g. a truncated message: the collective is over
            return True

    def _wait(self, name: str, settled, block) -> None:
        """Waits until settled() (which Tests MPI requests) is true, at most the timeout. Polls continuously
        for the first SPIN_S seconds, then with growing sleeps so that a rank waiting for a slow peer leaves
        the CPU to the others. block(): the same wait inside MPI, used on the background thread."""
        if self._runner.is_current():
            # On the background thread (asynchronous work, overlapping the caller's computation): block in
            # MPI with the GIL released rather than poll from Python, which would hold the GIL between polls
            # and slow the caller down. Whoever waits on the work applies the timeout.
            block()
            return
        if settled():
            return
        start = time.monotonic()
        nap = 1e-5
        while not settled():
            waited = time.monotonic() - start
            if waited > self.timeout:
                raise self._on_timeout(name)
            if waited > SPIN_S:
                time.sleep(nap)
                nap = min(nap * 2, 1e-3)
            else:  # (without it no faster, and far slower under load: docs/benchmarks/communication.md)
                os.sched_yield()  # with more ranks than cores, let the rank we wait for run

    # ----- hooks
    def all_reduce(self, t, op: str = "sum", async_op: bool = False):
        # The common call (in line, on a contiguous CPU tensor) straight to the C++ hot path, past the generic
        # layers of Communicator.all_reduce (a measurable part of a small call: docs/benchmarks/communication.md);
        # anything else, errors included, goes there.
        if self._hot is not None and not async_op and self._broken is None and self._runner.pending == 0 \
                and type(op) is str:
            raw = t.data if isinstance(t, Tensor) else t
            if type(raw) is _core.Tensor:
                log = self.arrivals
                if log is not None and log.paused:
                    log = None
                t0 = time.perf_counter() if log is not None else 0.0  # for the straggler report (arrivals.py)
                with self._runner.lock:
                    try:
                        if self._hot_all_reduce(raw, op):
                            if log is not None:
                                took = time.perf_counter() - t0
                                log.blocked += took
                                log.add(took)
                            return t
                    except (CommError, CollectiveMismatch) as e:
                        self._reraise(e)
        return super().all_reduce(t, op, async_op)

    def _hot_all_reduce(self, t, op: str) -> bool:
        """The all_reduce by the C++ hot path; False when it left the call to the Python path (nothing done)."""
        code = OP_CODE.get(op)
        if code is None:
            return False
        status = self._hot.all_reduce(t, code, self.verify is not False, self.timeout)
        if status == mpi_hot.DONE:
            return True
        if status == mpi_hot.NOT_HANDLED:
            return False
        if status == mpi_hot.REDUCE_IN_PYTHON:
            self._reduce_fused_rows(t, op)
            return True
        self._hot_failed(status, "all_reduce", lambda: self._hot.drain(MISMATCH_DRAIN_S))
        return True

    def _hot_failed(self, status: int, kind: str, drain) -> None:
        """Raises what a C++ hot path call that did not finish ended with, as the Python path would: a timeout,
        MPI's own error, or a mismatch (drain(): whether the mismatched data collective ended in time)."""
        if status == mpi_hot.TIMEOUT:
            raise self._on_timeout(kind)
        if status == mpi_hot.MPI_ERROR:
            raise self._MPI.Exception(self._hot.last_error)
        if status != mpi_hot.MISMATCH:
            raise CommError(f"mpi {kind}: unexpected status {status} from the C++ hot path (please report)")
        mismatch = self._compare(kind)
        if mismatch is None:  # cannot be: C++ compared the same slots
            raise CommError(f"mpi {kind}: the C++ hot path saw a mismatch that the slots do not show (please report)")
        if not (mismatch.paired and drain()):
            self._broken = CommError(f"mpi communicator of rank {self.rank}: unusable after a mismatched call whose "
                                     f"data collectives did not pair up ({mismatch})")
        raise CollectiveMismatch(str(mismatch))

    def _all_reduce(self, t, op):
        if self._hot is not None and self._hot_all_reduce(t, op):
            return
        if self._fusable(t.dtype, t.numel):
            return self._all_reduce_fused(t, op)
        self._enter("all_reduce", t, op=op)
        # float16 only: bfloat16's reduction callback widens with bit operations and is faster than the gather
        # (docs/benchmarks/communication.md, "Measurements behind the code's choices").
        if t.dtype == tensor.float16 and op in ("sum", "avg") and self.world_size <= FP16_GATHER_MAX_RANKS:
            return self._all_reduce_fp16_by_gather(t, op)
        if op == "avg":  # MPI's sum rounds at every step: the rule of comm/averaging.py
            averaging.before_sum(t, self.world_size)
        self._complete(self._comm.Iallreduce(self._MPI.IN_PLACE, self._buf(t), op=self._op(op, t.dtype)), "all_reduce")
        if op == "avg":
            averaging.after_sum(t, self.world_size)

    def _all_reduce_fused(self, t, op):
        """A small all_reduce inside the signature check's all-gather (see FUSE_BYTES): one collective, then
        every rank reduces the gathered rows in rank order (float16 in float32, rounded once)."""
        a = _array(t).reshape(-1)  # bfloat16: its uint16 bits
        mine = self._fused_rows(a)[0]
        self._enter("all_reduce", t, op=op, payload=(a, mine))
        check, kind = self._check
        self._check = None
        self._wait("all_reduce", check.Test, check.Wait)
        mismatch = self._compare(kind)
        if mismatch is not None:
            if not mismatch.paired:  # some rank started a data collective that nothing here pairs with
                self._broken = CommError(f"mpi communicator of rank {self.rank}: unusable after a mismatched call "
                                         f"whose data collectives did not pair up ({mismatch})")
            raise CollectiveMismatch(str(mismatch))
        self._reduce_fused_rows(t, op)

    def _fused_rows(self, a: np.ndarray):
        """(this rank's data in the check's slot, every rank's rows) as arrays of a's dtype, made once per shape."""
        views = self._fused_views.get((a.dtype.char, a.size))
        if views is None:
            end = _SIG_BYTES + a.nbytes
            views = (self._slot_u8[_SIG_BYTES:end].view(a.dtype), self._slots_u8[:, _SIG_BYTES:end].view(a.dtype))
            self._fused_views[(a.dtype.char, a.size)] = views
        return views

    def _reduce_fused_rows(self, t, op) -> None:
        """t = op over the rows the check gathered, in rank order (float16 in float32, rounded once)."""
        a = _array(t).reshape(-1)
        rows = self._fused_rows(a)[1]
        if t.dtype == tensor.bfloat16:  # widened exactly; every op in float32, rounded once below
            rows = _bf16_to_f32(rows)
        elif a.dtype == np.float16 and op in ("sum", "avg", "prod"):
            rows = rows.astype(np.float32)
        ufunc = _UFUNCS[op]
        if rows.dtype == a.dtype and op != "avg":
            ufunc.reduce(rows, axis=0, out=a)
            return
        reduced = ufunc.reduce(rows, axis=0)
        if op == "avg":
            reduced /= self.world_size
        a[...] = _f32_to_bf16(reduced) if t.dtype == tensor.bfloat16 else reduced

    def _all_reduce_fp16_by_gather(self, t, op):
        """float16 sum / average without a Python reduction callback: all-gather the ranks' vectors, then
        one C++ reduction over them in float32, rounded once (the same bits on every rank; an average never
        overflows where its float32 value would not). It moves (P - 1) n values per rank against
        2 (P - 1) / P n for a reduction tree: the same at 2 ranks, hence only up to FP16_GATHER_MAX_RANKS."""
        every = _core.Tensor([self.world_size, t.numel], t.dtype, t.device)
        self._complete(self._comm.Iallgather(self._buf(t), self._buf(every, t.numel)), "all_reduce")
        reduced = (_core.mean if op == "avg" else _core.sum)(every, [0], False)
        _core.copy_(t, reduced.reshape(list(t.shape)))

    def _broadcast(self, t, root):
        self._enter("broadcast", t, root)
        self._complete(self._comm.Ibcast(self._buf(t), root=root), "broadcast")

    def _reduce(self, t, root, op):
        self._enter("reduce", t, root, op)
        src = t
        if op == "avg" and averaging.divides_before_summing(t.dtype):  # a divided copy goes; t stays as it was
            src = t.clone()
            averaging.before_sum(src, self.world_size)
        if self.rank == root:
            send = self._MPI.IN_PLACE if src is t else self._buf(src)
            self._complete(self._comm.Ireduce(send, self._buf(t), op=self._op(op, t.dtype), root=root), "reduce")
            if op == "avg":
                averaging.after_sum(t, self.world_size)
        else:
            self._complete(self._comm.Ireduce(self._buf(src), None, op=self._op(op, t.dtype), root=root), "reduce")

    def _all_gather(self, out, t):
        self._enter("all_gather", t)
        self._complete(self._comm.Iallgather(self._buf(t), self._buf(out, t.numel)), "all_gather")

    def _reduce_scatter(self, out, t, op):
        self._enter("reduce_scatter", t, op=op)
        src = t
        if op == "avg" and averaging.divides_before_summing(t.dtype):  # the caller's input stays as it was
            src = t.clone()
            averaging.before_sum(src, self.world_size)
        self._complete(self._comm.Ireduce_scatter_block(self._buf(src, out.numel), self._buf(out),
                                                        op=self._op(op, t.dtype)), "reduce_scatter")
        if op == "avg":
            averaging.after_sum(out, self.world_size)

    def _gather(self, out, t, root):
        self._enter("gather", t, root)
        recv = self._buf(out, t.numel) if out is not None else None
        self._complete(self._comm.Igather(self._buf(t), recv, root=root), "gather")

    def _scatter(self, out, t, root):
        self._enter("scatter", out, root)
        send = self._buf(t, out.numel) if t is not None else None
        self._complete(self._comm.Iscatter(send, self._buf(out), root=root), "scatter")

    def _barrier(self):
        self._enter("barrier")
        self._complete(self._comm.Ibarrier(), "barrier")

    def _send(self, t, dst, tag):
        self._complete(self._comm.Isend(self._buf(t), dest=dst, tag=tag), "send")

    def _recv(self, t, src, tag):
        self._complete(self._comm.Irecv(self._buf(t), source=src, tag=tag), "recv")

    def _start_watcher(self, local):
        """Starts this host's watcher (see watch.py: it names a rank that dies, which mpiexec does not do
        reliably) on local rank 0; returns the name the ranks tell it their normal ends by."""
        if self.world_size == 1 or not launched_by_mpiexec() or os.environ.get(watch.ENV_SWITCH) == "0":
            return None
        mine = np.array([self.rank, os.getpid()], np.int64)
        table = np.zeros((local.size, 2), np.int64)
        await_setup(local.Iallgather(mine, table), "this host's ranks' pids for the watcher", self.timeout,
                     self.rank, self.world_size)  # plain integers: no pickle
        name = watch.socket_name(int(table[0, 1]))
        started = np.zeros(2, np.int64)  # the watcher's pid and its progress board's descriptor; 0: none
        if local.rank == 0:
            started[:] = watch.start(name, self._MPI.Get_processor_name(), {int(r): int(p) for r, p in table}) \
                or (0, 0)
        # once it listens: no rank of this host can end unseen
        await_setup(local.Ibcast(started, root=0), "the start of this host's watcher", self.timeout, self.rank,
                     self.world_size)
        if started[0]:
            board = watch.open_board(int(started[0]), int(started[1]), local.size)
            if board is not None:  # slots in the order of the ranks (the watcher's order)
                self._progress = (board, sorted(int(r) for r in table[:, 0]).index(self.rank))
        return name

    def _abort(self, reason):
        print(f"singa_lite: rank {self.rank} aborts the MPI job: {reason}", file=sys.stderr, flush=True)
        abort_job(self._comm.Abort)

    def _close(self):
        if self.world_size > 1:
            try:
                self._wait_for_every_close()
            except CommError as e:  # nothing is freed (MPI would wait in it): the job is aborted at exit
                self._broken = self._stuck = e
                raise
        self._hot = None  # it points into what is freed below
        if self._check_request is not None:
            self._check_request.Free()
        self._board.Unlock_all()
        if self.world_size > 1:  # collective: bounded, and a rank that never comes to it named
            try:
                mpi_setup.bounded(self._comm, "close (MPI_Win_free)", self.timeout, self._board.Free,
                                  error=mpi_setup.teardown_error, absent="it had closed the communicator but not "
                                  "come to free it: stuck in between")
            except CommError as e:
                self._broken = self._stuck = e
                raise
        else:
            self._board.Free()
        self._comm.Free()

    # ----- timeouts
    def _on_timeout(self, name: str) -> CommError:
        mine = int(self._entered[0])
        counts = self._read_board(timeout=BOARD_QUERY_S)
        silent = [r for r, c in enumerate(counts) if c is None]
        late = [r for r, c in enumerate(counts) if c is not None and 0 <= c < mine]
        ended = {r: -1 - c for r, c in enumerate(counts) if c is not None and c < 0}  # see _at_exit
        parts = []
        if silent:
            parts.append(self._unreachable(silent))
        if late:
            parts.append(f"ranks that had not entered it: {', '.join(map(str, late))}")
        if ended:
            parts.append("; ".join(
                f"rank {r} ended normally (its script finished without an error) after {n} collectives"
                for r, n in ended.items()) + (
                f", while this rank is inside #{mine}: the number of steps probably differed (uneven data "
                f"per rank?); give every rank the same number of batches, or train inside "
                f"`with dist_opt.join():`"))
        who = "; ".join(parts) or "every rank entered it, so one of them is stuck inside it"
        return CommError(f"mpi {name} #{mine} (rank {self.rank} of {self.world_size}): not finished after "
                         f"{self.timeout:g} s; {who}. The job cannot continue: it is aborted at exit. Look at "
                         f"those ranks' output, or raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")

    def _unreachable(self, silent: list) -> str:
        """Names the ranks that did not answer the board's query, by host: a host none of whose ranks answers
        is unreachable (its link is down, or it is gone)."""
        by_host = {}
        for r in silent:
            by_host.setdefault(self._hosts[r], []).append(r)
        said = []
        for host, ranks in by_host.items():
            whole = len(ranks) == self._hosts.count(host)
            said.append(f"{'host ' + host + ' is unreachable: ' if whole else ''}rank{'s' * (len(ranks) > 1)} "
                        f"{', '.join(map(str, ranks))}{'' if whole else ' on ' + host} did not answer a query of "
                        f"{'their' if len(ranks) > 1 else 'its'} progress within {BOARD_QUERY_S:g} s")
        return "; ".join(said) + (" (a cut network link, a host that is down, or ranks stuck in MPI)")

    def _read_board(self, timeout: float) -> list:
        """Every rank's entry on the arrival board, None for a rank that did not answer within `timeout`. The
        reads are nonblocking (Rget) and polled here: a blocking Flush towards an unreachable host never
        returns and holds MPI's lock meanwhile, so that even MPI_Abort would then wait forever."""
        bufs = [np.zeros(1, np.int64) for _ in range(self.world_size)]
        pending = {r: self._board.Rget(bufs[r], r) for r in range(self.world_size)}
        answered = set()
        end = time.monotonic() + timeout
        while pending and time.monotonic() < end:
            for r, request in list(pending.items()):
                try:
                    done = request.Test()
                except self._MPI.Exception:  # MPI's own error towards that rank: no answer
                    pending.pop(r)
                    continue
                if done:
                    pending.pop(r)
                    answered.add(r)
            time.sleep(1e-3)
        return [int(bufs[r][0]) if r in answered else None for r in range(self.world_size)]

    def _wait_for_every_close(self) -> None:
        """Marks this rank's end on the arrival board (-1 - count: a rank still waiting for this one in a
        collective names it as ended normally, see _on_timeout), then waits until every rank's entry says the
        same, reading the board with nonblocking one-sided reads (no collective that could pair up with
        another call of a rank still working): MPI_Win_free, which follows, is collective and would wait
        forever for a rank that never closes. Waits the timeout plus CLOSE_GRACE_S: a rank stuck in a
        collective this one never entered times out by itself, and its error says more (its call, and that
        this rank ended), so it should come first. On expiry: CommError naming the ranks that did not close."""
        if self._entered[0] >= 0:
            self._entered[0] = -1 - self._entered[0]
        self._board.Sync()
        limit = self.timeout + CLOSE_GRACE_S
        end = time.monotonic() + limit
        nap = 1e-3
        while True:
            counts = self._read_board(timeout=max(min(BOARD_QUERY_S, end - time.monotonic()), 0.1))
            if all(c is not None and c < 0 for c in counts):
                return
            if time.monotonic() >= end:
                break
            time.sleep(nap)
            nap = min(nap * 2, 0.05)
        running = [r for r, c in enumerate(counts) if c is not None and c >= 0]
        silent = [r for r, c in enumerate(counts) if c is None]
        parts = []
        if running:
            parts.append(f"rank{'s' * (len(running) > 1)} {', '.join(map(str, running))} had not closed it nor "
                         f"reached the end of {'their' if len(running) > 1 else 'its'} script (still in "
                         f"{'their' if len(running) > 1 else 'its'} own code, or stuck in another call)")
        if silent:
            parts.append(self._unreachable(silent))
        raise CommError(f"mpi close (rank {self.rank} of {self.world_size}): every rank must close the "
                        f"communicator (at the latest at exit; freeing it is collective in MPI), but after "
                        f"{limit:g} s {'; '.join(parts)}. The job cannot end normally: it is aborted at exit. Look "
                        f"at those ranks' output, or raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")

    def _at_exit(self):
        if self._broken is None and not self.closed:
            try:  # the window must go before MPI_Finalize (mpi4py's own exit hook, which runs after)
                self.close()
            except CommError:  # a rank never closed (self._stuck): aborted below, as MPI_Finalize would hang
                pass
        failed = self._stuck or (None if self.closed else self._broken)
        if self._watch_name is not None:  # this rank's end is not a death: the watcher must not blame it
            watch.tell(self._watch_name, "done" if failed is None else "reported", self.rank)
        if failed is not None:
            print(f"singa_lite: rank {self.rank}: aborting the MPI job after: {failed}", file=sys.stderr,
                  flush=True)
            time.sleep(ABORT_GRACE_S)  # the other surviving ranks' own errors get printed too
            abort_job(self._MPI.COMM_WORLD.Abort)
