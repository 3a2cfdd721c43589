"""The replica check (singa_lite.parallel.replica_check) on tcp and shm with 2 and 3 ranks: a parameter or
momentum buffer nudged by one ulp on one rank is named with its rank on every rank; identical replicas pass
(scenarios in helpers/replica_cases.py); the same on mpi through jobs/comm_hooks_job.py."""
import os
import shutil
import subprocess
import sys

import pytest

from singa_lite import _core

from comm_hook_cases import run  # noqa: E402
from replica_cases import scenario_all  # noqa: E402

BACKENDS = ["tcp", pytest.param("shm", marks=pytest.mark.skipif(not hasattr(_core, "ShmComm"),
                                                                reason="this build has no shm backend"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_replica_check_names_the_rank_and_tensor(backend, world_size):
    out = run(backend, scenario_all, world_size, timeout=180)
    assert sorted(out) == list(range(world_size)), out
    want = ["identical", "parameter", "momentum"] + (["majority"] if world_size >= 3 else []) + ["every"]
    assert out == {r: ("ok", want) for r in range(world_size)}, out


def test_replica_check_on_mpi():
    pytest.importorskip("mpi4py", reason="the mpi backend needs mpi4py: pip install 'singa_lite[mpi]'")
    from paths import job

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec: pip install 'singa_lite[mpi]' (the MPICH wheel provides one)")
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, job("comm_hooks_job.py"), "replicas"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(3)) and "'majority'" in out, out
