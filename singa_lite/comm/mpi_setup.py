"""Starting MPI and making the mpi backend's communicator without waiting forever (see mpi.py for the backend).

MPI's start-up and communicator creation are collective and blocking: a rank that never comes (stuck in its own
code before ``dist.init()``) left the others waiting in ``MPI_Init`` or ``MPI_Comm_dup`` for ever. Here each step
is bounded by the communicator's timeout: ``MPI_Init`` on a helper thread, then a polled nonblocking all-gather of
arrival flags (which names a rank that never arrived) before a nonblocking ``Idup``; on expiry ``CommError`` names
the step, and a failed setup aborts the job at exit (``MPI_Finalize`` would wait for its requests in flight).
Also: what tells that mpiexec started this process, and aborting an MPI job so that the rank surely ends.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
import time

import numpy as np

from .communicator import CommError

ABORT_GRACE_S = 1.0
# MPI_Abort asks mpiexec to end the job and may never return when mpiexec cannot be reached (this rank's host
# cut off from the launcher): SIGALRM (default action: the process ends) ends the rank then, after this long.
ABORT_EXIT_S = 5


# Environment variables that mpiexec sets (MPICH's Hydra, Open MPI, PMIx launchers).
MPI_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


def launched_by_mpiexec() -> bool:
    return any(v in os.environ for v in MPI_LAUNCH_VARS)


def mpiexec_ranks() -> int:
    """The number of ranks mpiexec started, from its environment (MPICH, Open MPI; 1 when it does not say); 0
    when not started by mpiexec. Read without initialising MPI."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        try:
            return int(os.environ[var])
        except (KeyError, ValueError):
            continue
    return 1 if launched_by_mpiexec() else 0


def import_mpi(timeout: float | None = None):
    """mpi4py's MPI module, initialised; a clear ImportError when mpi4py or an MPI library is missing.

    timeout (seconds): MPI_Init waits for every rank of the job to start MPI (MPICH: a PMI fence), forever when
    one never does (stuck in its own code before init). Under mpiexec, when this first initialises MPI, it
    then runs MPI_Init_thread on a helper thread through ctypes (mpi4py's own Init holds the GIL) and raises
    CommError when it has not finished after `timeout`; MPI is then not initialised and cannot abort the job:
    this rank ends with the error (uncaught), and mpiexec ends the others."""
    try:
        import mpi4py
        if timeout is not None and "mpi4py.MPI" not in sys.modules and mpiexec_ranks() > 1 \
                and mpi4py.rc.initialize and mpi4py.rc.errors == "exception":
            mpi4py.rc.initialize = False  # initialised below, with a deadline
            if mpi4py.rc.finalize is None:
                mpi4py.rc.finalize = True  # as if mpi4py had initialised it: MPI_Finalize at exit
            from mpi4py import MPI
            _init_with_deadline(MPI, mpi4py.rc, timeout)
        else:
            from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"the mpi backend needs mpi4py and an MPI library: pip install 'singa_lite[mpi]' "
                          f"(mpi4py + the MPICH wheel), or mpi4py built against your cluster's MPI ({e})") from e
    return MPI


