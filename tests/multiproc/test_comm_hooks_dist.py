"""The communication hooks (singa_lite.parallel.hooks, powersgd) on real multi-process communicators, tcp and
shm, against numpy references computed from every rank's buffers (helpers/comm_hook_cases.py), and PowerSGD's
convergence on a least-squares problem next to the plain all-reduce's."""
import pytest

from singa_lite import _core

from comm_hook_cases import run, scenario_all  # noqa: E402

BACKENDS = ["tcp", pytest.param("shm", marks=pytest.mark.skipif(not hasattr(_core, "ShmComm"),
                                                                reason="this build has no shm backend"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_hooks_match_numpy_and_powersgd_converges(backend, world_size):
    out = run(backend, scenario_all, world_size, timeout=300)
    assert sorted(out) == list(range(world_size)), out
    for r, result in out.items():
        assert result[0] == "ok", (r, result)
    done, conv = out[0][1]
    assert done == ["plain", "powersgd", "rank1"]
    assert all(out[r][1] == out[0][1] for r in out), "the ranks' losses differ"
    print(f"{backend} x{world_size}: least squares after 300 steps: {conv}")


def test_hooks_on_mpi():
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("mpi4py", reason="the mpi backend needs mpi4py: pip install 'singa_lite[mpi]'")
    from paths import job

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec: pip install 'singa_lite[mpi]' (the MPICH wheel provides one)")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, job("comm_hooks_job.py"), "hooks"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out
