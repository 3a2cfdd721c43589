"""Launch without MPI on loopback: plain processes started with torchrun-style (or Slurm) variables find each
other through dist.init() (the TCP rendezvous of singa_lite/comm/env.py), get their rank, local rank and backend
right, all-reduce, and train with DistOpt exactly as one process does; a missing rank and a wrong MASTER_PORT
give clear errors within the timeout. Every process runs under a deadline and is killed at the end."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from singa_lite import _core

from paths import HELPERS, job
from procs import processes_running, survivors

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

HOST = "127.0.0.1"
# Variables of an enclosing launcher must not leak into the ranks.
LAUNCH_VARS = ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "SINGA_LITE_COMM_TIMEOUT", "RANK", "WORLD_SIZE",
               "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK",
               "TORCHELASTIC_USE_AGENT_STORE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
               "MPI_LOCALRANKID")
CLEAN = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}



@pytest.fixture
def script(tmp_path):
    path = tmp_path / "rank.py"
    shutil.copy(job("env_rank_job.py"), path)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_ranks(script, envs, mode="full", timeout=60):
    """Starts one process per environment in `envs`; returns [(exit code, report dict)], rank order kept, and
    the seconds until the last one ended. Nothing outlives the call."""
    begin = time.monotonic()
    procs = [subprocess.Popen([sys.executable, script, HELPERS, mode], env={**CLEAN, **e}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in envs]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - begin)))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert lines, f"exit code {p.returncode}, no report\n{out}\n{err}"
            results.append((p.returncode, json.loads(lines[-1]), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not survivors([p.pid for p in procs])
    return results, time.monotonic() - begin


def torchrun_env(rank, world, port, **extra):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
            **{k: str(v) for k, v in extra.items()}}


def test_torchrun_variables_find_each_other_and_train_like_one_process(script):
    port = free_port()
    results, _ = start_ranks(script, [torchrun_env(r, 3, port) for r in range(3)])
    for rank, (code, report, err) in enumerate(results):
        assert code == 0, err
        assert report == {"rank": rank, "world": 3, "local": [rank, 3], "backend": "shm",
                          "distopt": "same as one process"}, err


TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed (pip install 'singa_lite[parity]')")
def test_real_torchrun_standalone(script):
    # PyTorch's launcher itself: its agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE), so
    # ours must take another port; the ranks then meet and train as with the variables set by hand.
    proc = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", script, HELPERS, "full"], env=CLEAN,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:  # torchrun and its workers: one process group
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out + err
    # The two workers share torchrun's stdout: their one-line reports (one write each) may end up on one line.
    reports = sorted((json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", out)), key=lambda r: r["rank"])
    assert reports == [{"rank": r, "world": 2, "local": [r, 2], "backend": "shm", "distopt": "same as one process"}
                       for r in range(2)], out + err


def test_explicit_env_init_and_the_exchange_decides_local_ranks(script):
    # The launcher claims two hosts (LOCAL_WORLD_SIZE 1): the ranks share this one, so the exchange says so.
    port = free_port()
    envs = [torchrun_env(r, 2, port, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, GROUP_RANK=r) for r in range(2)]
    results, _ = start_ranks(script, envs, mode="explicit")
    assert [(code, report["local"], report["backend"]) for code, report, _ in results] == [
        (0, [0, 2], "shm"), (0, [1, 2], "shm")], results


def test_slurm_variables_find_each_other(script):
    port = free_port()
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": str(r),
             "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "localhost",
             "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "MASTER_PORT": str(port)} for r in range(2)]
    results, _ = start_ranks(script, envs, mode="quick")
    assert [(code, report) for code, report, _ in results] == [
        (0, {"rank": r, "world": 2, "local": [r, 2], "backend": "shm"}) for r in range(2)], results


def test_a_missing_rank_is_named_within_the_timeout(script):
    port = free_port()
    envs = [torchrun_env(r, 3, port, SINGA_LITE_COMM_TIMEOUT=2) for r in (0, 1)]  # rank 2 never starts
    results, seconds = start_ranks(script, envs, mode="quick")
    for code, report, err in results:
        assert code == 3, err
        assert "rank 2 never arrived within 2 s: check that they started" in report["error"], report
        assert report["error"].startswith("CommError: dist.init, torchrun environment (rank ")
    assert seconds < 20


def test_a_wrong_master_port_is_a_clear_error(script):
    port, wrong = free_port(), free_port()
    envs = [torchrun_env(0, 2, port, SINGA_LITE_COMM_TIMEOUT=2), torchrun_env(1, 2, wrong, SINGA_LITE_COMM_TIMEOUT=2)]
    (code0, report0, _), (code1, report1, _) = start_ranks(script, envs, mode="quick")[0]
    assert code1 == 3 and f"could not connect to the rendezvous store at {HOST}:{wrong}" in report1["error"]
    assert "MASTER_ADDR and MASTER_PORT are the same on every rank" in report1["error"]
    assert report1["seconds"] < 10
    assert code0 == 3 and "rank 1 never arrived" in report0["error"], report0
    # a port where another service listens: refused at once, whatever the timeout
    with socket.socket() as other:
        other.bind((HOST, 0))
        other.listen()
        envs = [torchrun_env(1, 2, other.getsockname()[1], SINGA_LITE_COMM_TIMEOUT=60)]
        procs = subprocess.Popen([sys.executable, script, HELPERS, "quick"], env={**CLEAN, **envs[0]},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        conn, _ = other.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()
        out, err = procs.communicate(timeout=30)
    report = json.loads(out.splitlines()[-1])
    assert procs.returncode == 3 and "is not a singa_lite rendezvous store" in report["error"], report
    assert report["seconds"] < 10



def test_nccl_where_a_rank_cannot_run_it_fails_every_rank_at_once(script):
    from singa_lite.comm import nccl

    problem = nccl.readiness()
    if not problem:
        pytest.skip("NCCL runs here (tests/gpu cover the nccl backend)")
    port = free_port()
    envs = [torchrun_env(r, 2, port, SINGA_LITE_COMM_BACKEND="nccl", SINGA_LITE_COMM_TIMEOUT=20) for r in range(2)]
    results, seconds = start_ranks(script, envs, mode="quick")
    for rank, (code, report, _) in enumerate(results):  # every rank heard of all, before NCCL's rendezvous
        assert code == 3, rank
        assert f"rank(s) 0, 1 cannot use NCCL: rank 0: {problem}; rank 1: {problem}" in report["error"], rank
    assert seconds < 15  # not the 20 s timeout



@pytest.mark.gpu
def test_nccl_through_the_env_rendezvous(script):
    from singa_lite.comm import nccl

    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    n = min(_core.cuda_device_count(), 4)  # NCCL needs one GPU per rank: cuda:<local rank>
    port = free_port()
    envs = [torchrun_env(r, n, port, SINGA_LITE_COMM_BACKEND="nccl") for r in range(n)]
    results, _ = start_ranks(script, envs, mode="quick", timeout=120)  # the unique id travels through the store
    assert [(code, report) for code, report, _ in results] == [
        (0, {"rank": r, "world": n, "local": [r, n], "backend": "nccl"}) for r in range(n)], results


# ---------------------------------------------------------------- singa-run --hostfile with a local "remote shell"
WRAPPER = """\
#!/bin/sh
# Called as ssh is: HOST WORDS... Runs the words on this machine through a shell, as sshd would, and notes the host.
host=$1; shift
echo "$host" >> "$(dirname "$0")/hosts_used"
exec sh -c "$*"
"""

FAILING = """\
import time
from singa_lite import dist
comm = dist.init()
print("ready", flush=True)
if comm.rank == 2:
    raise RuntimeError("boom from rank 2")
