"""The hierarchical all-reduce (singa_lite/comm/hierarchical.py) under ``mpiexec -n 4``. On one host
(tests/multiproc/test_hierarchical.py) ranks 0-1 and 2-3 play two hosts (the shm communicator of each pair,
the leaders 0 and 2 over MPI), so the three steps run as on two hosts, and create() must leave the job flat.
With the argument ``hosts`` (tests/multihost, 2 simulated hosts x 2 ranks) create() makes it from the real
hosts. Either way every collective matches what the flat mpi backend gives and DistOpt trains as on one
process. Prints ``OK rank r``."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import numpy as np  # noqa: E402

import dist_cases  # noqa: E402
import distopt_cases  # noqa: E402
from singa_lite import dist, opt, tensor  # noqa: E402
from singa_lite.comm import hierarchical  # noqa: E402
from singa_lite.comm.holder import new_shm_name  # noqa: E402
from singa_lite.comm.shm import ShmCommunicator  # noqa: E402

PER_HOST = 2


def two_hosts(world):
    """world's ranks as hosts of PER_HOST ranks each."""
    host, local = divmod(world.rank, PER_HOST)
    names = world.all_gather_object(new_shm_name() if local == 0 else None)
    intra = ShmCommunicator(names[host * PER_HOST], local, PER_HOST, timeout=world.timeout)
    inter = world.split(local == 0)
    return hierarchical.HierarchicalCommunicator(world, intra, inter, world.world_size // PER_HOST)


def main(mode: str):
    world = dist.init(backend="mpi", timeout=60)
    assert world.world_size % PER_HOST == 0, world.world_size
    if mode == "hosts":  # several hosts: made from their names, one leader per host
        comm = hierarchical.create(world)
        assert isinstance(comm, hierarchical.HierarchicalCommunicator) and comm.hosts == 2, comm
        assert comm.intra.world_size == world.local_size and (comm.inter is not None) == (world.local_rank == 0)
        check(world, comm)
        return
    # one host: nothing to gain, the world comes back as it is
    assert hierarchical.create(world) is world
    assert opt.DistOpt(opt.SGD(lr=0.1), communicator=world, hierarchical=True).communicator is world
    try:
        hierarchical.create("not a communicator")
    except TypeError as e:
        assert "expected a Communicator" in str(e), e
    else:
        raise AssertionError("create() accepted a string")
    check(world, two_hosts(world))


def check(world, comm):
    assert comm.backend == "hierarchical" and comm.rank == world.rank and comm.world_size == world.world_size
    dist_cases.check_all(comm)  # every collective and dtype, exact where the flat backend is exact
    # floats that do not sum exactly: within rounding of the flat all-reduce, and the same bits on every rank
    rng = np.random.default_rng(world.rank)
    for dt in (np.float32, np.float64, tensor.bfloat16):
        x = rng.standard_normal(100_003).astype(np.float32)
        a = tensor.from_numpy(x).as_type(dt) if dt is tensor.bfloat16 else tensor.from_numpy(x.astype(dt))
        b = a.clone()
        comm.all_reduce(a, "avg")
        world.all_reduce(b, "avg")
        got, want = (tensor.to_numpy(t.as_type(tensor.float32)) for t in (a, b))
        tol = 2e-2 if dt is tensor.bfloat16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(dt))
        dist_cases.same_on_all_ranks(world, got, f"hierarchical avg {dt}")
    work = comm.all_reduce(tensor.from_numpy(np.full(7, world.rank + 1.0, np.float32)), "sum", async_op=True)
    np.testing.assert_array_equal(tensor.to_numpy(work.wait()), np.full(7, sum(range(1, world.world_size + 1))))
    done = distopt_cases.run_all(comm)  # DistOpt over it: k ranks == 1 rank, every mode
    comm.close()
    print(f"rank {world.rank} DistOpt scenarios: {', '.join(done)}", flush=True)
    print(f"OK rank {world.rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "one host")
