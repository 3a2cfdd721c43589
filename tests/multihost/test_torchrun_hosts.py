"""PyTorch's own launcher, torchrun, across two simulated hosts: one `torchrun --nnodes 2 --node-rank k` per
host (as a Kubernetes PyTorchJob or a hand-made two-node run starts it), 2 ranks each, meeting at h0's address.
dist.init() reads torchrun's variables, steps aside from torchrun's own store (TORCHELASTIC_USE_AGENT_STORE: ours
takes MASTER_PORT + 1), and the ranks get their global and local ranks, the node count and the tcp backend
(never shm across hosts); DistOpt's every-mode equivalence holds over it. Skipped without torch (the parity
extra installs it)."""
import os
import subprocess
import sys

import pytest

import distopt_cases
import sim_hosts

HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGY = os.path.join(HERE, "jobs", "topology_job.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
LIMIT_S = 120.0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed (pip install 'singa_lite[parity]')")
def test_torchrun_on_two_hosts(cluster):
    port = "29531"  # inside the namespaces the test made: no other service listens there
    env = {**cluster.env(), "SINGA_LITE_COMM_TIMEOUT": "60"}
    procs = [cluster.popen(["ip", "netns", "exec", cluster.ns(host), sim_hosts.WRAPPER, "--here", host, TORCHRUN,
                            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                            "--master-addr", cluster.address["h0"], "--master-port", port,
                            TOPOLOGY, "auto", "distopt"], env=env)
             for node, host in enumerate(cluster.hosts)]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=LIMIT_S)
            outs.append((proc.returncode, out + err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            cluster.kill_group(proc)
        cluster.kill_all()
        raise
    text = "\n".join(out for _, out in outs)
    assert [code for code, _ in outs] == [0, 0], text
    lines = sorted(line for line in text.splitlines() if line.startswith("rank ") and " local " in line)
    assert lines == [f"rank {r} local {r % 2}/2 host h{r // 2} hosts 2 backend tcp" for r in range(4)], text
    for r in range(4):
        assert f"rank {r} DistOpt scenarios: {', '.join(distopt_cases.SCENARIOS)}" in text, text
