"""The hierarchical all-reduce across two simulated hosts (2 ranks each): create() finds the hosts by name,
every collective matches the flat mpi backend and DistOpt trains as one process (the job of
tests/multiproc/jobs/hierarchical_job.py, in its ``hosts`` mode). Its speed: bench/bench_hierarchical.py."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(os.path.dirname(HERE), "multiproc", "jobs", "hierarchical_job.py")


@pytest.mark.slow
def test_hierarchical_all_reduce_across_two_hosts(cluster, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hosts")
    code, out, _ = cluster.run(cluster.mpiexec_command(hostfile, 4, [sys.executable, JOB, "hosts"]), 240)
    assert code == 0, out
    assert all(f"OK rank {r}" in out for r in range(4)), out
    assert out.count("DistOpt scenarios: singa_low_level, equivalence_sgd") == 4, out
