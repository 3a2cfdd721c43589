"""singa-run --hostfile across two simulated hosts (2 ranks each), in both hostfile forms: singa-run starts each
rank through netns_rsh (``--launcher-exec``, called like ssh) on its host, the ranks meet through dist.init's
TCP rendezvous at h0's address, find their local ranks from the hosts they report, and the automatic backend
is tcp (never shm across hosts); DistOpt's every-mode equivalence holds over it."""
import os
import sys

import pytest

import distopt_cases
import sim_hosts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOPOLOGY = os.path.join(HERE, "jobs", "topology_job.py")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["host:N", "host slots=N"])
def test_singa_run_hostfile_across_two_hosts(cluster, tmp_path, form):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two simulated hosts\n" + "".join(
        f"{h}:2\n" if form == "host:N" else f"{h} slots=2\n" for h in cluster.hosts))
    what = ["distopt"] if form == "host:N" else []  # the equivalence once: it takes a few seconds
    command = ["ip", "netns", "exec", cluster.ns("launcher"), sim_hosts.WRAPPER, "--here", "launcher",
               sys.executable, "-m", "singa_lite.run", "--hostfile", str(hostfile), "--launcher-exec",
               sim_hosts.WRAPPER, "--master-addr", cluster.address["h0"], "--no-prefix", TOPOLOGY, "auto", *what]
    code, out, _ = cluster.run(command, timeout=120, cwd=ROOT)
    assert code == 0, out
    lines = sorted(line for line in out.splitlines() if line.startswith("rank ") and " local " in line)
    assert lines == [f"rank {r} local {r % 2}/2 host h{r // 2} hosts 2 backend tcp" for r in range(4)], out
    for r in range(4 if what else 0):
        assert f"rank {r} DistOpt scenarios: {', '.join(distopt_cases.SCENARIOS)}" in out, out
