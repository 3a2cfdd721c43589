"""The hierarchical all-reduce (singa_lite/comm/hierarchical.py). Across real (simulated) hosts it runs in
tests/multihost; here 4 mpiexec ranks on one host play 2 hosts of 2 (jobs/hierarchical_job.py)."""
import distopt_cases
import paths
import pytest

from singa_lite import dist, opt
from singa_lite.comm import hierarchical

from test_dist_mpi import run_job_under_mpiexec
from test_tcp_backend import run_tcp


@pytest.mark.slow
def test_both_forms_match_the_flat_all_reduce_and_distopt_trains_as_one_process():
    out = run_job_under_mpiexec("hierarchical_job.py", 4, timeout=240)
    for form in ("sharded", "leader"):
        assert out.count(f"{form} DistOpt scenarios: singa_low_level, equivalence_sgd") == 4, out


def test_one_host_and_nccl_are_left_flat_and_bad_input_is_named():
    comm = dist.init(backend="shm")
    try:
        assert hierarchical.create(comm) is comm
        assert opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, hierarchical=True).communicator is comm
        with pytest.raises(TypeError, match="hierarchical must be True or False"):
            opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, hierarchical="yes")
        with pytest.raises(TypeError, match="expected a Communicator"):
            hierarchical.create(object())
        with pytest.raises(ValueError, match="form must be one of leader, sharded, got 'ring'"):
            hierarchical.create(comm, form="ring")
    finally:
        comm.close()


def _job():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hierarchical_job", paths.job("hierarchical_job.py"))
    hierarchical_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hierarchical_job)
    return hierarchical_job


def _both_forms_over(world):
    hierarchical_job = _job()
    return [hierarchical_job.check(world, hierarchical_job.two_hosts(world, sharded), last=False)
            for sharded in (True, False)]


def _a_leader_aborts_in_the_pipeline(world, sharded):
    import time

    import numpy as np

    from singa_lite import tensor

    comm = _job().two_hosts(world, sharded)
    comm.chunk_bytes = 64  # 16 float32 a piece: thousands of pieces, each with its cross-host exchange
    work = comm.all_reduce(tensor.from_numpy(np.ones(200_003, np.float32)), "sum", async_op=True)
    if world.rank == 2:  # the other host's leader, while the pieces run
        time.sleep(0.3)
        comm.abort("boom from rank 2")
    try:
        work.wait()
    except dist.CommError as e:
        return str(e)
    return "finished"


@pytest.mark.parametrize("sharded", [False, True])
def test_a_rank_that_aborts_while_the_pieces_run_ends_the_call_everywhere_with_its_cause(sharded):
    out, _ = run_tcp(_a_leader_aborts_in_the_pipeline, 4, timeout=240, comm_timeout=60, args=(sharded,))
    for r in range(4):
        assert out[r][0] == "ok" and "boom from rank 2" in out[r][1], out


def test_both_forms_over_the_tcp_backend():
    # ranks 0-1 and 2-3 play two hosts as under mpiexec, with the tcp world's split() making the cross-host meshes
    out, _ = run_tcp(_both_forms_over, 4, timeout=240, comm_timeout=60)
    for r in range(4):
        assert out[r] == ("ok", [list(distopt_cases.SCENARIOS)] * 2), out
