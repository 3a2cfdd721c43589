"""The hierarchical all-reduce (singa_lite/comm/hierarchical.py) under ``mpiexec -n 4``. On one host
(tests/multiproc/test_hierarchical.py) ranks 0-1 and 2-3 play two hosts (the shm communicator of each pair;
across the "hosts" ranks 0-2 and 1-3 in the sharded form, the leaders 0 and 2 in the leader form), so the three
steps of both forms run as on two hosts, and create() must leave the job flat. With the argument ``hosts``
(tests/multihost, 2 simulated hosts x 2 ranks) create() makes both forms from the real hosts. Either way
every collective matches what the flat mpi backend gives and DistOpt trains as on one process. With ``uneven``
(3 ranks on the 2 simulated hosts: 2 and 1) create() makes the leader form and refuses the sharded one. A
second argument names the world's backend (default mpi; ``auto`` under singa-run gives tcp). Prints ``OK rank r``."""
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


def two_hosts(world, sharded: bool):
    """world's ranks as hosts of PER_HOST ranks each."""
    host, local = divmod(world.rank, PER_HOST)
    names = world.all_gather_object(new_shm_name() if local == 0 else None)
    intra = ShmCommunicator(names[host * PER_HOST], local, PER_HOST, timeout=world.timeout)
    if sharded:  # the ranks of local rank j on every host
        inter = [world.split(local == j) for j in range(PER_HOST)][local]
    else:  # the leaders
        inter = world.split(local == 0)
    return hierarchical.HierarchicalCommunicator(world, intra, inter, world.world_size // PER_HOST, sharded)


def main(mode: str, backend: str = "mpi"):
    world = dist.init(backend=None if backend == "auto" else backend, timeout=60)
    if mode == "uneven":  # 2 hosts running 2 and 1 ranks: the leader form, and sharded refused by name
        try:
            hierarchical.create(world, "sharded")
        except ValueError as e:
            assert "needs the same number of ranks on every host; these hosts run 2, 1 ranks" in str(e), e
        else:
            raise AssertionError("form 'sharded' accepted hosts with 2 and 1 ranks")
        comm = hierarchical.create(world)
        assert comm.hosts == 2 and not comm.sharded and (comm.inter is not None) == (world.local_rank == 0), comm
        check(world, comm)
        return
    assert world.world_size % PER_HOST == 0, world.world_size
    if mode == "hosts":  # several hosts with as many ranks each: both forms made from their names
        comm = hierarchical.create(world, "sharded")
        assert isinstance(comm, hierarchical.HierarchicalCommunicator) and comm.hosts == 2 and comm.sharded, comm
        assert comm.intra.world_size == world.local_size and comm.inter.world_size == 2, comm
        check(world, comm, last=False)
        comm = hierarchical.create(world)  # the default form
        assert comm.hosts == 2 and not comm.sharded and (comm.inter is not None) == (world.local_rank == 0), comm
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
    check(world, two_hosts(world, sharded=True), last=False)
    check(world, two_hosts(world, sharded=False))


def check(world, comm, last: bool = True) -> list:
    """Every collective and DistOpt over the hierarchical `comm` against the flat `world`; the DistOpt
    scenarios passed. last: close comm and its world after (else only comm's own parts)."""
    assert comm.backend == "hierarchical" and comm.rank == world.rank and comm.world_size == world.world_size
    dist_cases.check_all(comm)  # every collective and dtype, exact where the flat backend is exact
    # floats that do not sum exactly: within rounding of the flat all-reduce, and the same bits on every rank
    rng = np.random.default_rng(world.rank)
    for dt, n in ((np.float32, 100_003), (np.float64, 100_000), (tensor.bfloat16, 7), (np.float32, 1)):
        x = rng.standard_normal(n).astype(np.float32)  # sizes the local ranks do not divide, and one that they do
        a = tensor.from_numpy(x).as_type(dt) if dt is tensor.bfloat16 else tensor.from_numpy(x.astype(dt))
        b = a.clone()
        comm.all_reduce(a, "avg")
        world.all_reduce(b, "avg")
        got, want = (tensor.to_numpy(t.as_type(tensor.float32)) for t in (a, b))
        tol = 2e-2 if dt is tensor.bfloat16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(dt))
        dist_cases.same_on_all_ranks(world, got, f"hierarchical avg {dt}")
    check_pipelined(world, comm)
    work = comm.all_reduce(tensor.from_numpy(np.full(7, world.rank + 1.0, np.float32)), "sum", async_op=True)
    np.testing.assert_array_equal(tensor.to_numpy(work.wait()), np.full(7, sum(range(1, world.world_size + 1))))
    done = distopt_cases.run_all(comm)  # DistOpt over it: k ranks == 1 rank, every mode
    form = "sharded" if comm.sharded else "leader"
    print(f"rank {world.rank} {form} DistOpt scenarios: {', '.join(done)}", flush=True)
    if not last:  # its own parts only: the world goes on to the next form
        comm.intra.close()
        if comm.inter is not None:
            comm.inter.close()
        return done
    comm.close()
    print(f"OK rank {world.rank}", flush=True)
    return done


def check_pipelined(world, comm, piece: int = 64) -> None:
    """The pipelined all_reduce (pieces of comm.chunk_bytes bytes, here `piece`: 16 float32) against numpy's sum
    and, bit for bit, against the same call in one piece (chunk_bytes 0): sizes not a multiple of the piece,
    smaller than one, a single element and none; the same bits on every rank. Then ranks that pass different
    sizes get CollectiveMismatch, all of them, and the communicator goes on."""
    kept = comm.chunk_bytes
    rng = np.random.default_rng(1000 + world.rank)
    try:
        for dt in (np.float32, np.float64, np.float16):
            for n in (0, 1, 5, 16, 17, 33, 1003):
                exact, rough = dist_cases.vals(world.rank, n, dt), rng.standard_normal(n).astype(dt)
                got = {}
                for chunk in (piece, 0):
                    comm.chunk_bytes = chunk
                    a = tensor.from_numpy(exact)
                    comm.all_reduce(a, "sum")
                    np.testing.assert_array_equal(tensor.to_numpy(a), dist_cases.expected(world.world_size, n, dt,
                                                                                          "sum"), f"{dt} {n} {chunk}")
                    for op in ("sum", "avg"):
                        b = tensor.from_numpy(rough)
                        comm.all_reduce(b, op)
                        got[chunk, op] = tensor.to_numpy(b)
                for op in ("sum", "avg"):
                    assert got[piece, op].tobytes() == got[0, op].tobytes(), f"pipelined {op} of {n} {dt} differs"
                    dist_cases.same_on_all_ranks(world, got[piece, op], f"pipelined {op} of {n} {dt}")
        comm.chunk_bytes = piece
        mine = tensor.from_numpy(np.ones(40 if world.rank == 0 else 41, np.float32))
        try:
            comm.all_reduce(mine, "sum")
        except dist.CollectiveMismatch as e:
            assert "the ranks' calls do not match: elements from 40 to 41 across ranks" in str(e), e
        else:
            raise AssertionError("a pipelined all_reduce of 40 and 41 elements passed")
        ones = tensor.from_numpy(np.ones(41, np.float32))
        comm.all_reduce(ones, "sum")
        np.testing.assert_array_equal(tensor.to_numpy(ones), np.full(41, world.world_size, np.float32))
    finally:
        comm.chunk_bytes = kept


if __name__ == "__main__":
    main(*(sys.argv[1:] or ["one host"]))
