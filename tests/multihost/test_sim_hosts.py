"""Jobs across two simulated hosts (helpers/sim_hosts.py): h0 and h1, 2 ranks each from an MPICH hostfile
(``h0:2``, ``h1:2``), mpiexec driven with ``-launcher rsh -launcher-exec netns_rsh -iface eth0`` from a third
namespace. Ranks, local ranks, node count and hostnames; the backend; traffic between hosts on the links."""
import os
import subprocess
import sys

import pytest

import sim_hosts

HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGY = os.path.join(HERE, "jobs", "topology_job.py")
LIMIT_S = 60.0


def topology(cluster, tmp_path, *args, env=None):
    hostfile = cluster.hostfile(tmp_path / "hosts")
    code, out, _ = cluster.run(cluster.mpiexec_command(hostfile, 4, [sys.executable, TOPOLOGY, *args]), LIMIT_S,
                               env=env)
    assert code == 0, out
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    return lines, out


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mpi", "auto"])  # auto: init() picks it (mpiexec -> mpi, never shm)
def test_ranks_local_ranks_and_hostnames_across_two_hosts(cluster, tmp_path, backend):
    lines, out = topology(cluster, tmp_path, backend)
    assert len(lines) == 4, out
    # MPICH fills the hostfile's hosts in order: ranks 0, 1 on h0, ranks 2, 3 on h1; local ranks restart per host.
    assert lines == [f"rank {r} local {r % 2}/2 host h{r // 2} hosts 2 backend mpi" for r in range(4)], out


@pytest.mark.slow
def test_each_host_watches_its_own_ranks(cluster, tmp_path):
    # The mpiexec watcher (singa_lite/comm/watch.py) runs once per host, started by the host's local rank 0
    # (grouped by MPI's shared-memory split), for that host's ranks only, under that host's name: the hosts
    # share /dev/shm and the pid space here, so a grouping by anything machine-wide would show up as one
    # watcher for all four ranks, or as watchers seen from the wrong host.
    lines, out = topology(cluster, tmp_path, "auto", "watchers")
    for r in range(4):
        assert f"rank {r} sees watcher for h{r // 2} of ranks {'0,1' if r < 2 else '2,3'}" in lines, out
    assert len(lines) == 8, out  # each rank sees exactly one watcher: its host's


@pytest.mark.slow
def test_each_hosts_ranks_map_to_its_own_gpus(cluster, tmp_path):
    # The nccl backend's device choice (SINGA's create_cuda_gpu_on(local_rank)): local ranks restart per host, so
    # ranks 2 and 3 on h1 take h1's GPUs 0 and 1, not 2 and 3; a host with fewer GPUs than ranks is named.
    lines, out = topology(cluster, tmp_path, "mpi", "gpus")
    gpus = [line for line in lines if " gpu " in line]
    assert len(gpus) == 4, out
    for r in range(4):
        local = r % 2
        one = ("fits" if local == 0 else
               "nccl: local rank 1 of 2 on this host, but the host has 1 GPU(s): NCCL needs one GPU per rank; "
               "start at most 1 ranks per host, or pass device=")
        assert f"rank {r} gpu cuda:{local}; on 1 GPU: {one}" in gpus, out


@pytest.mark.slow
def test_forcing_shm_under_mpiexec_is_refused(cluster, tmp_path):
    # The shm backend takes its ranks from a holder (one host). Forced under mpiexec it must not silently give
    # 4 one-rank jobs (each rank training alone): an error naming the mpi backend is expected.
    hostfile = cluster.hostfile(tmp_path / "hosts")
    code, out, _ = cluster.run(cluster.mpiexec_command(hostfile, 4, [sys.executable, TOPOLOGY, "shm"]), LIMIT_S)
    assert code != 0 and "this process is one of 4 ranks started by mpiexec: use backend 'mpi'" in out, out


@pytest.mark.slow
def test_traffic_between_hosts_crosses_their_links(cluster, tmp_path):
    # A 4 MB all-reduce: what h1's ranks receive from h0's must come over h1's link (UCX told to use tcp,
    # see sim_hosts), not through the shared memory the simulated hosts happen to share.
    before = cluster.rx_bytes("h1")
    code, out, _ = cluster.run(cluster.mpiexec_command(cluster.hostfile(tmp_path / "hosts"), 4, [
        sys.executable, "-c", "from singa_lite import dist, tensor; import numpy as np; c = dist.init(); "
        "t = tensor.from_numpy(np.ones(1 << 20, np.float32)); c.all_reduce(t); "
        "assert (tensor.to_numpy(t) == 4).all(); import os; os.write(1, b'OK\\n')"]), LIMIT_S)
    assert code == 0 and out.count("OK") == 4, out
    assert cluster.rx_bytes("h1") - before > 4 << 20, out


