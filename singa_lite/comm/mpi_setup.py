"""Starting MPI, making the mpi backend's communicator and ending MPI without waiting forever (see mpi.py for the
backend).

MPI's start-up, communicator creation and end are collective and blocking: a rank that never comes (stuck in its
own code before ``dist.init()``, or after its last collective) left the others waiting in ``MPI_Init``,
``MPI_Comm_split_type``, ``MPI_Win_allocate`` or ``MPI_Finalize`` for ever. Here each step is bounded by the
communicator's timeout and fails with ``CommError`` naming the step and, where it can be told, the rank:

* ``MPI_Init`` runs on a helper thread through ctypes (mpi4py's own Init holds the GIL), whether ``dist.init()``
  starts MPI or the script imports ``mpi4py.MPI`` itself after importing singa_lite's comm package (an import
  hook then does the same at that import); on expiry the ranks of this host that have not loaded MPI yet are
  named (MPI itself cannot tell).
* A blocking collective without a nonblocking form (a split, a window's creation or freeing) is a ``bounded``
  step: a polled nonblocking all-gather of arrival flags first (a rank that never comes is named), then the call
  on a helper thread (mpi4py releases the GIL inside MPI); nonblocking ones (``Idup``, ``Ibcast``, the all-gather
  of host names) are polled.
* At exit, once a setup of the whole job armed it: every rank's arrival at its end, then ``MPI_Finalize`` on a
  helper thread, both bounded (``arm_exit_guard``).

A step that timed out leaves MPI operations in flight, which ``MPI_Finalize`` would wait for: such a failure
(``StuckError``) aborts the job at exit. Also: what tells that mpiexec started this process, aborting an MPI job
so that the rank surely ends (also on an uncaught exception), and removing the names of MPICH's segments.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
import time

import numpy as np

from . import watch
from .communicator import DEFAULT_TIMEOUT, CommError

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
        if timeout is not None and "mpi4py.MPI" not in sys.modules and _take_over_init(mpi4py.rc):
            from mpi4py import MPI
            _init_with_deadline(MPI, mpi4py.rc, timeout)
        else:
            from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"the mpi backend needs mpi4py and an MPI library: pip install 'singa_lite[mpi]' "
                          f"(mpi4py + the MPICH wheel), or mpi4py built against your cluster's MPI ({e})") from e
    return MPI


def _take_over_init(rc) -> bool:
    """Whether MPI_Init is ours to run with a deadline (under mpiexec with several ranks, where mpi4py would run
    it at import with its default error policy); if so, tells mpi4py not to."""
    if not (mpiexec_ranks() > 1 and rc.initialize and rc.errors == "exception"):
        return False
    rc.initialize = False  # initialised by _init_with_deadline, right after the import
    if rc.finalize is None:
        rc.finalize = True  # as if mpi4py had initialised it: MPI_Finalize at exit
    return True


def env_timeout() -> float:
    """SINGA_LITE_COMM_TIMEOUT, else the default: the bound of an MPI_Init that starts before dist.init() could
    pass one (an invalid value is dist.init's to report: the default here)."""
    try:
        value = float(os.environ.get("SINGA_LITE_COMM_TIMEOUT", ""))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 < value < float("inf") else DEFAULT_TIMEOUT


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
            rank, size = _launch_rank(os.environ), mpiexec_ranks()
            atexit.register(_exit_failed)
            raise CommError(
                f"mpi start-up (MPI_Init) on rank {'?' if rank is None else rank} of {size}: not finished after "
                f"{timeout:g} s. MPI_Init waits for every rank of the job to start MPI, and at least one has not; "
                f"{_not_started(rank, size)}. Look at those ranks' output, or raise the timeout (timeout= or "
                f"SINGA_LITE_COMM_TIMEOUT). MPI cannot be used by this rank any more: it exits with status 1 "
                f"(caught or not), and mpiexec then ends the others")
        if result != [0]:  # an MPI error code (or the call raised on its thread: printed there)
            raise CommError(f"mpi start-up: MPI_Init_thread failed ({result[0] if result else 'no result'})")
    # mpi4py's default policy (rc.errors "exception"): MPI errors come back as MPI.Exception, not an abort.
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        comm.Set_errhandler(MPI.ERRORS_RETURN)


def _launch_rank(environ) -> int | None:
    """The rank mpiexec gave a process, from its environment (None when it does not say)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        try:
            return int(environ[var])
        except (KeyError, ValueError):
            continue
    return None


def _proc_environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _children(pid: int) -> list:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def _loaded_mpi(pid: int, depth: int = 3) -> bool:
    """Whether process `pid`, or one it started (a rank run through a shell), has loaded an MPI library."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if any(os.path.basename(line.split(None, 5)[-1]).startswith("libmpi.so") for line in f
                   if "/libmpi" in line):
                return True
    except (OSError, IndexError):
        pass
    return depth > 0 and any(_loaded_mpi(c, depth - 1) for c in _children(pid))


