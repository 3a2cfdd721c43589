"""dist.init() gives each rank of a job its share of the host's cores for the CPU kernels (OpenMP would give
every rank all of them: N ranks oversubscribe the host N times, and OpenMP's spinning barriers stall whenever
a thread is descheduled; SINGA's examples/cnn on 2 ranks ran 5-8x slower, see singa_lite/comm/__init__.py).
OMP_NUM_THREADS, a count chosen with device.set_num_threads and a launcher's core binding are kept."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from paths import job

JOB = job("threads_job.py")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

pytestmark = pytest.mark.skipif(CORES < 2, reason="needs 2+ cores (with one, every rank gets 1 thread anyway)")


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None or subprocess.run([sys.executable, "-c", "import mpi4py"]).returncode != 0:
        pytest.skip("needs mpiexec and mpi4py: pip install 'singa_lite[mpi]'")
    return [found, "-n", "2"]


def _threads(launcher: str, *args, **env) -> dict:
    """{rank: threads} printed by the job's ranks; env: variables set (None: removed) for the job."""
    full = {k: v for k, v in os.environ.items() if k not in env}
    full.update({k: v for k, v in env.items() if v is not None})
    prefix = _mpiexec() if launcher == "mpi" else []
    proc = subprocess.run([*prefix, sys.executable, JOB, launcher, *args], capture_output=True, text=True,
                          timeout=120, env=full)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = {int(r): int(n) for r, n in re.findall(r"threads rank (\d+): (\d+)", out)}
    assert sorted(found) == [0, 1], out
    return found


@pytest.mark.parametrize("launcher", ["mpi", "shm"])
def test_each_rank_gets_its_share_of_the_cores(launcher):
    assert _threads(launcher, OMP_NUM_THREADS=None) == {0: CORES // 2, 1: CORES // 2}


@pytest.mark.parametrize("launcher", ["mpi", "shm"])
def test_omp_num_threads_is_kept(launcher):
    assert _threads(launcher, OMP_NUM_THREADS="3") == {0: 3, 1: 3}


def test_a_count_set_before_init_is_kept():
    n = CORES + 1  # not the default (all cores), so it is the user's
    assert _threads("shm", "set", str(n), OMP_NUM_THREADS=None) == {0: n, 1: n}


def test_a_rank_bound_by_its_launcher_keeps_its_cores(monkeypatch):
    # In-process, with the affinities made up: a rank on all of its launcher's 4 cores shares them (2 each of
    # 2 local ranks); a rank bound to 4 of its launcher's 8 cores keeps the 4 OpenMP gives it.
    from singa_lite import _core, comm

    class TwoLocalRanks:
        local_size = 2

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = _core.get_num_threads()
    try:
        for mine, launcher, want in ((4, 4, 2), (4, 8, 4)):
            _core.set_num_threads(mine)  # OpenMP's default: the rank's cores
            monkeypatch.setattr(os, "sched_getaffinity",
                                lambda pid, m=mine, l=launcher: set(range(m if pid == 0 else l)))
            comm._share_cores(TwoLocalRanks())
            assert _core.get_num_threads() == want, (mine, launcher)
    finally:
        _core.set_num_threads(before)
