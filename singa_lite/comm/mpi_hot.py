"""The mpi backend's per-call hot path in C++ (``_core.MpiHotPath``, csrc/comm/mpi_hot.h), and the encoding of a
call's signature that it shares with the Python path of mpi.py.

Where mpi4py speaks the MPICH ABI (MPICH, Intel MPI, MVAPICH: mpich_abi_library), the C++ path calls that
library with mpi4py's own handles and does a call's per-call work (the arrival board, the call check, polling,
the small all_reduce) without Python in between; Python's share of a small call costs more than MPI itself
there (docs/benchmarks/communication.md). Elsewhere, or with HOT_PATH_VAR=0, mpi.py does the same work in
Python with the same results.
"""
from __future__ import annotations

import ctypes
import os
import warnings

from .. import _core, tensor
from .communicator import DTYPES, REDUCE_OPS

# A call's signature, as both paths write it into the check's slot: kind, dtype, count, root, op, call number.
KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "barrier")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
OP_CODE = {o: i for i, o in enumerate(REDUCE_OPS)}

HOT_PATH_VAR = "SINGA_LITE_MPI_HOT_PATH"  # "0": the Python path even where the C++ one could run
SPIN_S = 0.05  # seconds of continuous polling before a waiting rank starts to sleep between polls
# The C++ wait polls MPI_Test without yielding, as MPI_Wait does, for SPIN_S when every rank of this host has a
# CPU of its own; with more ranks than CPUs only this long, then sched_yield between polls as the Python path
# does: the rank waited for may need this CPU, and yielding sooner slows a mid-sized all_reduce down
# (docs/benchmarks/communication.md, "Options measured").
HOT_SPIN_NS = 10_000
# _core.MpiHotPath's results (csrc/comm/mpi_hot.h, MpiStatus)
DONE, TIMEOUT, MISMATCH, MPI_ERROR, REDUCE_IN_PYTHON, NOT_HANDLED = range(6)
# The MPICH ABI's handle values (mpi.h of MPICH): mpi4py must use them for the C++ path to pass its handles on.
_MPICH_COMM_WORLD, _MPICH_REQUEST_NULL, _MPICH_FLOAT = 0x44000000, 0x2C000000, 0x4C00040A
_HALF = (tensor.float16, tensor.bfloat16)


def mpich_abi_library(MPI) -> str | None:
    """The path of the MPI library this process loaded when mpi4py talks to it through the MPICH ABI (4-byte
    handles with MPICH's values; the library's soname libmpi.so.12), else None: the only case in which the C++
    hot path may call it with mpi4py's handles (``py2f()`` is the C handle there: MPICH's f2c is a cast)."""
    try:
        if any(MPI._sizeof(k) != 4 for k in (MPI.Comm, MPI.Request, MPI.Win, MPI.Datatype, MPI.Op)):
            return None
        if (MPI._handleof(MPI.COMM_WORLD), MPI._handleof(MPI.REQUEST_NULL), MPI._handleof(MPI.FLOAT)) != \
                (_MPICH_COMM_WORLD, _MPICH_REQUEST_NULL, _MPICH_FLOAT):
            return None
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if "libmpi.so.12" in line}
    except (AttributeError, TypeError, OSError, IndexError):  # an older mpi4py, not Linux
        return None
    paths = [p for p in paths if os.path.basename(p).split(".so.12")[0] == "libmpi"]
    return paths[0] if len(paths) == 1 else None


def make(MPI, comm, board, check_request, slot, slots, entered, progress, types: dict, ops: dict,
         spin_free: bool):
    """The C++ hot path over a communicator's handles and buffers, or None where it cannot run (see
    mpich_abi_library; one rank; no persistent check; an MPI not initialised for threads: its wait releases
    the GIL, so another thread may call MPI meanwhile).

    comm, board: the communicator and its arrival board's window; check_request: the persistent all-gather of
    the call check; slot, slots: this rank's and every rank's check slot (int64 arrays); entered: this rank's
    entry on the board; progress: (the watcher's progress board, this rank's slot) or None; types, ops: the
    MPI datatype of each dtype and the MPI op of each reduction; spin_free: every rank of this host has a CPU of
    its own (the wait then spins without yielding, see HOT_SPIN_NS)."""
    if os.environ.get(HOT_PATH_VAR, "1") == "0" or comm.size == 1 or check_request is None \
            or not hasattr(_core, "MpiHotPath") or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return None
    library = mpich_abi_library(MPI)
    if library is None:
        return None
    progress_address = 0
    if progress is not None:
        progress_board, progress_slot = progress
        progress_address = ctypes.addressof(ctypes.c_int64.from_buffer(progress_board.obj, 8 * progress_slot))
    dtype_codes = [-1] * 8  # indexed by the core's DType value
    mpi_types = [0] * 8
    for d, code in DTYPE_CODE.items():
        dtype_codes[int(d)] = code
        if d not in _HALF:  # 2-byte floats reduce through Python callbacks: the Python path's
            mpi_types[int(d)] = types[d].py2f()
    try:
        return _core.MpiHotPath(
            library=library, comm=comm.py2f(), win=board.py2f(),
            check_request=MPI._addressof(check_request), slot=slot.ctypes.data,
            slots=slots.ctypes.data, slot_bytes=slot.nbytes, world_size=comm.size,
            entered=entered.ctypes.data, progress=progress_address, dtype_codes=dtype_codes, mpi_types=mpi_types,
            mpi_ops=[ops[o].py2f() for o in REDUCE_OPS], all_reduce_kind=KIND_CODE["all_reduce"],
            avg_op=OP_CODE["avg"], max_op=OP_CODE["max"], min_op=OP_CODE["min"],
            request_null=MPI.REQUEST_NULL.py2f(), spin_ns=int(SPIN_S * 1e9) if spin_free else HOT_SPIN_NS,
            yield_ns=int(SPIN_S * 1e9))
    except ValueError as e:  # the library or one of its functions not found: the Python path works
        warnings.warn(f"singa_lite mpi backend: the C++ hot path is off ({e}); calls take the Python path",
                      stacklevel=3)
        return None
