"""A rank that never comes to the mpi backend's setup or teardown, run by tests/multiproc/test_mpi_startup_timeouts.py
under ``mpiexec -n N``: ``python mpi_startup_job.py <scenario>`` with SINGA_LITE_COMM_TIMEOUT set. Every rank prints
``PID r pid`` first (rank from mpiexec's environment: MPI may never start); a rank that catches the CommError it
expects prints ``RAISED r <message>`` and raises it again (uncaught: the job must end by itself), or, in the
scenarios named ``..._caught``, carries on as if all were well (the job must still end, and non-zero)."""
import os
import sys
import time

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
LATE = 1  # the rank that never comes
print(f"PID {RANK} {os.getpid()}", flush=True)


def raised(e: BaseException) -> None:
    print(f"RAISED {RANK} {' '.join(str(e).split())}", flush=True)


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