def _not_started(rank, size: int) -> str:
    """Which ranks have not started MPI, as far as this host can tell: the ranks mpiexec started here are the
    children of this process's parent (its proxy), each with its rank in its environment, and one that has not
    loaded an MPI library has not started MPI."""
    here = {}
    for pid in _children(os.getppid()):
        r = _launch_rank(_proc_environ(pid))
        if r is not None:
            here[r] = pid
    local = os.environ.get("MPI_LOCALNRANKS", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE"))
    if rank not in here or (local is not None and local.isdigit() and int(local) != len(here)):
        # (no /proc, or the ranks are not the proxy's children: started through a wrapper)
        return "MPI_Init cannot tell which, and the ranks of this host cannot be looked up"
    late = sorted(r for r, pid in here.items() if r != rank and not _loaded_mpi(pid))
    elsewhere = sorted(set(range(size)) - set(here))
    parts = []
    if late:
        several = len(late) > 1
        parts.append(f"rank{'s' * several} {', '.join(f'{r} (pid {here[r]})' for r in late)} on this host "
                     f"{'have' if several else 'has'} not started MPI (still in {'their' if several else 'its'} own "
                     f"code before importing mpi4py.MPI or calling dist.init(), or much slower to start)")
    else:
        parts.append("every rank on this host has started MPI" + (
            "" if elsewhere else ", so one of them is stuck inside MPI_Init"))
    if elsewhere:
        parts.append(f"rank{'s' * (len(elsewhere) > 1)} {', '.join(map(str, elsewhere))} "
                     f"run{'s' * (len(elsewhere) == 1)} on other hosts, which this one cannot see")
    return "; ".join(parts)


class _BoundInitAtImport(importlib.abc.MetaPathFinder):
    """Bounds MPI_Init when the script imports mpi4py.MPI itself: mpi4py then initialises MPI at that import,
    before any dist.init() could pass a timeout, and waits there for ever for a rank that never starts MPI. At
    that import this finder tells mpi4py not to initialise, and runs _init_with_deadline right after it (the
    timeout from SINGA_LITE_COMM_TIMEOUT, else 300 s). One use: it leaves sys.meta_path at the import. Installed
    when this module is imported under mpiexec before mpi4py.MPI (a script that imports mpi4py.MPI first starts
    MPI before singa_lite exists in the process: unbounded)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "mpi4py.MPI":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # mpi4py's own finder picks the module of its MPI ABI
        if spec is not None and spec.loader is not None:
            spec.loader = _InitAfterLoad(spec.loader)
        return spec


class _InitAfterLoad(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader, self._ours = loader, False

    def create_module(self, spec):
        import mpi4py
        self._ours = _take_over_init(mpi4py.rc)  # the rc as the script left it (it may have set initialize)
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if self._ours:
            import mpi4py
            _init_with_deadline(module, mpi4py.rc, env_timeout())


def _install_import_hook() -> None:
    if launched_by_mpiexec() and mpiexec_ranks() > 1 and "mpi4py.MPI" not in sys.modules \
            and not any(isinstance(f, _BoundInitAtImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _BoundInitAtImport())


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


class StuckError(CommError):
    """A setup or teardown step that timed out with MPI operations still in flight: MPI_Finalize would wait for
    them for ever, so the job must be aborted at exit (abort_at_exit)."""


def setup_error(step: str, rank: int, size: int, timeout: float, who: str) -> StuckError:
    return StuckError(f"mpi communicator setup ({step}) on rank {rank} of {size}: not finished after {timeout:g} "
                      f"s; {who}. The job cannot continue: it is aborted at exit. Look at those ranks' output, or "
                      f"raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")


def teardown_error(step: str, rank: int, size: int, timeout: float, who: str) -> StuckError:
    return StuckError(f"mpi {step} on rank {rank} of {size}: not finished after {timeout:g} s; {who}. The job "
                      f"cannot end normally: it is aborted at exit. Look at those ranks' output, or raise the timeout "
                      f"(timeout= or SINGA_LITE_COMM_TIMEOUT)")


def await_setup(request, step: str, timeout: float, rank: int, size: int) -> None:
    """Waits for a setup step that starts after every rank has arrived (see gather_arrivals): so on expiry, a
    rank is stuck in the setup or gone, and which one cannot be told."""
    if not poll(request, timeout):
        raise setup_error(step, rank, size, timeout, "every rank had arrived at it, so one of them is stuck in it "
                          "or gone (MPI does not tell which)")


NEVER_CALLED_INIT = ("it has not called init: still in its own code, stuck in another MPI call, or much slower to "
                     "start")


def gather_arrivals(comm, step: str, timeout: float, payload: bytes = b"", width: int = 0,
                    absent: str = NEVER_CALLED_INIT, error=setup_error) -> list:
    """Every rank's `payload` (at most `width` bytes; trailing NULs dropped), once every rank of comm has arrived
    at `step`: a nonblocking all-gather of arrival flags (and the payloads), polled. A rank that never comes
    leaves its flag unset, so the others name it (`absent` says what that means); error(step, rank, size,
    timeout, who) makes the exception."""
    rank, size = comm.rank, comm.size
    mine = np.zeros(1 + width, np.uint8)
    mine[0] = 1
    data = np.frombuffer(payload[:width], np.uint8)
    mine[1:1 + data.size] = data
    rows = np.zeros((size, 1 + width), np.uint8)
    rows[rank] = mine
    if not poll(comm.Iallgather(mine, rows), timeout):
        # (read while the all-gather is still in flight: rows already delivered are set, the rest still 0)
        missing = [r for r in range(size) if not rows[r, 0]]
        if size == 2:
            who = f"rank {missing[0]} never arrived ({absent})"
        else:
            who = (f"not heard from rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}: those that "
                   f"never arrived ({absent}) are among them, but an all-gather that a rank never joined may also "
                   f"leave out ranks that did arrive")
        raise error(step, rank, size, timeout, who)
    return [rows[r, 1:].tobytes().rstrip(b"\0") for r in range(size)]


def bounded(comm, step: str, timeout: float, call, arrive: bool = True, error=setup_error,
            absent: str = NEVER_CALLED_INIT):
    """call()'s result: a blocking collective over comm that MPI has no nonblocking form of (a split, a window's
    creation or freeing), with every wait bounded by `timeout`. First every rank's arrival at `step`
    (gather_arrivals: a rank that never comes is named), unless the caller has just made sure of it
    (arrive=False); then call() on a helper thread while this one waits (mpi4py releases the GIL inside MPI).
    On expiry StuckError, the thread left in MPI (a daemon: it does not hold the exit up; the job is aborted
    at exit). Below MPI_THREAD_SERIALIZED only the thread that started MPI may call it: call() then runs here,
    after the bounded arrival, unbounded. error and absent: as for gather_arrivals."""
    rank, size = comm.rank, comm.size
    if arrive:
        gather_arrivals(comm, step, timeout, absent=absent, error=error)
    MPI = sys.modules["mpi4py.MPI"]
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        return call()
    result, failure = [], []

    def run():
        try:
            result.append(call())
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread, which raises it
            failure.append(e)
    worker = threading.Thread(target=run, name=f"singa_lite mpi {step}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise error(step, rank, size, timeout, "every rank had arrived at it, so one of them is stuck in it or "
                    "gone (MPI does not tell which)")
    if failure:
        raise failure[0]
    return result[0]


def join(MPI, parent, timeout: float):
    """Our own duplicate of `parent`, once every rank of it has arrived, each wait bounded by `timeout`: every
    rank's arrival first (gather_arrivals), then the nonblocking duplicate (MPI_Comm_idup), which only starts
    once every rank is known to be here."""
    gather_arrivals(parent, "every rank's arrival", timeout)
    dup, request = parent.Idup()
    await_setup(request, "duplicating the communicator, MPI_Comm_idup", timeout, parent.rank, parent.size)
    return dup


def broadcast_bytes(data: bytes | None, root: int = 0, comm=None, timeout: float | None = None,
                    what: str = "broadcast_bytes") -> bytes:
    """Rank `root`'s bytes on every rank of `comm` (default COMM_WORLD): how rank 0's NCCL unique id reaches
    the others in the MPI bootstrap. timeout (default SINGA_LITE_COMM_TIMEOUT, else 300 s) bounds each of its
    two nonblocking broadcasts (the length, then the bytes); on expiry StuckError (the job is aborted at exit)
    naming the root on the others. A broadcast may complete on the root once its data has left (small data
    always does), so a receiver that never comes is noticed by the root only in its next collective."""
    timeout = env_timeout() if timeout is None else timeout
    MPI = import_mpi(timeout)
    comm = comm or MPI.COMM_WORLD
    rank, size = comm.rank, comm.size

    def wait(request, part: str):
        if poll(request, timeout):
            return
        who = ("not every rank received it (a rank that never comes to it blocks a large broadcast)" if rank == root
               else f"rank {root}, the root, never sent it (still in its own code, or stuck)")
        error = StuckError(f"mpi {what} ({part}) on rank {rank} of {size}: not finished after {timeout:g} s; {who}. "
                           f"The job cannot continue: it is aborted at exit. Look at that rank's output, or raise "
                           f"the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")
        abort_at_exit(MPI, rank, error)
        raise error
    n = np.array([len(data) if rank == root else 0], np.int64)
    wait(comm.Ibcast(n, root=root), "its length")
    buf = np.frombuffer(data, np.uint8).copy() if rank == root else np.empty(int(n[0]), np.uint8)
    wait(comm.Ibcast(buf, root=root), "its bytes")
    return buf.tobytes()


_abort_registered = []


def abort_at_exit(MPI, rank: int, error: BaseException) -> None:
    """After a failed setup: aborts the MPI job at interpreter exit (after the traceback), as MPI_Finalize
    would wait forever for the setup's requests still in flight, and the other ranks for this one. Once per
    process: the first failure is the one reported."""
    if _abort_registered:
        return
    _abort_registered.append(error)

    def abort():
        if MPI.Is_finalized():
            return
        print(f"singa_lite: rank {rank}: aborting the MPI job after a failed communicator setup: {error!r}",
              file=sys.stderr, flush=True)
        time.sleep(ABORT_GRACE_S)  # the other ranks' own errors get printed too
        abort_job(MPI.COMM_WORLD.Abort)
    atexit.register(abort)


def unlink_mpich_segments() -> list:
    """Removes the names of the MPICH shared-memory segments this process has mapped (/dev/shm/mpich_shm_*),
    returning them. MPICH removes them in MPI_Finalize, which a killed job never reaches: without this every
    killed job leaves its segments in /dev/shm until reboot. Called once every local rank has mapped them (after
    MPI_Init on every rank), it is harmless: mappings outlive names, nothing opens them by name again, and
    MPI_Finalize ignores their absence."""
    removed = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if " /dev/shm/mpich_shm_" in line}
    except OSError:  # not Linux: nothing to do
        return removed
    for path in sorted(paths):
        if path.endswith("(deleted)"):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # another rank of this host removed it first, or it is not ours to remove
            pass
    return removed


def abort_on_uncaught_exception(comm, abort, watch_name=None) -> None:
    """An uncaught exception on one rank ends that rank, while the others wait for it inside a collective and
    MPI_Finalize (at its exit) would wait for them: the job would hang until the timeout. So, as mpi4py's
    ``python -m mpi4py`` does, such an exception aborts the job once its traceback is printed (the others
    print nothing: mpiexec ends them, and the traceback is shown once). comm: the rank's Communicator (mpi, or
    nccl bootstrapped by MPI); abort: aborts the MPI job (``MPI.COMM_WORLD.Abort``); watch_name: the name this
    host's watcher (watch.py) hears the rank's end by, told first that the rank reported its failure."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        if comm.closed or comm.world_size == 1:
            return
        if watch_name is not None:
            watch.tell(watch_name, "reported", comm.rank)
        print(f"singa_lite: rank {comm.rank} of {comm.world_size} ended with an uncaught {kind.__name__} "
              f"(above): aborting the MPI job", file=sys.stderr, flush=True)
        abort_job(abort)

    sys.excepthook = hook


