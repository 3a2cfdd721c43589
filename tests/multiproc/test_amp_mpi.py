"""bfloat16 and mixed precision on the mpi backend under a real mpiexec, 2 and 3 ranks (amp_mpi_job.py)."""
import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from test_dist_mpi import run_job_under_mpiexec  # noqa: E402


@pytest.mark.parametrize("n", [2, 3])
def test_bfloat16_and_amp_on_mpi(n):
    run_job_under_mpiexec("amp_mpi_job.py", n, timeout=300)
