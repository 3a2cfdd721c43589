"""How many CPU threads a rank's kernels get once it joined a job, run by tests/multiproc/test_rank_threads.py:

    mpiexec -n 2 python threads_job.py mpi [set N]    # ranks of mpiexec (mpi backend)
    python threads_job.py shm [set N]                 # 2 ranks started by multiprocessing (shm backend)

``set N``: the rank calls device.set_num_threads(N) before joining. Each rank prints ``threads rank R: N``."""
import multiprocessing as mp
import sys

from singa_lite import device, dist


def rank_main(argv, holder=None, rank=None):
    if argv[1:2] == ["set"]:
        device.set_num_threads(int(argv[2]))
    if holder is None:
        comm = dist.init(backend="mpi", timeout=60)
    else:
        comm = dist.init(backend="shm", holder=holder, rank=rank, world_size=2, timeout=60)
    print(f"threads rank {comm.rank}: {device.get_num_threads()}", flush=True)
    comm.barrier()
    comm.close()


def main(argv):
    if argv[0] == "mpi":
        rank_main(argv)
        return
    ctx = mp.get_context("spawn")  # fresh processes, as a script's own multiprocessing ranks
    holder = dist.NcclIdHolder()
    procs = [ctx.Process(target=rank_main, args=(argv, holder, r)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    codes = [p.exitcode for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"ranks ended with {codes}")


if __name__ == "__main__":
    main(sys.argv[1:])