def test_the_cluster_is_made_and_removed(cluster):
    # Every namespace exists with its hostname-to-be, address and link, and nothing is added to the root
    # namespace; close() removes them all, with their processes.
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in cluster.namespaces:
        assert ns in names
    addr = sim_hosts.ip("-o", "-4", "addr", "show", "dev", "eth0", ns=cluster.ns("h1")).stdout
    assert "10.231.0.2/24" in addr
    assert "10.231.0." not in sim_hosts.ip("-o", "-4", "addr").stdout  # the root namespace has none of it
    sleeper = subprocess.Popen(["ip", "netns", "exec", cluster.ns("h0"), "sleep", "60"], start_new_session=True)
    try:
        cluster.close()
        assert sleeper.wait(timeout=10) != 0  # killed by the teardown
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in (cluster.switch, cluster.ns("h0")) if ns in names], names


def test_stale_namespaces_of_dead_runs_are_removed(cluster):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs: its run was aborted
    stale = f"{sim_hosts.PREFIX}{dead.pid}x0-h0"
    sim_hosts.ip("netns", "add", stale)
    try:
        assert stale in sim_hosts.remove_stale()
        assert stale not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert cluster.switch in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        sim_hosts.ip("netns", "delete", stale, check=False)


def test_wrapper_refuses_an_unknown_host(cluster):
    proc = subprocess.run([sim_hosts.WRAPPER, "h7", "hostname"], capture_output=True, text=True, timeout=30,
                          env=cluster.env())
    assert proc.returncode == 255 and "no simulated host 'h7'" in proc.stderr, proc.stderr
    proc = subprocess.run([sim_hosts.WRAPPER, "h1", "hostname; cat /sys/class/net/eth0/address >/dev/null"],
                          capture_output=True, text=True, timeout=30, env=cluster.env())
    assert proc.returncode == 0 and proc.stdout.strip() == "h1", proc.stderr


SERVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 5000))
s.listen()
print("listening", flush=True)
c, _ = s.accept()
n = 0
while True:
    data = c.recv(1 << 16)
    if not data:
        break
    n += len(data)
c.sendall(str(n).encode())
c.close()
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5000), timeout=30)
start = time.monotonic()
c.sendall(bytes(int(sys.argv[2])))
c.shutdown(socket.SHUT_WR)
got = c.recv(64)
print(got.decode(), time.monotonic() - start)
"""


def transfer_seconds(cluster, src, dst, nbytes) -> float:
    """Seconds to send `nbytes` over TCP from host `src` to host `dst` (until `dst` has them all)."""
    server = subprocess.Popen(["ip", "netns", "exec", cluster.ns(dst), sys.executable, "-c", SERVER,
                               cluster.address[dst]], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "listening\n"
        client = subprocess.run(["ip", "netns", "exec", cluster.ns(src), sys.executable, "-c", CLIENT,
                                 cluster.address[dst], str(nbytes)], capture_output=True, text=True, timeout=60)
        got, seconds = client.stdout.split()
        assert int(got) == nbytes, client.stdout + client.stderr
        return float(seconds)
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
def test_slow_links_limits_a_hosts_rate(cluster):
    nbytes = 2 << 20  # 16.8 Mbit: about 4 ms on a plain veth, 0.4 s at 40 Mbit/s
    assert transfer_seconds(cluster, "h0", "h1", nbytes) < 0.2
    applied = sim_hosts.slow_links(cluster, ["h1"], rate="40mbit", delay="100us")
    assert applied.split()[0] in ("netem", "tbf") and "40mbit" in applied
    for ns, dev in ((cluster.ns("h1"), "eth0"), (cluster.switch, cluster.port("h1"))):  # both directions
        shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
        assert applied.split()[0] in shown, shown
    assert transfer_seconds(cluster, "h0", "h1", nbytes) > 0.3  # into h1: the bridge's side of its link
    assert transfer_seconds(cluster, "h1", "h0", nbytes) > 0.3  # out of h1: its own side
    assert transfer_seconds(cluster, "h0", "launcher", nbytes) < 0.2  # the others' links are left alone


def test_the_skip_reason_names_what_is_missing(monkeypatch):
    # Where simulated hosts cannot be made, every test of this folder is skipped with why_not()'s reason.
    monkeypatch.setattr(sim_hosts.os, "geteuid", lambda: 1000)
    assert sim_hosts.why_not().startswith("simulated hosts need root (ip netns, veth, bridge, unshare --uts); "
                                          "running as uid 1000")
    monkeypatch.setattr(sim_hosts.os, "geteuid", lambda: 0)
    real_which = sim_hosts.shutil.which
    monkeypatch.setattr(sim_hosts.shutil, "which", lambda tool: None if tool == "ip" else real_which(tool))
    assert sim_hosts.why_not() == "simulated hosts need `ip` on PATH (iproute2 / util-linux)"
