"""The mpi backend under a real ``mpiexec`` (the MPICH wheel's), 1 to 3 ranks: every collective and the
failure paths. Each case runs tests/multiproc/jobs/mpi_job.py in a fresh MPI job with a hard time limit."""
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from paths import job  # noqa: E402

JOB = job("mpi_job.py")


def run_job_under_mpiexec(name: str, n: int, timeout: float) -> str:
    """Runs jobs/<name> on n ranks under mpiexec; asserts it exited 0 and every rank printed "OK rank r"."""
    from paths import job

    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, job(name)], capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out
    return out


def mpiexec() -> str:
    # The one next to this interpreter first: mpi4py's wheel talks to the MPICH wheel installed with it.
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec on PATH: pip install 'singa_lite[mpi]' (the MPICH wheel provides one)")
    return found


def run_job(n: int, scenario: str, limit: float = 120.0, **env):
    start = time.monotonic()
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, JOB, scenario], capture_output=True,
                          text=True, timeout=limit, env={**os.environ, **env})
    return proc, time.monotonic() - start


def test_shm_forced_under_mpiexec_is_refused_not_a_world_of_one_per_rank():
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", "from singa_lite import dist; dist.init()"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SINGA_LITE_COMM_BACKEND": "shm"})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "one of 2 ranks started by mpiexec: use backend 'mpi'" in proc.stderr, proc.stderr
    one = subprocess.run([mpiexec(), "-n", "1", sys.executable, "-c",
                          "from singa_lite import dist; c = dist.init(backend='shm'); print(c.world_size)"],
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and one.stdout.strip() == "1", one.stdout + one.stderr


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective(n):
    proc, _ = run_job(n, "collectives")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_distopt(n):
    # equivalence with one process on the whole batch (SGD, Adam, small buckets), half, sparse, partial,
    # first-step synchronisation and the model check: tests/multiproc/helpers/distopt_cases.py
    proc, _ = run_job(n, "distopt", limit=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out


def test_mismatched_sizes_raise_on_every_rank_and_the_communicator_survives():
    proc, _ = run_job(3, "mismatch")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(3)), out


def test_timeout_names_the_rank_that_did_not_arrive_and_ends_the_job():
    proc, elapsed = run_job(3, "timeout", JOB_TIMEOUT="2")
    out = proc.stdout + proc.stderr
    assert "OK rank 0" in out and "OK rank 2" in out, out  # both raised CommError naming rank 1
    assert proc.returncode != 0, out  # then the stuck job was aborted, rank 1's sleep included
    assert elapsed < 30, (elapsed, out)


def test_a_killed_rank_ends_the_job_fast():
    proc, elapsed = run_job(3, "killed")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "OK rank" not in out, out
    assert "signal 9" in out or "KILLED" in out.upper(), out
    assert elapsed < 10, (elapsed, out)
