"""bfloat16 and mixed precision on the mpi backend under a real mpiexec, 2 and 3 ranks (amp_mpi_job.py)."""
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from paths import job  # noqa: E402
from test_dist_mpi import mpiexec  # noqa: E402

JOB = job("amp_mpi_job.py")


@pytest.mark.parametrize("n", [2, 3])
def test_bfloat16_and_amp_on_mpi(n):
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, JOB], capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out
