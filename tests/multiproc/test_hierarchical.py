"""The hierarchical all-reduce (singa_lite/comm/hierarchical.py). Across real (simulated) hosts it runs in
tests/multihost; here 4 mpiexec ranks on one host play 2 hosts of 2 (jobs/hierarchical_job.py)."""
import pytest

from singa_lite import dist, opt
from singa_lite.comm import hierarchical

from test_dist_mpi import run_job_under_mpiexec


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
        with pytest.raises(ValueError, match="form must be one of auto, sharded, leader, got 'ring'"):
            hierarchical.create(comm, form="ring")
    finally:
        comm.close()