# ---------------------------------------------------------------- the end of the job
_exit_guard = {}  # "comm", "timeout", "MPI" once a setup of the whole job armed it


def arm_exit_guard(MPI, world, timeout: float, before_abort=None) -> None:
    """Bounds this process's end of MPI (collective: every rank of the job calls it, from a setup over the whole
    job, `world`). MPI_Finalize waits for every rank of the job to finalize: for ever for a rank that never
    ends (stuck in its own code after its last collective). At exit (_end_mpi) every rank's arrival is gathered
    on a duplicate of `world` made here, bounded by `timeout`: a rank that never comes is named and the job
    aborted; then MPI_Finalize runs on a helper thread, bounded too. Once per process (the first setup's
    timeout); `world` must span COMM_WORLD. before_abort(): called before that abort (the mpi backend tells its
    watcher that this rank's end is explained)."""
    if _exit_guard:
        return
    dup, request = world.Idup()
    await_setup(request, "the communicator for the end of the job, MPI_Comm_idup", timeout, world.rank,
                world.size)
    _exit_guard.update(comm=dup, timeout=timeout, MPI=MPI, before_abort=before_abort)


def _exit_error(step, rank, size, timeout, who) -> CommError:
    return CommError(f"mpi exit ({step}) on rank {rank} of {size}: not finished after {timeout:g} s; {who}. "
                     f"MPI_Finalize would wait for it for ever: the job is aborted. Look at that rank's output, or "
                     f"raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT)")


