"""Only the job's own ranks get in (launches without MPI: torchrun / Slurm variables, the rendezvous store and the
tcp mesh), tried as a hostile local user would: another uid running singa_lite's own dist.init() with the job's
public variables, a rank of another job whose port collides, a duplicate RANK, silent connections. And a rank
that simply ran out of steps is named as such, not as dead.

Tests with a second uid need root (a forked child setuid()s to 65534 'nobody'); CI runs as root."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from singa_lite import _core
from singa_lite.comm import auth
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore

from paths import job
from procs import fork_as, survivors

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")
HOST = "127.0.0.1"
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid (65534 'nobody')")
LAUNCH_VARS = ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "SINGA_LITE_COMM_TIMEOUT", "RANK", "WORLD_SIZE",
               "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK",
               "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
               "PMIX_RANK", "MPI_LOCALRANKID", auth.JOB_ID_VAR, auth.SECRET_VAR, auth.SECRET_FILE_VAR,
               auth.REQUIRE_VAR, auth.KEY_DIR_VAR)
CLEAN = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}


@pytest.fixture
def keys(tmp_path):
    """The job's user keeps its host key here (a private folder of the test, not the real home)."""
    return str(tmp_path / "keys")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def torchrun(rank, world, port, keys, backend="tcp", **extra):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
            "SINGA_LITE_COMM_BACKEND": backend, "SINGA_LITE_COMM_TIMEOUT": "60", auth.KEY_DIR_VAR: keys,
            **{k: str(v) for k, v in extra.items()}}


