"""DistOpt's training features (accumulation, clipping, buffers and SyncBatchNorm2d, join) on the mpi backend
under a real mpiexec: the scenarios of training_cases.py, run by training_job.py."""
import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from test_dist_mpi import run_job_under_mpiexec  # noqa: E402


@pytest.mark.parametrize("n", [2, 3])
def test_training_features_on_mpi(n):
    run_job_under_mpiexec("training_job.py", n, timeout=400)