def _end_mpi() -> None:
    """The exit handler of arm_exit_guard. Registered when this module is imported, so that it runs after the
    atexit handlers registered later (the communicators' own closes, a script's handlers that still use MPI) and
    before mpi4py's MPI_Finalize (a C-level exit handler, which then finds MPI finalized)."""
    if not _exit_guard:
        return
    MPI, comm, timeout = _exit_guard["MPI"], _exit_guard["comm"], _exit_guard["timeout"]
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    rank, size = comm.rank, comm.size
    try:
        gather_arrivals(comm, "every rank's end, before MPI_Finalize", timeout,
                        absent="still in its own code after its last collective, or stuck", error=_exit_error)
    except CommError as e:
        if _exit_guard["before_abort"] is not None:
            _exit_guard["before_abort"]()
        print(f"singa_lite: rank {rank}: aborting the MPI job at exit: {e}", file=sys.stderr, flush=True)
        # (mpiexec ends every process at once on an abort and may drop output not yet forwarded: the pause
        # gives it time to pass the line above on; docs/benchmarks/communication.md, "Measurements behind the
        # code's choices")
        time.sleep(ABORT_GRACE_S)
        abort_job(MPI.COMM_WORLD.Abort)
        return
    comm.Free()
    library = _loaded_mpi_library()
    if library is None:  # not one libmpi (or not Linux): mpi4py's own MPI_Finalize, once every rank is here
        return
    result = []
    worker = threading.Thread(target=lambda: result.append(library.MPI_Finalize()), name="singa_lite MPI_Finalize",
                              daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        print(f"singa_lite: rank {rank} of {size}: MPI_Finalize not finished after {timeout:g} s, though every "
              f"rank had reached its end; exiting with status 1 (raise the timeout if it is only slow: "
              f"SINGA_LITE_COMM_TIMEOUT)", file=sys.stderr, flush=True)
        _exit_failed()


atexit.register(_end_mpi)
_install_import_hook()
