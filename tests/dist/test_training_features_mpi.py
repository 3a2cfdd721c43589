"""DistOpt's training features (accumulation, clipping, buffers and SyncBatchNorm2d, join) on the mpi backend
under a real mpiexec: the scenarios of training_cases.py, run by training_job.py."""
import os
import sys

import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from test_dist_mpi import mpiexec  # noqa: E402

from paths import job  # noqa: E402

JOB = job("training_job.py")


@pytest.mark.parametrize("n", [2, 3])
def test_training_features_on_mpi(n):
    import subprocess

    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, JOB], capture_output=True, text=True,
                          timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"OK rank {r}" in out for r in range(n)), out


def test_a_rank_that_finished_early_is_named_as_ended_normally():
    import subprocess

    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, JOB, "finished_early"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "JOB_TIMEOUT": "3"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out  # the waiting ranks fail and the job is aborted
    assert ("rank 0 ended normally (its script finished without an error) after 0 collectives, while this rank "
            "is inside #1: the number of steps probably differed") in out, out
    assert "dist_opt.join()" in out and "died" not in out, out