def _init_with_deadline(MPI, rc, timeout: float) -> None:
    """MPI_Init_thread as mpi4py would run it at import (thread level and error handlers from mpi4py.rc), but
    given up after `timeout` (see import_mpi)."""
    if MPI.Is_initialized():
        return
    levels = {"multiple": MPI.THREAD_MULTIPLE, "serialized": MPI.THREAD_SERIALIZED,
              "funneled": MPI.THREAD_FUNNELED, "single": MPI.THREAD_SINGLE}
    required = levels.get(str(rc.thread_level).lower(), MPI.THREAD_MULTIPLE) if rc.threads else MPI.THREAD_SINGLE
    # Below THREAD_MULTIPLE only the thread that started MPI may call it: that one must be the caller's.
    library = _loaded_mpi_library() if required == MPI.THREAD_MULTIPLE else None
    if library is None:  # (also: not Linux, or not one library) mpi4py's own, blocking, initialisation
        MPI.Init_thread(required)
    else:
        provided = ctypes.c_int(-1)
        result = []
        # ctypes releases the GIL during the call, so this thread can keep time; a daemon thread, as it may
        # never come back. (MPI calls it the main thread; MPICH finalises from the interpreter's own fine.)
        worker = threading.Thread(target=lambda: result.append(library.MPI_Init_thread(
            None, None, ctypes.c_int(required), ctypes.byref(provided))), name="singa_lite MPI_Init", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            rank, size = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?")), mpiexec_ranks()
            atexit.register(_exit_failed)
            raise CommError(
                f"mpi start-up (MPI_Init) on rank {rank} of {size}: not finished after {timeout:g} s. MPI_Init "
                f"waits for every rank of the job to start MPI, and at least one has not (stuck in its own code "
                f"before dist.init(), or much slower to start); MPI_Init cannot tell which. Look at the other "
                f"ranks' output, or raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT). MPI cannot be used "
                f"by this rank any more: it exits with status 1 (caught or not), and mpiexec then ends the others")
        if result != [0]:  # an MPI error code (or the call raised on its thread: printed there)
            raise CommError(f"mpi start-up: MPI_Init_thread failed ({result[0] if result else 'no result'})")
    # mpi4py's default policy (rc.errors "exception"): MPI errors come back as MPI.Exception, not an abort.
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        comm.Set_errhandler(MPI.ERRORS_RETURN)


def _exit_failed() -> None:
    """At exit after MPI_Init timed out: the rank ends with status 1 even when the script caught the error. MPI
    cannot abort the job (not initialised), and mpiexec (Hydra) ends the other ranks when this one exits, but
    reports the job by this rank's status: 0 would call a job successful whose other ranks it killed. (os._exit:
    the exit handlers registered before this one do not run; the standard streams and logging are flushed.)"""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(1)


def _loaded_mpi_library():
    """The MPI library mpi4py loaded (ctypes handle), when there is exactly one libmpi in this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if "/libmpi" in line}
    except (OSError, IndexError):
        return None
    paths = [p for p in paths if os.path.basename(p).startswith("libmpi.so")]
    if len(paths) != 1:
        return None
    try:
        return ctypes.CDLL(paths[0], mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None


def abort_job(abort, code: int = 1) -> None:
    """Aborts the MPI job with `abort` (``Comm.Abort``), sure to end this rank: MPI_Abort reaches mpiexec
    through this host's proxy and waits to be ended by it, forever when the host's link is cut. So an alarm
    (SIGALRM, whose default action ends the process, whatever the GIL or MPI's locks are doing) ends the rank
    after ABORT_EXIT_S."""
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a handler the script set must not catch it
    except ValueError:  # not the main thread: the default action stays unless the script changed it
        pass
    signal.alarm(ABORT_EXIT_S)
    abort(code)


def poll(request, timeout: float) -> bool:
    """Whether the MPI request completed within `timeout` seconds, polled with Test (sleeping ever longer
    between polls, up to 10 ms: the setup is not latency-bound and the ranks may share few CPUs)."""
    end = time.monotonic() + timeout
    nap = 1e-5
    while not request.Test():
        if time.monotonic() >= end:
            return False
        time.sleep(nap)
        nap = min(nap * 2, 1e-2)
    return True


def setup_error(step: str, rank: int, size: int, timeout: float, who: str) -> CommError:
    return CommError(f"mpi communicator setup ({step}) on rank {rank} of {size}: not finished after {timeout:g} s; "
                     f"{who}. The job cannot continue: it is aborted at exit. Look at those ranks' output, or raise "
                     f"the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")


def await_setup(request, step: str, timeout: float, rank: int, size: int) -> None:
    """Waits for a setup step that starts after every rank has joined (see join): so on expiry, a rank is
    stuck in the setup or gone, and which one cannot be told."""
    if not poll(request, timeout):
        raise setup_error(step, rank, size, timeout, "every rank had joined the setup before it, so one of them "
                           "is stuck in it or gone (MPI does not tell which)")


def join(MPI, parent, timeout: float):
    """Our own duplicate of `parent`, once every rank of it has arrived, each wait bounded by `timeout`.
    First a nonblocking all-gather of arrival flags (polled): a rank that never comes leaves its flag unset,
    so the others can name it; then the nonblocking duplicate (MPI_Comm_idup), which only starts once every
    rank is known to be here."""
    rank, size = parent.rank, parent.size
    arrived = np.zeros(size, np.int64)
    arrived[rank] = 1
    if not poll(parent.Iallgather(np.ones(1, np.int64), arrived), timeout):
        # (read while the all-gather is still in flight: entries already delivered are 1, the rest still 0)
        missing = [r for r in range(size) if not arrived[r]]
        if size == 2:
            who = f"rank {missing[0]} never arrived (it has not called init: still in its own code, stuck in " \
                  f"another MPI call, or much slower to start)"
        else:
            who = (f"not heard from rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}: those that never "
                   f"arrived (not called init: still in their own code, stuck in another MPI call, or much slower "
                   f"to start) are among them, but an all-gather that a rank never joined may also leave out ranks "
                   f"that did arrive")
        raise setup_error("every rank's arrival", rank, size, timeout, who)
    dup, request = parent.Idup()
    if not poll(request, timeout):
        raise setup_error("duplicating the communicator, MPI_Comm_idup", rank, size, timeout,
                           "every rank had arrived, so one of them is stuck in it or gone (MPI does not tell which)")
    return dup


def abort_at_exit(MPI, rank: int, error: BaseException) -> None:
    """After a failed setup: aborts the MPI job at interpreter exit (after the traceback), as MPI_Finalize
    would wait forever for the setup's requests still in flight, and the other ranks for this one."""
    def abort():
        if MPI.Is_finalized():
            return
        print(f"singa_lite: rank {rank}: aborting the MPI job after a failed communicator setup: {error!r}",
              file=sys.stderr, flush=True)
        time.sleep(ABORT_GRACE_S)  # the other ranks' own errors get printed too
        abort_job(MPI.COMM_WORLD.Abort)
    atexit.register(abort)
