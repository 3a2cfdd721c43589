"""DistOpt's training features (accumulation, clipping, buffers and SyncBatchNorm2d, join) on the mpi backend
under a real mpiexec: the scenarios of training_cases.py, run by training_job.py."""
import os
import sys

import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from test_dist_mpi import mpiexec  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_job.py")


@pytest.mark.parametrize("n", [2, 3])
def test_training_features_on_mpi(n):
    import subprocess

    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, JOB], capture_output=True, text=True,
                          timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out