time.sleep(120)
"""


@pytest.fixture
def cluster(tmp_path, script):
    wrapper = tmp_path / "fake_ssh"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    (tmp_path / "failing.py").write_text(FAILING)
    return tmp_path


def singa_run(args, cwd, timeout=60):
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "singa_lite.run"] + args, cwd=cwd, env=CLEAN, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - start


@pytest.mark.parametrize("form,backend", [("host:N", "shm"), ("host slots=N", "tcp")])
def test_singa_run_hostfile_two_hosts_by_two_ranks(cluster, form, backend):
    # Two "hosts" that are this machine: the ranks find that they share it, so the automatic backend is shm;
    # --backend tcp forces what ranks on separate hosts would get.
    lines = ["localhost:2", "127.0.0.1:2"] if form == "host:N" else ["localhost slots=2", "127.0.0.1 slots=2"]
    (cluster / "hosts").write_text("# two hosts\n" + "\n".join(lines) + "\n")
    forced = ["--backend", "tcp"] if backend == "tcp" else []
    r, _ = singa_run(["--hostfile", "hosts", "--launcher-exec", str(cluster / "fake_ssh"), "--master-addr", HOST,
                      *forced, "rank.py", HELPERS, "full"], cluster)
    assert r.returncode == 0, r.stderr
    reports = {}
    for line in r.stdout.splitlines():
        prefix, _, text = line.partition("] ")
        if text.startswith("{"):
            reports[int(prefix.split()[-1])] = json.loads(text)
    assert reports == {k: {"rank": k, "world": 4, "local": [k, 4], "backend": backend,
                           "distopt": "same as one process"} for k in range(4)}, r.stdout + r.stderr
    assert sorted((cluster / "hosts_used").read_text().split()) == ["127.0.0.1"] * 2 + ["localhost"] * 2


def test_singa_run_hostfile_a_failed_rank_stops_the_others(cluster):
    (cluster / "hosts").write_text("localhost:2\n127.0.0.1 slots=2\n")
    r, seconds = singa_run(["--hostfile", "hosts", "--launcher-exec", str(cluster / "fake_ssh"), "--grace", "2",
                            "failing.py"], cluster)
    assert r.returncode == 1, r.stderr
    assert "[rank 2] RuntimeError: boom from rank 2" in r.stderr
    assert "singa-run: rank 2 failed: exit code 1" in r.stderr
    for k in (0, 1, 3):  # stopped through their helpers' control line
        assert f"rank {k} exit code 143 (= 128 + SIGTERM: a signal on " in r.stderr, r.stderr
    assert seconds < 30
    assert not survivors([], also=lambda: processes_running(str(cluster / "failing.py").encode()))



def test_singa_run_hostfile_passes_ctrl_c_to_every_rank(cluster):
    (cluster / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    (cluster / "waits.py").write_text("import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "singa_lite.run", "--hostfile", "hosts", "--launcher-exec",
                             str(cluster / "fake_ssh"), "--grace", "5", "waits.py"], cwd=cluster, env=CLEAN,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = 0
        while ready < 2:
            line = proc.stdout.readline()
            assert line, "singa-run ended before the ranks were ready"
            ready += line.rstrip().endswith("] ready")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "[rank 0] KeyboardInterrupt" in err and "[rank 1] KeyboardInterrupt" in err, err  # not SIGKILL's doing
    assert "interrupted by SIGINT; rank 0 exit code 130 (= 128 + SIGINT: a signal on localhost)" in err, err
    assert not survivors([], also=lambda: processes_running(str(cluster / "waits.py").encode()))
