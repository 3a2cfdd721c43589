"""A start-up that can be killed at any point, for tests/multiproc/test_hardening_shm.py.

    singa-run -np N hardening_job.py DELAY          (ranks from the launcher's environment)
    python hardening_job.py --mp DELAY              (a multiprocessing parent with an NcclIdHolder, 2 ranks)

The last rank sleeps DELAY seconds before dist.init(): until then the others wait in the rendezvous, having
created or mapped the segment. Each rank prints 'joined <rank>' once its communicator exists, then sleeps."""
import multiprocessing as mp
import os
import sys
import time


def rank_main(delay, holder=None, rank=None):
    from singa_lite import dist

    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"]) if holder is None else 2
    if rank == world - 1:
        time.sleep(delay)
    kwargs = {} if holder is None else {"holder": holder, "rank": rank, "world_size": world}
    comm = dist.init(backend="shm", timeout=60, **kwargs)
    print(f"joined {rank}", flush=True)
    time.sleep(60)
    comm.close()


if __name__ == "__main__":
    if sys.argv[1] == "--mp":
        from singa_lite import dist

        holder = dist.NcclIdHolder()
        print(f"holder {holder.shm_name}", flush=True)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=rank_main, args=(float(sys.argv[2]), holder, r)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    else:
        rank_main(float(sys.argv[1]))