def start(env, steps=3, *more):
    return subprocess.Popen([sys.executable, job("trust_job.py"), str(steps), *more], env={**CLEAN, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(proc, timeout=90):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"exit code {proc.returncode}, no report\n{out}\n{err}"
    return proc.returncode, json.loads(lines[-1]), err


def serving(port, seconds=30.0) -> bool:
    """Whether rank 0's store accepts connections (it does before it waits for the others)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def as_stranger(env: dict) -> str:
    """Runs dist.init() in a forked child as another user (65534) with `env` as its launch variables; returns
    what happened there ("joined as rank R" or the error)."""
    r, w = os.pipe()

    def stranger():
        os.close(r)
        for k in LAUNCH_VARS:
            os.environ.pop(k, None)
        os.environ.update(env)
        os.environ.pop(auth.KEY_DIR_VAR, None)  # its own key, wherever it can keep one
        from singa_lite import comm
        comm._launched = None
        try:
            c = comm.init(init_method="env")
            said = f"joined as rank {c.rank}"
        except Exception as e:  # noqa: BLE001 -- reported to the test
            said = f"{type(e).__name__}: {e}"
        os.write(w, said.encode())
    pid = fork_as(NOBODY, stranger)
    os.close(w)
    deadline = time.monotonic() + 90
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not done:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        return f.read().decode()


@needs_root
@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_another_user_with_the_jobs_variables_is_refused_and_the_job_trains(backend, keys):
    """The stranger used to join as rank 1 (tcp: it read rank 0's gradient buckets and rewrote them; shm: it
    read the segment's name from the store and created the segment first, and the job died)."""
    port = free_port()
    rank0 = start(torchrun(0, 2, port, keys, backend))
    assert serving(port)
    said = as_stranger(torchrun(1, 2, port, keys, backend))
    assert "CommError" in said and "does not hold this job's key, which this job requires" in said, said
    rank1 = start(torchrun(1, 2, port, keys, backend))
    for rank, proc in enumerate((rank0, rank1)):
        code, out, err = report(proc)
        assert code == 0 and out == {"rank": rank, "world": 2, "backend": backend, "sums": 3}, err


def test_a_rank_of_another_slurm_job_on_the_same_port_is_told_and_neither_job_is_touched(keys):
    """Slurm jobs 100 and 10100 both derive MASTER_PORT 20100 (20000 + id % 10000)."""
    port = next(p for p in range(20000 + os.getpid() % 5000, 30000) if port_free(p))
    job_a = port - 20000

    def slurm(rank, job_id):
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": str(job_id),
                "SLURM_STEP_NODELIST": "localhost", "SLURM_NODEID": "0", "MASTER_ADDR": HOST,
                "SINGA_LITE_COMM_BACKEND": "tcp", "SINGA_LITE_COMM_TIMEOUT": "60", auth.KEY_DIR_VAR: keys}
    a0 = start(slurm(0, job_a))
    assert serving(port)
    code, out, err = report(start(slurm(1, job_a + 10000)))
    assert code == 3 and f"the rendezvous store at {HOST}:{port} refused this process: another job (id " \
        f"'{job_a}.0') uses this port; this is job '{job_a + 10000}.0'" in out["error"], out
    a1 = start(slurm(1, job_a))
    for rank, proc in enumerate((a0, a1)):
        code, out, err = report(proc)
        assert code == 0 and out["sums"] == 3 and out["rank"] == rank, err


def test_a_rank_given_twice_is_refused_naming_both_processes(keys):
    """RANK=1 given twice used to let one duplicate train and tell the other "rank 0 did not join"."""
    port = free_port()
    rank0, first = start(torchrun(0, 3, port, keys)), None
    procs = [rank0]
    try:
        assert serving(port)
        first = start(torchrun(1, 3, port, keys))
        procs.append(first)
        assert wait_until(lambda: published(port, keys, 3, "host/1"))  # it holds its claim: the job waits for 2
        second = start(torchrun(1, 3, port, keys))
        procs.append(second)
        code, out, err = report(second)
        assert code == 3, out
        assert f"rank 1 is taken: pid {first.pid} on host {socket.gethostname()} joined as rank 1 first" in \
            out["error"] and f"this process (pid {second.pid} on host {socket.gethostname()}) says it is rank 1 " \
            f"too" in out["error"], out
        procs.append(start(torchrun(2, 3, port, keys)))
        for rank, proc in enumerate((rank0, first, procs[-1])):
            code, out, err = report(proc)
            assert code == 0 and out["rank"] == rank and out["sums"] == 3, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def wait_until(predicate, seconds=30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def published(port, keys, world, key) -> bool:
    """Whether `key` is in the job's store (read as the job's own user, claiming no rank)."""
    creds = auth.credentials({auth.KEY_DIR_VAR: keys}, single_host=True)
    try:
        with TcpStore(HOST, port, world, is_server=False, timeout=5, credentials=creds) as s:
            s.get(key, timeout=0.0)
            return True
    except CommError:
        return False


def test_silent_connections_and_strangers_at_a_ranks_mesh_listener_delay_nothing(keys, tmp_path):
    """The mesh used to greet accepted connections one at a time, 5 s each: six silent ones made the set-up
    time out, and the error blamed the network. Two ranks as threads of this process, on one store."""
    import threading

    import numpy as np

    from singa_lite import tensor
    from singa_lite.comm.tcp import TcpCommunicator

    creds = auth.credentials({auth.KEY_DIR_VAR: keys}, single_host=True)
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=30, credentials=creds)
    client = TcpStore(HOST, server.port, 2, is_server=False, timeout=30, credentials=creds)
    made, silent = {}, []

    def rank(r, store):
        try:
            made[r] = TcpCommunicator(store, r, 2, timeout=20, prefix="mesh", single_host=True)
        except Exception as e:  # noqa: BLE001 -- reported below
            made[r] = e
    t0 = threading.Thread(target=rank, args=(0, server))
    t0.start()
    try:
        with TcpStore(HOST, server.port, 2, is_server=False, timeout=30, credentials=creds) as reader:
            host, _, mesh_port = reader.get("mesh/addr/0", timeout=20).decode().rpartition(":")
        silent = [socket.create_connection((host, int(mesh_port)), timeout=5) for _ in range(12)]
        stranger = auth.credentials({auth.KEY_DIR_VAR: str(tmp_path / "stranger")}, single_host=True)
        sock = socket.create_connection((host, int(mesh_port)), timeout=5)
        with pytest.raises(auth.Refused, match="does not hold this job's key"):
            auth.client(sock, stranger, "mesh", {"prefix": "mesh", "world": 2, "rank": 1, "to": 0})
        sock.close()
        begin = time.monotonic()
        t1 = threading.Thread(target=rank, args=(1, client))
        t1.start()
        t0.join(30)
        t1.join(30)
        assert time.monotonic() - begin < auth.HANDSHAKE_S, "the silent connections held the set-up up"
        assert all(isinstance(made[r], TcpCommunicator) for r in (0, 1)), made
        out = [tensor.from_numpy(np.full(3, r + 1.0, np.float32)) for r in (0, 1)]
        works = [made[r].all_reduce(out[r], async_op=True) for r in (0, 1)]
        for w in works:
            w.wait()
        assert all(np.array_equal(tensor.to_numpy(t), np.full(3, 3.0)) for t in out)
    finally:
        for s in silent:
            s.close()
        for c in made.values():
            if isinstance(c, TcpCommunicator):
                c.close()
        client.close()
        server.close()


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_a_rank_that_ran_fewer_steps_is_named_as_such_not_as_dead(how, keys):
    port = free_port()
    rank0 = start(torchrun(0, 2, port, keys), 3)
    rank1 = start(torchrun(1, 2, port, keys), 2, *(["raise"] if how == "raise" else []))
    code0, out0, err0 = report(rank0)
    code1, out1, err1 = report(rank1)
    assert out1["sums"] == 2 and code1 == (0 if how == "exit" else 1), err1
    assert code0 == 3, out0
    text = out0["error"]
    assert "killed or crashed" not in text, text
    if how == "exit":
        assert "rank 1 (" in text and "exited normally (its script ended without an uncaught exception) after 2 " \
            "collective calls, while this rank is in all_reduce #3: did the ranks run different numbers of " \
            "steps?" in text and "dist_opt.join()" in text, text
    else:
        assert "ended with an uncaught exception after 2 collective calls" in text and "look at its output" in \
            text, text
    assert not survivors([rank0.pid, rank1.pid])


@needs_root
def test_another_user_is_refused_by_the_store_singa_run_elastic_serves(tmp_path, monkeypatch):
    """Under singa-run --elastic the launcher serves the job's store (no rank does): a local stranger with the
    ranks' public variables (everything but the key, which lives in the ranks' own environment) is refused."""
    from singa_lite.comm import launch_args, launcher

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = launch_args.parse_command_line(launch_args.build_parser(), ["--elastic", "-np", "2", "train.py"])
    launch_args.check_args(args)
    store = TcpStore(HOST, 0, 2, True, timeout=60.0, credentials=launcher.elastic_credentials(args))
    try:
        rank1 = launch_args.elastic_environment(args, 1, store.port, base={})
        public = {k: v for k, v in rank1.items() if k != auth.SECRET_VAR}
        said = as_stranger({**public, "SINGA_LITE_COMM_TIMEOUT": "20"})
        assert "CommError" in said and "refused" in said, said
        assert store.keys("")[0] == 0, f"the stranger wrote to the job's store: {store.keys('')[1]}"
    finally:
        store.close()
