"""A rank that never comes to the mpi backend's setup or teardown, run by tests/multiproc/test_mpi_startup_timeouts.py
under ``mpiexec -n N``: ``python mpi_startup_job.py <scenario>`` with SINGA_LITE_COMM_TIMEOUT set. Every rank prints
``PID r pid`` first (rank from mpiexec's environment: MPI may never start); a rank that catches the CommError it
expects prints ``RAISED r <message>`` and raises it again (uncaught: the job must end by itself), or, in the
scenarios named ``..._caught``, carries on as if all were well (the job must still end, and non-zero).

Scenarios ``stall_<step>`` (``_inside``): rank 1 stalls at one step of the setup or teardown that has no
nonblocking form in MPI, before it (it never arrives there) or, with ``_inside``, in the MPI call itself after
arriving: it wraps singa_lite's step runner (mpi_setup.bounded) on that rank only; the other ranks run the real
code. Scenarios ``nccl_...``: the nccl backend's MPI bootstrap (CPU only: its readiness check and id source are the
job's, see nccl_bootstrap)."""
import os
import sys
import time

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
LATE = 1  # the rank that never comes
print(f"PID {RANK} {os.getpid()}", flush=True)
STEPS = {"split_type": "the split into hosts", "window": "the arrival board's creation", "win_free": "close"}


def raised(e: BaseException) -> None:
    print(f"RAISED {RANK} {' '.join(str(e).split())}", flush=True)


def stall_at(prefix: str, inside: bool) -> None:
    """On this rank, the setup step whose name starts with `prefix` never begins (or, inside, never ends)."""
    from singa_lite.comm import mpi_setup

    real = mpi_setup.bounded

    def bounded(comm, step, timeout, call, *args, **kwargs):
        if step.startswith(prefix):
            if not inside:
                time.sleep(3600)

            def stalled():
                time.sleep(3600)
                return call()
            return real(comm, step, timeout, stalled, *args, **kwargs)
        return real(comm, step, timeout, call, *args, **kwargs)
    mpi_setup.bounded = bounded


def nccl_bootstrap(scenario: str) -> None:
    """The nccl backend's MPI bootstrap (nccl.mpi_bootstrap) with every rank ready and a stand-in id (128 random
    bytes of rank 0: NCCL cannot run here); its broadcast, local ranks and bounds are the real ones."""
    from mpi4py import MPI
    from singa_lite.comm import CommError, nccl

    if scenario == "nccl_late" and RANK == LATE:  # MPI started, but the bootstrap never called
        time.sleep(3600)

    def make_id():
        if scenario == "nccl_id_never_made":  # rank 0 never produces the id (stuck creating it)
            time.sleep(3600)
        return os.urandom(128)
    timeout = float(os.environ["SINGA_LITE_COMM_TIMEOUT"])
    try:
        nccl_id, local_rank, local_size = nccl.mpi_bootstrap(MPI.COMM_WORLD, timeout, lambda lr, ls: "", make_id)
    except CommError as e:
        raised(e)
        raise
    print(f"ID {RANK} {nccl_id.hex()} LOCAL {local_rank} {local_size}", flush=True)
    print(f"END {RANK}", flush=True)


def main(scenario: str) -> None:
    if scenario.startswith("never_starts_mpi") and RANK == LATE:  # stuck in its own code before anything of MPI
        time.sleep(3600)
    if scenario.startswith("never_inits") and RANK == LATE:  # MPI started (mpi4py imported), but no dist.init()
        from mpi4py import MPI  # noqa: F401
        time.sleep(3600)
    if scenario == "in_other_collective" and RANK == LATE:  # a barrier on COMM_WORLD that no other rank calls
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()

    from singa_lite import dist
    from singa_lite.comm import CommError

    if scenario == "imports_mpi_itself":  # MPI started by the script's own import (after singa_lite's), not init
        if RANK == LATE:
            time.sleep(3600)
        try:
            from mpi4py import MPI  # noqa: F401
        except CommError as e:
            raised(e)
            raise
        print(f"IMPORTED {RANK}", flush=True)
    if scenario.startswith("stall_") and RANK == LATE:
        stall_at(STEPS[scenario[len("stall_"):].removesuffix("_inside")], scenario.endswith("_inside"))
    if scenario.startswith("nccl_"):
        nccl_bootstrap(scenario)
        return

    try:
        comm = dist.init(backend="mpi")
    except CommError as e:
        raised(e)
        if scenario.endswith("_caught"):  # the script goes on, and ends as if all were well
            print(f"END {RANK}", flush=True)
            return
        raise
    print(f"INIT {RANK}", flush=True)
    if scenario == "normal":  # init, one call, close on every rank; then a clean exit
        import numpy as np
        from singa_lite import tensor
        t = tensor.from_numpy(np.ones(3, np.float32))
        comm.all_reduce(t)
        assert tensor.to_numpy(t).tolist() == [comm.world_size] * 3
        comm.close()
        print(f"CLOSED {RANK}", flush=True)
    elif scenario == "never_closes":  # rank 1 never closes, nor exits: the others' exit must not hang
        if RANK == LATE:
            time.sleep(3600)
    elif scenario == "close_raises":  # the same, seen from an explicit close()
        if RANK == LATE:
            time.sleep(3600)
        try:
            comm.close()
        except CommError as e:
            raised(e)
        else:
            raise AssertionError("close() returned while rank 1 never closed")
    elif scenario == "closes_then_stalls":  # closes; rank 1 then stays in its own code for ever: no MPI_Finalize
        comm.close()
        print(f"CLOSED {RANK}", flush=True)
        if RANK == LATE:
            time.sleep(3600)
    elif scenario.startswith("stall_win_free"):  # close() frees the window: rank 1 stalls there
        try:
            comm.close()
        except CommError as e:
            raised(e)
            raise
    elif scenario == "split_never_comes":  # rank 1 never calls split(): the others' split raises
        if RANK == LATE:
            time.sleep(3600)
        try:
            comm.split(True)
        except CommError as e:
            raised(e)
            raise
    print(f"END {RANK}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
