"""The hierarchical all-reduce across two simulated hosts (2 ranks each): create() finds the hosts by name,
every collective matches the flat mpi backend and DistOpt trains as one process (the job of
tests/multiproc/jobs/hierarchical_job.py, in its ``hosts`` mode: both forms); hosts with different numbers
of ranks refuse the sharded form (``uneven`` mode). Its speed: bench/bench_hierarchical.py."""
import os
import sys

import pytest

import sim_hosts

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(os.path.dirname(HERE), "multiproc", "jobs", "hierarchical_job.py")


def passed(code, out, ranks: int, *forms: str) -> None:
    """The job ended well on every rank, and DistOpt trained over each hierarchical form of `forms` on each."""
    assert code == 0, out
    assert all(f"OK rank {r}" in out for r in range(ranks)), out
    for form in forms:
        assert out.count(f"{form} DistOpt scenarios: singa_low_level, equivalence_sgd") == ranks, out


@pytest.mark.slow
def test_hierarchical_all_reduce_across_two_hosts(cluster, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hosts")
    code, out, _ = cluster.run(cluster.mpiexec_command(hostfile, 4, [sys.executable, JOB, "hosts"]), 240)
    passed(code, out, 4, "sharded", "leader")


@pytest.mark.slow
def test_hosts_with_different_rank_counts_get_the_leader_form(cluster, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hosts")  # h0:2, h1:2 with 3 ranks: 2 on h0, 1 on h1
    code, out, _ = cluster.run(cluster.mpiexec_command(hostfile, 3, [sys.executable, JOB, "uneven"]), 240)
    passed(code, out, 3, "leader")


@pytest.mark.slow
def test_hierarchical_over_tcp_across_two_hosts_launched_by_singa_run(cluster, tmp_path):
    # No MPI: singa-run --hostfile starts the ranks, the world is the tcp backend, and its split() makes the
    # cross-host meshes on the same rendezvous store.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h}:2\n" for h in cluster.hosts))
    command = ["ip", "netns", "exec", cluster.ns("launcher"), sim_hosts.WRAPPER, "--here", "launcher",
               sys.executable, "-m", "singa_lite.run", "--hostfile", str(hostfile), "--launcher-exec",
               sim_hosts.WRAPPER, "--master-addr", cluster.address["h0"], "--no-prefix", JOB, "hosts", "auto"]
    code, out, _ = cluster.run(command, timeout=240, cwd=os.path.dirname(os.path.dirname(HERE)))
    passed(code, out, 4, "sharded", "leader")
